// WY factors (docs/algorithm.md F3), KDA, the CPU twin's wy.cpp [W1]-[W3]. Included only by
// kda_wy.cu.
//
// kda_wy_kernel: grid NT * HV, block (chunk n, value head j) = (b / HV, b % HV), kThreads; the
//   GDN WY kernel (gdn_wy_kernel.cuh) with per-channel gates. One memory round trip: Phi, k, v
//   (16-bit storage) and gcum (fp32, per channel: GateTile16) through registers, then
//   [W1] xb = dtype((k beta) exp2(g)) per element and ub = dtype(v beta) into 16-bit shared memory
//   (the operands the twin rounds, at the same points), [W3] kg = dtype(k exp2(g_last - g))
//   (exponent <= 0, docs/algorithm.md 7.5) from the same registers straight to global memory
//   (16-bit storage, one 16-byte store per 8 channels; rows < L only), and [W2] W = Phi xb, U = Phi ub on
//   tensor cores (wy_products: mma.sync m16n8k16 with ldmatrix, dtype Phi, fp32 accumulation),
//   stored rounded to dtype for the chunk's L rows.
//   Every operand of [W2] is a dtype value in the twin too, so the 16-bit operands are exact and
//   the GPU differs from the twin only by the order of the fp32 sums (the twin: s ascending). kg
//   is no operand here; the state walks read it as GDN's read k (16-bit tiles). Rows beyond the
//   chunk are staged as zeros
//   (never read from memory; their gate reads 0, exp2(0) = 1, times k = 0 and beta = 0).
//   Deterministic: no atomics, every output element written once by one thread.
//   Shared memory: (16-bit) Phi 64 x 72, xb 64 x (K+8), ub 64 x (V+8); (fp32) beta 64, g_last K
//   (K = V = 128: 44,800 bytes).
#pragma once

#include "kernels/cuda/gdn_wy_kernel.cuh"  // WyParams, WySmem, wy_products
#include "kernels/cuda/kda_common.cuh"

namespace kcp::kernels::cuda {

// The GDN WY parameters (gdn_wy_kernel.cuh: k, v, beta, gcum, Phi, W, U) plus kg.
struct KdaWyParams : WyParams {
  uint16_t* kg;  // [T, HV, K] dtype, 16-bit storage
};

template <int K, int V>
struct KdaWySmem {
  using Tiles = WySmem<K, V>;  // the 16-bit tiles of wy_products
  static constexpr size_t bytes =
      (size_t(kC) * Tiles::kPld + size_t(kC) * Tiles::kXld + size_t(kC) * Tiles::kUld) * 2 + (size_t(kC) + K) * 4;
};

// [W3] kg = dtype(k exp2(g_last - g)) per channel for the elements of the k and gcum tiles this
// thread holds (8 channels of one row per 16-byte load of k), rows < L only, one 16-byte store
// per load. kg: the chunk's first row; sgL: g_last, K floats of shared memory.
template <class DT, int K>
__device__ __forceinline__ void store_kg(uint16_t* kg, int64_t stride, const Tile16<kC, K>& tk,
                                         const GateTile16<kC, K>& tg, const float* sgL, int L) {
  using T16 = Tile16<kC, K>;
#pragma unroll
  for (int it = 0; it < T16::ITERS; ++it) {
    const int e = threadIdx.x + it * kThreads, r = e / T16::V8, c = (e % T16::V8) * 8;
    if (e >= T16::TOTAL || r >= L) continue;
    const uint32_t w[4] = {tk.v[it].x, tk.v[it].y, tk.v[it].z, tk.v[it].w};
    const float4 gl0 = *reinterpret_cast<const float4*>(sgL + c);
    const float4 gl1 = *reinterpret_cast<const float4*>(sgL + c + 4);
    const float gl[8] = {gl0.x, gl0.y, gl0.z, gl0.w, gl1.x, gl1.y, gl1.z, gl1.w};
    float o[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const float x = DT::from_raw(uint16_t((u & 1) ? (w[u / 2] >> 16) : (w[u / 2] & 0xffffu)));
      o[u] = x * exp2f(gl[u] - tg.at(it, u));
    }
    *reinterpret_cast<uint4*>(kg + r * stride + c) =
        make_uint4(DT::pack(o[0], o[1]), DT::pack(o[2], o[3]), DT::pack(o[4], o[5]), DT::pack(o[6], o[7]));
  }
}

template <class DT, int K, int V>
__global__ void __launch_bounds__(kThreads, 2) kda_wy_kernel(KdaWyParams p) {
  using Sm = WySmem<K, V>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* sPhi = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* sX = sPhi + kC * Sm::kPld;
  uint16_t* sU = sX + kC * Sm::kXld;
  float* sB = reinterpret_cast<float*>(sU + kC * Sm::kUld);
  float* sgL = sB + kC;  // g_last per channel

  const KdaIx ix = kda_ix(p.sh);
  const ChunkItem w = chunk_item(p.chunks, p.sh, blockIdx.x);
  const int L = w.L, j = w.j, i = w.i, HV = p.sh.HV;
  const int64_t t0 = w.t0;
  const int tid = threadIdx.x;

  if (tid < kC) sB[tid] = tid < L ? p.beta[ix.th(t0 + tid, j)] : 0.0f;
  if (tid < K) sgL[tid] = L > 0 ? p.gcum[ix.hk(t0 + L - 1, j) + tid] : 0.0f;
  {  // one memory round trip: Phi, k, gcum, v
    Tile16<kC, kC> tP;
    Tile16<kC, K> tk;
    GateTile16<kC, K> tg;
    Tile16<kC, V> tv;
    tP.load(p.Phi + ix.cc(t0, j), int64_t(HV) * kC, L);
    tk.load(p.k + ix.qk(t0, i), int64_t(p.sh.H) * K, L);
    tg.load(p.gcum + ix.hk(t0, j), int64_t(HV) * K, L);
    tv.load(p.v + ix.vv(t0, j), int64_t(HV) * V, L);
    __syncthreads();  // beta, g_last
    tP.template store<DT>(sPhi, Sm::kPld);
    tk.template store_by_elem<DT>(sX, Sm::kXld, [&](int it, int r, int u, float x) {  // [W1] xb
      return (x * sB[r]) * exp2f(tg.at(it, u));
    });
    store_kg<DT, K>(p.kg + ix.hk(t0, j), int64_t(HV) * K, tk, tg, sgL, L);           // [W3]
    tv.template store<DT>(sU, Sm::kUld, [&](int r, float x) { return x * sB[r]; });  // [W1] ub
  }
  __syncthreads();
  wy_products<DT, K, V>(p.W, p.U, t0 * HV + j, HV, sPhi, sX, sU, L);  // [W2]
}

}  // namespace kcp::kernels::cuda
