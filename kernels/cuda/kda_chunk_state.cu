// Launchers of the KDA state walks: forward summaries / states, backward summaries / states.
#include "kernels/cuda/kda_chunk_state_kernel.cuh"

namespace kcp::kernels::cuda {

namespace {

template <class DT, int K, bool STATES>
void run_kda_fwd_walk(const KdaFwdWalkParams& p, cudaStream_t st) {
  if (p.sh.S == 0) return;
  constexpr int V = K;
  const int tiles = V / kKdaBV + (STATES ? 0 : K / kKdaBV);
  const size_t smem = KdaFwdWalkSmem<K>::bytes;
  allow_smem(kda_fwd_walk_kernel<DT, K, V, STATES>, smem);
  kda_fwd_walk_kernel<DT, K, V, STATES><<<unsigned(int64_t(p.sh.S) * p.sh.HV * tiles), kThreads, smem, st>>>(p);
  KCP_CUDA_LAUNCH_CHECK(st);
}

template <class DT, int K, bool STATES>
void run_kda_bwd_walk(const KdaBwdWalkParams& p, cudaStream_t st) {
  if (p.sh.S == 0) return;
  constexpr int V = K;
  const size_t smem = KdaBwdWalkSmem<K>::bytes;
  allow_smem(kda_bwd_walk_kernel<DT, K, V, STATES>, smem);
  kda_bwd_walk_kernel<DT, K, V, STATES><<<unsigned(int64_t(p.sh.S) * p.sh.HV * (V / kKdaBV)), kThreads, smem, st>>>(p);
  KCP_CUDA_LAUNCH_CHECK(st);
}

template <bool STATES>
void dispatch_fwd(const Problem& pb, const KdaFwdWalkParams& p, cudaStream_t st) {
  dispatch_dtype_kdim<Bf16, Fp16>(pb, [&](auto dt, auto kdim) {
    run_kda_fwd_walk<typename decltype(dt)::type, decltype(kdim)::value, STATES>(p, st);
  });
}
template <bool STATES>
void dispatch_bwd(const Problem& pb, const KdaBwdWalkParams& p, cudaStream_t st) {
  dispatch_dtype_kdim<Bf16, Fp16>(pb, [&](auto dt, auto kdim) {
    run_kda_bwd_walk<typename decltype(dt)::type, decltype(kdim)::value, STATES>(p, st);
  });
}

// The layout tables, flags and inputs every walk of a direction reads (Args: the phase's args).
template <class Params, class Args>
Params walk_params(const Args& a, const DevLayout& L) {
  Params p{};
  p.sh = shape_of(a.ctx.problem, L);
  p.chunks = L.chunks;
  p.segments = L.segments;
  p.pieces = L.pieces;
  p.has_h0 = a.ctx.problem.has_h0;
  p.has_dht = a.ctx.problem.has_dht;
  p.gcum = a.gcum;
  p.W = a.W.packed16();
  p.kg = a.kg;
  return p;
}
template <class Args>
KdaFwdWalkParams fwd_params(const Args& a, const DevLayout& L) {
  KdaFwdWalkParams p = walk_params<KdaFwdWalkParams>(a, L);
  p.U = a.U.packed16();
  return p;
}
template <class Args>
KdaBwdWalkParams bwd_params(const Args& a, const DevLayout& L) {
  KdaBwdWalkParams p = walk_params<KdaBwdWalkParams>(a, L);
  p.q = a.q.packed16();
  p.dO = a.dO;
  p.dv_local = a.dv_local.packed16();
  return p;
}

}  // namespace

void launch_kda_fwd_summaries(const FwdSummaryArgs& a, const DevLayout& L, cudaStream_t st) {
  KdaFwdWalkParams p = fwd_params(a, L);
  p.seg_h_ext = a.seg_h_ext;
  p.seg_Mt = a.seg_Mt;
  dispatch_fwd<false>(a.ctx.problem, p, st);
}

void launch_kda_fwd_states(const FwdStateArgs& a, const DevLayout& L, cudaStream_t st) {
  KdaFwdWalkParams p = fwd_params(a, L);
  p.seg_entry = a.seg_entry;
  p.h = a.h.packed16();
  p.v_new = a.v_new.packed16();
  p.ht = a.ht;
  dispatch_fwd<true>(a.ctx.problem, p, st);
}

void launch_kda_bwd_summaries(const BwdSummaryArgs& a, const DevLayout& L, cudaStream_t st) {
  KdaBwdWalkParams p = bwd_params(a, L);
  p.seg_dh_ext = a.seg_dh_ext;
  dispatch_bwd<false>(a.ctx.problem, p, st);
}

void launch_kda_bwd_states(const BwdStateArgs& a, const DevLayout& L, cudaStream_t st) {
  KdaBwdWalkParams p = bwd_params(a, L);
  p.seg_exit = a.seg_exit;
  p.dh = a.dh.packed16();
  p.dv2 = a.dv2.packed16();
  p.dh0 = a.dh0;
  dispatch_bwd<true>(a.ctx.problem, p, st);
}

}  // namespace kcp::kernels::cuda
