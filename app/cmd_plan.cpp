// `kcpbench plan`: how each selected row is planned for a world size and a device class.
#include <algorithm>
#include <cstdio>
#include <thread>

#include "app/cli_checks.h"
#include "app/commands.h"
#include "app/run_guard.h"
#include "core/compare/reference_spill.h"
#include "core/config/row_loader.h"
#include "core/plan/head_groups.h"
#include "core/plan/segment_plan.h"
#include "core/report/plan_json.h"
#include "core/util/error.h"

namespace kcp::app {

namespace {

int64_t largest(const MemoryEstimate& m, int64_t RankMemory::*field) {
  int64_t most = 0;
  for (const RankMemory& r : m.ranks) most = std::max(most, r.*field);
  return most;
}

nlohmann::json ranks_json(const MemoryEstimate& m) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankMemory& r : m.ranks)
    ranks.push_back({{"rank", r.rank},
                     {"inputs", r.inputs},
                     {"reference", r.reference},
                     {"reference_spilled", r.reference_spilled},
                     {"probes", r.probes},
                     {"form_arrays", r.form_arrays},
                     {"form_inputs", r.form_inputs},
                     {"twin_scratch", r.twin_scratch},
                     {"saved_set", r.saved_set},
                     {"workspace", r.workspace},
                     {"host_results", r.host_results},
                     {"kept", r.kept},
                     {"upload", r.upload},
                     {"run", r.run},
                     {"judge", r.judge},
                     {"host_peak", r.host_peak},
                     {"prepare", r.prepare}});
  return ranks;
}

// cpu: the CPU twin (run and calibrate), gpu: run on a GPU (form arrays in device memory).
nlohmann::json memory_json(const MemoryEstimate& cpu, const MemoryEstimate& gpu, int64_t available,
                           int64_t spill_room) {
  const int64_t spill = spilled_reference_bytes(cpu);
  return {{"what",
           "estimated bytes of a threads launch (all ranks in one process) on the CPU twin, for run and calibrate "
           "alike: host_bytes is the process's peak; host_per_rank the largest rank's share of the forms' peak; "
           "gpu: the same run on a GPU (device_per_rank: the largest rank's form arrays, backend scratch excluded)"},
          {"host_bytes", cpu.host_bytes},
          {"host_per_rank", largest(cpu, &RankMemory::host_peak)},
          {"host_available", available},
          {"fits", available <= 0 || cpu.host_bytes <= available},
          {"spill_bytes", spill},
          {"spill_folder", reference_spill_folder()},
          {"spill_room", spill_room},
          {"spill_fits", spill_room <= 0 || spill <= spill_room},
          {"phase_prepare", cpu.phase_prepare},
          {"phase_forms", cpu.phase_forms},
          {"sequences", cpu.sequences},
          {"reference_work", cpu.reference_work},
          {"reference_groups", cpu.reference_groups},
          {"head_groups", cpu.head_groups},
          {"keep_inputs", cpu.keep_inputs},
          {"fixed", cpu.fixed},
          {"ranks", ranks_json(cpu)},
          {"gpu",
           {{"head_groups", gpu.head_groups},
            {"keep_inputs", gpu.keep_inputs},
            {"host_bytes", gpu.host_bytes},
            {"host_per_rank", largest(gpu, &RankMemory::host_peak)},
            {"device_bytes", gpu.device_bytes},
            {"device_per_rank", largest(gpu, &RankMemory::form_arrays)},
            {"spill_bytes", spilled_reference_bytes(gpu)}}}};
}

// "; forms in 4 groups of heads", or for one group whether the input shards stay across forms.
std::string groups_text(const MemoryEstimate& e) {
  if (e.head_groups <= 1) return e.keep_inputs ? "; input shards kept across forms" : "";
  return fmt::format("; forms in {} groups of heads", e.head_groups);
}

