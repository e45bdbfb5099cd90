// Launcher of the KDA prep phase: q/k L2 norm or copy (launch_prep_qk, shared with GDN), then the
// per-channel gate cumsum, Pi, Aqk and Phi (kda_intra_kernel).
#include "kernels/cuda/kda_prep_kernel.cuh"

namespace kcp::kernels::cuda {

namespace {
template <class DT, int K>
void run_kda_intra(const PrepArgs& a, const DevLayout& L, cudaStream_t st) {
  const Problem& pb = a.ctx.problem;
  const Shape sh = shape_of(pb, L);
  if (sh.NT == 0) return;
  KdaIntraParams p{};
  static_cast<IntraParams&>(p) = intra_params(a, L);
  p.q = a.q_out.packed16();
  p.lower_bound = pb.lower_bound;
  p.Aqk = a.Aqk;
  const size_t smem = KdaIntraSmem<K>::bytes;
  allow_smem(kda_intra_kernel<DT, K>, smem);
  kda_intra_kernel<DT, K><<<unsigned(sh.NT * sh.HV), kThreads, smem, st>>>(p);
  KCP_CUDA_LAUNCH_CHECK(st);
}
}  // namespace

void launch_kda_prep(const PrepArgs& a, const DevLayout& L, cudaStream_t st) {
  launch_prep_qk(a, L, st);
  dispatch_dtype_dims<Bf16, Fp16>(a.ctx.problem, [&](auto dt, auto k, auto) {
    run_kda_intra<typename decltype(dt)::type, decltype(k)::value>(a, L, st);
  });
}

}  // namespace kcp::kernels::cuda
