// `kcpbench list`: the row sets and their rows, one line each (or JSON).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>

#include "app/commands.h"
#include "core/config/row_loader.h"
#include "core/report/plan_json.h"

namespace kcp::app {

namespace {
std::string seqlens_text(const RowConfig& r) {
  if (r.seqlens.size() <= 4) return fmt::format("[{}]", fmt::join(r.seqlens, ","));
  return fmt::format("[{} seqs]", r.seqlens.size());
}
}  // namespace

std::function<int()> add_list_command(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand("list", "List row sets and their rows, one line per row");
  struct Opts {
    std::vector<std::string> sets;
    bool json = false;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("--rows", o->sets,
                  "Row sets to list: a set name (int1 = <configs>/rows/int1.json) or a path; "
                  "default: every set in <configs>/rows");
  sub->add_flag("--json", o->json, "Print JSON instead of the table");
  return [sub, o, &g]() -> int {
    if (!sub->parsed()) return -1;
    std::vector<std::string> specs = o->sets.empty() ? known_row_sets(g.configs_dir) : o->sets;
    nlohmann::json out = nlohmann::json::array();
    for (const auto& spec : specs) {
      RowSet set = load_row_set(resolve_row_file(spec, g.configs_dir));
      if (o->json) {
        nlohmann::json js = {{"name", set.name},
                             {"file", set.file},
                             {"digest", set.digest},
                             {"description", set.description},
                             {"rows", nlohmann::json::array()}};
        for (size_t i = 0; i < set.rows.size(); ++i)
          js["rows"].push_back(row_summary_json(set.rows[i], set.row_digests[i]));
        out.push_back(js);
        continue;
      }
      std::printf("%s (%s, %zu rows, digest %.12s): %s\n", set.name.c_str(), set.file.c_str(), set.rows.size(),
                  set.digest.c_str(), set.description.c_str());
      for (size_t i = 0; i < set.rows.size(); ++i) {
        const auto& r = set.rows[i];
        std::printf("  %-5s %-3s H=%-3d HV=%-3d K=%-3d V=%-3d T=%-7lld %-18s W=%-2d gate=%-11s %s%s%s%s %.12s  %s\n",
                    r.name.c_str(), to_string(r.op), r.H, r.HV, r.K, r.V, static_cast<long long>(r.total_tokens()),
                    seqlens_text(r).c_str(), r.world, to_string(r.gate), r.qk_l2norm ? "l2n " : "",
                    r.initial_state ? "h0 " : "", r.final_state ? "ht " : "", r.dht ? "dht " : "",
                    set.row_digests[i].c_str(), r.description.c_str());
      }
    }
    if (o->json) std::printf("%s\n", out.dump(2).c_str());
    return 0;
  };
}

}  // namespace kcp::app
