// Launchers of the KDA state walks: forward summaries / states, backward summaries / states.
#include "kernels/cuda/kda_chunk_state_kernel.cuh"

namespace kcp::kernels::cuda {

namespace {

template <class DT, int K, int V, bool STATES>
void run_kda_fwd_walk(const KdaFwdWalkParams& p, cudaStream_t st) {
  launch_walk(kda_fwd_walk_kernel<DT, K, V, STATES>, KdaFwdWalkSmem<K>::bytes, fwd_walk_tiles<K, V, STATES>(), p, st);
}
template <class DT, int K, int V, bool STATES>
void run_kda_bwd_walk(const KdaBwdWalkParams& p, cudaStream_t st) {
  launch_walk(kda_bwd_walk_kernel<DT, K, V, STATES>, KdaBwdWalkSmem<K>::bytes, bwd_walk_tiles<V>(), p, st);
}

template <bool STATES>
void dispatch_fwd(const Problem& pb, const KdaFwdWalkParams& p, cudaStream_t st) {
  dispatch_dtype_dims<Bf16, Fp16>(pb, [&](auto dt, auto k, auto v) {
    run_kda_fwd_walk<typename decltype(dt)::type, decltype(k)::value, decltype(v)::value, STATES>(p, st);
  });
}
template <bool STATES>
void dispatch_bwd(const Problem& pb, const KdaBwdWalkParams& p, cudaStream_t st) {
  dispatch_dtype_dims<Bf16, Fp16>(pb, [&](auto dt, auto k, auto v) {
    run_kda_bwd_walk<typename decltype(dt)::type, decltype(k)::value, decltype(v)::value, STATES>(p, st);
  });
}

}  // namespace

void launch_kda_fwd_summaries(const FwdSummaryArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_fwd<false>(a.ctx.problem, with_kg<KdaFwdWalkParams>(fwd_summaries_params(a, L), a.kg), st);
}

void launch_kda_fwd_states(const FwdStateArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_fwd<true>(a.ctx.problem, with_kg<KdaFwdWalkParams>(fwd_states_params(a, L), a.kg), st);
}

void launch_kda_bwd_summaries(const BwdSummaryArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_bwd<false>(a.ctx.problem, with_kg<KdaBwdWalkParams>(bwd_summaries_params(a, L), a.kg), st);
}

void launch_kda_bwd_states(const BwdStateArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_bwd<true>(a.ctx.problem, with_kg<KdaBwdWalkParams>(bwd_states_params(a, L), a.kg), st);
}

}  // namespace kcp::kernels::cuda
