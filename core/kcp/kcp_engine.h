// The KCP engine (docs/design.md 3 step 4, section 4): runs one row in one form on one rank,
// forward then backward, across ranks (exchanges through the Communicator, folds in
// core/kcp/rank_exchange.h) and segments (the backend's phases, chained by
// core/kcp/rank_driver.h). Every rank of the world calls run_form() with the same row, plan and
// form.
//
//   forward:  rank summary of the last piece -> all-gather [W][HV*K*K (M) | HV*K*V (h_ext)] fp32
//             -> fold the earlier ranks of the first piece's sequence -> incoming state
//             -> segment entry states, state recurrence, o, ht
//   backward: rank summary of the first piece -> all-gather [W][M^T | dh_ext]
//             -> fold the later ranks of the last piece's sequence (last to first) -> exit gradient
//             -> dh recurrence per segment, gradients; dA_log / ddt_bias all-reduced.
// W = 1 and P = 1 run the same code (the exchanges then carry nothing that is used).
//
// Outputs, gradients, the saved set and the workspace are filled with NaN before the forward,
// and the workspace again between forward and backward ("poisoned workspace pairs"), so an
// unwritten element or a backward that reads forward scratch shows as a non-finite value.
#pragma once

#include <string>

#include "core/comm/communicator.h"
#include "core/config/row_config.h"
#include "core/inputs/inputs.h"
#include "core/kcp/fault_site.h"
#include "core/kcp/rank_result.h"
#include "core/plan/segment_plan.h"
#include "kernels/api/backend.h"

namespace kcp {

// One way of running a row (docs/design.md 1): package x saved set x schedule.
struct Form {
  Package package = Package::Det;
  SavedKind saved = SavedKind::Full;
  int forced_P = 0;           // 0 = the planned schedule
  std::string label() const;  // "det/full/planned", "nondet/light/P=2"
};

struct EngineOptions {
  int threads = 1;           // CPU twin worker threads per rank
  int warmup = 0;            // untimed forward+backward runs before the timed ones
  int repeats = 1;           // timed runs; the results of the last one are returned
  bool phase_times = false;  // then `repeats` more runs with every phase call timed (phase_kernel_ms)
  Fault fault;
  // The row's heads this run holds (a form run by groups of heads: core/kcp/head_group_run.h; the
  // row passed is then head_range_row's): the faults of value head 0 go only into the group that
  // holds it. Every head by default.
  HeadRange heads;
};

// Runs the forward and backward of `row` on this rank. `plan` is the plan of this form (forced
// P already applied); `shard` this rank's inputs (make_inputs over its token range).
RankResult run_form(const RowConfig& row, const SegmentPlan& plan, const Form& form, const RowInputs& shard,
                    Communicator& comm, const kernels::Backend& backend, const EngineOptions& opt);
// The same, taking the shard over: it is freed once uploaded, before the form's arrays are
// first written, so a rank holds its shard or the form's arrays, not both whole (the shard is
// made again for the next form; core/plan/memory_estimate.h).
RankResult run_form(const RowConfig& row, const SegmentPlan& plan, const Form& form, RowInputs&& shard,
                    Communicator& comm, const kernels::Backend& backend, const EngineOptions& opt);

// The kernel-level problem of a row (shared with calibrate and tests).
kernels::Problem kernel_problem(const RowConfig& row);
// The kernel-level layout of one rank of a plan.
kernels::RankLayout kernel_layout(const RankPlan& rp);

}  // namespace kcp
