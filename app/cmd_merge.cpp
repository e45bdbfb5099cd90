// `kcpbench merge A.json B.json ... --json OUT`: one results file from several runs of one build on
// one device (a row set's baseline from runs that each fit a time limit); the rules are in
// core/report/results_merge.h.
#include <fmt/format.h>

#include "app/commands.h"
#include "core/report/results_compare.h"
#include "core/report/results_merge.h"
#include "core/util/error.h"
#include "core/util/log.h"

namespace kcp::app {

std::function<int()> add_merge_command(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand(
      "merge",
      "Merge results JSON files of one build, device and row set into one (e.g. a baseline from runs of a "
      "few rows each): refuses files whose build, backend, device, communicator or row set differ, and an entry "
      "(row, form, seed, fault) that two files hold; the merged context lists every source's command line");
  struct Opts {
    std::vector<std::string> files;
    std::string json;
    bool allow_dirty = false;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("FILES", o->files, "Results JSON files (kcpbench.results/1) written by run or by merge")
      ->required()
      ->expected(2, -1);
  sub->add_option("--json", o->json, "Write the merged results here")->required();
  sub->add_flag("--allow-dirty", o->allow_dirty,
                "Also merge files built from a tree with uncommitted changes (their git sha does not pin the code)");
  return [sub, o, &g]() -> int {
    if (!sub->parsed()) return -1;
    std::vector<MergeInput> inputs;
    for (const std::string& f : o->files) {
      const nlohmann::json doc = read_results_file(f);  // names the file when it is missing or not JSON
      try {
        inputs.push_back({f, results_from_json(doc)});
      } catch (const ConfigError& err) {
        throw ConfigError(fmt::format("{}: not a results file: {}", f, err.what()));
      }
    }
    const MergeResult m = merge_results(inputs, g.argv, utc_now("%Y-%m-%dT%H:%M:%SZ"), o->allow_dirty);
    write_json_atomic(o->json, to_json(m.results));
    const Summary& s = *m.results.summary;
    log::info0("merged {} files ({} entries{}): {} passed, {} failed, {} skipped{}; wrote {}", inputs.size(),
               m.results.entries.size(),
               m.superseded_skips
                   ? fmt::format("; {} launch skips of rows another file ran left out", m.superseded_skips)
                   : "",
               s.passed, s.failed + s.contract_broken, s.skipped,
               s.complete.value_or(true) ? "" : " (a source was cut short: summary.complete false)", o->json);
    return 0;
  };
}

}  // namespace kcp::app
