// GDN backward gradients per (chunk, value head): B4 (dq, dk, dw, dgate from h, dh, v_new, dv2)
// and B5 (WY backward), docs/algorithm.md 3.1, with the rounding points [D1]-[D7] of the CPU twin
// (kernels/cpu/gdn_chunk_bwd.cpp). Included only by gdn_chunk_bwd.cu.
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

  if (tid < kC) sG[tid] = tid < L ? p.gcum[(t0 + tid) * HV + j] : 0.0f;
  {  // two memory round trips for the seven tiles
    Tile16<kKS, V> tS, tdS;
    Tile16<kC, V> tO;
    tS.load(p.h + kv0, V, kKS);
    tdS.load(p.dh + kv0, V, kKS);
    tO.load(p.dO + vv0, vvs, L);
    tS.template store<DT>(sS, Sm::kVld);
    tdS.template store<DT>(sdS, Sm::kVld);
    tO.template store<DT>(sdO, Sm::kVld);
  }
  {
    Tile16<kC, V> tN, tD;
    Tile16<kC, kKS> tk, tq;
    tN.load(p.v_new + vv0, vvs, L);
    tD.load(p.dv2 + vv0, vvs, L);
    tk.load(p.k + qk0, qks, L);
    tq.load(p.q + qk0, qks, L);
    tN.template store<DT>(svn, Sm::kVld);
    tD.template store<DT>(sdv2, Sm::kVld);
    tk.template store<DT>(sk, Sm::kSld);
    tq.template store<DT>(sq, Sm::kSld);
  }
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
  T64::each(dQ, [&](int r, int, float& v) { v = r < L ? v * exp2f(sG[r]) * scale : 0.0f; });
  T64::each(dK, [&](int r, int x, float& v) {
    v = r < L ? v * exp2f(gL - sG[r]) : 0.0f;
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
  T64::each(e, [&](int r, int s, float& v) {
    sE[r * Sm::kPld + s] = DT::raw((s <= r && r < L) ? v * exp2f(sG[r] - sG[s]) * scale : 0.0f);
  });
  __syncthreads();
  T64::template mma<DT>(dQ, AView<uint16_t, true>{sE, Sm::kPld}, BView<uint16_t, false>{sk, Sm::kSld}, 0, kend);
  T64::template mma<DT>(dK, AView<uint16_t, false>{sE, Sm::kPld}, BView<uint16_t, false>{sq, Sm::kSld}, 0, kend);
  Row2 rows[2];  // q . dQ, k . dK over the slice
  T64::zip_pairs(dQ, dK, [&](int r, int x, float& q0, float& q1, float& k0, float& k1) {
    rows[0].add(r, f16(sq, r * Sm::kSld + x) * q0 + f16(sq, r * Sm::kSld + x + 1) * q1);
    rows[1].add(r, f16(sk, r * Sm::kSld + x) * k0 + f16(sk, r * Sm::kSld + x + 1) * k1);
    if (r < L) {
      *reinterpret_cast<float2*>(p.dq_hv + ((t0 + r) * HV + j) * K + x0 + x) = make_float2(q0, q1);
      *reinterpret_cast<float2*>(p.dk_hv + ((t0 + r) * HV + j) * K + x0 + x) = make_float2(k0, k1);
    }
  });
  row_totals<2>(rows, sRow, sTot);
  if (tid < L) {
    float dl = sTot[tid * 2] - sTot[tid * 2 + 1];
    if (tid == L - 1) dl += dg_last;
    (kh == 0 ? p.dlam : p.dlam_hi)[(t0 + tid) * HV + j] = dl;
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
  static constexpr int kFloats = 2 * kC + kC * 2 * 3 + 4 * kC + kC * 3;
  static constexpr size_t bytes = size_t(kElems16) * 2 + size_t(kFloats) * 4;
};

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
  auto f16 = [](const uint16_t* t, int idx) { return DT::from_raw(t[idx]); };

  if (tid < kC) {
    sG[tid] = tid < L ? p.gcum[(t0 + tid) * HV + j] : 0.0f;
    sBeta[tid] = tid < L ? p.beta[(t0 + tid) * HV + j] : 0.0f;
  }
  {
    Tile16<kC, K> tk, tW;
    Tile16<kC, V> tD, tv;
    Tile16<kC, kC> tP;
    tk.load(p.k + qk0, qks, L);
    tW.load(p.dW16 + (t0 * HV + j) * K, int64_t(HV) * K, L);  // dW from gdn_bwd_dqk_kernel
    tD.load(p.dv2 + vv0, vvs, L);
    tv.load(p.v + vv0, vvs, L);
    tP.load(p.Phi + (t0 * HV + j) * kC, int64_t(HV) * kC, L);
    __syncthreads();  // beta
    tk.template store<DT>(sk, Sm::kKld);
    tW.template store<DT>(sdW, Sm::kKld);
    tD.template store<DT>(sdv2, Sm::kVld);
    tv.template store<DT>(sYb, Sm::kVld, [&](int r, float x) { return x * sBeta[r]; });  // v itself is
    tP.template store<DT>(sPhi, Sm::kPld);  // not kept: dY's epilogue reads its few elements from memory
  }
  Row2 rwy, rgl, rdb;
  __syncthreads();
  map_rows_to<DT, K>(sXb, sk, Sm::kKld, kC, [&](int r, float kx) { return (kx * sBeta[r]) * exp2f(sG[r]); });
  __syncthreads();
  {  // dPhi = dW Xb^T + dv2 Yb^T (strictly lower part, rounded)
    float a[1][T64::NT][4];
    T64::zero(a);
    T64::template mma<DT>(a, AView<uint16_t, true>{sdW, Sm::kKld}, BView<uint16_t, true>{sXb, Sm::kKld}, 0, K);
    T64::template mma<DT>(a, AView<uint16_t, true>{sdv2, Sm::kVld}, BView<uint16_t, true>{sYb, Sm::kVld}, 0, V);
    T64::each(a, [&](int r, int s, float& v) { sdPhi[r * Sm::kPld + s] = DT::raw((s < r && r < L) ? v : 0.0f); });
  }
  // dK of the B4 part, at this thread's accumulator positions (loaded here, not
  // earlier, so that it does not hold 32 registers through dPhi).
  float dK[1][TK::NT][4];
  TK::pairs(dK, [&](int r, int x, float& k0, float& k1) {
    float2 v = make_float2(0.f, 0.f);
    if (r < L) v = *reinterpret_cast<const float2*>(p.dk_hv + ((t0 + r) * HV + j) * K + x);
    k0 = v.x;
    k1 = v.y;
  });
  {  // dX = Phi^T dW: dK, dbeta, gate
    float a[1][TK::NT][4];
    TK::zero(a);
    TK::template mma<DT>(a, AView<uint16_t, false>{sPhi, Sm::kPld}, BView<uint16_t, false>{sdW, Sm::kKld}, 0, kend);
    TK::zip_pairs(a, dK, [&](int r, int x, float& d0, float& d1, float& k0, float& k1) {
      if (r >= L) return;
      const float b = sBeta[r], eg = exp2f(sG[r]);
      const float kx0 = f16(sk, r * Sm::kKld + x), kx1 = f16(sk, r * Sm::kKld + x + 1);
      k0 += d0 * (b * eg);
      k1 += d1 * (b * eg);
      rdb.add(r, d0 * (kx0 * eg) + d1 * (kx1 * eg));
      rwy.add(r, d0 * ((kx0 * b) * eg) + d1 * ((kx1 * b) * eg));
    });
  }
  {  // dY = Phi^T dv2: dv, dbeta
    float a[1][TV::NT][4];
    TV::zero(a);
    TV::template mma<DT>(a, AView<uint16_t, false>{sPhi, Sm::kPld}, BView<uint16_t, false>{sdv2, Sm::kVld}, 0, kend);
    TV::pairs(a, [&](int r, int c, float& d0, float& d1) {
      if (r >= L) return;
      const float b = sBeta[r];
      st16x2<DT>(p.dv + ((t0 + r) * HV + j) * V + c, b * d0, b * d1);
      const uint32_t vv = __ldg(reinterpret_cast<const unsigned int*>(p.v + vv0 + int64_t(r) * vvs + c));
      rdb.add(r, d0 * DT::from_raw(uint16_t(vv & 0xffffu)) + d1 * DT::from_raw(uint16_t(vv >> 16)));
    });
  }
  __syncthreads();  // dPhi visible; Xb, Yb, dW free
  map_rows_to<DT, K>(sKb, sk, Sm::kKld, kC, [&](int r, float kx) { return kx * sBeta[r]; });
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
    // Epilogue by explicit fragment loops (the column partials need the fragment index).
    const int t4 = lane_id() & 3, rb = T64::m0(), cb = T64::n0();
#pragma unroll
    for (int nt = 0; nt < T64::NT; ++nt) {
      float col0 = 0.0f, col1 = 0.0f;
#pragma unroll
      for (int h2 = 0; h2 < 2; ++h2) {
        const int r = rb + g8 + 8 * h2, s = cb + nt * 8 + 2 * t4;
        const float br = sBeta[r];
        float z[2] = {0.f, 0.f}, pb[2] = {0.f, 0.f};
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          if (s + u < r && r < L) {
            const float dpig = -a[0][nt][2 * h2 + u] * exp2f(sG[r] - sG[s + u]);
            pb[u] = DT::rnd(dpig);
            z[u] = dpig * (br * kk[0][nt][2 * h2 + u]);
          }
        }
        *reinterpret_cast<uint32_t*>(sdPi + r * Sm::kPld + s) = DT::pack(pb[0], pb[1]);
        rgl.add(r, z[0] + z[1]);
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
  __syncthreads();  // dPi' visible
  {                 // dK += beta_r (dPi' k) + dPi'^T Kb; dbeta += (dPi' k) . k_r
    float a[1][TK::NT][4];
    TK::zero(a);
    TK::template mma<DT>(a, AView<uint16_t, true>{sdPi, Sm::kPld}, BView<uint16_t, false>{sk, Sm::kKld}, 0, kend);
    TK::zip_pairs(a, dK, [&](int r, int x, float& w0, float& w1, float& k0, float& k1) {
      if (r >= L) return;
      const float b = sBeta[r];
      rdb.add(r, w0 * f16(sk, r * Sm::kKld + x) + w1 * f16(sk, r * Sm::kKld + x + 1));
      k0 += b * w0;
      k1 += b * w1;
    });
    TK::zero(a);
    TK::template mma<DT>(a, AView<uint16_t, false>{sdPi, Sm::kPld}, BView<uint16_t, false>{sKb, Sm::kKld}, 0, kend);
    TK::zip_pairs(a, dK, [&](int r, int x, float& c0, float& c1, float& k0, float& k1) {
      if (r >= L) return;
      k0 += c0;
      k1 += c1;
      *reinterpret_cast<float2*>(p.dk_hv + ((t0 + r) * HV + j) * K + x) = make_float2(k0, k1);
    });
  }
  {
    Row2 rows[3] = {rwy, rgl, rdb};
    row_totals<3>(rows, sRow, sTot);
  }
  if (tid < L) {
    const int r = tid;
    const float col = sCol[r] + sCol[kC + r] + sCol[2 * kC + r] + sCol[3 * kC + r];
    float dl = p.dlam[(t0 + r) * HV + j];  // the B4 parts from gdn_bwd_dqk_kernel, slice order
    if (p.dlam_hi) dl += p.dlam_hi[(t0 + r) * HV + j];
    dl += sTot[r * 3];
    dl += sTot[r * 3 + 1] - col;
    p.dlam[(t0 + r) * HV + j] = dl;
    p.dbeta[(t0 + r) * HV + j] = sTot[r * 3 + 2];
  }
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
