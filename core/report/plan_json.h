// JSON views of rows and plans, shared by `kcpbench list/plan --json` and the results report.
#pragma once

#include <nlohmann/json.hpp>

#include "core/config/row_config.h"
#include "core/plan/segment_plan.h"

namespace kcp {
nlohmann::json row_summary_json(const RowConfig& row, const std::string& digest);
nlohmann::json plan_json(const SegmentPlan& plan, bool with_segments);
}  // namespace kcp
