// `kcpbench calibrate`: derives each row's budgets from the CPU twin's error against FP64 over
// several seeds at the planned schedule (core/compare/budget.h), after holding the twin to its
// limits, and writes them into the row file (--write) or checks that the file holds exactly what
// it would write (--check).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <tuple>

#include "app/cli_checks.h"
#include "app/commands.h"
#include "app/run_guard.h"
#include "core/comm/mpi_communicator.h"
#include "core/compare/budget.h"
#include "core/report/report.h"
#include "core/report/results.h"
#include "core/util/error.h"
#include "core/util/log.h"
#include "kernels/cpu/cpu_backend.h"

namespace kcp::app {

namespace {

struct CalibrateCli {
  std::string rows = "int1", device = "h200", cache, seeds = "1:8", inject = "none", max_host_mem = "auto",
              head_group = "auto";
  MemoryFlags mem;
  std::vector<std::string> row;
  double k = 2.0;
  bool write = false, check = false;
  int threads = 0;
};

// The worst relative errors of one tensor over the seeds, and where they were.
struct Worst {
  double max_rel = 0, rel_rms = 0;
  uint64_t max_rel_seed = 0, rel_rms_seed = 0;
};
using TensorWorst = std::map<std::string, Worst>;  // per tensor
// A row's worst errors: at the planned schedule (h_entry / dh_exit: over every schedule) and per
// forced P that ran (every tensor, that schedule only).
struct RowWorst {
  TensorWorst planned;
  std::map<int, TensorWorst> forced;
};

// Folds one entry's metrics into `w`.
void fold_worst(TensorWorst& w, const std::string& t, double max_rel, double rel_rms, uint64_t seed) {
  Worst& x = w[t];
  if (!(max_rel <= x.max_rel)) x = {max_rel, x.rel_rms, seed, x.rel_rms_seed};
  if (!(rel_rms <= x.rel_rms)) x = {x.max_rel, rel_rms, x.max_rel_seed, seed};
}

double finite_or_inf(double x) { return std::isfinite(x) ? x : INFINITY; }

bool is_boundary(const std::string& t) {
  for (int i = 0; i < kResultTensorCount; ++i)
    if (t == kResultTensors[i]) return place_of(result_tensor(i)) == TensorPlace::Boundary;
  return false;
}

std::vector<const Entry*> entries_of(const RunOutcome& out, const std::string& row) {
  std::vector<const Entry*> v;
  for (const Entry& e : out.entries)
    if (e.row == row) v.push_back(&e);
  return v;
}

// The exact-storage twin's check of one entry: its worst relative error, against kExactTwinLimit.
void check_exact(const RowConfig& row, uint64_t seed, const Entry& x, double& exact_worst, std::string& exact_tensor,
                 std::vector<std::string>& violations) {
  for (const auto& [t, mx] : *x.tensors) {
    if (mx.count == 0) continue;
    const double xr = std::max(finite_or_inf(mx.rel_rms), finite_or_inf(mx.max_rel));
    if (!(xr <= exact_worst)) std::tie(exact_worst, exact_tensor) = std::make_pair(xr, t);
    if (mx.nonfinite > 0 || !(xr <= kExactTwinLimit))
      violations.push_back(
          fmt::format("{} {} {} seed {}: the exact-storage twin's error {:.3e} (non-finite {}) "
                      "breaks the limit {:.0e}: the twin's algorithm is wrong",
                      row.name, x.id, t, seed, xr, mx.nonfinite, kExactTwinLimit));
  }
}

// One row's entries at one seed: the rounded twin's (es, every schedule) and the exact-storage
// twin's (xs, the planned schedule; matched by entry id). The worst values go into `worst`, limit
// breaches into `violations`. Budgets come from the planned schedule, except h_entry / dh_exit:
// the worst of the row's schedules (planned and forced), since the planned one may carry no
// state across a segment. Each forced P that ran also gets budgets of its own.
void fold_row(const RowConfig& row, uint64_t seed, const std::vector<const Entry*>& es,
              const std::vector<const Entry*>& xs, RowWorst& worst, std::vector<std::string>& violations) {
  const double u = unit_roundoff(row.dtype);
  double exact_worst = 0;
  std::string exact_tensor = "-";
  KCP_CHECK(!es.empty(), "row {}: no entries to calibrate", row.name);
  for (const Entry* x : xs) {
    if (!x->tensors) {
      violations.push_back(fmt::format("{} {} seed {}: nothing to calibrate (exact-storage twin {}: {})", row.name,
                                       x->id, seed, x->status, x->reason.value_or("")));
      continue;
    }
    check_exact(row, seed, *x, exact_worst, exact_tensor, violations);
  }
  for (const Entry* ep : es) {
    const Entry& e = *ep;
    const bool planned = e.form && e.form->P == 0;
    if (!planned && e.status == "skip") continue;  // a forced P the row's rule does not run
    if (!e.tensors) {
      violations.push_back(fmt::format("{} {} seed {}: nothing to calibrate ({}: {})", row.name, e.id, seed, e.status,
                                       e.reason.value_or("")));
      continue;
    }
    for (const auto& [t, m] : *e.tensors) {
      if (m.count == 0) continue;  // nothing judged
      const double rel = finite_or_inf(m.rel_rms), mr = finite_or_inf(m.max_rel);
      if (m.nonfinite > 0 || !(rel <= kRoundedTwinUnits * u))
        violations.push_back(
            fmt::format("{} {} {} seed {}: the twin's rel-RMS {:.3e} (non-finite {}) breaks {} u = "
                        "{:.3e}",
                        row.name, e.id, t, seed, rel, m.nonfinite, kRoundedTwinUnits, kRoundedTwinUnits * u));
      if (!planned) fold_worst(worst.forced[e.form->P], t, mr, rel, seed);
      if (planned || is_boundary(t)) fold_worst(worst.planned, t, mr, rel, seed);
    }
  }
  log::info0("calibrate: seed {} {}: exact-storage twin's worst relative error {:.2e} ({}; limit {:.0e})", seed,
             row.name, exact_worst, exact_tensor, kExactTwinLimit);
}

// One seed's runs, row by row, of the rounded twin (whose errors set the budgets; every schedule
// the row names) and of the exact-storage twin (held to kExactTwinLimit; planned schedule), both
// judged against one FP64 reference computed once per row.
void calibrate_seed(const std::vector<SelectedRow>& rows, const RunOptions& opt, const CalibrateCli& o, uint64_t seed,
                    std::vector<RowWorst>& worst, std::vector<std::string>& violations) {
  std::deque<RowConfig> seeded;
  const auto at_seed = rows_at_seed(rows, seed, seeded);
  RunContext ctx;
  const auto rounded = kernels::make_cpu_backend(kernels::CpuStorage::Rounded);
  const auto exact_backend = kernels::make_cpu_backend(kernels::CpuStorage::Exact);
  RunOptions planned_only = opt;
  planned_only.use_row_forced = false;
  const int hw = std::max(1u, std::thread::hardware_concurrency());
  for (size_t i = 0; i < rows.size(); ++i) {
    const RowConfig& row = *at_seed[i].row;
    ReferenceStore refs(opt.cache_dir, hw, /*keep=*/true);  // the row's reference serves both twins
    log::info0("calibrate: seed {} {}: the twin ...", seed, row.name);
    const RunOutcome out = run_in_world({at_seed[i]}, opt, "local", o.threads, *rounded, ctx, {}, &refs);
    log::info0("calibrate: seed {} {}: the exact-storage twin (planned schedule) ...", seed, row.name);
    const RunOutcome exact =
        run_in_world({at_seed[i]}, planned_only, "local", o.threads, *exact_backend, ctx, {}, &refs);
    fold_row(row, seed, entries_of(out, row.name), entries_of(exact, row.name), worst[i], violations);
  }
}

std::string budget_text(const Budget& b) {
  return b.relative ? fmt::format("max_rel {} rel_rms {}", b.max_rel, b.rel_rms)
                    : fmt::format("max_abs {} rel_rms {} (absolute)", b.max_abs, b.rel_rms);
}

// The budgets of one schedule from its worst errors (`what`: "" planned, "P=2" ...); differences
// from the file's (`have`) go to `differences`, the derived values onto `line`.
nlohmann::ordered_json schedule_budgets(const RowConfig& row, const std::string& what, const TensorWorst& worst,
                                        const std::map<std::string, Budget>& have, const CalibrateCli& o,
                                        std::string& line, std::vector<std::string>& differences) {
  nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
  const std::string where = what.empty() ? row.name : row.name + " " + what;
  if (!what.empty()) line += fmt::format("\n{:<5} {}:", "", what);
  for (const std::string& t : all_tensor_names()) {
    auto it = worst.find(t);
    if (it == worst.end()) continue;
    const Budget b = derive_budget(it->second.max_rel, it->second.rel_rms, o.k, row.dtype);
    tensors[t] = {{"max_rel", b.max_rel}, {"rel_rms", b.rel_rms}};
    line += fmt::format(" {}={:.3g}/{:.3g}(s{}/s{})", t, b.max_rel, b.rel_rms, it->second.max_rel_seed,
                        it->second.rel_rms_seed);
    auto h = have.find(t);
    const bool same =
        h != have.end() && h->second.relative && h->second.max_rel == b.max_rel && h->second.rel_rms == b.rel_rms;
    if (!same)
      differences.push_back(fmt::format("{} {}: file has {}, calibrate derives max_rel {} rel_rms {}", where, t,
                                        h == have.end() ? std::string("no budget") : budget_text(h->second), b.max_rel,
                                        b.rel_rms));
  }
  return tensors;
}

// Where and with what the budgets were derived (provenance, not compared by --check): the host's
// cores and memory (a row's time and peak depend on them), the UTC date and the build.
std::string calibrated_on() {
  const double gib = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE)) /
                     (1024.0 * 1024 * 1024);
  const BuildInfo b = build_info();
  return fmt::format("a host of {} cores and {:.1f} GiB, {}, kcpbench {} (git {}{})",
                     std::max(1u, std::thread::hardware_concurrency()), gib, utc_now("%Y-%m-%dT%H:%MZ"), b.version,
                     b.git_sha, b.git_dirty ? ", dirty" : "");
}

