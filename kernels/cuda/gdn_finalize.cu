// Launchers of the GDN backward finalize: GVA + L2-norm backward of dq/dk (launch_finalize_qk,
// operator-independent, also used by the KDA finalize), gate backward.
#include "kernels/cuda/gdn_finalize_kernel.cuh"

namespace kcp::kernels::cuda {

namespace {
// sides: 2 = dq and dk (grid.y 0, 1), 1 = dq only.
template <class DT, int K>
void run_qk(const FinalizeQkParams& p, unsigned sides, cudaStream_t st) {
  const dim3 grid(unsigned((p.rows + 7) / 8), sides);
  finalize_qk_kernel<DT, K><<<grid, 256, 0, st>>>(p);
  KCP_CUDA_LAUNCH_CHECK(st);
}
}  // namespace

void launch_finalize_qk(const BwdFinalizeArgs& a, const DevLayout& L, cudaStream_t st, bool dk_done) {
  const Problem& pb = a.ctx.problem;
  if (L.T > 0) {
    FinalizeQkParams q{};
    q.dhv[0] = a.dq_hv;
    q.dhv[1] = a.dk_hv;
    q.y[0] = a.q.packed16();
    q.y[1] = a.k.packed16();
    q.rstd[0] = a.rstd_q;
    q.rstd[1] = a.rstd_k;
    q.out[0] = a.dq.packed16();
    q.out[1] = a.dk.packed16();
    q.rows = L.T * pb.H;
    q.H = pb.H;
    q.G = pb.group();
    q.l2norm = pb.qk_l2norm ? 1 : 0;
    dispatch_dtype_dims<Bf16, Fp16>(pb, [&](auto dt, auto k, auto) {
      run_qk<typename decltype(dt)::type, decltype(k)::value>(q, dk_done ? 1u : 2u, st);
    });
  }
}

void launch_bwd_finalize(const BwdFinalizeArgs& a, const DevLayout& L, float* partials, cudaStream_t st, bool dk_done) {
  const Problem& pb = a.ctx.problem;
  launch_finalize_qk(a, L, st, dk_done);
  const FinalizeGateParams g = gate_params(a, L, partials);
  const unsigned hb = unsigned((pb.HV + 63) / 64);
  if (L.n_chunks > 0) {
    finalize_gate_kernel<<<dim3(unsigned(L.n_chunks), hb), 256, 0, st>>>(g);
    KCP_CUDA_LAUNCH_CHECK(st);
  }
  if (g.dA_log || g.ddt_bias) {
    finalize_params_kernel<<<hb, 64, 0, st>>>(g);
    KCP_CUDA_LAUNCH_CHECK(st);
  }
}

}  // namespace kcp::kernels::cuda
