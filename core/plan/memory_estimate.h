// Host and device memory one row needs, estimated from its shape and plan before anything is
// allocated (`kcpbench plan` prints it; `kcpbench run` refuses a row that does not fit, exit 2).
//
// What a process holds while it runs a row (core/kcp/row_runner.cpp), in two phases:
//  A. preparing the row: the FP64 reference runs one group of heads at a time (reference_head_
//     groups: one group unless the row's results pass kReferenceGroupBytes, or fewer, wider groups
//     that choose_head_groups picked for the reference's threads; heads are independent, so the
//     bits are the same). Held at once: the
//     FP64 results of one group of heads of every sequence the process's ranks touch as ReferenceCache holds them
//     (core/compare/ reference_data.h: o, dq, dk, dv, dg, dbeta, ht, dh0, probes in double), the working set of the
//     sequences being computed at once (that group's inputs in float, the reference's prepared arrays and its
//     checkpointed states), and per rank its pieces' probes and one group's part of one tensor of its slice on its way
//     to the spill file (or its whole slice in memory); then the scales of dA_log / ddt_bias from the rank's gates and
//     reference dg. A group's sequences go once every rank of the process has its part (a barrier per group).
//  B. running forms: per rank what it keeps for the row (the probes of its pieces, and its
//     reference slice unless spilled) and the largest of three moments of one form:
//       upload: the shard, made afresh for the form, and the form's inputs (run_form frees the
//               shard once uploaded);
//       run:    the arrays of one form (core/kcp/form_buffers.cpp: uploaded inputs, saved set and
//               workspace arenas of kernels/api/tensors.h, one array per result tensor, the
//               exchange blocks and fold states), the host exchange buffers and the boundary
//               states downloaded before the arrays go;
//       judge:  the results, downloaded one by one as the form's arrays are freed (FormBuffers::
//               take_results: never both whole), one tensor of the slice read back when it was
//               spilled (judged tensor by tensor), the form's boundary reference and the
//               comparison's scratch.
//     On the CPU twin the run moment also counts the twin's floats of the 16-bit caller tensors
//     a phase reads or writes (CallerIn / CallerOut), or calibrate's exact-storage twin's float
//     caller tensors, whichever is larger.
//     Only one form's arrays exist at a time (FormRun frees them before the next form, and before
//     the det rerun); counted is the largest form of any schedule the row runs.
//     A form run by groups of heads (MemoryRequest::head_groups; core/kcp/head_group_run.h) holds
//     one group's shard, arrays, twin scratch, exchange, boundary states and results at a time
//     (head_range_row's shape), and while judging one group's part of one tensor of the slice
//     (gathered from memory or read back from the spill file in blocks of 8 MiB); what the rank
//     keeps for the row (probes, a slice in memory) and phase A stay those of every head.
// A rank's reference slice of at least kReferenceSpillBytes is spilled: written to an unlinked
// temporary file (core/compare/reference_spill.h) while the forms run, read back to judge each.
// The form arrays are device memory on a GPU and host memory on the CPU twin; the threads of one
// process (the threads launch: all W ranks) share its host memory and its device, and each rank's
// moments are summed as if they coincided (an upper bound: ranks are not in step).
// `calibrate` needs what `run` needs for the same rows: it runs the det package with the full
// saved set (the estimate's largest form) and its exact-storage twin reuses the slices the first
// twin prepared (ReferenceStore keep), never the whole sequences.
//
// Accuracy, against the peak RSS `/usr/bin/time -v` measured (2 cores): see the table in
// docs/reliability.md (Memory). The estimate is a few percent above the peak of rows whose arrays
// dominate and never below it in those runs; the reference's checkpoint term (an upper bound)
// keeps it on that side.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config/row_config.h"
#include "core/plan/segment_plan.h"
#include "kernels/api/backend.h"

