// WY factors (docs/algorithm.md F3), GDN. Included only by gdn_wy.cu.
//
// gdn_wy_kernel: grid NT * HV, block (chunk n, value head j) = (b / HV, b % HV), 256 threads.
//   Operands rounded as the twin does ([W1]): xb = dtype((k * beta) * exp2(g)), ub =
//   dtype(v * beta); W = Phi xb, U = Phi ub on tensor cores (dtype Phi, fp32 accumulation),
//   stored rounded to dtype for the chunk's L rows (through shared memory: coalesced 16-byte
//   row stores instead of the fragments' 4-byte ones). Shared memory (16-bit): Phi 64 x 72,
//   xb 64 x (K+8), ub 64 x (V+8); beta, exp2(g) 64 fp32 each (44.5 KB at K = V = 128: four
//   blocks per SM, registers capped by the launch bounds). Staging is one memory round trip:
//   Phi, k, v by cp.async (raw bits, rows beyond the chunk zero-filled) in two groups in the order
//   of first use, beta and g loaded with them; once Phi and k have landed, k is rounded to xb in
//   place (scale_rows_in_place) and W's product runs while v lands; then v is rounded to ub,
//   W's rows leave while U's product runs.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace kcp::kernels::cuda {

struct WyParams {
  Shape sh;
  const ChunkDesc* chunks;
  const uint16_t* k;    // [T, H, K] dtype, 16-bit storage
  const uint16_t* v;    // [T, HV, V] dtype, 16-bit (caller storage)
  const float* beta;    // [T, HV]
  const float* gcum;    // [T, HV] fp32 log2
  const uint16_t* Phi;  // [T, HV, 64] dtype, 16-bit storage
  uint16_t* W;          // [T, HV, K] dtype, 16-bit storage
  uint16_t* U;          // [T, HV, V] dtype, 16-bit storage
};

template <int K, int V>
struct WySmem {
  static constexpr int kPld = kC + 8, kXld = K + 8, kUld = V + 8;
  static constexpr size_t bytes = (size_t(kC) * kPld + size_t(kC) * kXld + size_t(kC) * kUld) * 2 + 2 * kC * 4;
};

// [W2] acc = Phi T for a 16-bit operand tile T (64 x N, row stride LD; Phi 64 x (64+8)) on tensor
// cores, fp32 accumulation over Phi's columns [0, kend) (those beyond the chunk are zero).
template <class DT, int N, int LD>
__device__ __forceinline__ void wy_mma(typename Tiling<kC, N>::Acc& acc, const uint16_t* sPhi, const uint16_t* sT,
                                       int kend) {
  using TT = Tiling<kC, N>;
  constexpr int kPld = kC + 8;  // Phi's row stride (WySmem::kPld)
  TT::zero(acc);
  TT::template mma<DT>(acc, AView<uint16_t, true>{sPhi, kPld}, BView<uint16_t, false>{sT, LD}, 0, kend);
}

// The dtype values of wy_mma's accumulator into a 16-bit tile (row stride LD): its own operand
// tile, after a barrier (every warp has read it).
template <class DT, int N, int LD>
__device__ __forceinline__ void wy_pack(typename Tiling<kC, N>::Acc& acc, uint16_t* sT) {
  Tiling<kC, N>::pairs(acc, [&](int r, int c, float& v0, float& v1) {
    *reinterpret_cast<uint32_t*>(sT + r * LD + c) = DT::pack(v0, v1);
  });
}

// [W2] W = Phi xb, U = Phi ub of one chunk on tensor cores, from the 16-bit tiles in shared memory
// (Phi 64 x (64+8), xb 64 x (K+8), ub 64 x (V+8); rows beyond the chunk zero, as are Phi's entries
// above the diagonal), stored rounded to dtype for the chunk's L rows: W row r at W + (th0 + r HV) K,
// U likewise (th0 = t0 HV + j). Each product's dtype result replaces its own operand tile in shared
// memory (after a barrier: every warp has read the operand) and leaves in 16-byte row stores.
// Call after the barrier that publishes the tiles (the KDA WY kernel; gdn_wy_kernel runs the same
// steps with its loads interleaved).
template <class DT, int K, int V>
__device__ __forceinline__ void wy_products(uint16_t* W, uint16_t* U, int64_t th0, int HV, const uint16_t* sPhi,
                                            uint16_t* sX, uint16_t* sU, int L) {
  using Sm = WySmem<K, V>;
  const int kend = (L + 15) & ~15;  // Phi columns beyond the chunk are zero
  {
    typename Tiling<kC, K>::Acc acc;
    wy_mma<DT, K, Sm::kXld>(acc, sPhi, sX, kend);
    __syncthreads();
    wy_pack<DT, K, Sm::kXld>(acc, sX);
  }
  {
    typename Tiling<kC, V>::Acc acc;
    wy_mma<DT, V, Sm::kUld>(acc, sPhi, sU, kend);
    __syncthreads();
    wy_pack<DT, V, Sm::kUld>(acc, sU);
  }
  __syncthreads();
  store_rows16<K>(W + th0 * K, int64_t(HV) * K, sX, Sm::kXld, L);
  store_rows16<V>(U + th0 * V, int64_t(HV) * V, sU, Sm::kUld, L);
}

