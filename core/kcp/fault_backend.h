// A Backend decorator that injects the faults of --inject into the phases it wraps, so the
// engine and the kernels stay free of test-only branches. Faults that live at the engine's own
// exchange points (a rank's incoming state, cross-package saved sets) are applied by the engine.
#pragma once

#include "core/kcp/backend_decorator.h"
#include "core/kcp/kcp_engine.h"

namespace kcp {

class FaultInjectingBackend final : public BackendDecorator {
 public:
  // segment: the segment whose entry state is zeroed (DropSegmentEntry); tile_token: the first
  // local token of the o tile left unwritten (SkipOutputTile); -1 disables either.
  FaultInjectingBackend(const kernels::Backend& inner, int segment, int64_t tile_token)
      : BackendDecorator(inner), segment_(segment), tile_token_(tile_token) {}

  void fwd_states(const kernels::FwdStateArgs& a) const override;
  void fwd_output(const kernels::FwdOutputArgs& a) const override;

 private:
  int segment_;
  int64_t tile_token_;
};

}  // namespace kcp
