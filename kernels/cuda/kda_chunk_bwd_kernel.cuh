// KDA backward gradients per (chunk, value head), docs/algorithm.md 3.2 steps 2, 4 and 5, with the
// rounding points [E1]-[E5] of the CPU twin (kernels/cpu/kda_chunk_bwd.cpp, wy_bwd_common.h).
// Included only by kda_chunk_bwd.cu.
//
// Three kernels, each grid NT * HV, block (chunk n, value head j) = (b / HV, b % HV), kThreads;
// they pass partial results through dq_hv, dk_hv, dlam, dbeta (each block owns its chunk's rows)
// and the backend's scratch (dW16, dAqk, dAkk), and add the twin's terms in the twin's order:
// kda_bwd_inter_kernel (step 4 inter part [E1], step 2 [E3]): four tensor-core products over V
//   (dtype operands, fp32 accumulation; issue 16 item 5), each 64 x K or 64 x 64 on 8 warps:
//   dW = dtype(-(dv2 h^T)) -> dW16; dAqk[r][s] = scale (dO v_new^T)[r][s] for s <= r (0 above)
//   -> scratch; dQi = (dO h^T)[r][x] exp2(g_r[x]) scale, dKint = (v_new dh^T)[r][x]
//   exp2(g_L[x] - g_r[x]); dq_hv = dQi, dk_hv = dKint, dlam = q dQi - k dKint; then a thread per
//   channel x adds dg_last[x] = Gam[x] (h dh^T)[x][x] + sum_r k dKint to the last row. Inputs in
//   one memory round trip: every tile by cp.async (gcum in a second group, waited for after the
//   products), q and k at the thread's fragment pairs into registers; the epilogue and the tail
//   read only registers and shared memory.
//   Shared memory (KdaInterSmem): (16-bit) dO, v_new, dv2 64 x (V+8); h, dh K x (V+8); (fp32)
//   gcum 64 x (K+8), overwritten by dKint; g_L K; after the products k 64 x (K+8) over dO, v_new
//   and the last row's dlam over dv2 (K = V = 128: 157,184 bytes, one block per SM; K = V = 64:
//   64,768 bytes, three).
// kda_bwd_wy_kernel (step 4 WY part [E2], [E5]): staging in one memory round trip: dW, dv2, Phi
//   by cp.async, k, gcum, v through registers into [E2] xb = dtype((k beta) exp2(g)) and
//   ub = dtype(v beta). On tensor cores (dtype operands, fp32 accumulation; issue 16 item 5):
//   dPhi = dW Xb^T + dv2 Yb^T (s < r, 64 x 64), dX = Phi^T dW (64 x K) and dY = Phi^T dv2 (64 x V)
//   (terms m >= r; Phi is 0 above the diagonal), dX, dY kept fp32 in shared memory over the dW, Xb
//   and dv2, Yb tiles; phi_backward's first product T1 = dtype(stril(dtype(dPhi)) Phi^T), then
//   dAkk = -stril(Phi^T T1) -> scratch. Then a warp per row r, lanes over channels, two rows per
//   warp step (their global operands all loaded before the step's first store; the first step's
//   loads are in flight during dAkk's product): dk_hv += dX beta exp2(g), dlam += dX X,
//   dv = dtype(beta dY), dbeta = sum dX k exp2(g) + sum dY v (lane partials, fixed-order warp sum).
//   Shared memory (16-bit, ldmatrix rows): dW, Xb 64 x (K+8); dv2, Yb 64 x (V+8); Phi, dPhi, T1
//   64 x 72; (fp32) beta 64 (K = V = 128: 97,536 bytes, two blocks per SM; K = V = 64: three).
// kda_bwd_intra_kernel (step 5 [E4]): thread (part, channel c), part = tid / K; the chunk's four
//   16-row sub-chunks are units, K = 128: part 0 owns units {0, 3}, part 1 {1, 2}; K = 64: unit
//   = part. A unit B (rows and columns 16 B .. 16 B + 15, channel c) computes, all fp32 (7.6):
//   * off the diagonal (F5 / 7.5, pivot p = 16 R, the first row of the later sub-chunk R):
//     row side dq2_r, dk2n_r = exp2(g_r - g_p) sum_{s < p} dA[r][s] (k_s exp2(g_p - g_s)) for its
//     rows (R = B), column side dkt_s += exp2(g_p - g_s) sum_{r in R} (dAqk q_r + dAkk beta_r k_r)
//     exp2(g_r - g_p) for its columns and each R > B; gated operands formed once per (row, pivot);
//   * its diagonal block per pair (r, s) and channel with exp2(g_r - g_s), both sides, as the twin;
//   then dq_hv += dq2, dk_hv += dk2 + dkt, dlam += q dq2 + k (dk2 - dkt) for its rows (one memory
//   round trip: the unit's 48 old values loaded at once) and the dbeta terms k dk2n, summed over
//   channels in a fixed order (butterfly, then warps in order).
//   Each output is one thread's sum: deterministic, no atomics. Rows, columns and pivots beyond L
//   are skipped or selected 0, never exponentiated (7.1). The twin differs by fp32 reassociation.
//   Shared memory (cp.async): q, k 16-bit 64 x K; gcum fp32 64 x K; dAqk, dAkk fp32 64 x 64; beta
//   and dbeta (loaded with the tiles); dbeta partials (K = 128: 99,840 bytes, two blocks per SM).
#pragma once

#include "kernels/cuda/gdn_chunk_bwd_kernel.cuh"  // GradParams
#include "kernels/cuda/kda_common.cuh"

