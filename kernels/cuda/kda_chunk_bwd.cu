// Launcher of the KDA backward gradients per (chunk, value head): inter part and dAqk, WY part
// and dAkk, intra part (three kernels, kda_chunk_bwd_kernel.cuh).
#include "kernels/cuda/kda_chunk_bwd_kernel.cuh"

namespace kcp::kernels::cuda {

namespace {
template <class DT, int K, int V>
void run_kda_grads(const KdaGradParams& p, cudaStream_t st) {
  if (p.sh.NT == 0) return;
  const unsigned grid = unsigned(p.sh.NT * p.sh.HV);
  const size_t smem1 = KdaInterSmem<K, V>::bytes, smem2 = KdaWyBwdSmem<K, V>::bytes, smem3 = KdaIntraBwdSmem<K>::bytes;
  allow_smem(kda_bwd_inter_kernel<DT, K, V>, smem1);
  allow_smem(kda_bwd_wy_kernel<DT, K, V>, smem2);
  allow_smem(kda_bwd_intra_kernel<DT, K>, smem3);
  kda_bwd_inter_kernel<DT, K, V><<<grid, kThreads, smem1, st>>>(p);
  KCP_CUDA_LAUNCH_CHECK(st);
  kda_bwd_wy_kernel<DT, K, V><<<grid, kThreads, smem2, st>>>(p);
  KCP_CUDA_LAUNCH_CHECK(st);
  kda_bwd_intra_kernel<DT, K><<<grid, kThreads, smem3, st>>>(p);
  KCP_CUDA_LAUNCH_CHECK(st);
}
}  // namespace

void launch_kda_bwd_grads(const BwdGradArgs& a, const DevLayout& L, const KdaGradScratch& s, cudaStream_t st) {
  KdaGradParams p{};
  static_cast<GradParams&>(p) = grad_params(a, L);
  p.dW16 = s.dW16;
  p.dAqk = s.dAqk;
  p.dAkk = s.dAkk;
  dispatch_dtype_dims<Bf16, Fp16>(a.ctx.problem, [&](auto dt, auto k, auto v) {
    run_kda_grads<typename decltype(dt)::type, decltype(k)::value, decltype(v)::value>(p, st);
  });
}

}  // namespace kcp::kernels::cuda
