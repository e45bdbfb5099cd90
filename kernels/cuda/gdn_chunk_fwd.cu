// Launchers of the GDN output (F5) and of the backward's local dv (B2), both chunk-local.
#include "kernels/cuda/gdn_chunk_fwd_kernel.cuh"

namespace kcp::kernels::cuda {

namespace {
template <class DT, int K, int V, bool OUTPUT>
void run_chunk(const ChunkParams& p, cudaStream_t st) {
  if (p.sh.NT == 0) return;
  const unsigned grid = unsigned(p.sh.NT * p.sh.HV);
  if constexpr (OUTPUT) {
    const size_t smem = OutputSmem<K, V>::bytes;
    allow_smem(gdn_output_kernel<DT, K, V>, smem);
    gdn_output_kernel<DT, K, V><<<grid, kThreads, smem, st>>>(p);
  } else {
    const size_t smem = LocalDvSmem<K, V>::bytes;
    allow_smem(gdn_local_dv_kernel<DT, K, V>, smem);
    gdn_local_dv_kernel<DT, K, V><<<grid, kThreads, smem, st>>>(p);
  }
  KCP_CUDA_LAUNCH_CHECK(st);
}
template <bool OUTPUT>
void dispatch(const Problem& pb, const ChunkParams& p, cudaStream_t st) {
  dispatch_dtype_dims<Bf16, Fp16>(pb, [&](auto dt, auto k, auto v) {
    run_chunk<typename decltype(dt)::type, decltype(k)::value, decltype(v)::value, OUTPUT>(p, st);
  });
}
}  // namespace

void launch_fwd_output(const FwdOutputArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch<true>(a.ctx.problem, output_params(a, L), st);
}

void launch_bwd_local_dv(const BwdLocalDvArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch<false>(a.ctx.problem, local_dv_params(a, L), st);
}

}  // namespace kcp::kernels::cuda
