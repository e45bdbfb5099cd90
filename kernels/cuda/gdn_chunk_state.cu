// Launchers of the GDN state walks: forward summaries / states, backward summaries / states.
#include "kernels/cuda/gdn_chunk_state_kernel.cuh"

namespace kcp::kernels::cuda {

void launch_fwd_summaries(const FwdSummaryArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_fwd_walk<false, false>(a.ctx.problem, fwd_summaries_params(a, L), st);
}

void launch_fwd_states(const FwdStateArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_fwd_walk<false, true>(a.ctx.problem, fwd_states_params(a, L), st);
}

// K = V = 128 only: at K = 64 the kernel took 206 registers (ptxas, sm_90a), so two blocks no
// longer share an SM as the planner's slots assume (kernels/api/tiles.h); there the phases run in
// turn.
bool launch_fwd_states_output(const FwdStateArgs& a, const DevLayout& L, cudaStream_t st) {
  if (a.ctx.problem.K != 128) return false;
  FwdWalkParams p = fwd_states_params(a, L);
  p.q = a.output->q.packed16();
  p.o = a.output->o.packed16();
  return launch_fwd_walk_wgmma(a.ctx.problem, p, true, st);
}

void launch_bwd_summaries(const BwdSummaryArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_bwd_walk<false, false>(a.ctx.problem, bwd_summaries_params(a, L), st);
}

void launch_bwd_states(const BwdStateArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_bwd_walk<false, true>(a.ctx.problem, bwd_states_params(a, L), st);
}

}  // namespace kcp::kernels::cuda
