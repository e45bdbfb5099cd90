// The one table of the backend phases (backend.h): X(name, Args) per phase, in the order of the
// algorithm (forward: prep .. fwd_output; backward: bwd_local_dv .. bwd_finalize). The Backend
// virtuals, the CPU twin's declarations, the engine's decorators (core/kcp/backend_decorator.h,
// phase_timing_backend.*) and the phase-name list are generated from it, so a new phase is added
// in one place and a decorator cannot forget to forward it. The order is part of the JSON
// output (engine_phase_names(): "forward.prep" ... in this order).
#pragma once

#define KCP_BACKEND_PHASES(X)      \
  X(prep, PrepArgs)                \
  X(wy, WyArgs)                    \
  X(fwd_summaries, FwdSummaryArgs) \
  X(fold, FoldArgs)                \
  X(fwd_states, FwdStateArgs)      \
  X(fwd_output, FwdOutputArgs)     \
  X(bwd_local_dv, BwdLocalDvArgs)  \
  X(bwd_summaries, BwdSummaryArgs) \
  X(bwd_states, BwdStateArgs)      \
  X(bwd_grads, BwdGradArgs)        \
  X(bwd_finalize, BwdFinalizeArgs)

// The declaration of a phase override inside a class derived from kcp::kernels::Backend (the
// Args type is named from kcp::kernels, so it works in any namespace).
#define KCP_PHASE_OVERRIDE(name, Args) void name(const ::kcp::kernels::Args& args) const override;

namespace kcp::kernels {

// The phase names, in table order ("prep", "wy", ...).
inline constexpr const char* kPhaseNames[] = {
#define KCP_PHASE_NAME(name, Args) #name,
    KCP_BACKEND_PHASES(KCP_PHASE_NAME)
#undef KCP_PHASE_NAME
};
inline constexpr int kPhaseCount = int(sizeof(kPhaseNames) / sizeof(kPhaseNames[0]));

}  // namespace kcp::kernels
