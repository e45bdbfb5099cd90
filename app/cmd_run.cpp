// `kcpbench run`: plan, run every form, judge against FP64, report (docs/design.md 3).
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "app/cli_checks.h"
#include "app/commands.h"
#include "app/deadline_watchdog.h"
#include "app/run_guard.h"
#include "core/comm/local_communicator.h"
#include "core/comm/mpi_communicator.h"
#include "core/comm/nccl_communicator.h"
#include "core/config/row_loader.h"
#include "core/kcp/external_backend.h"
#include "core/kcp/row_runner.h"
#include "core/report/npy_dump.h"
#include "core/report/report.h"
#include "core/report/results.h"
#include "core/util/error.h"
#include "core/util/log.h"
#include "kernels/cpu/cpu_backend.h"

namespace kcp::app {

namespace {
std::vector<std::string> split_commas(const std::vector<std::string>& items) {
  std::vector<std::string> out;
  for (const auto& it : items) {
    std::stringstream ss(it);
    std::string part;
    while (std::getline(ss, part, ','))
      if (!part.empty()) out.push_back(part);
  }
  return out;
}

// --sweep-P: "auto", or comma items each a segment count or a range A:B (every P), A:B:S (step S)
// or A:B:pow2 (the powers of two in [A, B]); all in [1, 64]. Ascending, without duplicates.
std::vector<int> parse_sweep_P(const std::vector<std::string>& items, bool& is_auto) {
  is_auto = false;
  std::vector<int> out;
  auto count = [](const std::string& t, const std::string& item) {
    char* end = nullptr;
    const long v = std::strtol(t.c_str(), &end, 10);
    KCP_REQUIRE(
        !t.empty() && end && *end == 0 && v >= 1 && v <= 64,
        "--sweep-P: expected a segment count in [1, 64] in \"{}\", got \"{}\" (forms: 1,2,4 or 1:64:pow2 or auto)",
        item, t);
    return static_cast<int>(v);
  };
  for (const auto& item : split_commas(items)) {
    if (item == "auto") {
      is_auto = true;
      continue;
    }
    if (item == "planned") continue;  // the planned schedule always runs in a sweep
    std::vector<std::string> f(1);    // fields between ':' (empty ones kept, so "2:" is an error)
    for (char c : item) {
      if (c == ':')
        f.emplace_back();
      else
        f.back() += c;
    }
    if (f.size() == 1) {
      out.push_back(count(f[0], item));
      continue;
    }
    KCP_REQUIRE(f.size() == 2 || f.size() == 3, "--sweep-P: expected a range A:B, A:B:STEP or A:B:pow2, got \"{}\"",
                item);
    const int a = count(f[0], item), b = count(f[1], item);
    KCP_REQUIRE(a <= b, "--sweep-P: range \"{}\" is empty (start > end)", item);
    if (f.size() == 3 && f[2] == "pow2") {
      for (int P = 1; P <= b; P *= 2)
        if (P >= a) out.push_back(P);
      continue;
    }
    const int step = f.size() == 3 ? count(f[2], item) : 1;
    for (int P = a; P <= b; P += step) out.push_back(P);
  }
  KCP_REQUIRE(!(is_auto && !out.empty()), "--sweep-P: 'auto' stands alone, got it with explicit counts");
  KCP_REQUIRE(is_auto || !out.empty(), "--sweep-P: no segment count given");
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Whether the file at `path` must not be replaced by an incomplete results file: anything there,
// except a results file that is incomplete itself (summary.complete false).
bool keeps_earlier_results(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return false;
  std::ifstream in(path);
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return true;
  const auto s = j.find("summary");
  if (s == j.end() || !s->is_object()) return true;
  const auto c = s->find("complete");
  return !(c != s->end() && c->is_boolean() && !c->get<bool>());
}

}  // namespace

std::string default_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME")) return std::string(x) + "/kcpbench";
  if (const char* h = std::getenv("HOME")) return std::string(h) + "/.cache/kcpbench";
  return "";
}

struct RunCli {
  std::string rows = "int1";
  std::vector<std::string> row, package, saved, P, sweep_P;
  std::string backend = "auto", comm = "auto", device = "h200", json, inject = "none", cache, dump;
  std::string max_host_mem = "auto", max_device_mem = "auto", seeds, external_dir, head_group = "auto";
  MemoryFlags mem;
  int sm_count = 0, threads = 0, inject_rank = -1, warmup = 0, repeats = 1;
  double deadline = 3600;
  bool bench = false;
  bool phase_times = false;
  bool no_det_checks = false;
};

// Shared by run and calibrate: the selected rows with their digests.
std::vector<SelectedRow> selected_rows(const RowSet& set, const std::vector<std::string>& patterns) {
  std::vector<SelectedRow> out;
  for (const RowConfig* r : select_rows(set, patterns))
    out.push_back({r, set.row_digests[r->index], set.row_json[r->index]});
  return out;
}

std::vector<SelectedRow> rows_at_seed(const std::vector<SelectedRow>& rows, uint64_t seed,
                                      std::deque<RowConfig>& store) {
  std::vector<SelectedRow> out;
  for (const SelectedRow& sr : rows) {
    store.push_back(*sr.row);
    store.back().seed = seed;
    SelectedRow at = sr;  // with every choice made for the row (groups of heads, spill, kept inputs)
    at.row = &store.back();
    at.other_seed = sr.other_seed || seed != sr.row->seed;
    out.push_back(at);
  }
  return out;
}

namespace {
// The rows at every seed of --seeds (seed by seed), or as they are when it is not given.
std::vector<SelectedRow> with_seeds(const std::vector<SelectedRow>& rows, const std::string& seeds_text,
                                    std::deque<RowConfig>& store) {
  if (seeds_text.empty()) return rows;
  std::vector<SelectedRow> out;
  for (uint64_t s : parse_seeds("--seeds", seeds_text))
    for (auto& sr : rows_at_seed(rows, s, store)) out.push_back(sr);
  return out;
}
// --backend exec: the options that have no meaning for an external kernel are refused (exit 2),
// and each row becomes a copy with W = 1 (the external kernel holds every sequence whole; the
// row's digest, and so its inputs and reference, stay the same).
std::vector<SelectedRow> external_rows(const std::vector<SelectedRow>& rows, const RunCli& o, const CLI::App& sub,
                                       bool launched, std::deque<RowConfig>& store) {
  for (const char* flag : {"--package", "--saved", "--P", "--sweep-P", "--inject", "--dump", "--bench", "--phase-times",
                           "--warmup", "--repeats", "--comm", "--threads"})
    KCP_REQUIRE(sub.count(flag) == 0,
                "{} does not apply to --backend exec (one external form per row and seed, one process; "
                "docs/external.md)",
                flag);
  KCP_REQUIRE(!launched, "--backend exec runs without mpirun (the external kernel sees whole sequences)");
  std::vector<SelectedRow> out;
  for (const SelectedRow& sr : rows) {
    store.push_back(*sr.row);
    store.back().world = 1;
    store.back().rank_tokens.clear();
    out.push_back({&store.back(), sr.digest, sr.json, sr.other_seed});
  }
  return out;
}

// The folder that holds the external backend's per-row folders: --external-dir, or a new one
// under the temp folder.
std::string external_root(const std::string& flag) {
  std::error_code ec;
  if (!flag.empty()) {
    std::filesystem::create_directories(flag, ec);
    KCP_REQUIRE(!ec && std::filesystem::is_directory(flag), "--external-dir {}: cannot create the folder: {}", flag,
                ec.message());
    return std::filesystem::absolute(flag).string();
  }
  std::string tmpl = (std::filesystem::temp_directory_path() / "kcpbench-external-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) KCP_THROW(ApiError, "cannot create a folder {}: {}", tmpl, std::strerror(errno));
  return tmpl;
}

// a += b: b's entries appended, its counts added.
void add_outcome(RunOutcome& a, RunOutcome b) {
  for (auto& e : b.entries) a.entries.push_back(std::move(e));
  a.passed += b.passed;
  a.failed += b.failed;
  a.skipped += b.skipped;
  a.contract_broken += b.contract_broken;
  a.refused += b.refused;
  a.timed_out += b.timed_out;
}

}  // namespace

// Runs the rows in the launch mode at hand: under mpirun every process is one rank (rows of
// another world size are recorded as skipped); otherwise each row gets its W ranks as threads.
// after_row (may be empty) sees the outcome so far after each row of the threads launch, and
// after each form of a long row.
RunOutcome run_in_world(const std::vector<SelectedRow>& rows, RunOptions opt, const std::string& comm_kind,
                        int threads_flag, const kernels::Backend& backend, RunContext& ctx,
                        const std::function<void(const RunOutcome&)>& after_row, ReferenceStore* shared_refs) {
  const bool use_mpi = mpi_available() && mpi_launched() && comm_kind != "local";
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  RunOutcome total;
  auto merge = [&](RunOutcome&& part) { add_outcome(total, std::move(part)); };
  // Records a row this launch cannot run as skipped (never dropped).
  auto skip_row = [&](const SelectedRow& sr, int rank, const std::string& why) {
    ++total.skipped;
    if (rank != 0) return;
    Entry e;
    e.id = e.row = sr.row->name;
    e.row_digest = sr.digest;
    e.status = "skip";
    e.reason = why;
    total.entries.push_back(std::move(e));
    log::info0("{}: skipped: {}", sr.row->name, why);
  };
  KCP_CHECK(!(use_mpi && shared_refs), "a shared reference store is for ranks as threads only");
  if (use_mpi) {
    auto host = make_mpi_communicator();
    std::unique_ptr<Communicator> nccl;
    if (comm_kind == "nccl") nccl = make_nccl_communicator(*host, local_rank() % std::max(1, gpu_count()));
    Communicator* comm = nccl ? nccl.get() : host.get();
    const int W = comm->size();
    ctx.world = W;
    opt.threads = threads_flag > 0 ? threads_flag : 1;
    ReferenceStore refs(opt.cache_dir, opt.threads);
    std::vector<SelectedRow> runnable;
    for (const auto& sr : rows) {
      if (sr.row->world == W) {
        runnable.push_back(sr);
        continue;
      }
      skip_row(sr, comm->rank(), fmt::format("row needs W = {} ranks; this mpirun has {}", sr.row->world, W));
    }
    merge(run_rows(runnable, opt, *comm, backend, refs));
    ctx.devices.assign(W, backend.name());
  } else {
    ReferenceStore own_refs(opt.cache_dir, hw);
    ReferenceStore& refs = shared_refs ? *shared_refs : own_refs;
    opt.progress_total = static_cast<int>(rows.size());
    if (after_row)  // a long row's finished forms are written too, not only its whole
      opt.after_long_form = [&](const RunOutcome& row_so_far) {
        RunOutcome so_far = total;
        add_outcome(so_far, row_so_far);
        after_row(so_far);
      };
    for (const auto& sr : rows) {
      const int W = sr.row->world;
      if (comm_kind == "nccl" && W != 1) {
        skip_row(sr, 0,
                 fmt::format("--comm nccl without mpirun runs one rank; row needs W = {} (use mpirun -np {})", W, W));
        continue;
      }
      opt.progress_offset = static_cast<int>(&sr - rows.data());
      opt.threads = threads_flag > 0 ? threads_flag : std::max(1, hw / W);
      RunOutcome part;
      run_local_world(W, [&](Communicator& local) {
        std::unique_ptr<Communicator> nccl;
        if (comm_kind == "nccl") nccl = make_nccl_communicator(local, 0);
        Communicator& comm = nccl ? *nccl : local;
        RunOutcome mine = run_rows({sr}, opt, comm, backend, refs);
        if (comm.rank() == 0) part = std::move(mine);
      });
      ctx.world = std::max(ctx.world, W);
      merge(std::move(part));
      if (after_row) after_row(total);
    }
    ctx.devices.assign(ctx.world, backend.name());
  }
  return total;
}

namespace {

// run's options, into `o` (each explained by --help): the rows, forms and schedules;
void add_form_options(CLI::App* sub, RunCli& o) {
  sub->add_option("--rows", o.rows, "Row set: a name (int1 = <configs>/rows/int1.json) or a path to a row file")
      ->capture_default_str();
  sub->add_option("--row", o.row, "Only these rows (names or globs like 'K*'); repeatable");
  sub->add_option("--seed,--seeds", o.seeds,
                  "Run every row at these seeds instead of its own: S, A:B (inclusive) or a comma list such as "
                  "1:8,13; entries record the seed, and their ids end in /seedS where it is not the row's own");
  sub->add_option("--package", o.package, "Packages to run: det, nondet (comma list; default: the row's)")
      ->check(comma_list());
  sub->add_option("--saved", o.saved, "Saved sets to run: full, light (comma list; default: the row's)")
      ->check(comma_list());
  sub->add_option("--P", o.P,
                  "Schedules: 'planned' and/or forced segment counts, e.g. --P planned,2,4 "
                  "(default: planned plus the row's forms.forced_P)")
      ->check(comma_list());
  sub->add_option("--sweep-P", o.sweep_P,
                  "Sweep the segment count: run every row at each P forced on all its ranks "
                  "(the row's forced_rule does not apply) plus the planned P, one entry "
                  "each; a P a rank cannot take is a skip entry. LIST: 1,2,4,8 or "
                  "1:64:pow2 (also A:B, A:B:STEP) or auto (powers of two up to the "
                  "largest P a rank can take, plus the planned P)")
      ->check(comma_list());
}

// the backend, launch, output, faults and deadline;
void add_launch_options(CLI::App* sub, RunCli& o) {
  sub->add_option("--backend", o.backend,
                  "cpu (the fp32 CPU twin), cuda, auto (cuda when a GPU is present), or exec:COMMAND (an external "
                  "kernel: per row and seed the inputs go to a folder as .npy with manifest.json, COMMAND runs "
                  "with the folder as its last argument and writes outputs/*.npy, judged like any backend; "
                  "docs/external.md)")
      ->capture_default_str();
  sub->add_option("--external-dir", o.external_dir,
                  "--backend exec: where the per-row folders (inputs, outputs, adapter.log) are made and kept "
                  "(default: a new folder under the temp folder)");
  sub->add_option("--comm", o.comm,
                  "local (ranks as threads), mpi, nccl (device buffers, one GPU per rank; "
                  "needs --backend cuda), or auto (mpi under mpirun, else local)")
      ->capture_default_str();
  sub->add_option("--device", o.device,
                  "Device class for planning rows without plan_device: h100, h200, b200, "
                  "gb300, cpu")
      ->capture_default_str();
  sub->add_option("--sm-count", o.sm_count, "Override the planning class's SM count")
      ->check(CLI::Range(1, kMaxSmCount));
  sub->add_option("--threads", o.threads, "CPU twin threads per rank (default: cores / ranks, at least 1)")
      ->check(CLI::Range(1, kMaxThreads));
  sub->add_option("--json", o.json, "Write the results JSON (kcpbench.results/1) to this path");
  auto* inject = sub->add_option("--inject", o.inject,
                                 "Inject a fault to prove the harness catches it: "
                                 "drop-segment-entry, drop-rank-incoming, skip-output-tile, "
                                 "saved-to-other-package, workspace-of-other-package, hang (needs a finite "
                                 "--deadline), nondeterministic-rerun (o differs by one ulp on every second run: a "
                                 "det form is contract_broken, exit 4)")
                     ->capture_default_str();
  sub->add_option("--deadline", o.deadline,
                  "Seconds one row may take on a rank before the run is aborted with "
                  "exit code 5, naming rank, row and phase (0: no deadline; refused with --inject hang)")
      ->capture_default_str()
      ->check(seconds_at_least_zero());
  sub->add_option("--inject-rank", o.inject_rank,
                  "Rank that takes the fault (default: the last rank that can; a "
                  "row without this rank records its entries as skipped)")
      ->check(CLI::Range(0, kMaxWorld - 1))
      ->needs(inject);
  sub->add_option("--cache", o.cache,
                  "FP64 reference cache folder ('none' disables; default "
                  "$XDG_CACHE_HOME/kcpbench or ~/.cache/kcpbench)");
  sub->add_option("--dump", o.dump,
                  "Write inputs, FP64 reference and backend outputs/gradients of the selected "
                  "rows and forms as .npy files, with DIR/manifest.json describing each (DIR: empty, new, or an "
                  "earlier dump, whose listed files are removed; anything else: exit 2)");
}

// the timing and the memory choices.
void add_timing_memory_options(CLI::App* sub, RunCli& o) {
  sub->add_option("--warmup", o.warmup, "Untimed forward+backward runs per form before the timed ones")
      ->capture_default_str();
  sub->add_option("--repeats", o.repeats, "Timed forward+backward runs per form (median/min/max/p90 in the JSON)")
      ->capture_default_str();
  sub->add_flag("--bench", o.bench,
                "Benchmark mode: --warmup 3 --repeats 20 unless given, and --phase-times "
                "(kernels only; results are still judged)");
  sub->add_flag("--phase-times", o.phase_times,
                "After the timed runs, as many runs again with each backend phase "
                "timed: per-phase median/min/max in the JSON (timings_ms.phases), "
                "medians in the table");
  sub->add_flag("--no-det-checks", o.no_det_checks, "Skip the det package's rerun and full-vs-light bitwise checks");
  sub->add_option("--max-host-mem", o.max_host_mem,
                  "Host memory a process may use (BYTES like 64G, 512MiB, or auto: MemAvailable of /proc/meminfo, "
                  "shared by the processes of an mpirun on one host). A row whose estimated need (kcpbench plan "
                  "shows it) is larger is refused before anything runs (exit 2); 0: no check")
      ->capture_default_str();
  sub->add_option("--max-device-mem", o.max_device_mem,
                  "Device memory the ranks of one device may use (BYTES, or auto: the GPU's total memory; the CPU "
                  "twin keeps its arrays in host memory). A row that needs more is refused (exit 2); 0: no check")
      ->capture_default_str();
  add_memory_flags(sub, o.mem, false);
  sub->add_option("--head-group", o.head_group, head_group_help())->capture_default_str();
}

// The run options that follow from run's flags alone (forms, schedules, faults, repeats, the FP64
// reference's and the inputs' memory choices); the external kernel, dumper and launch are set by
// the caller. Throws ConfigError naming the flag and value.
void parse_run_flags(const RunCli& o, const CLI::App& sub, RunOptions& opt) {
  for (const auto& p : split_commas(o.package)) {
    KCP_REQUIRE(p == "det" || p == "nondet", "--package: expected det or nondet, got \"{}\"", p);
    opt.packages.push_back(p == "det" ? Package::Det : Package::Nondet);
  }
  for (const auto& s : split_commas(o.saved)) {
    KCP_REQUIRE(s == "full" || s == "light", "--saved: expected full or light, got \"{}\"", s);
    opt.saved.push_back(s == "full" ? SavedKind::Full : SavedKind::Light);
  }
  const auto ps = split_commas(o.P);
  KCP_REQUIRE(ps.empty() || o.sweep_P.empty(),
              "--P and --sweep-P exclude each other (a sweep always runs the planned P)");
  if (!o.sweep_P.empty()) {
    opt.sweep = true;
    opt.use_row_forced = false;
    opt.forced_P = parse_sweep_P(o.sweep_P, opt.sweep_auto);
  }
  if (!ps.empty()) {
    opt.run_planned = false;
    opt.use_row_forced = false;
    for (const auto& p : ps) {
      if (p == "planned") {
        opt.run_planned = true;
        continue;
      }
      char* end = nullptr;
      const long v = std::strtol(p.c_str(), &end, 10);
      KCP_REQUIRE(end && *end == 0 && v >= 1 && v <= 64,
                  "--P: expected 'planned' or a segment count in [1, 64], got \"{}\"", p);
      opt.forced_P.push_back(static_cast<int>(v));
    }
  }
  device_class(o.device);  // validates the name early (exit 2)
  opt.device_class = o.device;
  opt.sm_count = o.sm_count;
  opt.fault.kind = parse_fault(o.inject);
  opt.fault.rank = o.inject_rank;
  opt.determinism_checks = !o.no_det_checks;
  KCP_REQUIRE(o.warmup >= 0 && o.repeats >= 1, "--warmup must be >= 0 and --repeats >= 1, got {} and {}", o.warmup,
              o.repeats);
  opt.warmup = o.bench && sub.count("--warmup") == 0 ? 3 : o.warmup;
  opt.repeats = o.bench && sub.count("--repeats") == 0 ? 20 : o.repeats;
  opt.phase_times = o.bench || o.phase_times;
  opt.cache_dir = o.cache == "none" ? "" : o.cache.empty() ? default_cache_dir() : o.cache;
  apply_memory_flags(o.mem, opt);
  opt.head_group_bytes = parse_head_group(o.head_group);
}

// The facts of this run that go into every results file's context.
RunContext run_context(const Globals& g, const RunCli& o, const RowSet& set, const std::vector<SelectedRow>& rows,
                       bool use_mpi, const std::string& comm_kind, const kernels::Backend& backend,
                       const std::string& ext_cmd) {
  RunContext ctx;
  ctx.argv = g.argv;
  ctx.launch_mode = use_mpi ? "mpirun" : "threads";
  ctx.comm = comm_kind;
  ctx.backend = ext_cmd.empty() ? backend.name() : "exec";
  ctx.backend_device = ext_cmd.empty() ? backend.device_name() : "external command: " + ext_cmd;
  ctx.device_class = o.device;
  ctx.row_set = set.name;
  ctx.row_set_file = set.file;
  ctx.row_set_digest = set.digest;
  for (const auto& sr : rows)
    if (std::find(ctx.seeds.begin(), ctx.seeds.end(), sr.row->seed) == ctx.seeds.end())
      ctx.seeds.push_back(sr.row->seed);
  return ctx;
}

// The --json file of a run. It is rewritten after every row of a threads launch, and after every
// form of a long row (summary.complete false until the end), so a run cut short (a deadline, a
// killed job) keeps the rows and forms it finished. The rows written so far never replace a file
// an earlier run left there (unless that one is incomplete too): they go beside it, to
// JSON.partial, until the run completes, and a deadline abort says where they are.
class ResultsFile {
 public:
  ResultsFile(const std::string& path, bool use_mpi, const RunContext& ctx, DeadlineWatchdog& watchdog)
      : path_(path), ctx_(ctx) {
    partial_ = !path.empty() && keeps_earlier_results(path) ? path + ".partial" : path;
    if (path.empty() || use_mpi) return;  // under mpirun the file is written once, at the end
    if (partial_ != path)
      log::info0("{} holds earlier results: this run writes its rows to {} until it completes", path, partial_);
    watchdog.set_note(partial_ == path
                          ? fmt::format("the rows finished before the deadline are in {} (complete: false)", partial_)
                          : fmt::format("the rows finished before the deadline are in {} (complete: false); {} was "
                                        "left as it was",
                                        partial_, path));
  }

