// Host and device memory one row needs, estimated from its shape and plan before anything is
// allocated (`kcpbench plan` prints it; `kcpbench run` refuses a row that does not fit, exit 2).
//
// What a process holds while it runs a row (core/kcp/row_runner.cpp), in two phases:
//  A. preparing the row: every rank's input shard (core/inputs/inputs.h), the FP64 reference of
//     every sequence its ranks touch as ReferenceCache holds it (core/compare/reference_data.h:
//     o, dq, dk, dv, dg, dbeta, ht, dh0 in double), the working set of the sequences being
//     computed at once (the sequence's inputs in float and double, the reference's prepared
//     arrays and its checkpointed states), and each rank's slice of the reference (RankReference).
//  B. running a form: per rank the shard, its reference slice, the arrays of one form
//     (core/kcp/form_buffers.cpp: uploaded inputs, saved set and workspace arenas of
//     kernels/api/tensors.h, one array per result tensor, the exchange blocks and fold states), the
//     results downloaded to the host and the host exchange buffers.
// The sequences' FP64 results are released between A and B, so the peak is the larger of the two.
// The form arrays are device memory on a GPU and host memory on the CPU twin; the threads of one
// process (the threads launch: all W ranks) share its host memory and its device.
//
// Accuracy, against the peak RSS `/usr/bin/time -v` measured for `kcpbench -q run --package nondet
// --saved full --no-det-checks --cache none` on the CPU twin (threads launch, 2 cores, 2026-12-03):
//   int1 A1 / B1 / D1 / KA1 / KB1    estimate 69-77 MiB, measured 27-37 MiB (the fixed 48 MiB dominates)
//   GDN 8192 tokens, HV 9, K=V=128, W 1      estimate 1077 MiB, measured 1051 MiB (+2%)
//   KDA 4096+12288 tokens, HV 4, K=V=128, W 2  estimate 1573 MiB, measured 1518 MiB (+4%)
//   GDN 32768 tokens, HV 8, K=V=128, W 4     estimate 4030 MiB, measured 3820 MiB (+6%)
//   int3 B4                                 estimate 17.9 GB (form arrays 11.04 GB), measured
//                                           17.7 GB (11.0 GB) earlier on 16 cores (README) (+1%)
// So the estimate is at most a few percent above the peak of rows whose arrays dominate and never
// below it in these runs; the reference's checkpoint term (an upper bound) keeps it on that side.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config/row_config.h"
#include "core/plan/segment_plan.h"
#include "kernels/api/backend.h"

namespace kcp {

struct MemoryRequest {
  PlanRequest plan;                           // how the row is planned (world 0 = the row's)
  std::vector<int> forced_P;                  // forced schedules that may run (the largest form counts)
  bool device_is_host = true;                 // the CPU twin: form arrays live in host memory
  std::vector<int> ranks;                     // ranks this process runs; empty = all (threads launch)
  int reference_threads = 1;                  // threads of one FP64 reference computation
  const kernels::Backend* backend = nullptr;  // for its private workspace scratch (null: none)
  bool spare_workspace = false;               // the workspace-of-other-package fault allocates a second one
};

struct RankMemory {
  int rank = 0;
  int64_t inputs = 0;        // host: the rank's input shard (float)
  int64_t reference = 0;     // host: the rank's slice of the FP64 reference (double)
  int64_t form_arrays = 0;   // device (host on the CPU twin): one form's arrays, the largest form
  int64_t saved_set = 0;     //   of which the saved set arena
  int64_t workspace = 0;     //   of which the workspace arena(s)
  int64_t host_results = 0;  // host: downloaded results, exchange buffers, comparison scratch
};

struct MemoryEstimate {
  std::string row;
  std::vector<RankMemory> ranks;  // the ranks of this process
  int64_t sequences = 0;          // host: FP64 results of every sequence the process holds at once
  int64_t reference_work = 0;     // host: working set of the reference computations running at once
  int64_t fixed = 0;              // host: binary, libraries, thread stacks
  int64_t phase_prepare = 0;      // host peak while the reference is prepared (A)
  int64_t phase_forms = 0;        // host peak while forms run (B)
  int64_t host_bytes = 0;         // host peak of the process: fixed + max(A, B)
  int64_t device_bytes = 0;       // device memory of the process (0 when device_is_host)
};

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
