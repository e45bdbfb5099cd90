#include "app/run_guard.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/comm/mpi_communicator.h"
#include "core/compare/reference_spill.h"
#include "core/plan/head_groups.h"
#include "core/util/error.h"
#include "core/util/log.h"

namespace kcp::app {

int64_t parse_bytes(const std::string& text, const char* option) {
  if (text == "auto") return -1;
  size_t used = 0;
  double v = -1;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  if (unit.ends_with("iB"))
    unit.resize(unit.size() - 2);
  else if (unit.ends_with("B"))
    unit.resize(unit.size() - 1);
  static const std::string units = "KMGTP";
  const size_t u = unit.size() == 1 ? units.find(unit[0]) : std::string::npos;
  KCP_REQUIRE(used > 0 && v >= 0 && std::isfinite(v) && (unit.empty() || u != std::string::npos),
              "{}: expected a byte count (like 64G, 512MiB or 1000000) or 'auto', got \"{}\"", option, text);
  const double bytes = v * std::pow(1024.0, u == std::string::npos ? 0 : double(u + 1));
  KCP_REQUIRE(bytes < 9.2e18, "{}: {} bytes do not fit in 64 bits", option, text);
  return static_cast<int64_t>(bytes);
}

int64_t parse_head_group(const std::string& text) {
  if (text == "auto") return kHeadGroupAuto;
  if (text == "never") return kHeadGroupNever;
  return parse_bytes(text, "--head-group");
}

std::string head_group_help() {
  return "How the forms of a row run: every head at once, or one group of q/k heads (with their value heads) at a "
         "time, each group's arrays and results freed before the next (heads are independent: the metrics, "
         "verdicts and det checks are those of every head at once; the plan and P stay the whole row's; times are "
         "the groups' summed). auto: every head when the row fits the memory at hand, else the fewest groups with "
         "which it fits; BYTES: the fewest groups whose form arrays take at most BYTES a rank (0: one q/k head a "
         "group); never: every head at once. `kcpbench plan` shows the groups";
}

int64_t host_memory_available() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("MemAvailable:", 0) == 0) return std::atoll(line.c_str() + 13) * 1024;  // "MemAvailable: N kB"
  return 0;
}

int64_t free_disk_bytes(const std::string& folder) {
  struct statvfs st {};
  if (::statvfs(folder.c_str(), &st) != 0) return 0;
  return int64_t(st.f_bavail) * int64_t(st.f_frsize);
}

int64_t parse_reference_spill(const std::string& text) {
  if (text == "never") return -1;
  if (text == "auto") return kReferenceSpillAuto;
  return parse_bytes(text, "--reference-spill");
}

std::string reference_spill_help() {
  return "Where a rank's FP64 reference slice waits while the forms run: a slice of at least BYTES is written "
         "to an unlinked file in $TMPDIR and read back to judge each form (0: always; never: kept in memory; "
         "auto: kept in memory when the row fits 90% of the host memory that way in no more groups of heads than "
         "with spilled slices, or when spilled slices would not fit the disk (--max-spill-disk) and kept ones fit; "
         "else, and when the host memory is unknown (--max-host-mem 0), 64MiB). The values are the same either way";
}

int64_t parse_reference_group(const std::string& text) {
  if (text == "never") return kReferenceGroupNever;
  if (text == "auto") return kReferenceGroupAuto;
  return parse_bytes(text, "--reference-group");
}

std::string reference_group_help() {
  return "How the FP64 reference of a large row runs: when the results of its sequences pass BYTES, one group of "
         "heads at a time, each group's results freed once the ranks have their part (0: one q/k head at a time; "
         "never: every head at once; auto: 512MiB, or fewer, larger groups, as few as keep every thread of the "
         "reference busy, where the row still fits 90% of the host memory that way). Larger groups use more threads on rows of few sequences (one "
         "value head's recurrence keeps at most V/16 threads busy) and more memory (kcpbench plan shows it). "
         "The values are the same either way";
}

std::string keep_inputs_help() {
  return "auto: a row's input shard stays in host memory across its forms (drawn once a row, not once a form; "
         "the det rerun draws it again) when the row runs in one group of heads and still fits 90% of the memory "
         "at hand (kcpbench plan shows it); never: each form draws it again. The values are the same either way";
}

void add_memory_flags(CLI::App* sub, MemoryFlags& f, bool as_run) {
  auto as = [as_run](const char* flag) { return as_run ? fmt::format(" (as run {})", flag) : std::string(); };
  sub->add_option("--reference-spill", f.reference_spill, reference_spill_help() + as("--reference-spill"))
      ->capture_default_str();
  sub->add_option("--max-spill-disk", f.max_spill_disk, max_spill_disk_help())->capture_default_str();
  sub->add_option("--reference-group", f.reference_group, reference_group_help() + as("--reference-group"))
      ->capture_default_str();
  sub->add_option("--keep-inputs", f.keep_inputs, keep_inputs_help() + as("--keep-inputs"))
      ->check(CLI::IsMember({"auto", "never"}))
      ->capture_default_str();
}

