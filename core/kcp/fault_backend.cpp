#include "core/kcp/fault_backend.h"

#include <limits>

namespace kcp {

void FaultInjectingBackend::fwd_states(const kernels::FwdStateArgs& a) const {
  if (segment_ >= 0 && segment_ < a.ctx.layout.n_segments) {
    // The entry states live in the caller's workspace; the fault overwrites one of them just
    // before the recurrence reads it, as a lost hand-off between segments would.
    const int64_t state = int64_t(a.ctx.problem.HV) * a.ctx.problem.K * a.ctx.problem.V;
    float* entry = const_cast<float*>(a.seg_entry) + segment_ * state;
    inner_.fill_floats(entry, 0.0f, state, a.ctx.exec);
  }
  inner_.fwd_states(a);
}

void FaultInjectingBackend::fwd_output(const kernels::FwdOutputArgs& a) const {
  inner_.fwd_output(a);
  if (tile_token_ >= 0 && tile_token_ < a.ctx.layout.T) {
    // Head 0, V columns of tokens [tile_token, tile_token + 64): as if that tile was skipped.
    const int64_t HVV = int64_t(a.ctx.problem.HV) * a.ctx.problem.V;
    const int64_t end = std::min<int64_t>(a.ctx.layout.T, tile_token_ + 64);
    for (int64_t t = tile_token_; t < end; ++t)
      inner_.fill_floats(a.o + t * HVV, std::numeric_limits<float>::quiet_NaN(), a.ctx.problem.V, a.ctx.exec);
  }
}

}  // namespace kcp
