// `kcpbench calibrate`: derives each row's budgets from the CPU twin's error against FP64 at the
// planned schedule (core/compare/budget.h; h_entry / dh_exit: the worst over the row's planned and
// forced schedules), and writes them into the row file (--write) or checks that the file holds
// exactly what it would write (--check).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "app/cli_checks.h"
#include "app/commands.h"
#include "core/comm/mpi_communicator.h"
#include "core/compare/budget.h"
#include "core/report/results.h"
#include "core/util/error.h"
#include "core/util/log.h"
#include "kernels/cpu/cpu_backend.h"

namespace kcp::app {

namespace {

// The metrics a tensor's budget is derived from (docs/design.md 6): the planned schedule's entry;
// for the Boundary tensors (h_entry, dh_exit) the worst over the row's entries (planned and its
// forced P), since the planned schedule may carry no state across any segment. Empty when no entry
// judged an element of it (then the row gets no budget for it, and needs none).
std::optional<TensorMetrics> calibration_metrics(const std::vector<const Entry*>& entries, const std::string& t) {
  bool boundary = false;
  for (int i = 0; i < kResultTensorCount; ++i)
    if (t == kResultTensors[i]) boundary = place_of(result_tensor(i)) == TensorPlace::Boundary;
  std::optional<TensorMetrics> out;
  for (const Entry* e : entries) {
    if (!e->tensors || (!boundary && e->form && e->form->P != 0)) continue;
    auto it = e->tensors->find(t);
    if (it == e->tensors->end()) continue;
    const TensorMetrics& m = it->second;
    if (!boundary) return m;
    if (m.count == 0) continue;
    if (!out) {
      out = m;
      continue;
    }
    out->max_abs = std::max(out->max_abs, m.max_abs);
    out->rel_rms = std::isfinite(m.rel_rms) ? std::max(out->rel_rms, m.rel_rms) : m.rel_rms;
    out->ref_max_abs = std::max(out->ref_max_abs, m.ref_max_abs);
    out->nonfinite += m.nonfinite;
  }
  return out;
}

}  // namespace

std::function<int()> add_calibrate_command(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand("calibrate",
                                 "Derive per-row budgets from the CPU twin's error against FP64 at the "
                                 "planned schedule; print, --write them into the row file, or --check it");
  struct Opts {
    std::string rows = "int1", device = "h200", cache;
    std::vector<std::string> row;
    double k = 2.0;
    bool write = false, check = false;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("--rows", o->rows, "Row set: a name or a path to a row file")->capture_default_str();
  sub->add_option("--row", o->row, "Only these rows (names or globs); repeatable");
  sub->add_option("--device", o->device,
                  "Device class whose planned schedule is calibrated (rows with plan_device "
                  "use theirs)")
      ->capture_default_str();
  sub->add_option("--k", o->k, "Multiplier of the twin's error in the budget formula")->capture_default_str();
  sub->add_flag("--write", o->write, "Write the budgets into the row file (atomically, other fields kept)");
  sub->add_flag("--check", o->check, "Exit 1 unless the row file holds exactly the budgets calibrate derives");
  sub->add_option("--threads", o->threads, "CPU twin threads per rank (default: cores / ranks)")
      ->check(CLI::Range(1, kMaxThreads));
  sub->add_option("--cache", o->cache, "FP64 reference cache folder ('none' disables)");
  return [sub, o, &g]() -> int {
    if (!sub->parsed()) return -1;
    KCP_REQUIRE(!(o->write && o->check), "calibrate: --write and --check exclude each other");
    KCP_REQUIRE(o->k >= 1.0, "calibrate: --k must be >= 1, got {}", o->k);
    KCP_REQUIRE(!(mpi_available() && mpi_launched()), "calibrate runs without mpirun (ranks as threads)");
    const std::string file = resolve_row_file(o->rows, g.configs_dir);
    RowSet set = load_row_set(file);
    const auto rows = selected_rows(set, o->row);
    RunOptions opt;
    opt.packages = {Package::Det};
    opt.saved = {SavedKind::Full};
    opt.use_row_forced = true;  // h_entry / dh_exit take the worst over the row's schedules
    opt.determinism_checks = false;
    opt.calibrating = true;  // the table says what each row measures (it has no budgets yet)
    opt.device_class = o->device;
    opt.cache_dir = o->cache == "none" ? "" : o->cache.empty() ? default_cache_dir() : o->cache;
    auto backend = kernels::make_cpu_backend();
    RunContext ctx;
    log::info0("{}", table_header());
    const RunOutcome out = run_in_world(rows, opt, "local", o->threads, *backend, ctx);

    // Read the file as ordered JSON so --write keeps its layout and key order.
    std::ifstream in(file);
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::ordered_json doc = nlohmann::ordered_json::parse(ss.str());
    std::vector<std::string> violations, differences;
    for (const auto& sr : rows) {
      const RowConfig& row = *sr.row;
      std::vector<const Entry*> entries;
      for (const Entry& en : out.entries)
        if (en.row == row.name) entries.push_back(&en);
      KCP_CHECK(!entries.empty() && entries.front()->tensors && entries.front()->form && entries.front()->form->P == 0,
                "row {}: the planned schedule's entry ran no tensors", row.name);
      nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
      std::string line = fmt::format("{:<5}", row.name);
      for (const std::string& t : all_tensor_names()) {
        const std::optional<TensorMetrics> found = calibration_metrics(entries, t);
        if (!found) continue;
        const TensorMetrics& m = *found;
        const double rel = std::isfinite(m.rel_rms) ? m.rel_rms : INFINITY;  // written as null when non-finite
        if (m.nonfinite > 0 || !(rel <= twin_rel_rms_limit(t)))
          violations.push_back(
              fmt::format("{} {}: cpu twin rel-RMS {:.3e} (non-finite {}) breaks the fixed limit {:.0e}", row.name, t,
                          rel, m.nonfinite, twin_rel_rms_limit(t)));
        const Budget b = derive_budget(m.max_abs, rel, m.ref_max_abs, o->k, row.dtype);
        tensors[t] = {{"max_abs", b.max_abs}, {"rel_rms", b.rel_rms}};
        line += fmt::format(" {}={:.3g}/{:.3g}", t, b.max_abs, b.rel_rms);
        auto have = row.budgets.find(t);
        if (have == row.budgets.end() || have->second.max_abs != b.max_abs || have->second.rel_rms != b.rel_rms)
          differences.push_back(
              fmt::format("{} {}: file has {}, calibrate derives max_abs {} rel_rms {}", row.name, t,
                          have == row.budgets.end()
                              ? std::string("no budget")
                              : fmt::format("max_abs {} rel_rms {}", have->second.max_abs, have->second.rel_rms),
                          b.max_abs, b.rel_rms));
      }
      std::printf("%s\n", line.c_str());
      doc["rows"][row.index]["budgets"] = {{"source", budget_formula(o->k, row.dtype)}, {"tensors", tensors}};
    }
    if (!violations.empty()) {
      for (const auto& v : violations) std::fprintf(stderr, "calibrate: %s\n", v.c_str());
      std::fprintf(stderr,
                   "calibrate: refusing to derive budgets from a twin that breaks its fixed limits (%zu problems)\n",
                   violations.size());
      return 1;
    }
    if (o->check) {
      for (const auto& d : differences) std::fprintf(stderr, "calibrate --check: %s\n", d.c_str());
      std::printf("calibrate --check: %zu rows, %zu differences\n", rows.size(), differences.size());
      return differences.empty() ? 0 : 1;
    }
    if (o->write) {
      const std::string tmp = file + ".tmp";
      {
        std::ofstream f(tmp);
        f << doc.dump(1) << "\n";
        if (!f) raise_api_error("I/O", "write", errno, "cannot write " + tmp, __FILE__, __LINE__);
      }
      if (std::rename(tmp.c_str(), file.c_str()) != 0)
        raise_api_error("I/O", "rename", errno, "cannot replace " + file, __FILE__, __LINE__);
      std::printf("calibrate: wrote budgets of %zu rows into %s\n", rows.size(), file.c_str());
    }
    return 0;
  };
}

}  // namespace kcp::app