namespace kcp::kernels::cuda {

// The GDN parameters (gdn_chunk_bwd_kernel.cuh; dlam_hi unused, dW16: dW = dtype(-dv2 h^T)) plus
// the scratch of the intra part.
struct KdaGradParams : GradParams {
  float* dAqk;  // [T, HV, 64] fp32, scratch: scale tril(dO v_new^T)
  float* dAkk;  // [T, HV, 64] fp32, scratch: -stril(Phi^T dtype(...) ...)
};

// Shared memory of kda_bwd_inter_kernel (byte offsets). 16-bit tiles read by ldmatrix (ld V + 8,
// cuda_common.cuh): dO, v_new, dv2 64 x V; h, dh K x V. fp32: gcum 64 x K (ld K + 8: the
// epilogue's float2 fragment accesses are conflict-free), overwritten in place by dKint; g_L K.
// After the products (dead tiles): k 16-bit 64 x (K + 8) over dO, v_new; the last row's dlam
// (fp32 K) over dv2.
template <int K, int V>
struct KdaInterSmem {
  static constexpr int kVld = V + 8, kGld = K + 8, kKld = K + 8;
  static constexpr size_t tile = size_t(kC) * kVld * 2, state = size_t(K) * kVld * 2;
  static constexpr size_t dO = 0, vn = dO + tile, dv = vn + tile, h = dv + tile, dh = h + state;
  static constexpr size_t g = dh + state, gL = g + size_t(kC) * kGld * 4;
  static constexpr size_t bytes = gL + size_t(K) * 4;
  static constexpr size_t k16 = dO, dl = dv;
  static_assert(k16 + size_t(kC) * kKld * 2 <= dv && dl + size_t(K) * 4 <= h, "k, dlam over dead tiles");
};

// Waits until at most one committed cp.async group is in flight (the older groups have landed).
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// f(mt, nt, h, r, x) for the element pairs (r, x), (r, x + 1) of a TK = Tiling<...> accumulator
// that the thread holds, in Tiling::zip_pairs' order (mt, nt, h: compile-time after unrolling).
template <class TK, class F>
__device__ __forceinline__ void frag_pairs(F&& f) {
  const int g = lane_id() >> 2, t = lane_id() & 3, r0 = TK::m0(), c0 = TK::n0();
#pragma unroll
  for (int mt = 0; mt < TK::MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < TK::NT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) f(mt, nt, h, r0 + mt * 16 + g + 8 * h, c0 + nt * 8 + 2 * t);
}

// q, k at the thread's dQi / dKint fragment pairs (r, x), (r, x + 1) (Tiling<kC, K>::zip_pairs'
// order), raw 16-bit pairs; rows beyond L are 0, never read. load() only issues the loads, so they
// are in flight during the products.
template <int K>
struct InterQK {
  using TK = Tiling<kC, K>;
  uint32_t q[TK::MT][TK::NT][2], k[TK::MT][TK::NT][2];
  __device__ __forceinline__ void load(const KdaGradParams& p, const KdaIx& ix, const ChunkItem& w) {
    frag_pairs<TK>([&](int mt, int nt, int h, int r, int x) {
      const bool in = r < w.L;
      const int64_t a = ix.qk(w.t0 + (in ? r : 0), w.i) + x;
      q[mt][nt][h] = in ? __ldg(reinterpret_cast<const unsigned int*>(p.q + a)) : 0u;
      k[mt][nt][h] = in ? __ldg(reinterpret_cast<const unsigned int*>(p.k + a)) : 0u;
    });
  }
};

// Every input of the block in one memory round trip (cp.async, rows beyond L zero-filled, never
// read): group 0 the product operands dO, v_new, dv2, h, dh and g_L; group 1 gcum (the epilogue's).
template <int K, int V>
__device__ __forceinline__ void inter_stage(const KdaGradParams& p, const KdaIx& ix, const ChunkItem& w,
                                            unsigned char* smem) {
  using Sm = KdaInterSmem<K, V>;
  const int64_t ldv = ix.HV * V;
  cp_async_rows<uint16_t, kC, V>(reinterpret_cast<uint16_t*>(smem + Sm::dO), Sm::kVld, p.dO + ix.vv(w.t0, w.j), ldv,
                                 w.L);
  cp_async_rows<uint16_t, kC, V>(reinterpret_cast<uint16_t*>(smem + Sm::vn), Sm::kVld, p.v_new + ix.vv(w.t0, w.j), ldv,
                                 w.L);
  cp_async_rows<uint16_t, kC, V>(reinterpret_cast<uint16_t*>(smem + Sm::dv), Sm::kVld, p.dv2 + ix.vv(w.t0, w.j), ldv,
                                 w.L);
  cp_async_rows<uint16_t, K, V>(reinterpret_cast<uint16_t*>(smem + Sm::h), Sm::kVld, p.h + ix.kv(w.n, w.j), V, K);
  cp_async_rows<uint16_t, K, V>(reinterpret_cast<uint16_t*>(smem + Sm::dh), Sm::kVld, p.dh + ix.kv(w.n, w.j), V, K);
  cp_async_rows<float, 1, K>(reinterpret_cast<float*>(smem + Sm::gL), K, p.gcum + ix.hk(w.t0 + w.L - 1, w.j), 0, 1);
  cp_async_commit();
  cp_async_rows<float, kC, K>(reinterpret_cast<float*>(smem + Sm::g), Sm::kGld, p.gcum + ix.hk(w.t0, w.j), ix.HV * K,
                              w.L);
  cp_async_commit();
}

// [E1] per fragment pair (r, x), (r, x + 1), r < L, from the accumulators aq = dO h^T and
// ak = v_new dh^T: dQi = aq exp2(g_r) scale, dKint = ak exp2(g_L - g_r); dq_hv = dQi,
// dk_hv = dKint, dlam = q dQi - k dKint. For the tail: dKint over its gcum (each element read,
// then written, by its one thread), k's raw pair to the k tile, the last row's dlam.
template <class DT, int K, int V>
__device__ __forceinline__ void inter_epilogue(const KdaGradParams& p, const KdaIx& ix, const ChunkItem& w,
                                               const typename Tiling<kC, K>::Acc& aq,
                                               const typename Tiling<kC, K>::Acc& ak, const InterQK<K>& qk,
                                               unsigned char* smem) {
  using Sm = KdaInterSmem<K, V>;
  using TK = Tiling<kC, K>;
  constexpr int gld = Sm::kGld, kld = Sm::kKld;
  float* sG = reinterpret_cast<float*>(smem + Sm::g);
  const float* sgL = reinterpret_cast<const float*>(smem + Sm::gL);
  uint16_t* sk = reinterpret_cast<uint16_t*>(smem + Sm::k16);
  float* sdl = reinterpret_cast<float*>(smem + Sm::dl);
  const float scale = p.sh.scale;
  frag_pairs<TK>([&](int mt, int nt, int h, int r, int x) {
    if (r >= w.L) return;
    const float q0 = aq[mt][nt][2 * h], q1 = aq[mt][nt][2 * h + 1];
    const float k0 = ak[mt][nt][2 * h], k1 = ak[mt][nt][2 * h + 1];
    const int64_t at = ix.hk(w.t0 + r, w.j) + x;
    float2* gs = reinterpret_cast<float2*>(sG + r * gld + x);
    const float2 gr = *gs;
    const float dQ0 = q0 * exp2f(gr.x) * scale, dQ1 = q1 * exp2f(gr.y) * scale;
    const float dK0 = k0 * exp2f(sgL[x] - gr.x), dK1 = k1 * exp2f(sgL[x + 1] - gr.y);
    *reinterpret_cast<float2*>(p.dq_hv + at) = make_float2(dQ0, dQ1);
    *reinterpret_cast<float2*>(p.dk_hv + at) = make_float2(dK0, dK1);
    *gs = make_float2(dK0, dK1);
    const uint32_t qq = qk.q[mt][nt][h], kk = qk.k[mt][nt][h];
    *reinterpret_cast<uint32_t*>(sk + r * kld + x) = kk;
    const float qx0 = DT::from_raw(uint16_t(qq & 0xffffu)), qx1 = DT::from_raw(uint16_t(qq >> 16));
    const float kx0 = DT::from_raw(uint16_t(kk & 0xffffu)), kx1 = DT::from_raw(uint16_t(kk >> 16));
    const float2 dl = make_float2(qx0 * dQ0 - kx0 * dK0, qx1 * dQ1 - kx1 * dK1);
    *reinterpret_cast<float2*>(p.dlam + at) = dl;
    if (r == w.L - 1) *reinterpret_cast<float2*>(sdl + x) = dl;
  });
}

// dg_last on the last row, a thread per channel x < K: dlam[L - 1][x] = (its epilogue value) +
// (Gam[x] (h dh^T)[x][x] + sum_{r < L} k[r][x] dKint[r][x]), sums ascending; operands in shared
// memory (h, dh rows by 16-byte loads, conflict-free: ld V + 8).
template <class DT, int K, int V>
__device__ __forceinline__ void inter_tail(const KdaGradParams& p, const KdaIx& ix, const ChunkItem& w,
                                           const unsigned char* smem) {
  using Sm = KdaInterSmem<K, V>;
  if (int(threadIdx.x) >= K) return;
  const int x = threadIdx.x;
  const uint16_t* hx = reinterpret_cast<const uint16_t*>(smem + Sm::h) + x * Sm::kVld;
  const uint16_t* dhx = reinterpret_cast<const uint16_t*>(smem + Sm::dh) + x * Sm::kVld;
  const uint16_t* sk = reinterpret_cast<const uint16_t*>(smem + Sm::k16);
  const float* sKint = reinterpret_cast<const float*>(smem + Sm::g);
  float acc = 0.0f;
#pragma unroll 4
  for (int c = 0; c < V; c += 8) {
    const uint4 a = *reinterpret_cast<const uint4*>(hx + c), b = *reinterpret_cast<const uint4*>(dhx + c);
    const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      acc += DT::from_raw(uint16_t(wa[u] & 0xffffu)) * DT::from_raw(uint16_t(wb[u] & 0xffffu));
      acc += DT::from_raw(uint16_t(wa[u] >> 16)) * DT::from_raw(uint16_t(wb[u] >> 16));
    }
  }
  acc *= exp2f(reinterpret_cast<const float*>(smem + Sm::gL)[x]);
  for (int r = 0; r < w.L; ++r) acc += DT::from_raw(sk[r * Sm::kKld + x]) * sKint[r * Sm::kGld + x];
  p.dlam[ix.hk(w.t0 + w.L - 1, w.j) + x] = reinterpret_cast<const float*>(smem + Sm::dl)[x] + acc;
}

