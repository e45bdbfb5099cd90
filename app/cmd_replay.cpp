// `kcpbench replay RESULTS.json --entry ID`: re-runs exactly one entry of a results file (its row
// as recorded in row_config, its form, P, seed and injected fault) through the code of `run`, and
// says whether the verdict and the ratios are the same, to the bit.
// Exit codes: 0 identical, 1 they differ, 2 the entry cannot be replayed (unknown id, no
// row_config, or the rebuilt row's digest differs from the entry's: the row changed).
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "app/commands.h"
#include "core/comm/mpi_communicator.h"
#include "core/config/row_loader.h"
#include "core/report/report.h"
#include "core/report/results_compare.h"
#include "core/util/error.h"
#include "core/util/log.h"

namespace kcp::app {

namespace {

using nlohmann::json;

// The value that follows `flag` on a recorded command line ("--flag V" or "--flag=V"), or "".
std::string recorded_flag(const json& ctx, const std::string& flag) {
  const json argv = ctx.value("command_line", json::array());
  for (size_t i = 0; i < argv.size(); ++i) {
    if (!argv[i].is_string()) continue;
    const std::string a = argv[i].get<std::string>();
    if (a == flag && i + 1 < argv.size() && argv[i + 1].is_string()) return argv[i + 1].get<std::string>();
    if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
  }
  return "";
}

std::string num_text(const json& v) {
  if (v.is_number_float()) return fmt::format("{:.17g}", v.get<double>());
  return v.dump();
}

// What must be identical between the stored entry and its replay.
struct Diff {
  std::vector<std::string> lines;
  void check(const std::string& what, const json& a, const json& b) {
    if (a != b) lines.push_back(fmt::format("{}: stored {}, replay {}", what, num_text(a), num_text(b)));
  }
};

Diff diff_entries(const json& a, const json& b) {
  Diff d;
  d.check("status", a.value("status", json()), b.value("status", json()));
  d.check("plan P", a.contains("plan") ? a["plan"].value("P", json()) : json(), b.contains("plan") ? b["plan"].value("P", json()) : json());
  d.check("plan fingerprint", a.contains("plan") ? a["plan"].value("fingerprint", json()) : json(),
          b.contains("plan") ? b["plan"].value("fingerprint", json()) : json());
  const json ta = a.value("tensors", json::object()), tb = b.value("tensors", json::object());
  for (auto it = ta.begin(); it != ta.end(); ++it) {
    if (!tb.contains(it.key())) {
      d.lines.push_back(fmt::format("tensor {}: stored, not judged in the replay", it.key()));
      continue;
    }
    for (const char* k : {"ratio_max", "rms_ratio", "max_abs", "rel_rms", "nonfinite", "pass", "worst"})
      d.check(it.key() + "." + k, it->value(k, json()), tb[it.key()].value(k, json()));
  }
  for (auto it = tb.begin(); it != tb.end(); ++it)
    if (!ta.contains(it.key())) d.lines.push_back(fmt::format("tensor {}: judged in the replay, not stored", it.key()));
  d.check("determinism", a.value("determinism", json()), b.value("determinism", json()));
  d.check("fault_at", a.value("fault_at", json()), b.value("fault_at", json()));
  return d;
}

void print_verdict(const char* who, const json& e) {
  std::printf("%s: %s", who, e.value("status", std::string("?")).c_str());
  if (e.contains("reason") && e["reason"].is_string()) std::printf(" (%s)", e["reason"].get<std::string>().c_str());
  std::printf("\n");
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
    const json doc = read_results_file(o->results);
    KCP_REQUIRE(doc.is_object() && doc.contains("entries") && doc["entries"].is_array(),
                "{}: not a kcpbench results file (no \"entries\" array)", o->results);
    const json ctx = doc.value("context", json::object());
    const json* stored = nullptr;
    std::string ids;
    int n_ids = 0;
    for (const auto& e : doc["entries"]) {
      const std::string id = e.value("id", std::string());
      if (id == o->entry && !stored) stored = &e;
      if (n_ids++ < 12) ids += (ids.empty() ? "" : ", ") + id;
    }
    KCP_REQUIRE(stored, "{}: no entry with id \"{}\" (ids: {}{})", o->results, o->entry, ids, n_ids > 12 ? ", ..." : "");
    const json& e = *stored;
    KCP_REQUIRE(e.contains("row_config") && e["row_config"].is_object(),
                "{}: entry {} has no row_config (written by a kcpbench that did not record rows); cannot replay",
                o->results, o->entry);
    KCP_REQUIRE(e.contains("form") && e["form"].is_object(), "{}: entry {} records no form; cannot replay", o->results,
                o->entry);

    // The row, rebuilt from the entry alone.
    const json rows_doc = {{"schema", "kcpbench.rows/1"}, {"name", "replay"}, {"rows", json::array({e["row_config"]})}};
    RowSet set = load_row_set_text(rows_doc.dump(), o->results + "#" + o->entry);
    const std::string want = e.value("row_digest", std::string());
    KCP_REQUIRE(set.row_digests[0] == want,
                "entry {}: the row changed: its row_config has digest {}, the entry records {}; the stored results "
                "cannot be reproduced from it",
                o->entry, set.row_digests[0], want);
    const auto rows = selected_rows(set, {});

    // The form, fault and planning of the entry.
    RunOptions opt;
    const json& form = e["form"];
    const std::string pk = form.value("package", std::string()), sv = form.value("saved", std::string());
    KCP_REQUIRE(pk == "det" || pk == "nondet", "entry {}: unknown package \"{}\"", o->entry, pk);
    KCP_REQUIRE(sv == "full" || sv == "light", "entry {}: unknown saved set \"{}\"", o->entry, sv);
    opt.packages = {pk == "det" ? Package::Det : Package::Nondet};
    opt.saved = {sv == "full" ? SavedKind::Full : SavedKind::Light};
    opt.use_row_forced = false;
    if (form.contains("P") && form["P"].is_number_integer()) {
      opt.run_planned = false;
      opt.forced_P = {form["P"].get<int>()};
    } else {
      KCP_REQUIRE(form.value("P", json()) == "planned", "entry {}: unknown schedule {}", o->entry, form.value("P", json()).dump());
    }
    opt.sweep = e.value("sweep", false);
    opt.fault.kind = parse_fault(e.value("fault", std::string("none")));
    if (e.contains("fault_at") && e["fault_at"].is_object()) opt.fault.rank = e["fault_at"].value("rank", -1);
    else if (const std::string r = recorded_flag(ctx, "--inject-rank"); !r.empty()) opt.fault.rank = std::atoi(r.c_str());
    // The det contract checks as stored: a rerun for det/full; for det/light the full form runs
    // first (its bits are what light is held to) and only the light entry is compared.
    const json det = e.value("determinism", json());
    opt.determinism_checks = pk == "det" && det.is_object();
    if (pk == "det" && sv == "light" && det.is_object() && det.contains("full_vs_light_identical"))
      opt.saved = {SavedKind::Full, SavedKind::Light};
    opt.device_class = ctx.value("device_class", std::string("h200"));
    if (e.contains("plan") && e["plan"].contains("device")) {
      const json& dev = e["plan"]["device"];
      if (dev.value("class", std::string()).find('@') != std::string::npos) opt.sm_count = dev.value("sm_count", 0);
    }
    opt.cache_dir = o->cache == "none" ? "" : o->cache.empty() ? default_cache_dir() : o->cache;

    // Ranks run as threads of this process: the metrics are the same bits as under mpirun.
    KCP_REQUIRE(!(mpi_available() && mpi_launched() && mpi_world_size() > 1),
                "replay runs the entry's ranks as threads of one process; start it without mpirun (or with -np 1)");
    auto backend = select_backend(!o->backend.empty() ? o->backend : ctx.value("backend", std::string("auto")));
    if (backend->device_name() != ctx.value("backend_device", std::string()))
      log::warn("replay runs on \"{}\"; the results file was made on \"{}\"", backend->device_name(),
                ctx.value("backend_device", std::string("?")));
    RunContext rctx;
    rctx.argv = g.argv;
    rctx.launch_mode = "threads";
    rctx.comm = "local";
    rctx.backend = backend->name();
    rctx.backend_device = backend->device_name();
    rctx.device_class = opt.device_class;
    rctx.row_set = set.name;
    rctx.row_set_file = set.file;
    rctx.row_set_digest = set.digest;
    rctx.seeds = {rows[0].row->seed};
    RunOutcome out = run_in_world(rows, opt, "local", o->threads, *backend, rctx);

    json fresh;
    for (const auto& x : out.entries)
      if (x.value("id", std::string()) == o->entry) fresh = json::parse(x.dump());  // as a reader of the file sees it
    KCP_CHECK(!fresh.is_null(), "the replay of {} produced no entry with that id", o->entry);
    if (!o->json.empty()) {
      json rdoc;
      rdoc["context"] = context_block(rctx);
      rdoc["entries"] = json::array({fresh});
      write_json_atomic(o->json, rdoc);
      log::info0("wrote {}", o->json);
    }

    print_verdict("stored", e);
    print_verdict("replay", fresh);
    const json ts = e.value("tensors", json::object()), tf = fresh.value("tensors", json::object());
    for (auto it = ts.begin(); it != ts.end(); ++it) {
      const json f = tf.value(it.key(), json::object());
      std::printf("  %-8s ratio_max %-22s -> %-22s rms ratio %-22s -> %s\n", it.key().c_str(),
                  num_text(it->value("ratio_max", json())).c_str(), num_text(f.value("ratio_max", json())).c_str(),
                  num_text(it->value("rms_ratio", json())).c_str(), num_text(f.value("rms_ratio", json())).c_str());
    }
    const Diff d = diff_entries(e, fresh);
    if (d.lines.empty()) {
      std::printf("replay of %s: identical (verdict and every ratio, to the bit)\n", o->entry.c_str());
      return 0;
    }
    std::printf("replay of %s: DIFFERS (%zu difference%s)\n", o->entry.c_str(), d.lines.size(), d.lines.size() == 1 ? "" : "s");
    for (const auto& l : d.lines) std::printf("  %s\n", l.c_str());
    return 1;
  };
}

}  // namespace kcp::app