void apply_memory_flags(const MemoryFlags& f, RunOptions& opt) {
  opt.reference_spill_bytes = parse_reference_spill(f.reference_spill);
  opt.reference_group_bytes = parse_reference_group(f.reference_group);
  opt.keep_inputs = f.keep_inputs == "auto";
}

SpillRoom spill_room(const std::string& max_spill_disk, int procs) {
  const int64_t flag = parse_bytes(max_spill_disk, "--max-spill-disk");
  if (flag >= 0) return {flag, "--max-spill-disk"};
  return {free_disk_bytes(reference_spill_folder()) / procs,
          procs > 1 ? fmt::format("free space, shared by the {} processes of this host", procs) : "free space"};
}

std::string max_spill_disk_help() {
  return "Room for the FP64 reference slices a row spills to files in $TMPDIR (--reference-spill): BYTES, "
         "or auto: the folder's free space, shared by the processes of an mpirun on one host. A row whose "
         "spill (kcpbench plan shows it) is larger is refused before anything runs (exit 2); 0: no check";
}

namespace {

// Refuses a row whose spilled reference slices do not fit the room for them (ConfigError).
void check_spill_room(const RowConfig& row, const MemoryEstimate& e, const SpillRoom& room) {
  const int64_t spill = spilled_reference_bytes(e);
  if (room.bytes <= 0 || spill <= room.bytes) return;
  KCP_THROW(ConfigError,
            "row {} spills {} bytes ({}) of FP64 reference slices to {} and {} bytes ({}) are free there ({}); set "
            "TMPDIR to a folder with room, or keep the slices in host memory with --reference-spill never (then "
            "they count as host memory), or override the check with --max-spill-disk BYTES (kcpbench plan shows "
            "the estimate)",
            row.name, spill, human_bytes(spill), reference_spill_folder(), room.bytes, human_bytes(room.bytes),
            room.source);
}

// Processes of this launch on this host (mpirun's environment; 1 without one).
int local_processes() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* s = std::getenv(v)) return std::max(1, std::atoi(s));
  return 1;
}

void check_hang(const RunOptions& opt, const RunGuard& guard) {
  if (opt.fault.kind != FaultKind::Hang) return;
  KCP_REQUIRE(guard.deadline > 0,
              "--inject hang needs a finite --deadline: the injected hang lasts until the deadline aborts the run, and "
              "--deadline {} sets none (give one, e.g. --deadline 30)",
              guard.deadline);
  log::warn("--inject hang: one rank hangs until the deadline of {} s{} aborts the run with exit code 5",
            guard.deadline, guard.deadline_given ? "" : " (the default; --deadline SECONDS shortens it)");
}

}  // namespace

