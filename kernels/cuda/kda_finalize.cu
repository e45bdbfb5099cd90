// Launcher of the KDA backward finalize: GVA + L2-norm backward of dq/dk (launch_finalize_qk,
// shared with GDN), then the per-channel gate backward and the dA_log / ddt_bias sums.
#include "kernels/cuda/kda_finalize_kernel.cuh"

namespace kcp::kernels::cuda {

namespace {
template <int K>
void run_kda_gate(const KdaFinalizeGateParams& g, cudaStream_t st) {
  if (g.sh.NT > 0) {
    kda_finalize_gate_kernel<K><<<unsigned(g.sh.NT * g.sh.HV), K, 0, st>>>(g);
    KCP_CUDA_LAUNCH_CHECK(st);
  }
  if (g.dA_log || g.ddt_bias) {
    kda_finalize_params_kernel<K><<<unsigned((g.sh.HV * (K + 1) + 127) / 128), 128, 0, st>>>(g);
    KCP_CUDA_LAUNCH_CHECK(st);
  }
}
}  // namespace

void launch_kda_bwd_finalize(const BwdFinalizeArgs& a, const DevLayout& L, float* partials, cudaStream_t st) {
  const Problem& pb = a.ctx.problem;
  launch_finalize_qk(a, L, st);
  KdaFinalizeGateParams g{};
  static_cast<FinalizeGateParams&>(g) = gate_params(a, L, partials);
  g.sh = shape_of(pb, L);
  g.lower_bound = pb.lower_bound;
  dispatch_dtype_dims<Bf16, Fp16>(pb, [&](auto, auto k, auto) { run_kda_gate<decltype(k)::value>(g, st); });
}

}  // namespace kcp::kernels::cuda
