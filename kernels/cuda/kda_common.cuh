// Shared pieces of the KDA kernels (kernels/cuda/kda_*_kernel.cuh): tensor offsets, the decoding
// of a block's (chunk, value head) work item, and staging of rows into fp32 shared-memory tiles.
// Included only by kernels/cuda/kda_*.cu (through the *_kernel.cuh files).
//
// Every KDA kernel keeps the CPU twin's rounding points (kernels/cpu/kda_chunk_fwd.cpp, wy.cpp,
// kda_chunk_bwd.cpp, finalize.cpp: [K1]-[K3], [W1]-[W3], [S1]-[S5], [B1]-[B4], [E1]-[E5],
// [F1]-[F3]): dtype values are rounded where the twin rounds. The products run on tensor cores
// with dtype operands and fp32 accumulation in a fixed fragment order: mma.sync in the WY factors
// (kda_wy_kernel.cuh), the output and local dv (kda_chunk_fwd_kernel.cuh), kda_bwd_inter_kernel
// and kda_bwd_wy_kernel; wgmma + TMA in the four state walks on sm_90a (gdn_walk_wgmma.cuh, K = V;
// the backward ones read qs from kda_qs.cu), else the mma.sync walk (gdn_chunk_state_kernel.cuh,
// KDA = true). The rest (gates, cumsums, the F5-pivot intra blocks, finalize) is fp32 on CUDA
// cores, each output element one thread's sum in a fixed order; row sums over K (dbeta, dA_log)
// are fixed-order warp or block reductions. No atomics: det and nondet run the same kernels and
// every result is bitwise reproducible; results differ from the twin by the order of fp32 sums.
//
// Per-channel gates and the sign of the exponents (docs/algorithm.md 7.1, 7.5). gcum holds the
// chunk-local inclusive cumsum lambda of the natural-log decay a <= 0 per channel, in log2 units,
// so along a chunk it is non-increasing in every channel: g_r[d] <= g_s[d] for r >= s. Every
// exponential is exp2 of such a difference, evaluated elementwise per pair and channel:
//   Pi / Aqk and the intra backward: exp2(g_r[d] - g_s[d]) for the pair (r, s) with r >= s only;
//   kg, the inter-chunk dK: exp2(g_last[d] - g_r[d]); qg, Gam: exp2(g_r[d]), exp2(g_last[d]).
// All exponents are <= 0, so no factor exceeds 1 and nothing overflows. The exceptions to the
// per-pair form are the prep's Pi / Aqk (kda_prep_kernel.cuh) and the intra backward
// (kda_bwd_intra_kernel, kda_chunk_bwd_kernel.cuh): their off-diagonal 16 x 16 blocks use the F5
// pivot at the row sub-block's first row p, exp2(g_r - g_p) exp2(g_p - g_s), both exponents <= 0
// (docs/algorithm.md 7.5); their diagonal blocks stay per pair. Masked pairs (s > r, or a row,
// column or pivot beyond the chunk's L rows) are never evaluated: the loops skip them or select 0,
// and rows beyond the chunk are staged as zeros, never read from memory.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace kcp::kernels::cuda {

// Offsets into the token-major tensors of kernels/api/tensors.h (KDA: gate width K).
struct KdaIx {
  int64_t H, HV, K, V;
  __device__ __forceinline__ int64_t qk(int64_t t, int i) const { return (t * H + i) * K; }   // [T, H, K]
  __device__ __forceinline__ int64_t vv(int64_t t, int j) const { return (t * HV + j) * V; }  // [T, HV, V]
  // [T, HV, K]: gcum, kg, W, dq_hv, dk_hv, dlam, g, dg
  __device__ __forceinline__ int64_t hk(int64_t t, int j) const { return (t * HV + j) * K; }
  __device__ __forceinline__ int64_t cc(int64_t t, int j) const { return (t * HV + j) * kC; }     // [T, HV, 64]
  __device__ __forceinline__ int64_t th(int64_t t, int j) const { return t * HV + j; }            // [T, HV]
  __device__ __forceinline__ int64_t kv(int64_t n, int j) const { return (n * HV + j) * K * V; }  // [*, HV, K, V]
  __device__ __forceinline__ int64_t kk(int64_t n, int j) const { return (n * HV + j) * K * K; }  // [*, HV, K, K]
};
__device__ __forceinline__ KdaIx kda_ix(const Shape& s) { return KdaIx{s.H, s.HV, s.K, s.V}; }

// The work item of a chunk-local kernel: item = n * HV + j (the twin's parallel_for index).
struct ChunkItem {
  int64_t n, t0;  // rank-global chunk, its first token
  int j, i, L;    // value head, its q/k head, chunk length
};
__device__ __forceinline__ ChunkItem chunk_item(const ChunkDesc* chunks, const Shape& sh, int64_t item) {
  ChunkItem w;
  w.n = item / sh.HV;
  w.j = int(item % sh.HV);
  w.i = w.j / sh.G;
  const ChunkDesc ch = chunks[w.n];
  w.L = ch.len;
  w.t0 = ch.begin;
  return w;
}

// Staging of a rows x cols tile into fp32 shared memory (row stride ld) by the whole block:
// element (r, c) = f(r, c) for r < valid, 0 otherwise (f is not called there, so nothing beyond
// the chunk is read). No barrier.
template <class F>
__device__ __forceinline__ void stage_tile(float* dst, int ld, int rows, int cols, int valid, F&& f) {
  for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) {
    const int r = e / cols, c = e % cols;
    dst[r * ld + c] = r < valid ? f(r, c) : 0.0f;
  }
}
// The same into a 16-bit shared-memory tile (raw dtype bits; f gives dtype values).
template <class DT, class F>
__device__ __forceinline__ void stage_tile16(uint16_t* dst, int ld, int rows, int cols, int valid, F&& f) {
  for (int e = threadIdx.x; e < rows * cols; e += blockDim.x) {
    const int r = e / cols, c = e % cols;
    dst[r * ld + c] = DT::raw(r < valid ? f(r, c) : 0.0f);
  }
}

}  // namespace kcp::kernels::cuda
