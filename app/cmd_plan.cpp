// `kcpbench plan`: how each selected row is planned for a world size and a device class.
#include <cstdio>

#include "app/cli_checks.h"
#include "app/commands.h"
#include "core/config/row_loader.h"
#include "core/plan/segment_plan.h"
#include "core/report/plan_json.h"
#include "core/util/error.h"

namespace kcp::app {

std::function<int()> add_plan_command(CLI::App& app, Globals& g) {
  auto* sub = app.add_subcommand("plan", "Show the segment plan of rows: per-rank token ranges, pieces, P and "
                                         "segments, workspace sizes");
  struct Opts {
    std::string rows = "int1";
    std::vector<std::string> row;
    std::string device;
    int sm_count = 0;
    int world = 0;
    int P = 0;
    bool json = false;
    bool segments = false;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("--rows", o->rows, "Row set: a name (int1 = <configs>/rows/int1.json) or a path to a row file")
      ->capture_default_str();
  sub->add_option("--row", o->row, "Only these rows (names or globs like 'A*'); repeatable");
  sub->add_option("--device", o->device, "Device class to plan for: h100, h200, b200, gb300, cpu (default: the "
                                         "row's plan_device, else h200)");
  sub->add_option("--sm-count", o->sm_count, "Override the device class's SM count")->check(CLI::Range(1, kMaxSmCount));
  sub->add_option("--world", o->world, "World size W (default: the row's world)")->check(CLI::Range(1, kMaxWorld));
  sub->add_option("--P", o->P, "Force this segment count on every rank (default: planned)")->check(CLI::Range(1, kMaxP));
  sub->add_flag("--json", o->json, "Print JSON (one plan per row) instead of text");
  sub->add_flag("--segments", o->segments, "Include every segment's token range");
  return [sub, o, &g]() -> int {
    if (!sub->parsed()) return -1;
    RowSet set = load_row_set(resolve_row_file(o->rows, g.configs_dir));
    nlohmann::json out = nlohmann::json::array();
    for (const RowConfig* row : select_rows(set, o->row)) {
      PlanRequest req;
      req.device = !o->device.empty() ? o->device : !row->plan_device.empty() ? row->plan_device : "h200";
      req.sm_count = o->sm_count;
      req.world = o->world;
      req.forced_P = o->P;
      SegmentPlan plan;
      try {
        plan = make_plan(*row, req);
      } catch (const ConfigError& e) {
        throw ConfigError(fmt::format("while planning row {} of {}: {}", row->name, set.file, e.what()));
      }
      if (o->json) out.push_back(plan_json(plan, o->segments));
      else std::fputs(describe(plan).c_str(), stdout);
    }
    if (o->json) std::printf("%s\n", out.dump(2).c_str());
    return 0;
  };
}

}  // namespace kcp::app