template <class DT, int K, int V>
__global__ void __launch_bounds__(kThreads) kda_bwd_inter_kernel(KdaGradParams p) {
  using Sm = KdaInterSmem<K, V>;
  using TK = Tiling<kC, K>;   // 64 x K products over V
  using TA = Tiling<kC, kC>;  // 64 x 64 dAqk
  constexpr int ld = Sm::kVld;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint16_t* sdO = reinterpret_cast<const uint16_t*>(smem_raw + Sm::dO);
  const uint16_t* svn = reinterpret_cast<const uint16_t*>(smem_raw + Sm::vn);
  const uint16_t* sdv = reinterpret_cast<const uint16_t*>(smem_raw + Sm::dv);
  const uint16_t* sS = reinterpret_cast<const uint16_t*>(smem_raw + Sm::h);
  const uint16_t* sdS = reinterpret_cast<const uint16_t*>(smem_raw + Sm::dh);

  const KdaIx ix = kda_ix(p.sh);
  const ChunkItem w = chunk_item(p.chunks, p.sh, blockIdx.x);
  const int L = w.L, j = w.j;
  const int64_t t0 = w.t0;
  const float scale = p.sh.scale;

  inter_stage<K, V>(p, ix, w, smem_raw);
  InterQK<K> qk;
  qk.load(p, ix, w);
  cp_async_wait_one();  // the product operands (group 0)
  __syncthreads();

  const AView<uint16_t, true> dO{sdO, ld}, vn{svn, ld}, dv{sdv, ld};
  const BView<uint16_t, true> hT{sS, ld}, dhT{sdS, ld}, vnT{svn, ld};
  {  // [E1] dW = dtype(-(dv2 h^T)) -> dW16
    float aw[TK::MT][TK::NT][4];
    TK::zero(aw);
    TK::template mma<DT>(aw, dv, hT, 0, V);
    TK::pairs(aw, [&](int r, int x, float& v0, float& v1) {
      if (r < L) st16x2<DT>(p.dW16 + ix.hk(t0 + r, j) + x, -v0, -v1);
    });
  }
  {  // [E3] dAqk[r][s] = scale (dO v_new^T)[r][s] for s <= r (0 above)
    float aa[TA::MT][TA::NT][4];
    TA::zero(aa);
    TA::template mma<DT>(aa, dO, vnT, 0, V);
    TA::pairs(aa, [&](int r, int s, float& v0, float& v1) {
      if (r < L)
        *reinterpret_cast<float2*>(p.dAqk + ix.cc(t0 + r, j) + s) =
            make_float2(s <= r ? scale * v0 : 0.0f, s + 1 <= r ? scale * v1 : 0.0f);
    });
  }
  {  // [E1] dQi = dO h^T, dKint = v_new dh^T (products over V), then the epilogue
    float aq[TK::MT][TK::NT][4], ak[TK::MT][TK::NT][4];
    TK::zero(aq);
    TK::zero(ak);
    TK::template mma<DT>(aq, dO, hT, 0, V);
    TK::template mma<DT>(ak, vn, dhT, 0, V);
    cp_async_wait_all();  // gcum (group 1)
    __syncthreads();      // gcum visible; dO, v_new, dv2 read by every warp (k, dlam go over them)
    inter_epilogue<DT, K, V>(p, ix, w, aq, ak, qk, smem_raw);
  }
  __syncthreads();  // dKint, k, the last row's dlam
  inter_tail<DT, K, V>(p, ix, w, smem_raw);
}