// The budgets object of one row (planned tensors, and forced P that ran); prints one line per
// schedule; differences from the file's go to `differences`.
nlohmann::ordered_json row_budgets(const RowConfig& row, const RowWorst& worst, const CalibrateCli& o,
                                   const std::vector<uint64_t>& seeds, std::vector<std::string>& differences) {
  std::string line = fmt::format("{:<5}", row.name);
  nlohmann::ordered_json b = {
      {"source", budget_formula(o.k, row.dtype)}, {"seeds", seeds}, {"calibrated_on", calibrated_on()}};
  b["tensors"] = schedule_budgets(row, "", worst.planned, row.budgets, o, line, differences);
  static const std::map<std::string, Budget> none;
  nlohmann::ordered_json forced = nlohmann::ordered_json::object();
  for (const auto& [P, tw] : worst.forced) {
    const auto have = row.forced_budgets.find(P);
    forced[std::to_string(P)] = schedule_budgets(
        row, fmt::format("P={}", P), tw, have == row.forced_budgets.end() ? none : have->second, o, line, differences);
  }
  for (const auto& [P, tensors] : row.forced_budgets)
    if (!worst.forced.count(P))
      differences.push_back(
          fmt::format("{}: file has budgets for forced P = {}, which calibrate did not run", row.name, P));
  if (!forced.empty()) b["forced"] = forced;
  if (row.budget_seeds != seeds) differences.push_back(fmt::format("{}: seeds differ", row.name));
  std::printf("%s\n", line.c_str());
  return b;
}

