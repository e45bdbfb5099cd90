// GDN backward gradients per (chunk, value head): B4 (dq, dk, dw, dgate from h, dh, v_new, dv2)
// and B5 (WY backward), docs/algorithm.md 3.1, with the rounding points [D1]-[D7] of the CPU twin
// (kernels/cpu/gdn_chunk_bwd.cpp). Included by gdn_chunk_bwd.cu, and by kda_chunk_bwd_kernel.cuh
// for GradParams.
//
// Two kernels, so that each one's unrolled code stays well inside the SM's instruction cache (fused,
// they are ~150 KB of SASS, more than it holds; docs/perf-notes.md). Both: 256 threads, dtype
// operands on tensor cores with fp32 accumulation.
// gdn_bwd_dqk_kernel (B4), grid NT * HV * K / 64, one 64-column slice of K per block (below):
//   dQ = (dO h^T) exp2(g) scale + E k, dK = (v_new dh^T) exp2(gL - g) + E^T q with
//   E = dtype(tril(dO v_new^T) exp2(g_r - g_s) scale); the gate rows q.dQ - k.dK plus, on the
//   last row, Gam <h, dh> + sum(dK_int o k). Writes dq_hv (final), dk_hv and dlam / dlam_hi (B4
//   parts) and dW = dtype(-dv2 h^T) into dW16 (scratch), which the second kernel reads back.
// gdn_bwd_wy_kernel (B5), grid NT * HV, block (chunk n, value head j) = (b / HV, b % HV), dK in the
//   mma accumulators (64 x K, 8 warps): dPhi = dW Xb^T + dv2 Yb^T, dX = Phi^T dW, dY = Phi^T dv2 (dv, dbeta,
//   gate), dPi = -stril(Phi^T dtype(stril(dtype(dPhi)) Phi^T)), dPi' = dPi gated, dK += beta dPi' k
//   + dPi'^T dtype(k beta), gate row minus column sums; adds to dk_hv and dlam, writes dv, dbeta.
// Row sums (gate, dbeta) are reduced in a fixed order: quad shuffles, then per-warp partials in
// shared memory added in warp order, so results are bitwise reproducible.
// Latency: each kernel stages its tiles and per-row values in one memory round trip (dqk by
// cp.async), and every epilogue issues all of a thread's loads (global v, shared k pairs, gates,
// beta) before its first store, since a load after a store that may alias it cannot move above
// it: loaded one pair at a time between stores, dY's v cost 16 dependent round trips per block.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace kcp::kernels::cuda {

struct GradParams {
  Shape sh;
  const ChunkDesc* chunks;
  const uint16_t* q;      // [T, H, K] dtype, 16-bit storage
  const uint16_t* k;      // [T, H, K] dtype, 16-bit storage
  const uint16_t* v;      // [T, HV, V] dtype, 16-bit (caller storage)
  const float* beta;      // [T, HV]
  const float* gcum;      // [T, HV] fp32 log2
  const uint16_t* Phi;    // [T, HV, 64] dtype, 16-bit storage
  const uint16_t* h;      // [NT, HV, K, V] dtype, 16-bit storage
  const uint16_t* v_new;  // [T, HV, V] dtype, 16-bit storage
  const uint16_t* dh;     // [NT, HV, K, V] dtype, 16-bit storage
  const uint16_t* dv2;    // [T, HV, V] dtype, 16-bit storage
  const uint16_t* dO;     // [T, HV, V] dtype, 16-bit (caller storage)
  float* dq_hv;           // [T, HV, K] fp32
  float* dk_hv;           // [T, HV, K] fp32
  uint16_t* dv;           // [T, HV, V] dtype, 16-bit (caller storage)
  float* dbeta;           // [T, HV] fp32
  float* dlam;            // [T, HV] fp32
  float* dlam_hi;         // [T, HV] fp32, backend scratch: the second K slice's gate part (K = 128)
  uint16_t* dW16;         // [T, HV, K] dtype, 16-bit storage, backend scratch: dW between the kernels
  // B5 finalizing dk on chip (gdn_bwd_wy_wgmma.cuh, FIN; BwdGradArgs::finalize): the caller's dk,
  // the saved k (normalized) and rstd_k (L2 norm). Null dk_out: B5 adds its part to dk_hv.
  uint16_t* dk_out;     // [T, H, K] dtype, 16-bit (caller storage)
  const uint16_t* yk;   // [T, H, K] dtype, 16-bit storage (l2norm)
  const float* rstd_k;  // [T, H] fp32 (l2norm)
  int l2norm;
};

// Two per-thread row accumulators (rows r and r + 8 of a fragment), chosen without indexing.
struct Row2 {
  float lo = 0.0f, hi = 0.0f;
  __device__ __forceinline__ void add(int r, float x) {
    if ((r >> 3) & 1)
      hi += x;
    else
      lo += x;
  }
  __device__ __forceinline__ float get(int h) const { return h ? hi : lo; }
};

// Row h of the thread's two accumulator rows (r0 + 8 h) of a Row2: r0 % 16 < 8, so Row2::add's
// test of bit 3 is h, known here at compile time.
__device__ __forceinline__ float& row_of(Row2& q, int h) { return h ? q.hi : q.lo; }