template <int K, int V>
struct KdaWyBwdSmem {
  static constexpr int kKld = K + 8, kVld = V + 8, kCld = kC + 8;  // ldmatrix rows (cuda_common.cuh)
  static constexpr size_t tiles = (2 * size_t(kC) * kKld + 2 * size_t(kC) * kVld + 3 * size_t(kC) * kCld) * 2;
  static constexpr size_t bytes = tiles + size_t(kC) * 4;  // + beta
  static constexpr int kBlocks = K + V <= 128 ? 3 : 2;     // per SM (__launch_bounds__: registers)
  static_assert(kBlocks * (bytes + 1024) <= 228 * 1024, "kBlocks blocks per SM");
};

// Rows of kda_bwd_wy_kernel's per-row part one warp step takes: rows r + kWarps u, u < kWyRows
// (a row's operands: (4 K + V) / 32 registers per lane, K = V = 128: 20).
inline constexpr int kWyRows = 2;

// The global operands of one row r < L of kda_bwd_wy_kernel's per-row part as lane l of its warp
// holds them: channels x = l + 32 m (k, gcum, and dk_hv, dlam as kda_bwd_inter_kernel left them)
// and values e = l + 32 m (v). load() only loads, so the loads of a warp step's rows are all in
// flight before its first store.
template <class DT, int K, int V>
struct WyRowIn {
  static constexpr int NK = K / 32, NV = V / 32;
  float k[NK], g[NK], dk[NK], dl[NK], v[NV];
  __device__ __forceinline__ void load(const KdaGradParams& p, const KdaIx& ix, const ChunkItem& w, int r) {
    const int l = lane_id();
    const int64_t aq = ix.qk(w.t0 + r, w.i) + l, at = ix.hk(w.t0 + r, w.j) + l, av = ix.vv(w.t0 + r, w.j) + l;
#pragma unroll
    for (int m = 0; m < NK; ++m) {
      k[m] = DT::from_raw(__ldg(p.k + aq + 32 * m));
      g[m] = __ldg(p.gcum + at + 32 * m);
      dk[m] = p.dk_hv[at + 32 * m];
      dl[m] = p.dlam[at + 32 * m];
    }
#pragma unroll
    for (int m = 0; m < NV; ++m) v[m] = load_caller<DT>(p.v, av + 32 * m);
  }
};

// Row r's outputs from its operands, beta_r and its dX, dY rows (fp32, shared memory):
// dk_hv += dX beta exp2(g), dlam += dX X (X = (k beta) exp2(g), [E2]'s xb unrounded),
// dv = dtype(beta dY) [E5]. Returns the lane's dbeta partial: dX k exp2(g) over its channels
// ascending, then dY v over its values ascending.
template <class DT, int K, int V>
__device__ __forceinline__ float wy_row_out(const KdaGradParams& p, const KdaIx& ix, const ChunkItem& w, int r,
                                            float br, const WyRowIn<DT, K, V>& in, const float* dXr, const float* dYr) {
  const int l = lane_id();
  const int64_t at = ix.hk(w.t0 + r, w.j) + l, av = ix.vv(w.t0 + r, w.j) + l;
  float db = 0.0f;
#pragma unroll
  for (int m = 0; m < WyRowIn<DT, K, V>::NK; ++m) {
    const float dX = dXr[l + 32 * m];
    const float eg = exp2f(in.g[m]);
    const float X = (in.k[m] * br) * eg;
    p.dk_hv[at + 32 * m] = in.dk[m] + dX * (br * eg);
    db += dX * (in.k[m] * eg);
    p.dlam[at + 32 * m] = in.dl[m] + dX * X;
  }
#pragma unroll
  for (int m = 0; m < WyRowIn<DT, K, V>::NV; ++m) {
    const float dY = dYr[l + 32 * m];
    store_caller<DT>(p.dv, av + 32 * m, br * dY);  // [E5]
    db += dY * in.v[m];
  }
  return db;
}

// The rows r + kWarps u (u < kWyRows, rows < L) of one warp step.
template <class DT, int K, int V>
struct WyRowStep {
  WyRowIn<DT, K, V> in[kWyRows];
  __device__ __forceinline__ void load(const KdaGradParams& p, const KdaIx& ix, const ChunkItem& w, int r) {
#pragma unroll
    for (int u = 0; u < kWyRows; ++u)
      if (r + kWarps * u < w.L) in[u].load(p, ix, w, r + kWarps * u);
  }
  // dk_hv, dlam, dv of the rows, and dbeta by a fixed-order warp sum of the lane partials.
  __device__ __forceinline__ void store(const KdaGradParams& p, const KdaIx& ix, const ChunkItem& w, int r,
                                        const float* sB, const float* sdX, const float* sdY) {
    using Sm = KdaWyBwdSmem<K, V>;
#pragma unroll
    for (int u = 0; u < kWyRows; ++u) {
      const int ru = r + kWarps * u;
      if (ru >= w.L) break;
      float db = wy_row_out<DT, K, V>(p, ix, w, ru, sB[ru], in[u], sdX + ru * Sm::kKld, sdY + ru * Sm::kVld);
      db = warp_sum(db);
      if (lane_id() == 0) p.dbeta[ix.th(w.t0 + ru, w.j)] = db;
    }
  }
};

