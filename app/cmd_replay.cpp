// `kcpbench replay RESULTS.json --entry ID`: re-runs exactly one entry of a results file (its row
// as recorded in row_config, its form, P, seed and injected fault) through the code of `run`, and
// says whether the verdict and the ratios are the same, to the bit.
// Exit codes: 0 identical, 1 they differ, 2 the entry cannot be replayed (unknown id, no
// row_config, or the rebuilt row's digest differs from the entry's: the row changed).
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <thread>

#include "app/commands.h"
#include "app/run_guard.h"
#include "core/comm/mpi_communicator.h"
#include "core/config/row_loader.h"
#include "core/report/report.h"
#include "core/report/results.h"
#include "core/report/results_compare.h"
#include "core/util/error.h"
#include "core/util/log.h"

namespace kcp::app {

namespace {

using nlohmann::json;

// The value that follows `flag` on the command line entry `e` ran with ("--flag V" or "--flag=V"),
// or "": the context's, or in a merged file that of the entry's source run.
std::string recorded_flag(const Context& ctx, const Entry& e, const std::string& flag) {
  // results_from_json has checked that a source indexes merged_from.
  const std::vector<std::string>& argv = e.source ? (*ctx.merged_from)[*e.source].command_line : ctx.command_line;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == flag && i + 1 < argv.size()) return argv[i + 1];
    if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
  }
  return "";
}

// Values as the file shows them: doubles to the bit (17 digits), non-finite as null.
std::string text(double v) { return std::isfinite(v) ? fmt::format("{:.17g}", v) : std::string("null"); }
std::string text(int64_t v) { return std::to_string(v); }
std::string text(bool v) { return v ? "true" : "false"; }
std::string text(const std::string& v) { return json(v).dump(); }
std::string text(const json& v) { return v.dump(); }
std::string text(const WorstElement& w) {
  return fmt::format("{{rank {}, token {}, seq {}, head {}, channel {}, segment {}, boundary_distance {}}}", w.rank,
                     w.token, w.seq, w.head, w.channel, w.segment, w.boundary_distance);
}
std::string text(const std::optional<Determinism>& d) { return d ? to_json(*d).dump() : "null"; }
std::string text(const std::optional<FaultAt>& f) {
  return f ? fmt::format("{{rank {}, token {}, segment {}}}", f->rank, f->token, f->segment) : "null";
}

// Equal to the bit; two nulls (NaN) are equal.
bool same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }
template <class T>
bool same(const T& a, const T& b) {
  return a == b;
}

// A ratio as written: absent (null) without a budget.
double ratio(const TensorMetrics& m, double TensorMetrics::*which) {
  return m.has_budget ? m.*which : std::numeric_limits<double>::quiet_NaN();
}

// A field of the plan (kept as JSON: it is plan_json's), null when absent.
json plan_field(const Entry& e, const char* key) { return e.plan ? e.plan->value(key, json()) : json(); }

// What must be identical between the stored entry and its replay.
struct Diff {
  std::vector<std::string> lines;
  template <class T>
  void check(const std::string& what, const T& a, const T& b) {
    if (!same(a, b)) lines.push_back(fmt::format("{}: stored {}, replay {}", what, text(a), text(b)));
  }
};

void diff_tensor(Diff& d, const std::string& name, const TensorMetrics& a, const TensorMetrics& b) {
  d.check(name + ".ratio_max", ratio(a, &TensorMetrics::ratio_max), ratio(b, &TensorMetrics::ratio_max));
  d.check(name + ".rms_ratio", ratio(a, &TensorMetrics::rms_ratio), ratio(b, &TensorMetrics::rms_ratio));
  d.check(name + ".max_abs", a.max_abs, b.max_abs);
  d.check(name + ".rel_rms", a.rel_rms, b.rel_rms);
  d.check(name + ".nonfinite", a.nonfinite, b.nonfinite);
  d.check(name + ".pass", a.pass, b.pass);
  d.check(name + ".worst", a.worst, b.worst);
}

Diff diff_entries(const Entry& a, const Entry& b) {
  Diff d;
  d.check("status", a.status, b.status);
  d.check("plan P", plan_field(a, "P"), plan_field(b, "P"));
  d.check("plan fingerprint", plan_field(a, "fingerprint"), plan_field(b, "fingerprint"));
  const std::map<std::string, TensorMetrics> none;
  const auto& ta = a.tensors ? *a.tensors : none;
  const auto& tb = b.tensors ? *b.tensors : none;
  for (const auto& [name, m] : ta) {
    if (auto it = tb.find(name); it != tb.end())
      diff_tensor(d, name, m, it->second);
    else
      d.lines.push_back(fmt::format("tensor {}: stored, not judged in the replay", name));
  }
  for (const auto& [name, m] : tb)
    if (!ta.count(name)) d.lines.push_back(fmt::format("tensor {}: judged in the replay, not stored", name));
  d.check("determinism", a.determinism, b.determinism);
  d.check("fault_at", a.fault_at, b.fault_at);
  return d;
}

