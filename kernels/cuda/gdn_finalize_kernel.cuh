// Backward finalize (docs/algorithm.md B6, B7), GDN, rounding points [F1]-[F3] of the CPU twin
// (kernels/cpu/finalize.cpp). Included only by gdn_finalize.cu.
//
// finalize_qk_kernel: grid (ceil(T*H / 8), 2), one warp per (token, q/k head) row: sum of the
//   G value heads' dq_hv / dk_hv in fixed order j = i G .. i G + G - 1 (fp32), L2-norm backward
//   dx = rstd (dy - (dy . y) y) with y the saved normalized q / k, one rounding to dtype. A lane
//   holds K / 32 consecutive channels, read and written by one vector access each; the loads of
//   up to kFinG heads and of y, rstd are in flight together.
// finalize_gate_kernel: grid (NT, ceil(HV / 64)), 256 threads stage the chunk's dlam (and raw
//   gates) for 64 heads in shared memory, then one thread per (chunk, value head): reverse
//   chunk-local cumsum of dlam in token order (fp32), raw-gate backward, dg; the chunk's partial
//   sums of dA_log and ddt_bias (rows in order) go to partials [NT, HV, 2].
// finalize_params_kernel: one thread per value head adds the chunk partials in chunk order.
// Every reduction has a fixed order, so det and nondet give the same bits.
#pragma once

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/finalize_params.cuh"
#include "kernels/cuda/finalize_row.cuh"

namespace kcp::kernels::cuda {

struct FinalizeQkParams {
  const float* dhv[2];   // dq_hv, dk_hv [T, HV, K] fp32
  const uint16_t* y[2];  // saved q, k [T, H, K] dtype, 16-bit storage (L2 norm)
  const float* rstd[2];  // [T, H] fp32 (L2 norm)
  uint16_t* out[2];      // dq, dk [T, H, K] dtype, 16-bit (caller storage)
  int64_t rows;          // T * H
  int H, G, l2norm;
};

// Loads of up to kFinG value heads are issued together (G = 2 at H = 16, HV = 32: one round trip
// instead of one per head); the sum still adds the heads in order.
inline constexpr int kFinG = 4;

// Eight blocks per SM (<= 32 registers, as before the vector loads; without the bound K = 128
// took 38 registers: six blocks).
template <class DT, int K>
__global__ void __launch_bounds__(256, 8) finalize_qk_kernel(FinalizeQkParams p) {
  const int64_t row = int64_t(blockIdx.x) * 8 + warp_id();
  if (row >= p.rows) return;
  const bool kside = blockIdx.y != 0;  // (selects, not indexes, the parameter arrays)
  const int64_t t = row / p.H;
  const int i = int(row % p.H);
  constexpr int E = K / 32;
  using LV = LaneVec<E>;
  // The L2-norm operands first: their loads do not wait for the sum.
  uint32_t yu[E / 2] = {};
  float r = 0.0f;
  if (p.l2norm) {
    LV::load16((kside ? p.y[1] : p.y[0]) + row * K + lane_id() * E, yu);
    r = (kside ? p.rstd[1] : p.rstd[0])[row];
  }
  float sum[E];
#pragma unroll
  for (int e = 0; e < E; ++e) sum[e] = 0.0f;
  const float* x0 = (kside ? p.dhv[1] : p.dhv[0]) + ((t * p.H * p.G) + int64_t(i) * p.G) * K + lane_id() * E;
  for (int g0 = 0; g0 < p.G; g0 += kFinG) {
    float x[kFinG][E];
#pragma unroll
    for (int u = 0; u < kFinG; ++u)
      if (g0 + u < p.G) LV::load(x0 + int64_t(g0 + u) * K, x[u]);
#pragma unroll
    for (int u = 0; u < kFinG; ++u)
      if (g0 + u < p.G) {
#pragma unroll
        for (int e = 0; e < E; ++e) sum[e] += x[u][e];
      }
  }
  finish_row<DT, E>(sum, yu, r, p.l2norm, (kside ? p.out[1] : p.out[0]) + row * K + lane_id() * E);
}

__global__ void __launch_bounds__(256) finalize_gate_kernel(FinalizeGateParams p) {
  __shared__ float sL[kC][65], sR[kC][65];  // dlam and raw gate per (row, head of this block)
  const int64_t n = blockIdx.x;
  const int jb = blockIdx.y * 64, nh = min(64, p.HV - jb);
  const ChunkDesc ch = p.chunks[n];
  const int L = ch.len;
  const int64_t t0 = ch.begin;
  const int HV = p.HV;
  const bool softplus = p.gate == int(GateForm::Softplus);
  // Cooperative, coalesced staging (consecutive threads read consecutive heads of a row).
  for (int e = threadIdx.x; e < L * 64; e += blockDim.x) {
    const int r = e / 64, jj = e % 64;
    if (jj >= nh) continue;
    const int64_t at = (t0 + r) * HV + jb + jj;
    sL[r][jj] = p.dlam[at];
    if (softplus) sR[r][jj] = p.g[at];
  }
  __syncthreads();
  const int jj = threadIdx.x, j = jb + jj;
  if (jj >= nh) return;
  float acc = 0.0f;
  for (int r = L - 1; r >= 0; --r) {  // chunk-local reverse cumsum, token order of the twin
    acc += sL[r][jj];
    sL[r][jj] = acc;
  }
  const float ea = p.A_log ? expf(p.A_log[j]) : 1.0f;
  const float bias = p.dt_bias ? p.dt_bias[j] : 0.0f;
  float part_A = 0.0f, part_b = 0.0f;
  for (int r = 0; r < L; ++r) {
    const float dA = sL[r][jj];
    float dg = dA;
    if (softplus) {
      const float x = sR[r][jj] + bias;
      const float sg = x > 20.0f ? 1.0f : 1.0f / (1.0f + expf(-x));
      const float av = -ea * (x > 20.0f ? x : logf(1.0f + expf(x)));
      dg = dA * (-ea * sg);
      part_A += dA * av;
    }
    p.dg[(t0 + r) * HV + j] = dg;
    part_b += dg;
  }
  p.partials[(n * HV + j) * 2] = part_A;
  p.partials[(n * HV + j) * 2 + 1] = part_b;
}

__global__ void __launch_bounds__(64) finalize_params_kernel(FinalizeGateParams p) {
  const int j = blockIdx.x * 64 + threadIdx.x;
  if (j >= p.HV) return;
  float tot_A = 0.0f, tot_b = 0.0f;
  for (int64_t n = 0; n < p.NT; ++n) {
    tot_A += p.partials[(n * p.HV + j) * 2];
    tot_b += p.partials[(n * p.HV + j) * 2 + 1];
  }
  if (p.dA_log) p.dA_log[j] = tot_A;
  if (p.ddt_bias) p.ddt_bias[j] = tot_b;
}

}  // namespace kcp::kernels::cuda
