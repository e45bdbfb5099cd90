// Launcher of the GDN WY phase (W, U per chunk and value head).
#include "kernels/cuda/gdn_wy_kernel.cuh"

namespace kcp::kernels::cuda {

namespace {
template <class DT, int K>
void run_wy(const WyArgs& a, const DevLayout& L, cudaStream_t st) {
  const Shape sh = shape_of(a.ctx.problem, L);
  if (sh.NT == 0) return;
  const WyParams p = wy_params(a, L);
  const size_t smem = WySmem<K, K>::bytes;
  allow_smem(gdn_wy_kernel<DT, K, K>, smem);
  gdn_wy_kernel<DT, K, K><<<unsigned(sh.NT * sh.HV), kThreads, smem, st>>>(p);
  KCP_CUDA_LAUNCH_CHECK(st);
}
}  // namespace

void launch_wy(const WyArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_dtype_kdim<Bf16, Fp16>(
      a.ctx.problem, [&](auto dt, auto kdim) { run_wy<typename decltype(dt)::type, decltype(kdim)::value>(a, L, st); });
}

}  // namespace kcp::kernels::cuda
