// The fp32 fold chain of kernels/api/fold.h, and a fill. Included only by fold.cu.
//
// fold_kernel: grid HV * tiles, block (value head j, 32-column tile) = (b / tiles, b % tiles),
//   256 threads. Tiles [0, V/32) walk X[:, c0 : c0 + 32] (columns of X are independent:
//   X_{i+1} = op(A_i) X_i + b_i), tiles [V/32, V/32 + K/32) walk the composed transfer
//   C_{i+1} = op(A_i) C_i from C_0 = I. Each item op(A_i) (K x K, fp32) is staged in shared
//   memory (padded rows); each thread keeps 16 row accumulators; sums run over the inner index
//   in increasing order, then + b (the
//   twin's order), fp32 throughout (never rounded: docs/algorithm.md 7.2). A block reads its columns of
//   x0 before writing the same columns of x_final, so x_final may alias x0.
//   Shared memory: (K x (K+1) + 2 K x 33) fp32.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace kcp::kernels::cuda {

struct FoldParams {
  int HV, K, V, n;
  const float* A;  // item i at A + i * A_stride: [HV, K, K]
  int64_t A_stride;
  int transpose_A;
  const float* b;  // item i at b + i * b_stride: [HV, K, V]
  int64_t b_stride;
  const float* x0;       // [HV, K, V] or null
  float* states_before;  // item i at states_before + i * states_stride, or null
  int64_t states_stride;
  float* x_final;   // [HV, K, V] or null
  float* composed;  // [HV, K, K] or null
  int xtiles;       // V / 32 when x_final or states_before is wanted, else 0
};

__global__ void __launch_bounds__(256) fold_kernel(FoldParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int K = p.K, V = p.V, Ald = K + 1;
  float* sA = reinterpret_cast<float*>(smem_raw);
  float* sX = sA + K * Ald;
  float* sXn = sX + K * 33;
  const int tiles = p.xtiles + (p.composed ? K / 32 : 0);
  const int j = blockIdx.x / tiles, tile = blockIdx.x % tiles;
  const bool ctile = tile >= p.xtiles;
  const int c0 = (ctile ? tile - p.xtiles : tile) * 32;
  const int c = threadIdx.x % 32, rg = threadIdx.x / 32;
  const int64_t KV = int64_t(K) * V, KK = int64_t(K) * K;
  const int W = ctile ? K : V;  // row length of the walked matrix

  for (int r = rg; r < K; r += 8) {
    float x;
    if (ctile)
      x = (r == c0 + c) ? 1.0f : 0.0f;
    else
      x = p.x0 ? p.x0[j * KV + int64_t(r) * V + c0 + c] : 0.0f;
    sX[r * 33 + c] = x;
  }
  for (int it = 0; it < p.n; ++it) {
    __syncthreads();
    if (!ctile && p.states_before)
      for (int r = rg; r < K; r += 8)
        p.states_before[it * p.states_stride + j * KV + int64_t(r) * V + c0 + c] = sX[r * 33 + c];
    // Work nobody reads is skipped (fold.h): the state after the last item when x_final is not
    // wanted, and op(A_0) X_0 when X_0 is zero (x0 null), where X_1 = 0 + b_0 (the same bits).
    if (!ctile && !p.x_final && it + 1 == p.n) break;
    if (!ctile && !p.x0 && it == 0) {
      const float* b0 = p.b + j * KV;
      for (int r = rg; r < K; r += 8) sX[r * 33 + c] = 0.0f + b0[int64_t(r) * V + c0 + c];
      continue;
    }
    const float* A = p.A + it * p.A_stride + j * KK;
#pragma unroll 8
    for (int e = threadIdx.x; e < K * K; e += blockDim.x) {
      const int ga = e / K, gb = e % K;
      const float v = __ldg(A + e);
      if (p.transpose_A)
        sA[gb * Ald + ga] = v;
      else
        sA[ga * Ald + gb] = v;
    }
    __syncthreads();
    const float* b = ctile ? nullptr : p.b + it * p.b_stride + j * KV;
    // 16 independent accumulators per thread (rows rg + 8 q), sums over m in increasing order.
    float acc[16];
#pragma unroll
    for (int q = 0; q < 16; ++q) acc[q] = 0.0f;
    const int nq = K / 8;
    for (int m = 0; m < K; ++m) {
      const float x = sX[m * 33 + c];
#pragma unroll
      for (int q = 0; q < 16; ++q)
        if (q < nq) acc[q] += sA[(rg + 8 * q) * Ald + m] * x;
    }
#pragma unroll
    for (int q = 0; q < 16; ++q) {
      if (q >= nq) break;
      const int r = rg + 8 * q;
      sXn[r * 33 + c] = b ? acc[q] + b[int64_t(r) * V + c0 + c] : acc[q];
    }
    __syncthreads();
    for (int r = rg; r < K; r += 8) sX[r * 33 + c] = sXn[r * 33 + c];
  }
  __syncthreads();
  float* out = ctile ? p.composed + j * KK : p.x_final ? p.x_final + j * KV : nullptr;
  if (out)
    for (int r = rg; r < K; r += 8) out[int64_t(r) * W + c0 + c] = sX[r * 33 + c];
}

template <class T>
__global__ void fill_kernel(T* dst, T value, int64_t n) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += int64_t(gridDim.x) * blockDim.x)
    dst[e] = value;
}

}  // namespace kcp::kernels::cuda