// [E2] staging, one memory round trip: dW, dv2, Phi by cp.async (raw bits, no registers), and
// k, gcum, v through registers into xb = dtype((k beta) exp2(g)) and ub = dtype(v beta); rows
// beyond L are zeros (k, g, v and beta read 0 there, never from memory). Ends with a barrier.
template <class DT, int K, int V>
__device__ __forceinline__ void wy_bwd_stage(const KdaGradParams& p, const KdaIx& ix, const ChunkItem& w, uint16_t* sdW,
                                             uint16_t* sXb, uint16_t* sdv, uint16_t* sYb, uint16_t* sPhi, float* sB) {
  using Sm = KdaWyBwdSmem<K, V>;
  const int64_t HV = ix.HV;
  if (int(threadIdx.x) < kC) sB[threadIdx.x] = int(threadIdx.x) < w.L ? p.beta[ix.th(w.t0 + threadIdx.x, w.j)] : 0.0f;
  cp_async_rows<uint16_t, kC, K>(sdW, Sm::kKld, p.dW16 + ix.hk(w.t0, w.j), HV * K, w.L);
  cp_async_rows<uint16_t, kC, V>(sdv, Sm::kVld, p.dv2 + ix.vv(w.t0, w.j), HV * V, w.L);
  cp_async_rows<uint16_t, kC, kC>(sPhi, Sm::kCld, p.Phi + ix.cc(w.t0, w.j), HV * kC, w.L);
  cp_async_commit();
  Tile16<kC, K> tk;
  GateTile16<kC, K> tg;
  Tile16<kC, V> tv;
  tk.load(p.k + ix.qk(w.t0, w.i), ix.H * K, w.L);
  tg.load(p.gcum + ix.hk(w.t0, w.j), HV * K, w.L);
  tv.load(p.v + ix.vv(w.t0, w.j), HV * V, w.L);
  __syncthreads();  // sB
  // xb, then ub
  tk.template store_by_elem<DT>(sXb, Sm::kKld,
                                [&](int it, int r, int u, float x) { return (x * sB[r]) * exp2f(tg.at(it, u)); });
  tv.template store<DT>(sYb, Sm::kVld, [&](int r, float x) { return x * sB[r]; });
  cp_async_wait_all();
  __syncthreads();
}

// dX = Phi^T dW (64 x K), then dY = Phi^T dv2 (64 x V), kept fp32: A(m = r, k = m) = Phi[m][r],
// zero for m < r (Phi's zeros above the diagonal), so a warp starts at its first row block;
// rows m >= L are zeros. Each goes to an fp32 tile (ld in floats as the 16-bit one) over the two
// 16-bit tiles every warp has finished reading at the barrier before (dX over dW, Xb; dY over
// dv2, Yb), one accumulator at a time (two would cost a block per SM). No barrier at the end.
template <class DT, int K, int V>
__device__ __forceinline__ void wy_bwd_dx_dy(const uint16_t* sPhi, uint16_t* sdW, uint16_t* sdv, int L) {
  using Sm = KdaWyBwdSmem<K, V>;
  using TX = Tiling<kC, K>;
  using TY = Tiling<kC, V>;
  constexpr int kld = Sm::kKld, vld = Sm::kVld, cld = Sm::kCld;
  float* sdX = reinterpret_cast<float*>(sdW);
  float* sdY = reinterpret_cast<float*>(sdv);
  const int ke = (L + 15) & ~15;
  {
    float ax[TX::MT][TX::NT][4];
    TX::zero(ax);
    TX::template mma<DT>(ax, AView<uint16_t, false>{sPhi, cld}, BView<uint16_t, false>{sdW, kld}, TX::m0(), ke);
    __syncthreads();
    TX::pairs(ax, [&](int r, int x, float& v0, float& v1) {
      *reinterpret_cast<float2*>(sdX + r * kld + x) = make_float2(v0, v1);
    });
  }
  {
    float ay[TY::MT][TY::NT][4];
    TY::zero(ay);
    TY::template mma<DT>(ay, AView<uint16_t, false>{sPhi, cld}, BView<uint16_t, false>{sdv, vld}, TY::m0(), ke);
    __syncthreads();
    TY::pairs(ay, [&](int r, int e, float& v0, float& v1) {
      *reinterpret_cast<float2*>(sdY + r * vld + e) = make_float2(v0, v1);
    });
  }
}

