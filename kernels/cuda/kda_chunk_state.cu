// Launchers of the KDA state walks: forward summaries / states, backward summaries / states. The
// kernels are the GDN walks with per-channel gates (gdn_chunk_state_kernel.cuh, KDA = true; on
// the wgmma walk where it applies, gdn_walk_wgmma.cuh; its backward walks first write qs into
// the scratch `qs` with kda_qs_kernel, kda_qs.cu: bwd_summaries only for the segments whose
// summary is read, bwd_states for every token).
#include "kernels/cuda/gdn_chunk_state_kernel.cuh"

namespace kcp::kernels::cuda {

void launch_kda_fwd_summaries(const FwdSummaryArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_fwd_walk<true, false>(a.ctx.problem, fwd_summaries_params(a, L), st);
}

void launch_kda_fwd_states(const FwdStateArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_fwd_walk<true, true>(a.ctx.problem, fwd_states_params(a, L), st);
}

void launch_kda_bwd_summaries(const BwdSummaryArgs& a, const DevLayout& L, uint16_t* qs, cudaStream_t st) {
  BwdWalkParams p = bwd_summaries_params(a, L);
  p.qs = qs;
  const QsRows read = qs_rows_of_summaries(a.ctx.problem, a.ctx.layout);  // only these blocks load qs
  dispatch_bwd_walk<true, false>(a.ctx.problem, p, st, &read);
}

void launch_kda_bwd_states(const BwdStateArgs& a, const DevLayout& L, uint16_t* qs, cudaStream_t st) {
  BwdWalkParams p = bwd_states_params(a, L);
  p.qs = qs;
  dispatch_bwd_walk<true, true>(a.ctx.problem, p, st);
}

}  // namespace kcp::kernels::cuda
