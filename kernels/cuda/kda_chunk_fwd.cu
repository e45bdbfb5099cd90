// Launchers of the KDA output (F5) and of the backward's local dv (3.2 step 2), both chunk-local.
#include "kernels/cuda/kda_chunk_fwd_kernel.cuh"

namespace kcp::kernels::cuda {

namespace {
template <class DT, int K, int V, bool OUTPUT>
void run_kda_chunk(const KdaChunkParams& p, cudaStream_t st) {
  if (p.sh.NT == 0) return;
  const unsigned grid = unsigned(p.sh.NT * p.sh.HV);
  if constexpr (OUTPUT) {
    const size_t smem = KdaOutputSmem<K, V>::bytes;
    allow_smem(kda_output_kernel<DT, K, V>, smem);
    kda_output_kernel<DT, K, V><<<grid, kThreads, smem, st>>>(p);
  } else {
    const size_t smem = KdaLocalDvSmem<V>::bytes;
    allow_smem(kda_local_dv_kernel<DT, K, V>, smem);
    kda_local_dv_kernel<DT, K, V><<<grid, kThreads, smem, st>>>(p);
  }
  KCP_CUDA_LAUNCH_CHECK(st);
}
template <bool OUTPUT>
void dispatch(const Problem& pb, const KdaChunkParams& p, cudaStream_t st) {
  dispatch_dtype_dims<Bf16, Fp16>(pb, [&](auto dt, auto k, auto v) {
    run_kda_chunk<typename decltype(dt)::type, decltype(k)::value, decltype(v)::value, OUTPUT>(p, st);
  });
}
// The GDN parameters plus Aqk.
KdaChunkParams with_aqk(const ChunkParams& base, const float* Aqk) {
  KdaChunkParams p{};
  static_cast<ChunkParams&>(p) = base;
  p.Aqk = Aqk;
  return p;
}

}  // namespace

void launch_kda_fwd_output(const FwdOutputArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch<true>(a.ctx.problem, with_aqk(output_params(a, L), a.Aqk), st);
}

void launch_kda_bwd_local_dv(const BwdLocalDvArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch<false>(a.ctx.problem, with_aqk(local_dv_params(a, L), a.Aqk), st);
}

}  // namespace kcp::kernels::cuda
