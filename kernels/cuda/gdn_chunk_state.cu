// Launchers of the GDN state walks: forward summaries / states, backward summaries / states.
#include "kernels/cuda/gdn_chunk_state_kernel.cuh"

namespace kcp::kernels::cuda {

namespace {

template <class DT, int K, bool STATES>
void run_fwd_walk(const FwdWalkParams& p, cudaStream_t st) {
  if (p.sh.S == 0) return;
  constexpr int V = K;
  const int tiles = V / kBV + (STATES ? 0 : K / kBV);
  const size_t smem = WalkSmem<K>::bytes;
  allow_smem(gdn_fwd_walk_kernel<DT, K, V, STATES>, smem);
  gdn_fwd_walk_kernel<DT, K, V, STATES><<<unsigned(int64_t(p.sh.S) * p.sh.HV * tiles), kThreads, smem, st>>>(p);
  KCP_CUDA_LAUNCH_CHECK(st);
}

template <class DT, int K, bool STATES>
void run_bwd_walk(const BwdWalkParams& p, cudaStream_t st) {
  if (p.sh.S == 0) return;
  constexpr int V = K;
  const size_t smem = BwdWalkSmem<K>::bytes;
  allow_smem(gdn_bwd_walk_kernel<DT, K, V, STATES>, smem);
  gdn_bwd_walk_kernel<DT, K, V, STATES><<<unsigned(int64_t(p.sh.S) * p.sh.HV * (V / kBV)), kThreads, smem, st>>>(p);
  KCP_CUDA_LAUNCH_CHECK(st);
}

template <bool STATES>
void dispatch_fwd(const Problem& pb, const FwdWalkParams& p, cudaStream_t st) {
  const bool fp16 = pb.dtype == DType::FP16;
  if (pb.K == 64) fp16 ? run_fwd_walk<Fp16, 64, STATES>(p, st) : run_fwd_walk<Bf16, 64, STATES>(p, st);
  else fp16 ? run_fwd_walk<Fp16, 128, STATES>(p, st) : run_fwd_walk<Bf16, 128, STATES>(p, st);
}
template <bool STATES>
void dispatch_bwd(const Problem& pb, const BwdWalkParams& p, cudaStream_t st) {
  const bool fp16 = pb.dtype == DType::FP16;
  if (pb.K == 64) fp16 ? run_bwd_walk<Fp16, 64, STATES>(p, st) : run_bwd_walk<Bf16, 64, STATES>(p, st);
  else fp16 ? run_bwd_walk<Fp16, 128, STATES>(p, st) : run_bwd_walk<Bf16, 128, STATES>(p, st);
}

FwdWalkParams fwd_params(const PhaseCtx& c, const DevLayout& L) {
  FwdWalkParams p{};
  p.sh = shape_of(c.problem, L);
  p.chunks = L.chunks;
  p.segments = L.segments;
  p.pieces = L.pieces;
  p.has_h0 = c.problem.has_h0;
  p.has_dht = c.problem.has_dht;
  return p;
}
BwdWalkParams bwd_params(const PhaseCtx& c, const DevLayout& L) {
  BwdWalkParams p{};
  p.sh = shape_of(c.problem, L);
  p.chunks = L.chunks;
  p.segments = L.segments;
  p.pieces = L.pieces;
  p.has_h0 = c.problem.has_h0;
  p.has_dht = c.problem.has_dht;
  return p;
}

}  // namespace

void launch_fwd_summaries(const FwdSummaryArgs& a, const DevLayout& L, cudaStream_t st) {
  FwdWalkParams p = fwd_params(a.ctx, L);
  p.k = a.k;
  p.gcum = a.gcum;
  p.W = a.W;
  p.U = a.U;
  p.seg_h_ext = a.seg_h_ext;
  p.seg_Mt = a.seg_Mt;
  dispatch_fwd<false>(a.ctx.problem, p, st);
}

void launch_fwd_states(const FwdStateArgs& a, const DevLayout& L, cudaStream_t st) {
  FwdWalkParams p = fwd_params(a.ctx, L);
  p.k = a.k;
  p.gcum = a.gcum;
  p.W = a.W;
  p.U = a.U;
  p.seg_entry = a.seg_entry;
  p.h = a.h;
  p.v_new = a.v_new;
  p.ht = a.ht;
  dispatch_fwd<true>(a.ctx.problem, p, st);
}

void launch_bwd_summaries(const BwdSummaryArgs& a, const DevLayout& L, cudaStream_t st) {
  BwdWalkParams p = bwd_params(a.ctx, L);
  p.q = a.q;
  p.k = a.k;
  p.gcum = a.gcum;
  p.W = a.W;
  p.dO = a.dO;
  p.dv_local = a.dv_local;
  p.seg_dh_ext = a.seg_dh_ext;
  dispatch_bwd<false>(a.ctx.problem, p, st);
}

void launch_bwd_states(const BwdStateArgs& a, const DevLayout& L, cudaStream_t st) {
  BwdWalkParams p = bwd_params(a.ctx, L);
  p.q = a.q;
  p.k = a.k;
  p.gcum = a.gcum;
  p.W = a.W;
  p.dO = a.dO;
  p.dv_local = a.dv_local;
  p.seg_exit = a.seg_exit;
  p.dh = a.dh;
  p.dv2 = a.dv2;
  p.dh0 = a.dh0;
  dispatch_bwd<true>(a.ctx.problem, p, st);
}

}  // namespace kcp::kernels::cuda