void check_memory(std::vector<SelectedRow>& rows, const RunOptions& opt, const kernels::Backend& backend,
                  const RunGuard& guard) {
  const int64_t host_flag = parse_bytes(guard.max_host_mem, "--max-host-mem");
  const int64_t device_flag = parse_bytes(guard.max_device_mem, "--max-device-mem");
  const int procs = guard.use_mpi ? local_processes() : 1;
  const int64_t host_avail = host_flag >= 0 ? host_flag : host_memory_available() / procs;
  const int64_t device_avail = device_flag >= 0 ? device_flag : backend.device_memory_bytes();
  const std::string host_source =
      host_flag >= 0 ? "--max-host-mem"
      : procs > 1    ? fmt::format("MemAvailable in /proc/meminfo, shared by the {} processes of this host", procs)
                     : "MemAvailable in /proc/meminfo";
  const std::string device_source =
      device_flag >= 0 ? "--max-device-mem" : fmt::format("{} memory", backend.device_name());
  const SpillRoom room = spill_room(guard.max_spill_disk, procs);
  const bool device_is_host = std::string(backend.name()) == "cpu";
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  // --dump writes whole tensors: every head at once (a forced grouping is refused).
  KCP_REQUIRE(guard.dump.empty() || opt.head_group_bytes == kHeadGroupAuto || opt.head_group_bytes == kHeadGroupNever,
              "--dump writes whole tensors: it runs every head at once, and --head-group asks for groups of heads");
  const int64_t group_bytes = guard.dump.empty() ? opt.head_group_bytes : kHeadGroupNever;
  for (SelectedRow& sr : rows) {
    const RowConfig& row = *sr.row;
    MemoryRequest req;
    req.plan.device = !row.plan_device.empty() ? row.plan_device : opt.device_class;
    req.plan.sm_count = opt.sm_count;
    req.forced_P = opt.forced_P;
    if (opt.use_row_forced)
      req.forced_P.insert(req.forced_P.end(), row.forms.forced_P.begin(), row.forms.forced_P.end());
    req.device_is_host = device_is_host;
    req.backend = &backend;
    req.spare_workspace = opt.fault.kind == FaultKind::WorkspaceOfOtherPackage;
    req.reference_spill_bytes = opt.reference_spill_bytes;
    req.reference_group_bytes = opt.reference_group_bytes;
    if (guard.use_mpi) {
      if (row.world != mpi_world_size()) continue;  // recorded as skipped by the run
      req.ranks = {mpi_world_rank()};
      req.reference_threads = std::max(1, guard.threads);  // as run_in_world gives the reference
    } else {
      req.reference_threads = hw;
    }
    const HeadGroupChoice choice =
        choose_head_groups(row, req, group_bytes, host_avail, device_avail, opt.keep_inputs, room.bytes);
    const MemoryEstimate& e = choice.estimate;
    sr.head_groups = choice.groups;
    sr.reference_spill_bytes = choice.reference_spill_bytes;
    sr.reference_group_bytes = choice.reference_group_bytes;
    sr.keep_inputs = choice.keep_inputs;
    log::debug("row {}: FP64 reference slices {}; input shards {}", row.name,
               choice.reference_spill_bytes < 0 ? "kept in memory" : "spilled from 64 MiB",
               choice.keep_inputs ? "kept across forms" : "drawn for each form");
    if (choice.groups > 1)
      log::info0("row {}: its forms run in {} groups of heads ({} q/k head{} each): host {}, device {}", row.name,
                 choice.groups, row.H / choice.groups, row.H / choice.groups > 1 ? "s" : "", human_bytes(e.host_bytes),
                 human_bytes(e.device_bytes));
    const std::string per =
        std::string(guard.use_mpi ? " in this rank's process" : " in this process (its ranks are threads)") +
        (choice.groups > 1 ? fmt::format(" in {} groups of heads", choice.groups) : "");
    if (host_avail > 0 && e.host_bytes > host_avail)
      KCP_THROW(ConfigError,
                "row {} needs {} bytes ({}) of host memory{} and {} bytes ({}) are available ({}); --max-host-mem "
                "BYTES overrides the check (kcpbench plan shows the estimate)",
                row.name, e.host_bytes, human_bytes(e.host_bytes), per, host_avail, human_bytes(host_avail),
                host_source);
    if (device_avail > 0 && e.device_bytes > device_avail)
      KCP_THROW(ConfigError,
                "row {} needs {} bytes ({}) of device memory{} and the device has {} bytes ({}; {}); "
                "--max-device-mem BYTES overrides the check (kcpbench plan shows the estimate)",
                row.name, e.device_bytes, human_bytes(e.device_bytes), per, device_avail, human_bytes(device_avail),
                device_source);
    check_spill_room(row, e, room);
  }
}

void check_output_path(const std::string& path, const char* flag, bool folder) {
  namespace fs = std::filesystem;
  if (path.empty()) return;
  std::error_code ec;
  const fs::path p(path);
  const fs::file_status st = fs::status(p, ec);
  if (!folder && fs::is_directory(st))
    KCP_THROW(ConfigError, "{} {}: is a folder, not a file (give a file path such as {}/results.json)", flag, path,
              path);
  if (folder && fs::exists(st) && !fs::is_directory(st))
    KCP_THROW(ConfigError, "{} {}: is not a folder (it exists as a file)", flag, path);
  const fs::path dir = folder ? p : p.has_parent_path() ? p.parent_path() : fs::path(".");
  fs::path existing = dir;  // the nearest part of the folder that exists
  while (!existing.empty() && !fs::exists(existing, ec)) existing = existing.parent_path();
  if (existing.empty()) existing = ".";
  if (!fs::is_directory(existing, ec))
    KCP_THROW(ConfigError, "{} {}: cannot make the folder {}: {} is not a folder", flag, path, dir.string(),
              existing.string());
  const fs::path probe = existing / fmt::format(".kcpbench-probe-{}", static_cast<long>(::getpid()));
  std::FILE* f = std::fopen(probe.c_str(), "w");
  if (!f) {
    const int err = errno;
    KCP_THROW(ConfigError, "{} {}: cannot write in {}: {}", flag, path, existing.string(), std::strerror(err));
  }
  std::fclose(f);
  fs::remove(probe, ec);
}

void check_before_run(std::vector<SelectedRow>& rows, const RunOptions& opt, const kernels::Backend& backend,
                      const RunGuard& guard) {
  if (!guard.use_mpi || mpi_world_rank() == 0) check_output_path(guard.json, "--json", false);
  check_output_path(guard.dump, "--dump", true);
  check_hang(opt, guard);
  check_memory(rows, opt, backend, guard);
}

}  // namespace kcp::app