template <class DT, int K, int V>
__global__ void __launch_bounds__(kThreads, KdaWyBwdSmem<K, V>::kBlocks) kda_bwd_wy_kernel(KdaGradParams p) {
  using Sm = KdaWyBwdSmem<K, V>;
  using TA = Tiling<kC, kC>;
  constexpr int kld = Sm::kKld, vld = Sm::kVld, cld = Sm::kCld;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* sdW = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* sXb = sdW + kC * kld;
  uint16_t* sdv = sXb + kC * kld;
  uint16_t* sYb = sdv + kC * vld;
  uint16_t* sPhi = sYb + kC * vld;
  uint16_t* sdPhi = sPhi + kC * cld;
  uint16_t* sT1 = sdPhi + kC * cld;
  float* sB = reinterpret_cast<float*>(smem_raw + Sm::tiles);  // beta, 0 beyond L
  // dX (fp32, ld kld) over dW, Xb and dY (fp32, ld vld) over dv2, Yb: wy_bwd_dx_dy.
  float* sdX = reinterpret_cast<float*>(sdW);
  float* sdY = reinterpret_cast<float*>(sdv);

  const KdaIx ix = kda_ix(p.sh);
  const ChunkItem w = chunk_item(p.chunks, p.sh, blockIdx.x);
  const int L = w.L;
  const int64_t t0 = w.t0;

  wy_bwd_stage<DT, K, V>(p, ix, w, sdW, sXb, sdv, sYb, sPhi, sB);

  // dPhi (strictly lower), rounded: the operand of phi_backward; sums over K, then V.
  {
    float acc[TA::MT][TA::NT][4];
    TA::zero(acc);
    TA::template mma<DT>(acc, AView<uint16_t, true>{sdW, kld}, BView<uint16_t, true>{sXb, kld}, 0, K);
    TA::template mma<DT>(acc, AView<uint16_t, true>{sdv, vld}, BView<uint16_t, true>{sYb, vld}, 0, V);
    TA::pairs(acc, [&](int r, int s, float& v0, float& v1) {
      const bool in = r < L;
      *reinterpret_cast<uint32_t*>(sdPhi + r * cld + s) =
          DT::pack(in && s < r ? v0 : 0.0f, in && s + 1 < r ? v1 : 0.0f);
    });
  }
  wy_bwd_dx_dy<DT, K, V>(sPhi, sdW, sdv, L);
  // T1 = dtype(dPhib Phi^T), strictly lower (the terms x > s are Phi's zeros above the diagonal).
  {
    float acc[TA::MT][TA::NT][4];
    TA::zero(acc);
    TA::template mma<DT>(acc, AView<uint16_t, true>{sdPhi, cld}, BView<uint16_t, true>{sPhi, cld}, 0, kC);
    TA::pairs(acc, [&](int m, int s, float& v0, float& v1) {
      const bool in = m < L;
      *reinterpret_cast<uint32_t*>(sT1 + m * cld + s) = DT::pack(in && s < m ? v0 : 0.0f, in && s + 1 < m ? v1 : 0.0f);
    });
  }
  // The per-row part's first warp step loads before dAkk's product, which hides their latency.
  WyRowStep<DT, K, V> rows;
  rows.load(p, ix, w, warp_id());
  __syncthreads();
  // dAkk = -stril(Phi^T T1) (the terms m < r are Phi's zeros, m >= L T1's zero rows).
  {
    float acc[TA::MT][TA::NT][4];
    TA::zero(acc);
    TA::template mma<DT>(acc, AView<uint16_t, false>{sPhi, cld}, BView<uint16_t, false>{sT1, cld}, 0, kC);
    TA::pairs(acc, [&](int r, int s, float& v0, float& v1) {
      if (r < L)
        *reinterpret_cast<float2*>(p.dAkk + ix.cc(t0 + r, w.j) + s) =
            make_float2(s < r ? -v0 : 0.0f, s + 1 < r ? -v1 : 0.0f);
    });
  }
  // Per row: a warp per row, lanes over channels, kWyRows rows per step.
  for (int r = warp_id(); r < L; r += kWarps * kWyRows) {
    rows.store(p, ix, w, r, sB, sdX, sdY);
    if (r + kWarps * kWyRows < L) rows.load(p, ix, w, r + kWarps * kWyRows);
  }
}

// ---- kda_bwd_intra_kernel: step 5 [E4] with F5 sub-chunk pivots (docs/algorithm.md 7.5) ----

// Shared memory: q, k 16-bit 64 x K; gcum fp32 64 x K; dAqk, dAkk fp32 64 x 64; beta 64; the
// dbeta warp partials (K / 32) x 64; dbeta 64 as kda_bwd_wy_kernel left it (loaded with beta, so
// the final dbeta update is a store, not a read-modify-write at the end). A warp reads one row of q, k, g (its 32
// consecutive channels: conflict-free) or one dA address (broadcast) at a time, so rows are unpadded.
template <int K>
struct KdaIntraBwdSmem {
  static constexpr size_t q16 = 0, k16 = q16 + size_t(kC) * K * 2, g = k16 + size_t(kC) * K * 2;
  static constexpr size_t aq = g + size_t(kC) * K * 4, ak = aq + size_t(kC) * kC * 4;
  static constexpr size_t beta = ak + size_t(kC) * kC * 4, red = beta + kC * 4;
  static constexpr size_t db = red + size_t(K / 32) * kC * 4;
  static constexpr size_t bytes = db + kC * 4;
  static_assert(2 * bytes + 2048 <= 228 * 1024, "two blocks per SM");
};

// The staged chunk as the thread sees it: values of its channel c, dA rows, beta.
template <class DT, int K>
struct BwdIntraView {
  const uint16_t *sq, *sk;
  const float *sg, *aq, *ak, *beta;
  int c, L;
  __device__ __forceinline__ float q(int r) const { return DT::from_raw(sq[r * K + c]); }
  __device__ __forceinline__ float k(int r) const { return DT::from_raw(sk[r * K + c]); }
  __device__ __forceinline__ float g(int r) const { return sg[r * K + c]; }
};

__device__ __forceinline__ void ld4f(const float* src, float (&x)[4]) {
  const float4 v = *reinterpret_cast<const float4*>(src);
  x[0] = v.x;
  x[1] = v.y;
  x[2] = v.z;
  x[3] = v.w;
}

// [E4] row side off the diagonal (F5): rows r = b + i < L of the unit's sub-chunk against the
// columns s < b, pivot p = b (the sub-chunk's first row, p < L): dq2_r = exp2(g_r - g_p)
// sum_s dAqk[r][s] (k_s exp2(g_p - g_s)), dk2n_r the same with dAkk. Column sub-chunks ascending,
// their 16 gated k_s formed once (registers); rows beyond L stay 0, never exponentiated (7.1).
template <class DT, int K>
__device__ __forceinline__ void bwd_rows_off(const BwdIntraView<DT, K>& v, int b, float (&dq)[16], float (&dk)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) dq[i] = dk[i] = 0.0f;
  const float gp = v.g(b);
