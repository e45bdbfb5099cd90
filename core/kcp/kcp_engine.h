// The KCP engine (DESIGN.md 3 step 4, section 4): runs one row in one form on one rank, forward
// then backward, across ranks (exchanges through the Communicator) and segments (the backend's
// phases). Every rank of the world calls run_form() with the same row, plan and form.
//
//   forward:  rank summary of the last piece -> all-gather [W][HV*K*K (M) | HV*K*V (h_ext)] fp32
//             -> fold the earlier ranks of the first piece's sequence -> incoming state
//             -> segment entry states, state recurrence, o, ht (kernels/cpu/rank_driver.h)
//   backward: rank summary of the first piece -> all-gather [W][M^T | dh_ext]
//             -> fold the later ranks of the last piece's sequence (last to first) -> exit gradient
//             -> dh recurrence per segment, gradients; dA_log / ddt_bias all-reduced.
// W = 1 and P = 1 run the same code (the exchanges then carry nothing that is used).
//
// Outputs, gradients, the saved set and the workspace are filled with NaN before the forward,
// and the workspace again between forward and backward ("poisoned workspace pairs"), so an
// unwritten element or a backward that reads forward scratch shows as a non-finite value.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/config/row_config.h"
#include "core/inputs/inputs.h"
#include "core/plan/segment_plan.h"
#include "kernels/api/backend.h"

namespace kcp {

// One way of running a row (DESIGN.md 1): package x saved set x schedule.
struct Form {
  Package package = Package::Det;
  SavedKind saved = SavedKind::Full;
  int forced_P = 0;  // 0 = the planned schedule
  std::string label() const;  // "det/full/planned", "nondet/light/P=2"
};

// Faults injected on purpose (--inject), to prove that the harness catches them.
enum class FaultKind {
  None,
  DropSegmentEntry,        // one segment's entry state replaced by zeros (the first segment after a cut)
  DropRankIncoming,        // one rank's incoming state from earlier ranks replaced by zeros
  SkipOutputTile,          // one 64-token x 1-head tile of o left unwritten (still NaN-poisoned)
  SavedToOtherPackage,     // the forward's saved set handed to the other package's backward
  WorkspaceOfOtherPackage, // the backward given a workspace tagged with the other package
  Hang                     // one rank never reaches the forward exchange (tests the deadline)
};
struct Fault {
  FaultKind kind = FaultKind::None;
  int rank = -1;     // -1: the engine picks (the last rank that can take the fault)
  std::string name() const;
};
FaultKind parse_fault(const std::string& name);
// Empty when the fault can be injected into this plan, else why not (the entry is then skipped:
// e.g. drop-segment-entry needs a rank that cuts a piece, drop-rank-incoming a rank that
// continues a sequence).
std::string fault_skip_reason(const Fault& fault, const SegmentPlan& plan);  // throws ConfigError naming the known faults
std::vector<std::string> fault_names();

// What one rank produced (host floats), in the layouts of kernels/api/tensors.h.
struct RankResult {
  std::vector<float> o, dq, dk, dv, dg, dbeta;  // local tokens
  std::vector<float> ht, dh0;                   // [n_pieces, HV, K, V] (pieces of this rank)
  std::vector<float> dA_log, ddt_bias;          // totals over all ranks (all-reduced)
  // Per timed repeat: kernel time (backend timers around the phases, exchange excluded) and host
  // wall time (exchange included) of this rank's forward and backward.
  std::vector<double> forward_kernel_ms, backward_kernel_ms, forward_wall_ms, backward_wall_ms;
  // With EngineOptions::phase_times, per phase ("forward.prep", "backward.wy": the backward
  // recomputes wy and the forward states) and per phase-timed run: its calls' kernel time summed.
  // Only phases this rank called.
  std::map<std::string, std::vector<double>> phase_kernel_ms;
  int64_t device_bytes = 0;                     // everything the form allocated in the backend's memory
  int faulted_segment = -1;                     // where an injected fault was applied (-1 none)
  int64_t faulted_token = -1;                   // global token of the fault boundary (-1 none)
};

struct EngineOptions {
  int threads = 1;   // CPU twin worker threads per rank
  int warmup = 0;    // untimed forward+backward runs before the timed ones
  int repeats = 1;   // timed runs; the results of the last one are returned
  bool phase_times = false;  // then `repeats` more runs with every phase call timed (phase_kernel_ms)
  Fault fault;
};

// Runs the forward and backward of `row` on this rank. `plan` is the plan of this form (forced
// P already applied); `shard` this rank's inputs (make_inputs over its token range).
RankResult run_form(const RowConfig& row, const SegmentPlan& plan, const Form& form, const RowInputs& shard,
                    Communicator& comm, const kernels::Backend& backend, const EngineOptions& opt);

// The kernel-level problem of a row (shared with calibrate and tests).
kernels::Problem kernel_problem(const RowConfig& row);
// The kernel-level layout of one rank of a plan.
kernels::RankLayout kernel_layout(const RankPlan& rp);

}  // namespace kcp
