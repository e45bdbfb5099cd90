// WY factors (docs/algorithm.md F3), GDN. Included only by gdn_wy.cu.
//
// gdn_wy_kernel: grid NT * HV, block (chunk n, value head j) = (b / HV, b % HV), 256 threads.
//   Operands rounded as the twin does ([W1]): xb = dtype((k * beta) * exp2(g)), ub =
//   dtype(v * beta); W = Phi xb, U = Phi ub on tensor cores (dtype Phi, fp32 accumulation),
//   stored rounded to dtype for the chunk's L rows (through shared memory: coalesced 16-byte
//   row stores instead of the fragments' 4-byte ones). Shared memory (16-bit): Phi 64 x 72,
//   xb 64 x (K+8), ub 64 x (V+8); beta, exp2(g) 64 fp32 each. Staging is one memory round trip:
//   Phi, k, v by cp.async (raw bits, rows beyond the chunk zero-filled), beta and g loaded with
//   them; after the barrier the k and v tiles are rounded to xb, ub in place (scale_rows_in_place).
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

// [W2] W = Phi xb, U = Phi ub of one chunk on tensor cores, from the 16-bit tiles in shared memory
// (Phi 64 x (64+8), xb 64 x (K+8), ub 64 x (V+8); rows beyond the chunk zero, as are Phi's entries
// above the diagonal), stored rounded to dtype for the chunk's L rows: W row r at W + (th0 + r HV) K,
// U likewise (th0 = t0 HV + j). Each product's dtype result replaces its own operand tile in shared
// memory (after a barrier: every warp has read the operand) and leaves in 16-byte row stores.
// Call after the barrier that publishes the tiles; shared by the GDN and KDA WY kernels.
template <class DT, int K, int V>
__device__ __forceinline__ void wy_products(uint16_t* W, uint16_t* U, int64_t th0, int HV, const uint16_t* sPhi,
                                            uint16_t* sX, uint16_t* sU, int L) {
  using Sm = WySmem<K, V>;
  const int kend = (L + 15) & ~15;  // Phi columns beyond the chunk are zero
  {
    using TW = Tiling<kC, K>;
    float acc[TW::MT][TW::NT][4];
    TW::zero(acc);
    TW::template mma<DT>(acc, AView<uint16_t, true>{sPhi, Sm::kPld}, BView<uint16_t, false>{sX, Sm::kXld}, 0, kend);
    __syncthreads();
    TW::pairs(acc, [&](int r, int c, float& v0, float& v1) {
      *reinterpret_cast<uint32_t*>(sX + r * Sm::kXld + c) = DT::pack(v0, v1);
    });
  }
  {
    using TU = Tiling<kC, V>;
    float acc[TU::MT][TU::NT][4];
    TU::zero(acc);
    TU::template mma<DT>(acc, AView<uint16_t, true>{sPhi, Sm::kPld}, BView<uint16_t, false>{sU, Sm::kUld}, 0, kend);
    __syncthreads();
    TU::pairs(acc, [&](int r, int c, float& v0, float& v1) {
      *reinterpret_cast<uint32_t*>(sU + r * Sm::kUld + c) = DT::pack(v0, v1);
    });
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
__global__ void __launch_bounds__(kThreads, 2) gdn_wy_kernel(WyParams p) {
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
  const int tid = threadIdx.x;

  // One memory round trip: Phi, k, v by cp.async (raw bits, rows beyond the chunk zero-filled),
  // beta and gcum loaded before the copies are issued.
  const bool in = tid < L;  // tid < kC
  const float b = in ? p.beta[(t0 + tid) * HV + j] : 0.0f;
  const float g = in ? p.gcum[(t0 + tid) * HV + j] : 0.0f;
  cp_async_rows<uint16_t, kC, kC>(sPhi, Sm::kPld, p.Phi + (t0 * HV + j) * kC, int64_t(HV) * kC, L);
  cp_async_rows<uint16_t, kC, K>(sX, Sm::kXld, p.k + (t0 * p.sh.H + i) * K, int64_t(p.sh.H) * K, L);
  cp_async_rows<uint16_t, kC, V>(sU, Sm::kUld, p.v + (t0 * HV + j) * V, int64_t(HV) * V, L);
  cp_async_commit();
  if (tid < kC) {
    sB[tid] = b;
    sE[tid] = in ? exp2f(g) : 0.0f;
  }
  cp_async_wait_all();
  __syncthreads();  // tiles, beta, exp2(g)
  scale_rows_in_place<DT, kC, K>(sX, Sm::kXld, [&](int r, float x) { return (x * sB[r]) * sE[r]; });  // [W1]
  scale_rows_in_place<DT, kC, V>(sU, Sm::kUld, [&](int r, float x) { return x * sB[r]; });
  __syncthreads();
  wy_products<DT, K, V>(p.W, p.U, t0 * HV + j, HV, sPhi, sX, sU, L);
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