#pragma unroll 1
  for (int s0 = 0; s0 < b; s0 += 16) {
    float kg[16];
#pragma unroll
    for (int u = 0; u < 16; ++u) kg[u] = v.k(s0 + u) * exp2f(gp - v.g(s0 + u));
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if (b + i >= v.L) break;
#pragma unroll
      for (int u = 0; u < 16; u += 4) {
        float x[4], y[4];
        ld4f(v.aq + (b + i) * kC + s0 + u, x);
        ld4f(v.ak + (b + i) * kC + s0 + u, y);
#pragma unroll
        for (int t = 0; t < 4; ++t) {
          dq[i] += x[t] * kg[u + t];
          dk[i] += y[t] * kg[u + t];
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const float a = b + i < v.L ? exp2f(v.g(b + i) - gp) : 0.0f;
    dq[i] = __fmul_rn(dq[i], a);  // not contracted into bwd_diag's first term (see its (r, r) pair)
    dk[i] = __fmul_rn(dk[i], a);
  }
}

// [E4] the unit's diagonal 16 x 16 block per pair (r, s), s <= r < L, both sides (no pivot on
// the diagonal, as the twin): e = exp2(g_r - g_s); dq2_r += dAqk[r][s] k_s e,
// dk2n_r += dAkk[r][s] k_s e (s < r), dkt_s += (dAqk[r][s] q_r + dAkk[r][s] beta_r k_r) e. Rows
// ascending, columns ascending; e = 1 on the diagonal (exp2(0), not evaluated). dkt starts here.
template <class DT, int K>
__device__ __forceinline__ void bwd_diag(const BwdIntraView<DT, K>& v, int b, float (&dq)[16], float (&dk)[16],
                                         float (&dkt)[16]) {
  float gs[16], ks[16];
#pragma unroll
  for (int u = 0; u < 16; ++u) {
    gs[u] = v.g(b + u);
    ks[u] = v.k(b + u);
    dkt[u] = 0.0f;
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int r = b + i;
    if (r >= v.L) break;
    const float qr = v.q(r), kb = v.beta[r] * ks[i];
#pragma unroll
    for (int u0 = 0; u0 <= i; u0 += 4) {
      float x[4], y[4];
      ld4f(v.aq + r * kC + b + u0, x);
      ld4f(v.ak + r * kC + b + u0, y);
#pragma unroll
      for (int t = 0; t < 4 && u0 + t < i; ++t) {
        const int u = u0 + t;
        const float e = exp2f(gs[i] - gs[u]), kse = ks[u] * e;
        dq[i] += x[t] * kse;
        dk[i] += y[t] * kse;
        dkt[u] += (x[t] * qr + y[t] * kb) * e;
      }
      if (i - u0 < 4) {  // the pair (r, r); rounding pinned, not left to the contraction:
        // i = 0 (pivot row, dq[0] = its row side times exp2(0) = 1): product, then add (main's
        // build contracted dq[0] * 1 here instead of this product); i > 0: one fma onto dq[i].
        dq[i] = i == 0 ? __fadd_rn(dq[i], __fmul_rn(x[i - u0], ks[i])) : __fmaf_rn(x[i - u0], ks[i], dq[i]);
        dkt[i] += x[i - u0] * qr;
      }
    }
  }
}

// [E4] column side off the diagonal (F5): columns s = b + u of the unit against the rows r < L of
// each later sub-chunk R, with R's pivot p = 16 R (its first row, p < L), as the row side:
// dkt_s += exp2(g_p - g_s) sum_{r in R} (dAqk[r][s] q_r + dAkk[r][s] beta_r k_r) exp2(g_r - g_p).
// R ascending, rows ascending; sub-chunks and rows beyond L are skipped, never exponentiated.
template <class DT, int K>
__device__ __forceinline__ void bwd_cols_off(const BwdIntraView<DT, K>& v, int b, float (&dkt)[16]) {
#pragma unroll 1
  for (int p = b + 16; p < v.L; p += 16) {
    const float gp = v.g(p);
    float t[16];
#pragma unroll
    for (int u = 0; u < 16; ++u) t[u] = 0.0f;
    const int end = min(p + 16, v.L);
#pragma unroll 2
    for (int r = p; r < end; ++r) {
      const float a = exp2f(v.g(r) - gp), qa = v.q(r) * a, ka = (v.beta[r] * v.k(r)) * a;
#pragma unroll
      for (int u = 0; u < 16; u += 4) {
        float x[4], y[4];
        ld4f(v.aq + r * kC + b + u, x);
        ld4f(v.ak + r * kC + b + u, y);
#pragma unroll
        for (int z = 0; z < 4; ++z) t[u + z] += x[z] * qa + y[z] * ka;
      }
    }
#pragma unroll
    for (int u = 0; u < 16; ++u) dkt[u] += exp2f(gp - v.g(b + u)) * t[u];
  }
}

// One butterfly step of row_sums16: lanes with lane bit 2 H keep the upper H of their first
// 2 H values, the others the lower H, each adding the partner's (lane ^ 2 H) copy.
template <int H>
__device__ __forceinline__ void row_sums_step(float (&v)[16]) {
  const bool up = lane_id() & (2 * H);
#pragma unroll
  for (int x = 0; x < H; ++x) {
    const float keep = up ? v[x + H] : v[x], send = up ? v[x] : v[x + H];
    v[x] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * H);
  }
}
// Sums of 16 per-lane values over the warp's 32 lanes by a fixed butterfly (16 shuffles, not
// 16 x 5): lane l returns the sum of value (l >> 1) & 15; lanes l and l ^ 1 get the same bits.
__device__ __forceinline__ float row_sums16(float (&v)[16]) {
  row_sums_step<8>(v);
  row_sums_step<4>(v);
  row_sums_step<2>(v);
  row_sums_step<1>(v);
  return v[0] + __shfl_xor_sync(0xffffffffu, v[0], 1);
}