// Row totals of NQ per-thread quantities over a 64-row tiling with WM = 4, WN = 2: quad sums,
// then the two warp columns added in order. Result for row r, quantity u: out[r * NQ + u].
template <int NQ>
__device__ __forceinline__ void row_totals(const Row2 (&q)[NQ], float* sRow, float* out) {
  const int g8 = lane_id() >> 2;
  for (int h2 = 0; h2 < 2; ++h2) {
    float v[NQ];
#pragma unroll
    for (int u = 0; u < NQ; ++u) v[u] = quad_sum(q[u].get(h2));
    if ((lane_id() & 3) == 0) {
      const int r = (warp_id() % 4) * 16 + g8 + 8 * h2, wn = warp_id() / 4;
#pragma unroll
      for (int u = 0; u < NQ; ++u) sRow[(r * 2 + wn) * NQ + u] = v[u];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kC * NQ; e += blockDim.x) {
    const int r = e / NQ, u = e % NQ;
    out[e] = sRow[(r * 2) * NQ + u] + sRow[(r * 2 + 1) * NQ + u];
  }
  __syncthreads();
}

// One 8-byte global store of (lo, hi) at dst (8-byte aligned), as CUTLASS's global_store: in
// gdn_bwd_dqk_kernel a float2 store through reinterpret_cast became two 4-byte stores (PTX
// st.global.f32 twice), each warp store then covering half of every 32-byte sector it touched.
__device__ __forceinline__ void st_global_f32x2(float* dst, float lo, float hi) {
  asm volatile("st.global.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(lo), "f"(hi));
}

// gdn_bwd_dqk_kernel works on one 64-column slice of K per block (KS = K / 64 slices): block b ->
// (chunk n, value head j, slice kh) = (b / (KS HV), (b / KS) % HV, b % KS). Every product it
// forms sums over V or over the chunk's tokens, never over K, so the slices are independent
// except for the gate rows (q . dQ - k . dK and the last row's terms), whose partials go to dlam
// (kh = 0) and dlam_hi (kh = 1); gdn_bwd_wy_kernel adds them in that order. The slice keeps the
// block at ~105 KB of shared memory and <= 128 registers, so two blocks share an SM and one
// block's loads overlap the other's products (all of K in one block needs ~148 KB: one per SM).
inline constexpr int kKS = 64;  // K columns per gdn_bwd_dqk_kernel block

template <int V>
struct DqkSmem {
  static constexpr int kVld = V + 8, kSld = kKS + 8, kPld = kC + 8;
  static constexpr int kOffDS = kKS * kVld;  // h rows of the slice at 0, then dh rows
  static constexpr int kOffDO = kOffDS + kKS * kVld;
  static constexpr int kOffVN = kOffDO + kC * kVld;
  static constexpr int kOffDv2 = kOffVN + kC * kVld;
  static constexpr int kOffK = kOffDv2 + kC * kVld;
  static constexpr int kOffQ = kOffK + kC * kSld;
  static constexpr int kOffE = kOffDv2;  // E reuses dv2 once dW is formed
  static_assert(kC * kPld <= kC * kVld, "E must fit in the dv2 tile");
  static constexpr int kElems16 = kOffQ + kC * kSld;
  static constexpr int kFloats = kC + kC * 2 * 2 + kC * 2 + 2 * kWarps;
  static constexpr size_t bytes = size_t(kElems16) * 2 + size_t(kFloats) * 4;
};

template <class DT, int K, int V>
__global__ void __launch_bounds__(kThreads, 2) gdn_bwd_dqk_kernel(GradParams p) {
  constexpr int KS = K / kKS;
  using Sm = DqkSmem<V>;
  using T64 = Tiling<kC, kKS>;  // every product of the block is 64 x 64
  static_assert(K % kKS == 0 && T64::WM == 4 && T64::MT == 1, "row partials need WM = 4");
  static_assert(KS <= 2, "the gate partials have two places: dlam and dlam_hi");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* s16 = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* sS = s16;
  uint16_t* sdS = s16 + Sm::kOffDS;
  uint16_t* sdO = s16 + Sm::kOffDO;
  uint16_t* svn = s16 + Sm::kOffVN;
  uint16_t* sdv2 = s16 + Sm::kOffDv2;
  uint16_t* sE = s16 + Sm::kOffE;
  uint16_t* sk = s16 + Sm::kOffK;
  uint16_t* sq = s16 + Sm::kOffQ;
  float* sG = reinterpret_cast<float*>(s16 + Sm::kElems16);
  float* sRow = sG + kC;            // [64][2][2]
  float* sTot = sRow + kC * 2 * 2;  // [64][2]
  float* sRed = sTot + kC * 2;      // [2][kWarps]

  const int HV = p.sh.HV;
  const int kh = blockIdx.x % KS;
  const int64_t n = blockIdx.x / (KS * HV);
  const int j = (blockIdx.x / KS) % HV, i = j / p.sh.G;
  const ChunkDesc ch = p.chunks[n];
  const int L = ch.len;
  const int64_t t0 = ch.begin;
  const int tid = threadIdx.x;
  const float scale = p.sh.scale;
  const int kend = (L + 15) & ~15;
  const int x0 = kh * kKS;  // first K column of the slice
  const int64_t qk0 = (t0 * p.sh.H + i) * K + x0, qks = int64_t(p.sh.H) * K;
  const int64_t vv0 = (t0 * HV + j) * V, vvs = int64_t(HV) * V;
  const int64_t kv0 = ((n * HV + j) * K + x0) * int64_t(V);
  auto f16 = [](const uint16_t* t, int idx) { return DT::from_raw(t[idx]); };

  // One memory round trip: the seven tiles by cp.async (raw bits, rows beyond L zero-filled),
  // then gcum (its load after the copies in program order, so that its store to shared memory
  // does not hold them back).
  cp_async_rows<uint16_t, kKS, V>(sS, Sm::kVld, p.h + kv0, V, kKS);
  cp_async_rows<uint16_t, kKS, V>(sdS, Sm::kVld, p.dh + kv0, V, kKS);
  cp_async_rows<uint16_t, kC, V>(sdO, Sm::kVld, p.dO + vv0, vvs, L);
  cp_async_rows<uint16_t, kC, V>(svn, Sm::kVld, p.v_new + vv0, vvs, L);
  cp_async_rows<uint16_t, kC, V>(sdv2, Sm::kVld, p.dv2 + vv0, vvs, L);
  cp_async_rows<uint16_t, kC, kKS>(sk, Sm::kSld, p.k + qk0, qks, L);
  cp_async_rows<uint16_t, kC, kKS>(sq, Sm::kSld, p.q + qk0, qks, L);
  cp_async_commit();
  if (tid < kC) sG[tid] = tid < L ? p.gcum[(t0 + tid) * HV + j] : 0.0f;
  cp_async_wait_all();
  __syncthreads();
  const float gL = sG[L - 1];

  {  // dW = dtype(-dv2 h^T) of the slice -> dW16 (read back by gdn_bwd_wy_kernel)
    float w[1][T64::NT][4];
    T64::zero(w);
    T64::template mma<DT>(w, AView<uint16_t, true>{sdv2, Sm::kVld}, BView<uint16_t, true>{sS, Sm::kVld}, 0, V);
    // Stored from the fragments: staging through shared memory for 16-byte stores (two more
    // barriers) is slower: bwd_grads 4.24 ms instead of 4.17 ms at T = 32768 (docs/perf-notes.md).
    T64::pairs(w, [&](int r, int x, float& v0, float& v1) {
      if (r < L) st16x2<DT>(p.dW16 + ((t0 + r) * HV + j) * K + x0 + x, -v0, -v1);
    });
  }
  float e[1][T64::NT][4], dQ[1][T64::NT][4], dK[1][T64::NT][4];
  T64::zero(e);
  T64::zero(dQ);
  T64::zero(dK);
  T64::template mma<DT>(e, AView<uint16_t, true>{sdO, Sm::kVld}, BView<uint16_t, true>{svn, Sm::kVld}, 0, V);
  T64::template mma<DT>(dQ, AView<uint16_t, true>{sdO, Sm::kVld}, BView<uint16_t, true>{sS, Sm::kVld}, 0, V);
  T64::template mma<DT>(dK, AView<uint16_t, true>{svn, Sm::kVld}, BView<uint16_t, true>{sdS, Sm::kVld}, 0, V);
  float kint = 0.0f;  // sum over this thread's elements of dK_int o k
  // The gates of the thread's rows r0 + 8 h (h = (r >> 3) & 1, as r0 % 16 < 8) and columns, read
  // once: E's stores to shared memory would hold back each later read.
  const int r0 = T64::m0() + (lane_id() >> 2), t4 = lane_id() & 3;
  const float gr[2] = {sG[r0], sG[r0 + 8]};
  const float eq[2] = {exp2f(gr[0]), exp2f(gr[1])}, ek[2] = {exp2f(gL - gr[0]), exp2f(gL - gr[1])};
  float gs[T64::NT][2];
#pragma unroll
  for (int nt = 0; nt < T64::NT; ++nt) {
    gs[nt][0] = sG[T64::n0() + nt * 8 + 2 * t4];
    gs[nt][1] = sG[T64::n0() + nt * 8 + 2 * t4 + 1];
  }
  T64::each(dQ, [&](int r, int, float& v) { v = r < L ? v * eq[(r >> 3) & 1] * scale : 0.0f; });
  T64::each(dK, [&](int r, int x, float& v) {
    v = r < L ? v * ek[(r >> 3) & 1] : 0.0f;
    kint += v * f16(sk, r * Sm::kSld + x);
  });
  float hdh = 0.0f;
  for (int t = tid; t < kKS * (V / 2); t += kThreads) {
    const int x = t / (V / 2), c = (t % (V / 2)) * 2;
    hdh += f16(sS, x * Sm::kVld + c) * f16(sdS, x * Sm::kVld + c) +
           f16(sS, x * Sm::kVld + c + 1) * f16(sdS, x * Sm::kVld + c + 1);
  }
  hdh = block_sum(hdh, sRed);  // (its barriers also end every warp's reads of dv2)
  kint = block_sum(kint, sRed + kWarps);
  const float dg_last = hdh * exp2f(gL) + kint;  // this slice's part
  // E = dtype(tril(dO v_new^T) exp2(g_r - g_s) scale), two values per 32-bit store
#pragma unroll
  for (int nt = 0; nt < T64::NT; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h, s = T64::n0() + nt * 8 + 2 * t4;
      float ev[2];
#pragma unroll
      for (int u = 0; u < 2; ++u)
        ev[u] = (s + u <= r && r < L) ? e[0][nt][2 * h + u] * exp2f(gr[h] - gs[nt][u]) * scale : 0.0f;
      *reinterpret_cast<uint32_t*>(sE + r * Sm::kPld + s) = DT::pack(ev[0], ev[1]);
    }
  __syncthreads();
  T64::template mma<DT>(dQ, AView<uint16_t, true>{sE, Sm::kPld}, BView<uint16_t, false>{sk, Sm::kSld}, 0, kend);
  T64::template mma<DT>(dK, AView<uint16_t, false>{sE, Sm::kPld}, BView<uint16_t, false>{sq, Sm::kSld}, 0, kend);
  Row2 rows[2];  // q . dQ, k . dK over the slice
  T64::zip_pairs(dQ, dK, [&](int r, int x, float& q0, float& q1, float& k0, float& k1) {
    rows[0].add(r, f16(sq, r * Sm::kSld + x) * q0 + f16(sq, r * Sm::kSld + x + 1) * q1);
    rows[1].add(r, f16(sk, r * Sm::kSld + x) * k0 + f16(sk, r * Sm::kSld + x + 1) * k1);
    if (r < L) {
      st_global_f32x2(p.dq_hv + ((t0 + r) * HV + j) * K + x0 + x, q0, q1);
      st_global_f32x2(p.dk_hv + ((t0 + r) * HV + j) * K + x0 + x, k0, k1);
    }
  });
  row_totals<2>(rows, sRow, sTot);
  if (tid < L) {
    float dl = sTot[tid * 2] - sTot[tid * 2 + 1];
    if (tid == L - 1) dl += dg_last;
    (kh == 0 ? p.dlam : p.dlam_hi)[(t0 + tid) * HV + j] = dl;
  }
}

// gdn_bwd_wy_kernel's per-row values for row tid < kC of the chunk (thread tid; zeros beyond L):
// gcum, beta and the B4 gate parts dlam + dlam_hi (slice order) that gdn_bwd_dqk_kernel left,
// all loaded before the first store, into sG, sBeta, sDl.
__device__ __forceinline__ void wy_stage_rows(const GradParams& p, int64_t t, int j, bool valid, float* sG,
                                              float* sBeta, float* sDl) {
  const int tid = threadIdx.x;
  if (tid >= kC) return;
  float g = 0.0f, b = 0.0f, dl = 0.0f;
  if (valid) {
    const int64_t at = t * p.sh.HV + j;
    g = p.gcum[at];
    b = p.beta[at];
    dl = p.dlam[at];
    if (p.dlam_hi) dl += p.dlam_hi[at];
  }
  sG[tid] = g;
  sBeta[tid] = b;
  sDl[tid] = dl;
}

// The 32-bit words (two 16-bit values each) of a 64-row shared-memory tile t at the element
// pairs a Tiling TT's accumulator gives this thread, in TT::pairs order, all loads issued before
// the caller's first store: w[2 nt + h] = t[r][c .. c + 1], r = m0 + lane / 4 + 8 h,
// c = n0 + 8 nt + 2 (lane % 4).
template <class TT>
__device__ __forceinline__ void smem_pairs(uint32_t (&w)[TT::NT * 2], const uint16_t* t, int ld) {
  static_assert(TT::MT == 1, "one fragment row per warp");
  const int g8 = lane_id() >> 2, t4 = lane_id() & 3;
#pragma unroll
  for (int nt = 0; nt < TT::NT; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      w[2 * nt + h] = *reinterpret_cast<const uint32_t*>(t + (TT::m0() + g8 + 8 * h) * ld + TT::n0() + nt * 8 + 2 * t4);
}

// dst[r][x] = dtype(src[r][x] * scale[r]) over a 64 x COLS 16-bit shared-memory tile (map_rows_to
// of cuda_common.cuh with that map, 16 bytes at a time): every load of the thread (src and its
// rows' scale) is issued before its first store. map_rows_to's loop, one load then one store
// per step, was a chain of dependent shared-memory round trips.
template <class DT, int COLS>
__device__ __forceinline__ void scale_rows_batched(uint16_t* dst, const uint16_t* src, int ld, const float* scale) {
  constexpr int V8 = COLS / 8, ITERS = kC * V8 / kThreads;
  static_assert(kC * V8 % kThreads == 0, "whole 16-byte steps per thread");
  uint4 v[ITERS];
  float sc[ITERS];
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int e = threadIdx.x + it * kThreads;
    v[it] = *reinterpret_cast<const uint4*>(src + (e / V8) * ld + (e % V8) * 8);
    sc[it] = scale[e / V8];
  }
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int e = threadIdx.x + it * kThreads;
    const uint32_t w[4] = {v[it].x, v[it].y, v[it].z, v[it].w};
    uint32_t o[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      o[u] = DT::pack(DT::from_raw(uint16_t(w[u] & 0xffffu)) * sc[it], DT::from_raw(uint16_t(w[u] >> 16)) * sc[it]);
    *reinterpret_cast<uint4*>(dst + (e / V8) * ld + (e % V8) * 8) = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

// [D5] The dX = Phi^T dW epilogue of both B5 kernels over the thread's accumulator a (Tiling TK,
// 64 x K: rows r0 + 8 h with beta bh[h]; rows >= L skipped), in TK::zip_pairs' order, with k's
// pairs kw at the thread's accumulator positions (TK::zip_pairs' order): dK += dX beta exp2(g),
// dbeta += dX k exp2(g), gate += dX (k beta) exp2(g).
template <class DT, class TK>
__device__ __forceinline__ void wy_dx_update(const float (&a)[1][TK::NT][4], float (&dK)[1][TK::NT][4],
                                             const uint32_t (&kw)[TK::NT * 2], const float* sG, const float (&bh)[2],
                                             int r0, int L, Row2& rdb, Row2& rwy) {
  const float egh[2] = {exp2f(sG[r0]), exp2f(sG[r0 + 8])};
#pragma unroll
  for (int nt = 0; nt < TK::NT; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h;
      if (r >= L) continue;
      const float b = bh[h], eg = egh[h], d0 = a[0][nt][2 * h], d1 = a[0][nt][2 * h + 1];
      const float kx0 = DT::from_raw(uint16_t(kw[2 * nt + h] & 0xffffu));
      const float kx1 = DT::from_raw(uint16_t(kw[2 * nt + h] >> 16));
      dK[0][nt][2 * h] += d0 * (b * eg);
      dK[0][nt][2 * h + 1] += d1 * (b * eg);
      row_of(rdb, h) += d0 * (kx0 * eg) + d1 * (kx1 * eg);
      row_of(rwy, h) += d0 * ((kx0 * b) * eg) + d1 * ((kx1 * b) * eg);
    }
}

// gdn_bwd_wy_kernel's dX epilogue: k's pairs from the padded tile sk (row stride ld), all read
// before the first update (not pair by pair behind the row test), then wy_dx_update.
template <class DT, class TK>
__device__ __forceinline__ void wy_dx_out(const float (&a)[1][TK::NT][4], float (&dK)[1][TK::NT][4], const uint16_t* sk,
                                          int ld, const float* sG, const float (&bh)[2], int r0, int L, Row2& rdb,
                                          Row2& rwy) {
  uint32_t kw[TK::NT * 2];
  smem_pairs<TK>(kw, sk, ld);
  wy_dx_update<DT, TK>(a, dK, kw, sG, bh, r0, L, rdb, rwy);
}

// gdn_bwd_wy_kernel's dY = Phi^T dv2 epilogue over the thread's accumulator a (Tiling TV, 64 x V:
// rows r0 + 8 h with beta bh[h]; rows >= L skipped), in TV::pairs' order: dv = dtype(beta dY)
// and dbeta += dY v, with v, dv the chunk's rows of the value head (row stride `stride`). Every
// load of v is issued before the first dv store (loaded pair by pair after each store, they
// were 2 NT dependent memory round trips).
template <class DT, class TV>
__device__ __forceinline__ void wy_dy_out(const float (&a)[1][TV::NT][4], const uint16_t* v, uint16_t* dv,
                                          int64_t stride, const float (&bh)[2], int r0, int L, Row2& rdb) {
  const int t4 = lane_id() & 3;
  uint32_t vv[TV::NT * 2];
#pragma unroll
  for (int nt = 0; nt < TV::NT; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t at = int64_t(r0 + 8 * h) * stride + TV::n0() + nt * 8 + 2 * t4;
      vv[2 * nt + h] = r0 + 8 * h < L ? __ldg(reinterpret_cast<const unsigned int*>(v + at)) : 0u;
    }
#pragma unroll
  for (int nt = 0; nt < TV::NT; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h;
      if (r >= L) continue;
      const float d0 = a[0][nt][2 * h], d1 = a[0][nt][2 * h + 1], b = bh[h];
      const uint32_t w = vv[2 * nt + h];
      st16x2<DT>(dv + int64_t(r) * stride + TV::n0() + nt * 8 + 2 * t4, b * d0, b * d1);
      rdb.add(r, d0 * DT::from_raw(uint16_t(w & 0xffffu)) + d1 * DT::from_raw(uint16_t(w >> 16)));
    }
}

// [D6] dPi's epilogue of both B5 kernels (gdn_bwd_wy_kernel, gdn_bwd_wy_wgmma.cuh) over a 64 x 64
// accumulator of Tiling<kC, kC> (WM = 4, MT = 1): dPi' = dPi exp2(g_r - g_s) (a = Phi^T T1, negated
// here), put(r, s, w) stores w, the pair dtype(dPi') at (r, s), (r, s + 1), in the kernel's layout;
// the gate term dPi' beta_r (k_r . k_s) goes into the row partials rgl and the column partials sCol
// (per warp row). The gates of the thread's rows and columns are read before the loop (its dPi'
// stores would hold back each later read).
template <class DT, class T64, class Put>
__device__ __forceinline__ void dpi_epilogue(const float (&a)[1][T64::NT][4], const float (&kk)[1][T64::NT][4],
                                             const float* sG, float* sCol, const float (&bh)[2], int L, Row2& rgl,
                                             Put&& put) {
  const int g8 = lane_id() >> 2, t4 = lane_id() & 3, rb = T64::m0(), cb = T64::n0();
  const float gr[2] = {sG[rb + g8], sG[rb + g8 + 8]};
  float gs[T64::NT][2];
#pragma unroll
  for (int nt = 0; nt < T64::NT; ++nt) {
    gs[nt][0] = sG[cb + nt * 8 + 2 * t4];
    gs[nt][1] = sG[cb + nt * 8 + 2 * t4 + 1];
  }
#pragma unroll
  for (int nt = 0; nt < T64::NT; ++nt) {
    float col0 = 0.0f, col1 = 0.0f;
#pragma unroll
    for (int h2 = 0; h2 < 2; ++h2) {
      const int r = rb + g8 + 8 * h2, s = cb + nt * 8 + 2 * t4;
      const float br = bh[h2];
      float z[2] = {0.f, 0.f}, pb[2] = {0.f, 0.f};
#pragma unroll
      for (int u = 0; u < 2; ++u) {
        if (s + u < r && r < L) {
          const float dpig = -a[0][nt][2 * h2 + u] * exp2f(gr[h2] - gs[nt][u]);
          pb[u] = DT::rnd(dpig);
          z[u] = dpig * (br * kk[0][nt][2 * h2 + u]);
        }
      }
      put(r, s, DT::pack(pb[0], pb[1]));
      row_of(rgl, h2) += z[0] + z[1];
      col0 += z[0];
      col1 += z[1];
    }
    col0 = column_sum(col0);
    col1 = column_sum(col1);
    if (g8 == 0) {
      sCol[(warp_id() % 4) * kC + cb + nt * 8 + 2 * t4] = col0;
      sCol[(warp_id() % 4) * kC + cb + nt * 8 + 2 * t4 + 1] = col1;
    }
  }
}

template <int K, int V>
struct WyBwdSmem {
  static constexpr int kKld = K + 8, kVld = V + 8, kPld = kC + 8;
  static constexpr int kOffDv2 = kC * kKld;  // after k
  static constexpr int kOffDW = kOffDv2 + kC * kVld;
  static constexpr int kOffPhi = kOffDW + kC * kKld;
  static constexpr int kOffKb = kOffDW;  // after dX: Kb reuses dW
  static constexpr int kOffXb = kOffPhi + kC * kPld;
  static constexpr int kOffYb = kOffXb + kC * kKld;
  static constexpr int kOffDPhi = kOffYb + kC * kVld;
  static constexpr int kOffT1 = kOffXb;  // after dPhi: T1 and dPi' reuse Xb, Yb
  static constexpr int kOffDPi = kOffXb + kC * kPld;
  static_assert(2 * kC * kPld <= kC * kKld + kC * kVld, "T1 and dPi' must fit in the Xb, Yb space");
  static constexpr int kElems16 = kOffDPhi + kC * kPld;
  static constexpr int kFloats = 2 * kC + kC * 2 * 3 + 4 * kC + kC * 3 + kC;
  static constexpr size_t bytes = size_t(kElems16) * 2 + size_t(kFloats) * 4;
};

// B5's last step, both kernels (gdn_bwd_wy_kernel, gdn_bwd_wy_wgmma.cuh): the rows' totals of the
// wy, gate and dbeta parts (row_totals), then for the chunk's rows r < L dlam = the B4 parts (sDl)
// + the wy total + the gate total - the column sums (sCol's four warp rows), and dbeta.
__device__ __forceinline__ void wy_finish_rows(const GradParams& p, const Row2& rwy, const Row2& rgl, const Row2& rdb,
                                               float* sRow, const float* sCol, float* sTot, const float* sDl,
                                               int64_t t0, int HV, int j, int L) {
  {
    Row2 rows[3] = {rwy, rgl, rdb};
    row_totals<3>(rows, sRow, sTot);
  }
  const int tid = int(threadIdx.x);
  if (tid < L) {
    const int r = tid;
    const float col = sCol[r] + sCol[kC + r] + sCol[2 * kC + r] + sCol[3 * kC + r];
    float dl = sDl[r];  // the B4 parts from gdn_bwd_dqk_kernel (wy_stage_rows)
    dl += sTot[r * 3];
    dl += sTot[r * 3 + 1] - col;
    p.dlam[(t0 + r) * HV + j] = dl;
    p.dbeta[(t0 + r) * HV + j] = sTot[r * 3 + 2];
  }
}

template <class DT, int K, int V>
__global__ void __launch_bounds__(kThreads, 2) gdn_bwd_wy_kernel(GradParams p) {
  using Sm = WyBwdSmem<K, V>;
  using TK = Tiling<kC, K>;
  using TV = Tiling<kC, V>;
  using T64 = Tiling<kC, kC>;
  static_assert(TK::WM == 4 && TV::WM == 4 && T64::WM == 4 && TK::MT == 1 && TV::MT == 1 && T64::MT == 1,
                "the row partials assume every 64-row tiling puts warp w on rows (w % 4) * 16");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* s16 = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* sk = s16;
  uint16_t* sdv2 = s16 + Sm::kOffDv2;
  uint16_t* sdW = s16 + Sm::kOffDW;
  uint16_t* sPhi = s16 + Sm::kOffPhi;
  uint16_t* sKb = s16 + Sm::kOffKb;
  uint16_t* sXb = s16 + Sm::kOffXb;
  uint16_t* sYb = s16 + Sm::kOffYb;
  uint16_t* sT1 = s16 + Sm::kOffT1;
  uint16_t* sdPi = s16 + Sm::kOffDPi;
  uint16_t* sdPhi = s16 + Sm::kOffDPhi;
  float* sG = reinterpret_cast<float*>(s16 + Sm::kElems16);
  float* sBeta = sG + kC;
  float* sRow = sBeta + kC;         // [64][2][3]
  float* sCol = sRow + kC * 2 * 3;  // [4 warp rows][64]
  float* sTot = sCol + 4 * kC;      // [64][3]
  float* sDl = sTot + kC * 3;       // the B4 gate parts (dlam + dlam_hi), 0 beyond L

  const int HV = p.sh.HV;
  const int64_t n = blockIdx.x / HV;
  const int j = blockIdx.x % HV, i = j / p.sh.G;
  const ChunkDesc ch = p.chunks[n];
  const int L = ch.len;
  const int64_t t0 = ch.begin;
  const int tid = threadIdx.x;
  const int kend = (L + 15) & ~15;
  const int64_t qk0 = (t0 * p.sh.H + i) * K, qks = int64_t(p.sh.H) * K;
  const int64_t vv0 = (t0 * HV + j) * V, vvs = int64_t(HV) * V;
  const int g8 = lane_id() >> 2;

  // One memory round trip: the tiles' loads, then the per-row values (after the tiles' loads in
  // program order, so that their stores to shared memory do not hold the tiles' loads back).
  {
    Tile16<kC, K> tk, tW;
    Tile16<kC, V> tD, tv;
    Tile16<kC, kC> tP;
    tk.load(p.k + qk0, qks, L);
    tW.load(p.dW16 + (t0 * HV + j) * K, int64_t(HV) * K, L);  // dW from gdn_bwd_dqk_kernel
    tD.load(p.dv2 + vv0, vvs, L);
    tv.load(p.v + vv0, vvs, L);
    tP.load(p.Phi + (t0 * HV + j) * kC, int64_t(HV) * kC, L);
    wy_stage_rows(p, t0 + tid, j, tid < L, sG, sBeta, sDl);
    __syncthreads();  // gcum, beta
    // The maps' per-row factors of this thread's 16-byte steps, read before the first store.
    using TTk = Tile16<kC, K>;
    using TTv = Tile16<kC, V>;
    static_assert(TTk::TOTAL % kThreads == 0 && TTv::TOTAL % kThreads == 0, "every step is a row of the tile");
    float bk[TTk::ITERS], ek[TTk::ITERS], bv[TTv::ITERS];
#pragma unroll
    for (int it = 0; it < TTk::ITERS; ++it) {
      bk[it] = sBeta[TTk::row_of(it)];
      ek[it] = exp2f(sG[TTk::row_of(it)]);
    }
#pragma unroll
    for (int it = 0; it < TTv::ITERS; ++it) bv[it] = sBeta[TTv::row_of(it)];
    tk.template store<DT>(sk, Sm::kKld);
    // Xb = dtype((k beta) exp2(g)), Yb = dtype(v beta) (v itself is not kept: dY's epilogue reads
    // its few elements from memory)
    tk.template store_by_iter<DT>(sXb, Sm::kKld, [&](int it, int, float kx) { return (kx * bk[it]) * ek[it]; });
    tW.template store<DT>(sdW, Sm::kKld);
    tD.template store<DT>(sdv2, Sm::kVld);
    tv.template store_by_iter<DT>(sYb, Sm::kVld, [&](int it, int, float x) { return x * bv[it]; });
    tP.template store<DT>(sPhi, Sm::kPld);
  }
  Row2 rwy, rgl, rdb;
  __syncthreads();
  // dK of the B4 part, at this thread's accumulator positions, loaded before dPhi's product
  // (which hides their latency; loaded after it, dX's product alone did not).
  float dK[1][TK::NT][4];
  TK::pairs(dK, [&](int r, int x, float& k0, float& k1) {
    float2 v = make_float2(0.f, 0.f);
    if (r < L) v = *reinterpret_cast<const float2*>(p.dk_hv + ((t0 + r) * HV + j) * K + x);
    k0 = v.x;
    k1 = v.y;
  });
  {  // dPhi = dW Xb^T + dv2 Yb^T (strictly lower part, rounded)
    float a[1][T64::NT][4];
    T64::zero(a);
    T64::template mma<DT>(a, AView<uint16_t, true>{sdW, Sm::kKld}, BView<uint16_t, true>{sXb, Sm::kKld}, 0, K);
    T64::template mma<DT>(a, AView<uint16_t, true>{sdv2, Sm::kVld}, BView<uint16_t, true>{sYb, Sm::kVld}, 0, V);
    T64::each(a, [&](int r, int s, float& v) { sdPhi[r * Sm::kPld + s] = DT::raw((s < r && r < L) ? v : 0.0f); });
  }
  // The thread's accumulator rows r0, r0 + 8 (the same in every 64-row tiling: WM = 4, MT = 1)
  // and their beta.
  const int r0 = TK::m0() + g8;
  const float bh[2] = {sBeta[r0], sBeta[r0 + 8]};
  {  // dX = Phi^T dW: dK, dbeta, gate
    float a[1][TK::NT][4];
    TK::zero(a);
    TK::template mma<DT>(a, AView<uint16_t, false>{sPhi, Sm::kPld}, BView<uint16_t, false>{sdW, Sm::kKld}, 0, kend);
    wy_dx_out<DT, TK>(a, dK, sk, Sm::kKld, sG, bh, r0, L, rdb, rwy);
  }
  {  // dY = Phi^T dv2: dv, dbeta
    float a[1][TV::NT][4];
    TV::zero(a);
    TV::template mma<DT>(a, AView<uint16_t, false>{sPhi, Sm::kPld}, BView<uint16_t, false>{sdv2, Sm::kVld}, 0, kend);
    wy_dy_out<DT, TV>(a, p.v + vv0, p.dv + vv0, vvs, bh, r0, L, rdb);
  }
  __syncthreads();  // dPhi visible; Xb, Yb, dW free
  // Kb = dtype(k beta)
  scale_rows_batched<DT, K>(sKb, sk, Sm::kKld, sBeta);
  {  // T1 = dtype(dPhi Phi^T), strictly lower
    float a[1][T64::NT][4];
    T64::zero(a);
    T64::template mma<DT>(a, AView<uint16_t, true>{sdPhi, Sm::kPld}, BView<uint16_t, true>{sPhi, Sm::kPld}, 0, kend);
    T64::each(a, [&](int m, int s, float& v) { sT1[m * Sm::kPld + s] = DT::raw(s < m ? v : 0.0f); });
  }
  __syncthreads();
  {  // dPi = -Phi^T T1; dPi' = dPi exp2(g_r - g_s); gate term with beta_r (k_r . k_s)
    float a[1][T64::NT][4], kk[1][T64::NT][4];
    T64::zero(a);
    T64::zero(kk);
    T64::template mma<DT>(a, AView<uint16_t, false>{sPhi, Sm::kPld}, BView<uint16_t, false>{sT1, Sm::kPld}, 0, kend);
    T64::template mma<DT>(kk, AView<uint16_t, true>{sk, Sm::kKld}, BView<uint16_t, true>{sk, Sm::kKld}, 0, K);
    dpi_epilogue<DT, T64>(a, kk, sG, sCol, bh, L, rgl,
                          [&](int r, int s, uint32_t w) { *reinterpret_cast<uint32_t*>(sdPi + r * Sm::kPld + s) = w; });
  }
  __syncthreads();  // dPi' visible
  {                 // dK += beta_r (dPi' k) + dPi'^T Kb; dbeta += (dPi' k) . k_r
    float a[1][TK::NT][4];
    TK::zero(a);
    TK::template mma<DT>(a, AView<uint16_t, true>{sdPi, Sm::kPld}, BView<uint16_t, false>{sk, Sm::kKld}, 0, kend);
    uint32_t kw[TK::NT * 2];  // k at the thread's pairs, read before the epilogue
    smem_pairs<TK>(kw, sk, Sm::kKld);
#pragma unroll
    for (int nt = 0; nt < TK::NT; ++nt)  // TK::zip_pairs' order
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + 8 * h;
        if (r >= L) continue;
        const float b = bh[h], w0 = a[0][nt][2 * h], w1 = a[0][nt][2 * h + 1];
        rdb.add(r, w0 * DT::from_raw(uint16_t(kw[2 * nt + h] & 0xffffu)) +
                       w1 * DT::from_raw(uint16_t(kw[2 * nt + h] >> 16)));
        dK[0][nt][2 * h] += b * w0;
        dK[0][nt][2 * h + 1] += b * w1;
      }
    TK::zero(a);
    TK::template mma<DT>(a, AView<uint16_t, false>{sdPi, Sm::kPld}, BView<uint16_t, false>{sKb, Sm::kKld}, 0, kend);
    TK::zip_pairs(a, dK, [&](int r, int x, float& c0, float& c1, float& k0, float& k1) {
      if (r >= L) return;
      k0 += c0;
      k1 += c1;
      *reinterpret_cast<float2*>(p.dk_hv + ((t0 + r) * HV + j) * K + x) = make_float2(k0, k1);
    });
  }
  wy_finish_rows(p, rwy, rgl, rdb, sRow, sCol, sTot, sDl, t0, HV, j, L);
}

// The parameters from the phase's Args (host), without the scratch pointers; the KDA kernels'
// extend them by dAqk and dAkk.
inline GradParams grad_params(const BwdGradArgs& a, const DevLayout& L) {
  GradParams p{};
  p.sh = shape_of(a.ctx.problem, L);
  p.chunks = L.chunks;
  p.q = a.q.packed16();
  p.k = a.k.packed16();
  p.v = a.v.packed16();
  p.beta = a.beta;
  p.gcum = a.gcum;
  p.Phi = a.Phi.packed16();
  p.h = a.h.packed16();
  p.v_new = a.v_new.packed16();
  p.dh = a.dh.packed16();
  p.dv2 = a.dv2.packed16();
  p.dO = a.dO.packed16();
  p.dq_hv = a.dq_hv;
  p.dk_hv = a.dk_hv;
  p.dv = a.dv.packed16();
  p.dbeta = a.dbeta;
  p.dlam = a.dlam;
  return p;
}

}  // namespace kcp::kernels::cuda
