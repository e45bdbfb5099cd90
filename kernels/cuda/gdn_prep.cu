// Launchers of the GDN prep phase: q/k L2 norm (or copy), then gate cumsum + Pi + Phi; the q/k
// part alone (launch_prep_qk) is operator-independent and also serves the KDA prep.
#include "kernels/cuda/gdn_prep_kernel.cuh"

namespace kcp::kernels::cuda {

namespace {
template <class DT, int K>
void run_prep_qk(const PrepArgs& a, const Shape& sh, cudaStream_t st) {
  if (sh.T > 0) {
    const Problem& pb = a.ctx.problem;
    PrepQkParams q{};
    q.x[0] = a.q.packed16();
    q.x[1] = a.k.packed16();
    q.y[0] = a.q_out.packed16();
    q.y[1] = a.k_out.packed16();
    q.rstd[0] = a.rstd_q;
    q.rstd[1] = a.rstd_k;
    q.rows = sh.T * sh.H;
    q.l2norm = pb.qk_l2norm ? 1 : 0;
    const dim3 grid(unsigned((q.rows + 7) / 8), 2);
    prep_qk_kernel<DT, K><<<grid, 256, 0, st>>>(q);
    KCP_CUDA_LAUNCH_CHECK(st);
  }
}

template <class DT, int K>
void run_prep(const PrepArgs& a, const DevLayout& L, cudaStream_t st) {
  const Problem& pb = a.ctx.problem;
  const Shape sh = shape_of(pb, L);
  run_prep_qk<DT, K>(a, sh, st);
  if (sh.NT > 0) {
    const IntraParams p = intra_params(a, L);
    const size_t smem = IntraSmem<K>::bytes;
    allow_smem(gdn_intra_kernel<DT, K>, smem);
    gdn_intra_kernel<DT, K><<<unsigned(sh.NT * sh.HV), kThreads, smem, st>>>(p);
    KCP_CUDA_LAUNCH_CHECK(st);
  }
}
}  // namespace

void launch_prep_qk(const PrepArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_dtype_dims<Bf16, Fp16>(a.ctx.problem, [&](auto dt, auto k, auto) {
    run_prep_qk<typename decltype(dt)::type, decltype(k)::value>(a, shape_of(a.ctx.problem, L), st);
  });
}

void launch_prep(const PrepArgs& a, const DevLayout& L, cudaStream_t st) {
  dispatch_dtype_dims<Bf16, Fp16>(a.ctx.problem, [&](auto dt, auto k, auto) {
    run_prep<typename decltype(dt)::type, decltype(k)::value>(a, L, st);
  });
}

}  // namespace kcp::kernels::cuda