void print_verdict(const char* who, const Entry& e) {
  std::printf("%s: %s", who, e.status.c_str());
  if (e.reason) std::printf(" (%s)", e.reason->c_str());
  std::printf("\n");
}

// The entry of a results file with that id (the first), or a ConfigError listing some ids.
const Entry& find_entry(const Results& doc, const std::string& path, const std::string& id) {
  const Entry* stored = nullptr;
  std::string ids;
  int n_ids = 0;
  for (const auto& e : doc.entries) {
    if (e.id == id && !stored) stored = &e;
    if (n_ids++ < 12) ids += (ids.empty() ? "" : ", ") + e.id;
  }
  KCP_REQUIRE(stored, "{}: no entry with id \"{}\" (ids: {}{})", path, id, ids, n_ids > 12 ? ", ..." : "");
  return *stored;
}

}  // namespace

namespace {

// The form, fault, det checks and planning the entry ran with (ConfigError when it cannot be
// replayed: an external entry, an unknown package or saved set).
RunOptions entry_options(const Context& ctx, const Entry& e) {
  RunOptions opt;
  const EntryForm& form = *e.form;
  const std::string &pk = form.package, &sv = form.saved;
  KCP_REQUIRE(pk != "external",
              "entry {}: an external entry (--backend exec) is not replayed: rerun the command line of the "
              "results file's context (its folder is in the entry's external.folder)",
              e.id);
  KCP_REQUIRE(pk == "det" || pk == "nondet", "entry {}: unknown package \"{}\"", e.id, pk);
  KCP_REQUIRE(sv == "full" || sv == "light", "entry {}: unknown saved set \"{}\"", e.id, sv);
  opt.packages = {pk == "det" ? Package::Det : Package::Nondet};
  opt.saved = {sv == "full" ? SavedKind::Full : SavedKind::Light};
  opt.use_row_forced = false;
  if (form.P > 0) {  // else the planned schedule
    opt.run_planned = false;
    opt.forced_P = {form.P};
  }
  opt.sweep = e.sweep.value_or(false);
  opt.fault.kind = parse_fault(e.fault.value_or("none"));
  if (e.fault_at)
    opt.fault.rank = e.fault_at->rank;
  else if (const std::string r = recorded_flag(ctx, e, "--inject-rank"); !r.empty())
    opt.fault.rank = std::atoi(r.c_str());
  // The det contract checks as stored: a rerun for det/full; for det/light the full form runs
  // first (its bits are what light is held to) and only the light entry is compared.
  opt.determinism_checks = pk == "det" && e.determinism.has_value();
  if (pk == "det" && sv == "light" && e.determinism && e.determinism->full_vs_light_identical)
    opt.saved = {SavedKind::Full, SavedKind::Light};
  opt.device_class = ctx.device_class.empty() ? "h200" : ctx.device_class;
  if (e.plan && e.plan->contains("device")) {
    const json& dev = (*e.plan)["device"];
    if (dev.value("class", std::string()).find('@') != std::string::npos) opt.sm_count = dev.value("sm_count", 0);
  }
  return opt;
}

// Both verdicts and every tensor's ratios, then identical (0) or each difference (1).
int report_replay(const Entry& e, const Entry& replayed) {
  const Entry* fresh = &replayed;
  print_verdict("stored", e);
  print_verdict("replay", *fresh);
  for (const auto& [name, m] : e.tensors ? *e.tensors : std::map<std::string, TensorMetrics>{}) {
    const TensorMetrics* f = nullptr;
    if (fresh->tensors)
      if (auto it = fresh->tensors->find(name); it != fresh->tensors->end()) f = &it->second;
    const double nan = std::numeric_limits<double>::quiet_NaN();
    std::printf("  %-8s ratio_max %-22s -> %-22s rms ratio %-22s -> %s\n", name.c_str(),
                text(ratio(m, &TensorMetrics::ratio_max)).c_str(),
                text(f ? ratio(*f, &TensorMetrics::ratio_max) : nan).c_str(),
                text(ratio(m, &TensorMetrics::rms_ratio)).c_str(),
                text(f ? ratio(*f, &TensorMetrics::rms_ratio) : nan).c_str());
  }
  const Diff d = diff_entries(e, *fresh);
  if (d.lines.empty()) {
    std::printf("replay of %s: identical (verdict and every ratio, to the bit)\n", e.id.c_str());
    return 0;
  }
  std::printf("replay of %s: DIFFERS (%zu difference%s)\n", e.id.c_str(), d.lines.size(),
              d.lines.size() == 1 ? "" : "s");
  for (const auto& l : d.lines) std::printf("  %s\n", l.c_str());
  return 1;
}

// The context of the replayed entry's results file: this process, its ranks as threads.
RunContext replay_context(const Globals& g, const kernels::Backend& backend, const RunOptions& opt, const RowSet& set,
                          uint64_t seed) {
  RunContext rctx;
  rctx.argv = g.argv;
  rctx.launch_mode = "threads";
  rctx.comm = "local";
  rctx.backend = backend.name();
  rctx.backend_device = backend.device_name();
  rctx.device_class = opt.device_class;
  rctx.row_set = set.name;
  rctx.row_set_file = set.file;
  rctx.row_set_digest = set.digest;
  rctx.seeds = {seed};
  return rctx;
}

}  // namespace

