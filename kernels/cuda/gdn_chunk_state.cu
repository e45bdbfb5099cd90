// Launchers of the GDN state walks: forward summaries / states, backward summaries / states.
#include "kernels/cuda/gdn_chunk_state_kernel.cuh"
#include "kernels/cuda/gdn_walk_wgmma.h"

namespace kcp::kernels::cuda {

namespace {

template <class DT, int K, int V, bool STATES>
void run_fwd_walk(const FwdWalkParams& p, cudaStream_t st) {
  launch_walk(gdn_fwd_walk_kernel<DT, K, V, STATES>, WalkSmem<K>::bytes, fwd_walk_tiles<K, V, STATES>(), p, st);
}
template <class DT, int K, int V, bool STATES>
void run_bwd_walk(const BwdWalkParams& p, cudaStream_t st) {
  launch_walk(gdn_bwd_walk_kernel<DT, K, V, STATES>, BwdWalkSmem<K>::bytes, bwd_walk_tiles<V>(), p, st);
}

template <bool STATES>
void dispatch_fwd(const Problem& pb, const FwdWalkParams& p, cudaStream_t st) {
  if (launch_fwd_walk_wgmma(pb, p, STATES, st)) return;  // the Hopper walk where it applies
  dispatch_dtype_dims<Bf16, Fp16>(pb, [&](auto dt, auto k, auto v) {
    run_fwd_walk<typename decltype(dt)::type, decltype(k)::value, decltype(v)::value, STATES>(p, st);
  });
}
template <bool STATES>
void dispatch_bwd(const Problem& pb, const BwdWalkParams& p, cudaStream_t st) {
  dispatch_dtype_dims<Bf16, Fp16>(pb, [&](auto dt, auto k, auto v) {
    run_bwd_walk<typename decltype(dt)::type, decltype(k)::value, decltype(v)::value, STATES>(p, st);
  });
}

}  // namespace

void launch_fwd_summaries(const FwdSummaryArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_fwd<false>(a.ctx.problem, fwd_summaries_params(a, L), st);
}

void launch_fwd_states(const FwdStateArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_fwd<true>(a.ctx.problem, fwd_states_params(a, L), st);
}

void launch_bwd_summaries(const BwdSummaryArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_bwd<false>(a.ctx.problem, bwd_summaries_params(a, L), st);
}

void launch_bwd_states(const BwdStateArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_bwd<true>(a.ctx.problem, bwd_states_params(a, L), st);
}

}  // namespace kcp::kernels::cuda