// The unit's rows r = b + i < L: dq_hv += dq2, dk_hv += beta_r dk2n + dkt,
// dlam += q_r dq2 + k_r (beta_r dk2n - dkt) (the twin's expressions), in one memory round trip:
// first the dbeta terms k_r dk2n (summed over the warp's channels to red[warp of the part][r])
// and the increments (in place of dk, dkt: no more live registers), then the old values of all
// 16 rows loaded at once (48 loads in flight), then the stores.
template <class DT, int K>
__device__ __forceinline__ void bwd_unit_store(const KdaGradParams& p, const KdaIx& ix, const ChunkItem& w,
                                               const BwdIntraView<DT, K>& v, int b, const float (&dq)[16],
                                               float (&dk)[16], float (&dkt)[16], float* red) {
  {
    float db[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) db[i] = b + i < w.L ? v.k(b + i) * dk[i] : 0.0f;
    const float s = row_sums16(db);
    if ((lane_id() & 1) == 0) red[(warp_id() % (K / 32)) * kC + b + (lane_id() >> 1)] = s;
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {  // dk := the dk_hv increment, dkt := the dlam increment
    const int r = b + i;
    if (r >= w.L) break;
    const float qr = v.q(r), kr = v.k(r), dk2 = v.beta[r] * dk[i];
    const float inc_l = qr * dq[i] + kr * (dk2 - dkt[i]), inc_k = dk2 + dkt[i];
    dkt[i] = inc_l;
    dk[i] = inc_k;
  }
  const int ld = int(ix.HV) * K;  // row stride of [T, HV, K]
  const int64_t base = ix.hk(w.t0 + b, w.j) + v.c;
  float *pq = p.dq_hv + base, *pk = p.dk_hv + base, *pl = p.dlam + base;
  float oq[16], ok[16], ol[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const bool in = b + i < w.L;
    oq[i] = in ? pq[i * ld] : 0.0f;
    ok[i] = in ? pk[i * ld] : 0.0f;
    ol[i] = in ? pl[i * ld] : 0.0f;
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    if (b + i >= w.L) break;
    pl[i * ld] = ol[i] + dkt[i];
    pk[i * ld] = ok[i] + dk[i];
    pq[i * ld] = oq[i] + dq[i];
  }
}

// One unit: sub-chunk b / 16 of the chunk for the thread's channel: its rows' dq2, dk2n (row
// side) and its columns' dkt (column side), then the stores. Nothing for b >= L.
template <class DT, int K>
__device__ __forceinline__ void bwd_unit(const KdaGradParams& p, const KdaIx& ix, const ChunkItem& w,
                                         const BwdIntraView<DT, K>& v, int b, float* red) {
  if (b >= w.L) return;
  float dq[16], dk[16], dkt[16];
  bwd_rows_off<DT, K>(v, b, dq, dk);
  bwd_diag<DT, K>(v, b, dq, dk, dkt);
  bwd_cols_off<DT, K>(v, b, dkt);
  bwd_unit_store<DT, K>(p, ix, w, v, b, dq, dk, dkt, red);
}

// Step 5 [E4]. Thread (part = tid / K, channel c = tid % K) computes every output of its channel
// for the sub-chunks of its part: K = 128 (two parts): {0, 3} and {1, 2}, K = 64: {part}. Each
// sub-chunk owns its rows and columns, so each output is one thread's sum (no reduction but
// dbeta's fixed-order row sums) and the parts' work is about equal (diagonal block + 3 x 16 x 16
// off-diagonal pairs per sub-chunk and side).
template <class DT, int K>
__global__ void __launch_bounds__(kThreads, 2) kda_bwd_intra_kernel(KdaGradParams p) {
  using Sm = KdaIntraBwdSmem<K>;
  constexpr int kUnits = 4 * K / kThreads;  // sub-chunks per thread
  static_assert(kUnits == 1 || kUnits == 2, "K = 64 or 128");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* sq = reinterpret_cast<uint16_t*>(smem_raw + Sm::q16);
  uint16_t* sk = reinterpret_cast<uint16_t*>(smem_raw + Sm::k16);
  float* sg = reinterpret_cast<float*>(smem_raw + Sm::g);
  float* sAq = reinterpret_cast<float*>(smem_raw + Sm::aq);
  float* sAk = reinterpret_cast<float*>(smem_raw + Sm::ak);
  float* sB = reinterpret_cast<float*>(smem_raw + Sm::beta);
  float* red = reinterpret_cast<float*>(smem_raw + Sm::red);
  float* sDb = reinterpret_cast<float*>(smem_raw + Sm::db);

  const KdaIx ix = kda_ix(p.sh);
  const ChunkItem w = chunk_item(p.chunks, p.sh, blockIdx.x);
  // Every input of the chunk at once (rows beyond L zero-filled, never read).
  cp_async_rows<uint16_t, kC, K>(sq, K, p.q + ix.qk(w.t0, w.i), ix.H * K, w.L);
  cp_async_rows<uint16_t, kC, K>(sk, K, p.k + ix.qk(w.t0, w.i), ix.H * K, w.L);
  cp_async_rows<float, kC, K>(sg, K, p.gcum + ix.hk(w.t0, w.j), ix.HV * K, w.L);
  cp_async_rows<float, kC, kC>(sAq, kC, p.dAqk + ix.cc(w.t0, w.j), ix.HV * kC, w.L);
  cp_async_rows<float, kC, kC>(sAk, kC, p.dAkk + ix.cc(w.t0, w.j), ix.HV * kC, w.L);
  cp_async_commit();
  if (threadIdx.x < kC) {  // both loads before the stores: one round trip
    const bool in = int(threadIdx.x) < w.L;
    const float b = in ? p.beta[ix.th(w.t0 + threadIdx.x, w.j)] : 0.0f;
    const float d = in ? p.dbeta[ix.th(w.t0 + threadIdx.x, w.j)] : 0.0f;
    sB[threadIdx.x] = b;
    sDb[threadIdx.x] = d;
  }
  cp_async_wait_all();
  __syncthreads();

  const int part = threadIdx.x / K;
  const BwdIntraView<DT, K> v{sq, sk, sg, sAq, sAk, sB, int(threadIdx.x % K), w.L};
#pragma unroll 1
  for (int n = 0; n < kUnits; ++n) bwd_unit<DT, K>(p, ix, w, v, 16 * (n == 0 ? part : 3 - part), red);
  __syncthreads();
  if (int(threadIdx.x) < w.L) {  // dbeta += the row sums over the channels, warps in order
    float s = 0.0f;
#pragma unroll
    for (int x = 0; x < K / 32; ++x) s += red[x * kC + threadIdx.x];
    p.dbeta[ix.th(w.t0 + threadIdx.x, w.j)] = sDb[threadIdx.x] + s;
  }
}

}  // namespace kcp::kernels::cuda
