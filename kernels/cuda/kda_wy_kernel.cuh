// WY factors (docs/algorithm.md F3), KDA, the CPU twin's wy.cpp [W1]-[W3]. Included only by
// kda_wy.cu.
//
// kda_wy_kernel: grid NT * HV, block (chunk n, value head j) = (b / HV, b % HV), kThreads.
//   Operands as the twin rounds them: xb = dtype((k beta) exp2(g)) per channel, ub = dtype(v beta);
//   kg = dtype(k exp2(g_last - g)) (exponent <= 0) straight to global memory. Then a thread per
//   output element: W[r][c] = dtype(sum_{s <= r} Phi[r][s] xb[s][c]), U likewise, s ascending
//   (the twin's order), fp32. Shared memory (fp32): Phi 64 x 64, xb 64 x K, ub 64 x V, beta 64.
#pragma once

#include "kernels/cuda/gdn_wy_kernel.cuh"  // WyParams
#include "kernels/cuda/kda_common.cuh"

namespace kcp::kernels::cuda {

// The GDN WY parameters (gdn_wy_kernel.cuh: k, v, beta, gcum, Phi, W, U) plus kg.
struct KdaWyParams : WyParams {
  float* kg;  // [T, HV, K] dtype
};

template <int K, int V>
struct KdaWySmem {
  static constexpr size_t bytes = (size_t(kC) * kC + size_t(kC) * K + size_t(kC) * V + kC) * 4;
};

template <class DT, int K, int V>
__global__ void __launch_bounds__(kThreads) kda_wy_kernel(KdaWyParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sPhi = reinterpret_cast<float*>(smem_raw);
  float* sX = sPhi + kC * kC;
  float* sU = sX + kC * K;
  float* sB = sU + kC * V;

  const KdaIx ix = kda_ix(p.sh);
  const ChunkItem w = chunk_item(p.chunks, p.sh, blockIdx.x);
  const int L = w.L, j = w.j, i = w.i;
  const int64_t t0 = w.t0;
  const int tid = threadIdx.x;

  if (tid < kC) sB[tid] = tid < L ? p.beta[ix.th(t0 + tid, j)] : 0.0f;
  stage_tile(sPhi, kC, kC, kC, L, [&](int r, int s) { return DT::from_raw(p.Phi[ix.cc(t0 + r, j) + s]); });
  __syncthreads();  // beta
  const float* gL = p.gcum + ix.hk(t0 + L - 1, j);
  for (int e = tid; e < L * K; e += kThreads) {  // [W1] xb, [W3] kg
    const int s = e / K, c = e % K;
    const float ks = DT::from_raw(p.k[ix.qk(t0 + s, i) + c]);
    const float gs = p.gcum[ix.hk(t0 + s, j) + c];
    sX[s * K + c] = DT::rnd((ks * sB[s]) * exp2f(gs));
    p.kg[ix.hk(t0 + s, j) + c] = DT::rnd(ks * exp2f(gL[c] - gs));
  }
  for (int e = tid; e < L * V; e += kThreads) {  // [W1] ub
    const int s = e / V, c = e % V;
    sU[s * V + c] = DT::rnd(load_caller<DT>(p.v, ix.vv(t0 + s, j) + c) * sB[s]);
  }
  __syncthreads();
  for (int e = tid; e < L * K; e += kThreads) {  // [W2]
    const int r = e / K, c = e % K;
    float acc = 0.0f;
    for (int s = 0; s <= r; ++s) acc += sPhi[r * kC + s] * sX[s * K + c];
    p.W[ix.hk(t0 + r, j) + c] = DT::raw(acc);
  }
  for (int e = tid; e < L * V; e += kThreads) {
    const int r = e / V, c = e % V;
    float acc = 0.0f;
    for (int s = 0; s <= r; ++s) acc += sPhi[r * kC + s] * sU[s * V + c];
    p.U[ix.vv(t0 + r, j) + c] = DT::raw(acc);
  }
}

}  // namespace kcp::kernels::cuda