// Rows [0, ROWS) of a 16-bit tile in shared memory (row stride ld) replaced in place by
// dtype(f(r, x)) of their values x, 16 bytes per access (each thread rewrites only what it read;
// the expression and rounding of Tile16::store<DT>(dst, ld, f)).
template <class DT, int ROWS, int COLS, class F>
__device__ __forceinline__ void scale_rows_in_place(uint16_t* s, int ld, F&& f) {
  constexpr int V8 = COLS / 8, TOTAL = ROWS * V8, ITERS = (TOTAL + kThreads - 1) / kThreads;
  static_assert(COLS % 8 == 0, "16-byte accesses of 8 16-bit values");
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int e = threadIdx.x + it * kThreads, r = e / V8, c = (e % V8) * 8;
    if (e >= TOTAL) continue;
    uint4* q = reinterpret_cast<uint4*>(s + r * ld + c);
    const uint4 v = *q;
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    uint32_t o[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      o[u] = DT::pack(f(r, DT::from_raw(uint16_t(w[u] & 0xffffu))), f(r, DT::from_raw(uint16_t(w[u] >> 16))));
    *q = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

template <class DT, int K, int V>
__global__ void __launch_bounds__(kThreads, 4) gdn_wy_kernel(WyParams p) {
  using Sm = WySmem<K, V>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* sPhi = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* sX = sPhi + kC * Sm::kPld;
  uint16_t* sU = sX + kC * Sm::kXld;
  float* sB = reinterpret_cast<float*>(sU + kC * Sm::kUld);
  float* sE = sB + kC;  // exp2(g)

  const int HV = p.sh.HV;
  const int64_t n = blockIdx.x / HV;
  const int j = blockIdx.x % HV, i = j / p.sh.G;
  const ChunkDesc ch = p.chunks[n];
  const int L = ch.len;
  const int64_t t0 = ch.begin;
  const int64_t th0 = t0 * HV + j;
  const int tid = threadIdx.x;
  const int kend = (L + 15) & ~15;  // Phi columns beyond the chunk are zero

  // One memory round trip, in two cp.async groups in the order of first use (raw bits, rows
  // beyond the chunk zero-filled): Phi and k (W's operands), then v (U's), which lands while W's
  // product runs; beta and gcum loaded before the copies are issued.
  const bool in = tid < L;  // tid < kC
  const float b = in ? p.beta[(t0 + tid) * HV + j] : 0.0f;
  const float g = in ? p.gcum[(t0 + tid) * HV + j] : 0.0f;
  cp_async_tile<uint16_t, kC, kC>(sPhi, Sm::kPld, p.Phi + th0 * kC, int64_t(HV) * kC, L);
  cp_async_tile<uint16_t, kC, K>(sX, Sm::kXld, p.k + (t0 * p.sh.H + i) * K, int64_t(p.sh.H) * K, L);
  cp_async_commit();  // group 0: W = Phi xb
  cp_async_tile<uint16_t, kC, V>(sU, Sm::kUld, p.v + th0 * V, int64_t(HV) * V, L);
  cp_async_commit();  // group 1: U = Phi ub
  if (tid < kC) {
    sB[tid] = b;
    sE[tid] = in ? exp2f(g) : 0.0f;
  }
  cp_async_wait_group<1>();
  __syncthreads();  // Phi, k, beta, exp2(g)
  scale_rows_in_place<DT, kC, K>(sX, Sm::kXld, [&](int r, float x) { return (x * sB[r]) * sE[r]; });  // [W1]
  __syncthreads();
  {  // [W2] W = Phi xb, stored while U's product runs
    typename Tiling<kC, K>::Acc acc;
    wy_mma<DT, K, Sm::kXld>(acc, sPhi, sX, kend);
    cp_async_wait_all();
    __syncthreads();  // v; every warp has read xb
    wy_pack<DT, K, Sm::kXld>(acc, sX);
  }
  // [W1] ub
  scale_rows_in_place<DT, kC, V>(sU, Sm::kUld, [&](int r, float x) { return x * sB[r]; });
  __syncthreads();  // W's dtype rows, ub
  store_rows16<K>(p.W + th0 * K, int64_t(HV) * K, sX, Sm::kXld, L);
  {  // [W2] U = Phi ub
    typename Tiling<kC, V>::Acc acc;
    wy_mma<DT, V, Sm::kUld>(acc, sPhi, sU, kend);
    __syncthreads();  // every warp has read ub
    wy_pack<DT, V, Sm::kUld>(acc, sU);
  }
  __syncthreads();
  store_rows16<V>(p.U + th0 * V, int64_t(HV) * V, sU, Sm::kUld, L);
}

// The parameters from the phase's Args (host); the KDA WY kernel's extend them by kg.
inline WyParams wy_params(const WyArgs& a, const DevLayout& L) {
  WyParams p{};
  p.sh = shape_of(a.ctx.problem, L);
  p.chunks = L.chunks;
  p.k = a.k.packed16();
  p.v = a.v.packed16();
  p.beta = a.beta;
  p.gcum = a.gcum;
  p.Phi = a.Phi.packed16();
  p.W = a.W.packed16();
  p.U = a.U.packed16();
  return p;
}

}  // namespace kcp::kernels::cuda