  // The callback after each row. --json was checked before the first row; should a write still
  // fail (a disk full, the folder removed), the run goes on with one warning.
  std::function<void(const RunOutcome&)> after_row() {
    if (path_.empty()) return {};
    return [this](const RunOutcome& t) {
      try {
        write_json_atomic(partial_, doc(t, false));
      } catch (const Error& e) {
        if (!warned_) log::warn("could not write {} after a row (the run goes on): {}", path_, e.what());
        warned_ = true;
      }
    };
  }

  // The complete file; a failed write keeps the entries in the temp folder, says where, then
  // throws ApiError (exit 3): never lose a finished entry.
  void write_final(const RunOutcome& total) {
    if (path_.empty()) return;
    const nlohmann::json d = doc(total, true);
    try {
      write_json_atomic(path_, d);
    } catch (const Error& e) {
      const std::string kept = (std::filesystem::temp_directory_path() /
                                fmt::format("kcpbench-results-{}.json", static_cast<long>(::getpid())))
                                   .string();
      write_json_atomic(kept, d);
      throw ApiError(fmt::format("{}; the results were written to {} instead", e.what(), kept));
    }
    std::error_code ec_ignored;
    if (partial_ != path_) std::filesystem::remove(partial_, ec_ignored);
    log::info0("wrote {}", path_);
  }

