// Launcher of the KDA WY phase (W, U, kg per chunk and value head).
#include "kernels/cuda/kda_wy_kernel.cuh"

namespace kcp::kernels::cuda {

namespace {
template <class DT, int K, int V>
void run_kda_wy(const WyArgs& a, const DevLayout& L, cudaStream_t st) {
  const Shape sh = shape_of(a.ctx.problem, L);
  if (sh.NT == 0) return;
  KdaWyParams p{};
  static_cast<WyParams&>(p) = wy_params(a, L);
  p.kg = a.kg.packed16();
  const size_t smem = KdaWySmem<K, V>::bytes;
  allow_smem(kda_wy_kernel<DT, K, V>, smem);
  kda_wy_kernel<DT, K, V><<<unsigned(sh.NT * sh.HV), kThreads, smem, st>>>(p);
  KCP_CUDA_LAUNCH_CHECK(st);
}
}  // namespace

void launch_kda_wy(const WyArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_dtype_dims<Bf16, Fp16>(a.ctx.problem, [&](auto dt, auto k, auto v) {
    run_kda_wy<typename decltype(dt)::type, decltype(k)::value, decltype(v)::value>(a, L, st);
  });
}

}  // namespace kcp::kernels::cuda