std::function<int()> add_replay_command(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand(
      "replay",
      "Re-run exactly one entry of a results file (row as recorded, form, P, seed, injected fault) and check that the "
      "verdict and every ratio are the same to the bit. Exit 0 identical, 1 different, 2 cannot replay");
  struct Opts {
    std::string results, entry, json, backend, cache;
    int threads = 0;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("RESULTS", o->results, "Results JSON (kcpbench.results/1) holding the entry")->required();
  sub->add_option("--entry", o->entry, "The entry's id, e.g. A1/det/full/P=2")->required();
  sub->add_option("--json", o->json, "Write the replayed entry as a results JSON (comparable with kcpbench compare)");
  sub->add_option("--backend", o->backend, "cpu, cuda or auto (default: the backend the results file records)");
  sub->add_option("--cache", o->cache, "FP64 reference cache folder ('none' disables; default as for run)");
  sub->add_option("--threads", o->threads, "CPU twin threads per rank (default: cores / ranks)");
  return [sub, o, &g]() -> int {
    if (!sub->parsed()) return -1;
    const json raw = read_results_file(o->results);
    KCP_REQUIRE(raw.is_object() && raw.contains("entries") && raw["entries"].is_array(),
                "{}: not a kcpbench results file (no \"entries\" array)", o->results);
    Results doc;
    try {
      doc = results_from_json(raw);
    } catch (const ConfigError& err) {
      throw ConfigError(fmt::format("{}: corrupt results file: {}", o->results, err.what()));
    }
    const Context& ctx = doc.context;
    const Entry& e = find_entry(doc, o->results, o->entry);
    KCP_REQUIRE(e.row_config,
                "{}: entry {} has no row_config (written by a kcpbench that did not record rows); cannot replay",
                o->results, o->entry);
    KCP_REQUIRE(e.form, "{}: entry {} records no form; cannot replay", o->results, o->entry);

    // The row, rebuilt from the entry alone.
    const json rows_doc = {{"schema", "kcpbench.rows/1"}, {"name", "replay"}, {"rows", json::array({*e.row_config})}};
    RowSet set = load_row_set_text(rows_doc.dump(), o->results + "#" + o->entry);
    KCP_REQUIRE(set.row_digests[0] == e.row_digest,
                "entry {}: the row changed: its row_config has digest {}, the entry records {}; the stored results "
                "cannot be reproduced from it",
                o->entry, set.row_digests[0], e.row_digest);
    // At the entry's seed (run --seeds records it; the row's own when it is the same).
    std::deque<RowConfig> seeded;
    auto rows = rows_at_seed(selected_rows(set, {}), e.seed.value_or(set.rows[0].seed), seeded);

    RunOptions opt = entry_options(ctx, e);
    opt.cache_dir = o->cache == "none" ? "" : o->cache.empty() ? default_cache_dir() : o->cache;

    // Ranks run as threads of this process: the metrics are the same bits as under mpirun.
    KCP_REQUIRE(!(mpi_available() && mpi_launched() && mpi_world_size() > 1),
                "replay runs the entry's ranks as threads of one process; start it without mpirun (or with -np 1)");
    auto backend = select_backend(!o->backend.empty() ? o->backend : ctx.backend.empty() ? "auto" : ctx.backend);
    if (backend->device_name() != ctx.backend_device)
      log::warn("replay runs on \"{}\"; the results file was made on \"{}\"", backend->device_name(),
                ctx.backend_device.empty() ? "?" : ctx.backend_device);
    // The memory choices run makes (groups of heads, spill, kept inputs), and its refusals.
    opt.reference_spill_bytes = kReferenceSpillAuto;
    RunGuard guard;
    guard.threads = o->threads;
    check_memory(rows, opt, *backend, guard);
    RunContext rctx = replay_context(g, *backend, opt, set, rows[0].row->seed);
    RunOutcome out = run_in_world(rows, opt, "local", o->threads, *backend, rctx);

    std::optional<Entry> fresh;
    for (const auto& x : out.entries)
      if (x.id == o->entry)  // read back from its text, as a reader of the file sees it
        fresh = entry_from_json(json::parse(to_json(x).dump()), "replay");
    KCP_CHECK(fresh, "the replay of {} produced no entry with that id", o->entry);
    if (!o->json.empty()) {
      const Results rdoc{context_block(rctx), {*fresh}, std::nullopt};
      write_json_atomic(o->json, to_json(rdoc));
      log::info0("wrote {}", o->json);
    }

    return report_replay(e, *fresh);
  };
}

}  // namespace kcp::app
