// WY factors (docs/algorithm.md F3), GDN. Included only by gdn_wy.cu.
//
// gdn_wy_kernel: grid NT * HV, block (chunk n, value head j) = (b / HV, b % HV), 256 threads.
//   Operands rounded as the twin does ([W1]): xb = dtype((k * beta) * exp2(g)), ub =
//   dtype(v * beta); W = Phi xb, U = Phi ub on tensor cores (dtype Phi, fp32 accumulation),
//   stored rounded to dtype for the chunk's L rows (through shared memory: coalesced 16-byte
//   row stores instead of the fragments' 4-byte ones). Shared memory (16-bit): Phi 64 x 72,
//   xb 64 x (K+8), ub 64 x (V+8).
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

  if (tid < kC) {
    const bool in = tid < L;
    sB[tid] = in ? p.beta[(t0 + tid) * HV + j] : 0.0f;
    sE[tid] = in ? exp2f(p.gcum[(t0 + tid) * HV + j]) : 0.0f;
  }
  {  // one memory round trip: Phi, k, v
    Tile16<kC, kC> tP;
    Tile16<kC, K> tk;
    Tile16<kC, V> tv;
    tP.load(p.Phi + (t0 * HV + j) * kC, int64_t(HV) * kC, L);
    tk.load(p.k + (t0 * p.sh.H + i) * K, int64_t(p.sh.H) * K, L);
    tv.load(p.v + (t0 * HV + j) * V, int64_t(HV) * V, L);
    __syncthreads();  // beta, exp2(g)
    tP.template store<DT>(sPhi, Sm::kPld);
    tk.template store<DT>(sX, Sm::kXld, [&](int r, float x) { return (x * sB[r]) * sE[r]; });  // [W1]
    tv.template store<DT>(sU, Sm::kUld, [&](int r, float x) { return x * sB[r]; });
  }
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
