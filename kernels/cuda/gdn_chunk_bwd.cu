// Launcher of the GDN backward gradients per (chunk, value head): B4, then B5 (two kernels).
#include "kernels/cuda/gdn_chunk_bwd_kernel.cuh"

namespace kcp::kernels::cuda {

namespace {
template <class DT, int K, int V>
void run_grads(const GradParams& p, cudaStream_t st) {
  if (p.sh.NT == 0) return;
  const unsigned grid = unsigned(p.sh.NT * p.sh.HV);
  const size_t smem1 = DqkSmem<V>::bytes, smem2 = WyBwdSmem<K, V>::bytes;
  allow_smem(gdn_bwd_dqk_kernel<DT, K, V>, smem1);
  allow_smem(gdn_bwd_wy_kernel<DT, K, V>, smem2);
  gdn_bwd_dqk_kernel<DT, K, V><<<grid* unsigned(K / kKS), kThreads, smem1, st>>>(p);
  KCP_CUDA_LAUNCH_CHECK(st);
  gdn_bwd_wy_kernel<DT, K, V><<<grid, kThreads, smem2, st>>>(p);
  KCP_CUDA_LAUNCH_CHECK(st);
}
}  // namespace

void launch_bwd_grads(const BwdGradArgs& a, const DevLayout& L, float* dlam_hi, uint16_t* dW16, cudaStream_t st) {
  GradParams p = grad_params(a, L);
  p.dlam_hi = dlam_hi;
  p.dW16 = dW16;
  dispatch_dtype_dims<Bf16, Fp16>(a.ctx.problem, [&](auto dt, auto k, auto v) {
    run_grads<typename decltype(dt)::type, decltype(k)::value, decltype(v)::value>(p, st);
  });
}

}  // namespace kcp::kernels::cuda
