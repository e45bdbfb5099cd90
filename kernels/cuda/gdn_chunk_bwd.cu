// Launcher of the GDN backward gradients per (chunk, value head): B4, then B5 (two kernels). B4
// runs on wgmma (gdn_bwd_dqk_wgmma.cuh) where bwd_grads_use_wgmma() (walk_select.h), else gdn_bwd_dqk_kernel; B5 on
// wgmma (gdn_bwd_wy_wgmma.cuh) where launch_bwd_wy_wgmma runs it, else gdn_bwd_wy_kernel. With the
// finalize in the same call (BwdGradArgs::finalize) the wgmma B5 also finalizes dk (its FIN kernel).
#include "kernels/cuda/gdn_bwd_dqk_wgmma.cuh"
#include "kernels/cuda/gdn_bwd_wy_wgmma.cuh"
#include "kernels/cuda/gdn_chunk_bwd_kernel.cuh"
#include "kernels/cuda/walk_select.h"

namespace kcp::kernels::cuda {

namespace {
template <class DT, int K, int V>
void run_dqk(const GradParams& p, unsigned blocks, cudaStream_t st) {
  if (bwd_grads_use_wgmma()) {  // every K, V and dtype
    const size_t smem = dqk_wg::Smem<V>::bytes;
    allow_smem(gdn_bwd_dqk_wgmma_kernel<DT, K, V>, smem);
    gdn_bwd_dqk_wgmma_kernel<DT, K, V><<<blocks, kThreads, smem, st>>>(p);
  } else {
    const size_t smem = DqkSmem<V>::bytes;
    allow_smem(gdn_bwd_dqk_kernel<DT, K, V>, smem);
    gdn_bwd_dqk_kernel<DT, K, V><<<blocks, kThreads, smem, st>>>(p);
  }
  KCP_CUDA_LAUNCH_CHECK(st);
}

// B5 over `grid` blocks: the wgmma kernel (gdn_bwd_wy_wgmma.cuh) where launch_bwd_wy_wgmma runs it,
// else the mma.sync kernel.
template <class DT, int K, int V>
void run_wy(const GradParams& p, unsigned grid, cudaStream_t st) {
  if (launch_bwd_wy_wgmma<DT, K, V>(p, grid, st)) return;
  const size_t smem = WyBwdSmem<K, V>::bytes;
  allow_smem(gdn_bwd_wy_kernel<DT, K, V>, smem);
  gdn_bwd_wy_kernel<DT, K, V><<<grid, kThreads, smem, st>>>(p);
  KCP_CUDA_LAUNCH_CHECK(st);
}

// B4, then B5; with fin (BwdGradArgs::finalize) B5 finalizes dk on chip where its wgmma kernel runs
// and the G value heads of a q/k head fit one cluster whose blocks split the chunk's 64 rows (G = 1,
// 2, 4, 8). Returns whether it did.
template <class DT, int K, int V>
bool run_grads(GradParams p, const BwdFinalizeArgs* fin, cudaStream_t st) {
  if (p.sh.NT == 0) return false;
  const unsigned grid = unsigned(p.sh.NT * p.sh.HV);
  run_dqk<DT, K, V>(p, grid * unsigned(K / kKS), st);
  const int G = p.sh.G;
  if (fin && G <= 8 && kC % G == 0) {
    p.dk_out = fin->dk.packed16();
    p.yk = fin->k.packed16();
    p.rstd_k = fin->rstd_k;
    p.l2norm = fin->ctx.problem.qk_l2norm ? 1 : 0;
    if (launch_bwd_wy_wgmma<DT, K, V>(p, grid, st)) return true;
    p.dk_out = nullptr;
  }
  run_wy<DT, K, V>(p, grid, st);
  return false;
}
}  // namespace

bool launch_bwd_grads(const BwdGradArgs& a, const DevLayout& L, float* dlam_hi, uint16_t* dW16, cudaStream_t st) {
  GradParams p = grad_params(a, L);
  p.dlam_hi = dlam_hi;
  p.dW16 = dW16;
  bool dk_done = false;
  dispatch_dtype_dims<Bf16, Fp16>(a.ctx.problem, [&](auto dt, auto k, auto v) {
    dk_done = run_grads<typename decltype(dt)::type, decltype(k)::value, decltype(v)::value>(p, a.finalize, st);
  });
  return dk_done;
}

}  // namespace kcp::kernels::cuda