 private:
  nlohmann::json doc(const RunOutcome& t, bool complete) const {
    Results d;
    d.context = context_block(ctx_);
    d.entries = t.entries;
    d.summary = Summary{t.passed, t.failed, t.skipped, t.contract_broken, t.refused, complete};
    return to_json(d);
  }

  std::string path_, partial_;
  const RunContext& ctx_;
  bool warned_ = false;
};

// Every rank holds the same counts (verdicts are reduced), so all agree on the exit code.
int run_exit_code(const RunOutcome& total) {
  if (total.contract_broken > 0) return 4;
  if (total.timed_out > 0) return 5;  // an external command passed the row deadline
  if (total.failed > 0 || total.refused > 0) return 1;
  return 0;
}

}  // namespace

std::function<int()> add_run_command(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand("run",
                                 "Run rows forward and backward in every form, judge every output and gradient "
                                 "against the FP64 reference, print a table and write JSON");
  auto o = std::make_shared<RunCli>();
  add_form_options(sub, *o);
  add_launch_options(sub, *o);
  add_timing_memory_options(sub, *o);
  return [sub, o, &g]() -> int {
    if (!sub->parsed()) return -1;
    RowSet set = load_row_set(resolve_row_file(o->rows, g.configs_dir));
    std::deque<RowConfig> seeded;  // the rows at other seeds (--seeds)
    const std::string ext_cmd = external_command(o->backend);
    const bool launched = mpi_available() && mpi_launched();
    auto rows = with_seeds(selected_rows(set, o->row), o->seeds, seeded);
    RunOptions opt;
    ExternalKernel ext;
    if (!ext_cmd.empty()) {
      rows = external_rows(rows, *o, *sub, launched, seeded);
      ext = {ext_cmd, external_root(o->external_dir), o->deadline};
      opt.external = &ext;
      log::info0("external backend: `{} FOLDER`, folders under {}", ext_cmd, ext.root);
    }
    parse_run_flags(*o, *sub, opt);
    KCP_REQUIRE(o->comm == "auto" || o->comm == "local" || o->comm == "mpi" || o->comm == "nccl",
                "--comm: expected local, mpi, nccl or auto, got \"{}\"", o->comm);
    KCP_REQUIRE(o->comm != "mpi" || launched,
                "--comm mpi: this process was not started by mpirun (or kcpbench was built without MPI)");
    const bool use_mpi = launched && o->comm != "local";
    auto backend = select_backend(ext_cmd.empty() ? o->backend : "cpu");  // exec: never called
    KCP_REQUIRE(o->comm != "nccl" || std::string(backend->name()) == "cuda",
                "--comm nccl exchanges device buffers: it needs --backend cuda (this run uses {})", backend->name());
    const std::string comm_kind = o->comm == "auto" ? (launched ? "mpi" : "local") : o->comm;
    check_before_run(rows, opt, *backend,
                     {o->deadline, sub->count("--deadline") > 0, o->max_host_mem, o->max_device_mem, use_mpi,
                      o->threads, o->json, o->dump, o->mem.max_spill_disk});

    RunContext ctx = run_context(g, *o, set, rows, use_mpi, comm_kind, *backend, ext_cmd);
    DeadlineWatchdog watchdog(o->deadline);
    Dumper dumper(o->dump);
    if (dumper.enabled()) opt.dumper = &dumper;
    ResultsFile results(o->json, use_mpi, ctx, watchdog);
    log::info0("{}", table_header());
    RunOutcome total = run_in_world(rows, opt, comm_kind, o->threads, *backend, ctx, results.after_row());
    if (opt.external) ctx.devices.assign(ctx.devices.size(), "exec");
    dumper.write_manifest(to_json(context_block(ctx)));
    if (!use_mpi || mpi_world_rank() == 0) {
      results.write_final(total);
      std::printf("%d passed, %d failed, %d skipped%s\n", total.passed, total.failed + total.contract_broken,
                  total.skipped, total.refused > 0 ? fmt::format(", {} refused", total.refused).c_str() : "");
      std::fflush(stdout);
    }
    return run_exit_code(total);
  };
}

}  // namespace kcp::app