void write_row_file(const std::string& file, const nlohmann::ordered_json& doc) {
  const std::string tmp = file + ".tmp";
  {
    std::ofstream f(tmp);
    f << doc.dump(1) << "\n";
    if (!f) raise_api_error("I/O", "write", errno, "cannot write " + tmp, __FILE__, __LINE__);
  }
  if (std::rename(tmp.c_str(), file.c_str()) != 0)
    raise_api_error("I/O", "rename", errno, "cannot replace " + file, __FILE__, __LINE__);
}

// calibrate's options, into `o` (each explained by --help).
void add_calibrate_options(CLI::App* sub, CalibrateCli& o) {
  sub->add_option("--rows", o.rows, "Row set: a name or a path to a row file")->capture_default_str();
  sub->add_option("--row", o.row, "Only these rows (names or globs); repeatable");
  sub->add_option("--seeds", o.seeds,
                  "Seeds the budgets are derived over (S, A:B inclusive, or a comma list); the worst error over "
                  "them sets each budget, and the row file records them")
      ->capture_default_str();
  sub->add_option("--device", o.device,
                  "Device class whose planned schedule is calibrated (rows with plan_device "
                  "use theirs)")
      ->capture_default_str();
  sub->add_option("--k", o.k, "Multiplier of the twin's error in the budget formula")->capture_default_str();
  sub->add_flag("--write", o.write, "Write the budgets into the row file (atomically, other fields kept)");
  sub->add_flag("--check", o.check, "Exit 1 unless the row file holds exactly the budgets calibrate derives");
  sub->add_option("--threads", o.threads, "CPU twin threads per rank (default: cores / ranks)")
      ->check(CLI::Range(1, kMaxThreads));
  sub->add_option("--cache", o.cache, "FP64 reference cache folder ('none' disables)");
  sub->add_option("--inject", o.inject,
                  "Run both twins with an engine fault (as run --inject) to see calibrate refuse a broken twin")
      ->capture_default_str();
  sub->add_option("--max-host-mem", o.max_host_mem,
                  "Host memory this process may use (as run --max-host-mem): a row whose estimate (kcpbench plan) "
                  "is larger is refused before anything runs (exit 2)")
      ->capture_default_str();
  sub->add_option("--head-group", o.head_group, head_group_help() + " (as run --head-group; both twins)")
      ->capture_default_str();
  add_memory_flags(sub, o.mem, true);
}

}  // namespace

