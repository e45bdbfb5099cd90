// What one rank produced for one form, and the shapes of the result tensors of a row (the table
// itself: core/config/result_tensors.h).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/config/row_config.h"

namespace kcp {

// Whether the row has the tensor: ht with a final state, dh0 with an initial state, dA_log /
// ddt_bias with the raw gate's A_log / dt_bias; the others (h_entry, dh_exit too) always.
bool row_has(const RowConfig& row, ResultTensor t);
// Token tensors: {heads, width} of one token (e.g. dq: {H, K}); {0, 0} for the others.
std::array<int64_t, 2> token_dims(const RowConfig& row, ResultTensor t);
// Elements of the tensor on a rank with `tokens` local tokens, `pieces` local pieces and
// `segments` local segments.
int64_t result_elements(const RowConfig& row, ResultTensor t, int64_t tokens, int64_t pieces, int64_t segments);
// The .npy shape of the tensor on such a rank.
std::vector<int64_t> result_shape(const RowConfig& row, ResultTensor t, int64_t tokens, int64_t pieces,
                                  int64_t segments);

// What one rank produced (host floats), in the layouts of kernels/api/tensors.h.
struct RankResult {
  // One host array per result tensor, in table order; empty when the row does not have it.
  std::array<std::vector<float>, kResultTensorCount> tensors;
  std::vector<float>& operator[](ResultTensor t) { return tensors[static_cast<int>(t)]; }
  const std::vector<float>& operator[](ResultTensor t) const { return tensors[static_cast<int>(t)]; }
  // Per timed repeat: kernel time (backend timers around the phases, exchange excluded) and host
  // wall time (exchange included) of this rank's forward and backward.
  std::vector<double> forward_kernel_ms, backward_kernel_ms, forward_wall_ms, backward_wall_ms;
  // With EngineOptions::phase_times, per phase ("forward.prep", "backward.fwd_states": the backward
  // recomputes the forward states, and wy with a light saved set) and per phase-timed run: its
  // calls' kernel time summed.
  // Only phases this rank called.
  std::map<std::string, std::vector<double>> phase_kernel_ms;
  int64_t device_bytes = 0;    // everything the form allocated in the backend's memory
  int faulted_segment = -1;    // where an injected fault was applied (-1 none)
  int64_t faulted_token = -1;  // global token of the fault boundary (-1 none)
};

}  // namespace kcp