// "; 8 rank slices spilled to $TMPDIR (/tmp), 80.1 GiB", and what `run` does when the room for
// them (--max-spill-disk, else the folder's free space) is smaller.
std::string spill_text(int64_t bytes, int slices, int64_t room) {
  std::string s =
      fmt::format("; {} rank slices spilled to $TMPDIR ({}), {}", slices, reference_spill_folder(), human_bytes(bytes));
  if (room > 0 && bytes > room) s += fmt::format(": more than the {} free there, `run` refuses it", human_bytes(room));
  return s;
}

// The device memory of a GPU of the class where known (what the CUDA runtime reports on the
// machines this project uses: H100 about 78 GiB, H200 about 139 GiB), else 0 (no limit).
int64_t class_device_memory(const std::string& device) {
  if (device == "h100") return int64_t(78) << 30;
  if (device == "h200") return int64_t(139) << 30;
  return 0;
}

std::string describe_memory(const MemoryEstimate& cpu, const MemoryEstimate& gpu, int64_t available,
                            int64_t spill_room) {
  const size_t W = cpu.ranks.size();
  int spilled = 0;
  for (const RankMemory& r : cpu.ranks) spilled += r.reference_spilled ? 1 : 0;
  std::string s = fmt::format(
      "  memory: host {} ({} bytes) for run and calibrate on the CPU twin ({} ranks as threads, up to {} a rank; "
      "FP64 reference {} + its working set {}{} while prepared, then forms {}{}{})",
      human_bytes(cpu.host_bytes), cpu.host_bytes, W, human_bytes(largest(cpu, &RankMemory::host_peak)),
      human_bytes(cpu.sequences), human_bytes(cpu.reference_work),
      cpu.reference_groups > 1 ? fmt::format(" (one of {} groups of heads at a time)", cpu.reference_groups) : "",
      human_bytes(cpu.phase_forms), groups_text(cpu),
      spilled ? spill_text(spilled_reference_bytes(cpu), spilled, spill_room) : std::string());
  if (available > 0 && cpu.host_bytes > available)
    s += fmt::format(": more than the {} available here, `run` refuses it", human_bytes(available));
  int gpu_spilled = 0;
  for (const RankMemory& r : gpu.ranks) gpu_spilled += r.reference_spilled ? 1 : 0;
  s += fmt::format(
      "\n  memory on a GPU: device {} a rank, {} in all; host {} ({} ranks as threads, up to {} a rank{}{})\n",
      human_bytes(largest(gpu, &RankMemory::form_arrays)), human_bytes(gpu.device_bytes), human_bytes(gpu.host_bytes),
      W, human_bytes(largest(gpu, &RankMemory::host_peak)), groups_text(gpu),
      gpu_spilled ? spill_text(spilled_reference_bytes(gpu), gpu_spilled, spill_room) : std::string());
  return s;
}

// The row's plan; an error names the row and its file.
SegmentPlan plan_row(const RowConfig& row, const PlanRequest& req, const std::string& file) {
  try {
    return make_plan(row, req);
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("while planning row {} of {}: {}", row.name, file, e.what()));
  }
}

// What `plan` asks of the memory estimate (its flags, as run's).
struct MemoryAsk {
  int64_t spill_bytes = 0, reference_group = 0, room = 0, available = 0, device_flag = -1, group_bytes = 0;
  bool keep_inputs = true;
};

// The row's memory in a threads launch (every rank a thread of one process) on the CPU twin, and
// on a GPU (the form arrays in device memory, without backend scratch), as `run` would choose it.
std::pair<MemoryEstimate, MemoryEstimate> row_memory(const RowConfig& row, const PlanRequest& req, const MemoryAsk& a) {
  MemoryRequest mreq;
  mreq.plan = req;
  mreq.forced_P = row.forms.forced_P;
  mreq.reference_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  mreq.reference_spill_bytes = a.spill_bytes;
  mreq.reference_group_bytes = a.reference_group;
  MemoryEstimate cpu = choose_head_groups(row, mreq, a.group_bytes, a.available, 0, a.keep_inputs, a.room).estimate;
  mreq.device_is_host = false;
  const int64_t device = a.device_flag >= 0 ? a.device_flag : class_device_memory(req.device);
  MemoryEstimate gpu =
      choose_head_groups(row, mreq, a.group_bytes, a.available, device, a.keep_inputs, a.room).estimate;
  return {std::move(cpu), std::move(gpu)};
}

}  // namespace