namespace kcp {

// A rank's FP64 reference slice of at least this many bytes is written to a temporary file while
// the forms run and read back to judge each (RunOptions::reference_spill_bytes; int1 rows stay in
// memory, every int3 row spills).
inline constexpr int64_t kReferenceSpillBytes = int64_t(64) << 20;
// --reference-spill auto (choose_head_groups, core/plan/head_groups.h): the slices stay in host
// memory when the row fits the host that way with no more groups of heads than spilling needs,
// else slices of at least kReferenceSpillBytes are spilled. choose_head_groups resolves it;
// estimate_memory alone reads it as kReferenceSpillBytes.
inline constexpr int64_t kReferenceSpillAuto = -2;

// The FP64 reference of a row whose sequences' results (o, dq, dk, dv, dg, dbeta in double, over
// every token of the row) pass this many bytes runs one group of heads at a time (RunOptions::
// reference_group_bytes): the sequences' results and the reference's working set then hold one
// group's heads (heads are independent; the bits are the same).
inline constexpr int64_t kReferenceGroupBytes = int64_t(512) << 20;
// --reference-group auto: groups of at most kReferenceGroupBytes, unless `run` / `calibrate` /
// `plan` chose wider ones for the reference's threads where the host has room
// (choose_head_groups, core/plan/head_groups.h); never: every head at once.
inline constexpr int64_t kReferenceGroupAuto = -2;
inline constexpr int64_t kReferenceGroupNever = -1;

// How the forms of a row are run by groups of q/k heads (core/kcp/head_group_run.h; RunOptions::
// head_group_bytes, core/plan/head_groups.h): kHeadGroupAuto every head at once when the row fits
// the memory at hand, else the fewest groups with which it fits; kHeadGroupNever every head at
// once; a byte count B >= 0: the fewest groups whose form arrays take at most B a rank (0: one q/k
// head a group).
inline constexpr int64_t kHeadGroupAuto = -2;
inline constexpr int64_t kHeadGroupNever = -1;

// Groups of q/k heads (each with its value heads) the FP64 reference of the row runs in, a
// divisor of H: 1 for kReferenceGroupNever or when the row's results take at most the cap
// (group_bytes; kReferenceGroupBytes for kReferenceGroupAuto), else the fewest groups whose part
// takes at most it (H groups at most).
int reference_head_groups(const RowConfig& row, int64_t group_bytes);
// The most groups of heads (a divisor of H) each of which gives a reference computation of
// `threads` threads as many work items as threads (1 when even every head at once gives fewer).
int reference_groups_for_threads(const RowConfig& row, int threads);
// A group_bytes for reference_head_groups that gives exactly `groups` groups (a divisor of H).
int64_t reference_group_bytes_for(const RowConfig& row, int groups);

// Bytes of a rank's FP64 reference slice as the runner builds it (Token tensors, ht / dh0 per
// piece, double): what it spills.
int64_t reference_slice_bytes(const RowConfig& row, const RankPlan& rp);

struct MemoryRequest {
  PlanRequest plan;                                      // how the row is planned (world 0 = the row's)
  std::vector<int> forced_P;                             // forced schedules that may run (the largest form counts)
  bool device_is_host = true;                            // the CPU twin: form arrays live in host memory
  std::vector<int> ranks;                                // ranks this process runs; empty = all (threads launch)
  int reference_threads = 1;                             // threads of one FP64 reference computation
  const kernels::Backend* backend = nullptr;             // for its private workspace scratch (null: none)
  bool spare_workspace = false;                          // the workspace-of-other-package fault allocates a second one
  int64_t reference_spill_bytes = kReferenceSpillBytes;  // RunOptions::reference_spill_bytes
  int64_t reference_group_bytes = kReferenceGroupAuto;   // RunOptions::reference_group_bytes
  int head_groups = 1;                                   // groups of heads each form runs in (a divisor of H)
  bool keep_inputs = false;  // the rank's input shard stays across the row's forms (one group of heads only)
};

struct RankMemory {
  int rank = 0;
  int64_t inputs = 0;              // host: the rank's input shard (float)
  int64_t reference = 0;           // host: the rank's slice of the FP64 reference (double)
  bool reference_spilled = false;  //   kept in a temporary file while forms run (>= kReferenceSpillBytes)
  int64_t probes = 0;              // host: S_p, dS_p at the probes of its pieces (kept for the row)
  int64_t form_arrays = 0;         // device (host on the CPU twin): one form's arrays, the largest form
  int64_t form_inputs = 0;         //   of which the uploaded inputs
  int64_t saved_set = 0;           //   of which the saved set arena
  int64_t workspace = 0;           //   of which the workspace arena(s)
  int64_t twin_scratch = 0;        // host, CPU twin only: its floats of the 16-bit caller tensors while a phase runs
  int64_t host_results = 0;        // host: judging a form (= judge)
  // Host moments of one form (memory_estimate.h, phase B) and what the rank keeps for the row.
  int64_t kept = 0, upload = 0, run = 0, judge = 0;
  int64_t host_peak = 0;  // kept + max(upload, run, judge): the rank's share of phase B
  int64_t prepare = 0;    // its share of phase A: shard, probes and its slice (or its largest tensor)
};

struct MemoryEstimate {
  std::string row;
  std::vector<RankMemory> ranks;  // the ranks of this process
  int reference_groups = 1;       // groups of heads the FP64 reference runs in (reference_head_groups)
  int head_groups = 1;            // groups of heads each form runs in (MemoryRequest::head_groups)
  bool keep_inputs = false;       // input shards kept across forms (MemoryRequest::keep_inputs)
  int64_t sequences = 0;          // host: FP64 results of every sequence the process holds at once (one group's)
  int64_t reference_work = 0;     // host: working set of the reference computations running at once
  int64_t fixed = 0;              // host: binary, libraries, thread stacks
  int64_t phase_prepare = 0;      // host peak while the reference is prepared (A)
  int64_t phase_forms = 0;        // host peak while forms run (B)
  int64_t host_bytes = 0;         // host peak of the process: fixed + max(A, B)
  int64_t device_bytes = 0;       // device memory of the process (0 when device_is_host)
};

// The FP64 reference slices a row's estimate spills to files (core/compare/reference_spill.h), in
// bytes: the spilled ranks' slices of this process, all alive while the row's forms run.
int64_t spilled_reference_bytes(const MemoryEstimate& e);

// Throws ConfigError naming the row when a size does not fit in 64 bits, or the row cannot be
// planned as asked.
MemoryEstimate estimate_memory(const RowConfig& row, const MemoryRequest& req);

// "1.5 GiB", "3.0 PiB" (binary units).
std::string human_bytes(int64_t bytes);

// Checked 64-bit arithmetic: throws ConfigError "row R: ... does not fit in 64 bits" naming the row
// and what was being sized.
int64_t checked_mul(int64_t a, int64_t b, const std::string& row, const char* what);
int64_t checked_add(int64_t a, int64_t b, const std::string& row, const char* what);

}  // namespace kcp