std::function<int()> add_calibrate_command(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand("calibrate",
                                 "Derive per-row budgets from the CPU twin's error against FP64 over several seeds "
                                 "at the planned schedule; print, --write them into the row file, or --check it");
  auto o = std::make_shared<CalibrateCli>();
  add_calibrate_options(sub, *o);
  return [sub, o, &g]() -> int {
    if (!sub->parsed()) return -1;
    KCP_REQUIRE(!(o->write && o->check), "calibrate: --write and --check exclude each other");
    KCP_REQUIRE(o->k >= 1.0, "calibrate: --k must be >= 1, got {}", o->k);
    KCP_REQUIRE(!(mpi_available() && mpi_launched()), "calibrate runs without mpirun (ranks as threads)");
    const std::vector<uint64_t> seeds = parse_seeds("--seeds", o->seeds);
    const std::string file = resolve_row_file(o->rows, g.configs_dir);
    RowSet set = load_row_set(file);
    auto rows = selected_rows(set, o->row);
    RunOptions opt;
    opt.packages = {Package::Det};
    opt.saved = {SavedKind::Full};
    opt.use_row_forced = true;  // h_entry / dh_exit take the worst over the row's schedules
    opt.determinism_checks = false;
    opt.calibrating = true;  // the table says what each row measures (it has no budgets yet)
    opt.device_class = o->device;
    opt.fault.kind = parse_fault(o->inject);
    KCP_REQUIRE(opt.fault.kind != FaultKind::Hang && opt.fault.kind != FaultKind::NondeterministicRerun &&
                    !is_package_mismatch(opt.fault.kind),
                "calibrate --inject: {} does not change the twin's numbers; give a fault that does", o->inject);
    opt.cache_dir = o->cache == "none" ? "" : o->cache.empty() ? default_cache_dir() : o->cache;
    opt.head_group_bytes = parse_head_group(o->head_group);
    apply_memory_flags(o->mem, opt);
    {  // the twins hold what run holds for the same forms (core/plan/memory_estimate.h)
      RunGuard guard;
      guard.max_host_mem = o->max_host_mem;
      guard.max_spill_disk = o->mem.max_spill_disk;
      guard.threads = o->threads;
      check_memory(rows, opt, *kernels::make_cpu_backend(kernels::CpuStorage::Rounded), guard);
    }
    log::info0("{}", table_header());
    std::vector<RowWorst> worst(rows.size());
    std::vector<std::string> violations, differences;
    for (uint64_t s : seeds) calibrate_seed(rows, opt, *o, s, worst, violations);

    // Read the file as ordered JSON so --write keeps its layout and key order.
    std::ifstream in(file);
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::ordered_json doc = nlohmann::ordered_json::parse(ss.str());
    for (size_t i = 0; i < rows.size(); ++i) {
      const RowConfig& row = *rows[i].row;
      doc["rows"][row.index]["budgets"] = row_budgets(row, worst[i], *o, seeds, differences);
    }
    if (!violations.empty()) {
      for (const auto& v : violations) std::fprintf(stderr, "calibrate: %s\n", v.c_str());
      std::fprintf(stderr, "calibrate: refusing to derive budgets from a twin that breaks its limits (%zu problems)\n",
                   violations.size());
      return 1;
    }
    if (o->check) {
      for (const auto& d : differences) std::fprintf(stderr, "calibrate --check: %s\n", d.c_str());
      std::printf("calibrate --check: %zu rows, %zu differences\n", rows.size(), differences.size());
      return differences.empty() ? 0 : 1;
    }
    if (o->write) {
      write_row_file(file, doc);
      std::printf("calibrate: wrote budgets of %zu rows into %s (seeds %s)\n", rows.size(), file.c_str(),
                  o->seeds.c_str());
    }
    return 0;
  };
}

}  // namespace kcp::app