std::function<int()> add_plan_command(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand("plan",
                                 "Show the segment plan of rows: per-rank token ranges, pieces, P and "
                                 "segments, workspace sizes, and the host and device memory the row needs");
  struct Opts {
    std::string rows = "int1";
    std::vector<std::string> row;
    std::string device;
    int sm_count = 0;
    int world = 0;
    int P = 0;
    bool json = false;
    bool segments = false;
    std::string head_group = "auto", max_host_mem = "auto", max_device_mem = "auto";
    MemoryFlags mem;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("--rows", o->rows, "Row set: a name (int1 = <configs>/rows/int1.json) or a path to a row file")
      ->capture_default_str();
  sub->add_option("--row", o->row, "Only these rows (names or globs like 'A*'); repeatable");
  sub->add_option("--device", o->device,
                  "Device class to plan for: h100, h200, b200, gb300, cpu (default: the "
                  "row's plan_device, else h200)");
  sub->add_option("--sm-count", o->sm_count, "Override the device class's SM count")->check(CLI::Range(1, kMaxSmCount));
  sub->add_option("--world", o->world, "World size W (default: the row's world)")->check(CLI::Range(1, kMaxWorld));
  sub->add_option("--P", o->P, "Force this segment count on every rank (default: planned)")
      ->check(CLI::Range(1, kMaxP));
  sub->add_flag("--json", o->json, "Print JSON (one plan per row) instead of text");
  sub->add_flag("--segments", o->segments, "Include every segment's token range");
  sub->add_option("--head-group", o->head_group, head_group_help())->capture_default_str();
  sub->add_option("--max-host-mem", o->max_host_mem,
                  "Host memory the groups of heads are chosen for (BYTES, or auto: MemAvailable here), as run "
                  "--max-host-mem")
      ->capture_default_str();
  sub->add_option("--max-device-mem", o->max_device_mem,
                  "Device memory the GPU estimate's groups of heads are chosen for (BYTES, or auto: the device "
                  "class's, H100 78 GiB, H200 139 GiB; others no limit)")
      ->capture_default_str();
  add_memory_flags(sub, o->mem, true);
  return [sub, o, &g]() -> int {
    if (!sub->parsed()) return -1;
    RowSet set = load_row_set(resolve_row_file(o->rows, g.configs_dir));
    MemoryAsk ask;
    RunOptions flags;
    apply_memory_flags(o->mem, flags);
    ask.spill_bytes = flags.reference_spill_bytes;
    ask.reference_group = flags.reference_group_bytes;
    ask.keep_inputs = flags.keep_inputs;
    ask.room = spill_room(o->mem.max_spill_disk, 1).bytes;  // a threads launch: one process
    const int64_t host_flag = parse_bytes(o->max_host_mem, "--max-host-mem");
    ask.available = host_flag >= 0 ? host_flag : host_memory_available();
    ask.device_flag = parse_bytes(o->max_device_mem, "--max-device-mem");
    ask.group_bytes = parse_head_group(o->head_group);
    nlohmann::json out = nlohmann::json::array();
    for (const RowConfig* row : select_rows(set, o->row)) {
      PlanRequest req;
      req.device = !o->device.empty() ? o->device : !row->plan_device.empty() ? row->plan_device : "h200";
      req.sm_count = o->sm_count;
      req.world = o->world;
      req.forced_P = o->P;
      const SegmentPlan plan = plan_row(*row, req, set.file);
      const auto [mem, gpu] = row_memory(*row, req, ask);
      if (o->json) {
        nlohmann::json j = plan_json(plan, o->segments);
        j["memory"] = memory_json(mem, gpu, ask.available, ask.room);
        out.push_back(j);
      } else {
        std::fputs(describe(plan).c_str(), stdout);
        std::fputs(describe_memory(mem, gpu, ask.available, ask.room).c_str(), stdout);
      }
    }
    if (o->json) std::printf("%s\n", out.dump(2).c_str());
    return 0;
  };
}

}  // namespace kcp::app
