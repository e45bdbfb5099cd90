// KDA prep, intra-chunk part (docs/algorithm.md 1.2, F0-F2, F5 KDA), the CPU twin's prep.cpp [P2]
// and kda_chunk_fwd.cpp kda_intra [K1], [K2]. Included only by kda_prep.cu; q / k are prepared
// first by the operator-independent prep_qk_kernel (launch_prep_qk, gdn_prep.cu).
//
// kda_intra_kernel: grid NT * HV, block (chunk n, value head j) = (b / HV, b % HV), kThreads,
// two blocks per SM (about 109 KiB of shared memory at K = 128).
//   (1) gate: every gate load of a thread issued at once, activated in fp32 (kda_gate_rows; the
//       gate form chosen once per block, softplus by select), then thread c < K forms the
//       chunk-local inclusive cumsum of channel c in token order (the twin's order), times kRcpLn2,
//       to gcum and shared memory, reading 16 rows into registers before each run of adds. q, k
//       arrive meanwhile (cp.async, 16-bit).
//   (2) Pi and Aqk ([K1]) over the 4 x 4 grid of 16 x 16 sub-blocks (R, S) of the chunk, s <= r:
//       * diagonal blocks R == S (kda_diag_blocks): per pair and channel, exactly as the twin,
//         sum_c x_r[c] (k_s[c] exp2(g_r[c] - g_s[c])), masked pairs never evaluated;
//       * off-diagonal blocks R > S (kda_gated_slab, kda_offdiag_slab): pivot row p = 16 R, the
//         first row of sub-chunk R (F5, 7.5): exp2(g_r - g_s) = exp2(g_r - g_p) exp2(g_p - g_s),
//         both exponents <= 0, so each block is (X_R o exp2(G_R - g_p)) (K_S o exp2(g_p - G_S))^T,
//         an fp32 product on CUDA cores over channel slabs of 32 with gated operands formed once
//         per (row, channel) and (pivot, column row, channel), all 8 warps on the products. The
//         twin evaluates every pair elementwise; the two differ by fp32 reassociation only.
//       Full chunks (L = 64) take copies of the diagonal and slab loops without the tests
//       against L (no branches, so reads and exp2 interleave); the partial last chunk of a
//       sequence keeps them. Aqk = dtype(scale * sum) stored for s <= r (0 above), Pi =
//       beta_r * sum for s < r.
//   (3) Phi = (I + Pi)^-1 by chunk_inverse_64 (shared with GDN), stored in dtype (16-bit storage).
//   Shared memory: q, k 16-bit 64 x (K + 8); gcum fp32 64 x (K + 4); one gated slab fp32
//   32 x 200 (Phi and the merge scratch of (3) reuse it); Pi 64 x 65; beta 64.
#pragma once

#include "kernels/cuda/gdn_prep_kernel.cuh"  // chunk_inverse_64, store_phi, kPiLd
#include "kernels/cuda/kda_common.cuh"

#include <type_traits>

namespace kcp::kernels::cuda {

// The GDN intra parameters (gdn_prep_kernel.cuh: k, g, beta, A_log, dt_bias, gate, gcum, Phi with
// the KDA shapes) plus q, the lower bound and Aqk.
struct KdaIntraParams : IntraParams {
  const uint16_t* q;  // [T, H, K] dtype, 16-bit storage: q after prep
  float lower_bound;  // lb of GateForm::LowerBound
  float* Aqk;         // [T, HV, 64] dtype
};

// Natural-log decay of one gate element (docs/algorithm.md 1.2), fp32: the twin's activate() for
// the gate form Form, with eA = expf(A_log) formed once per block (expf(0) = 1 without A_log).
// Softplus: softplus_f's value with both of its sides evaluated and one selected (no branch, so a
// thread's activations interleave; ln(1 + e^x) of x > 20 is discarded, at worst inf).
template <int Form>
__device__ __forceinline__ float kda_activate(const KdaIntraParams& p, float graw, float eA, float bias) {
  if constexpr (Form == int(GateForm::Softplus)) {
    const float x = graw + bias, ln1pe = logf(1.0f + expf(x));
    return -eA * (x > 20.0f ? x : ln1pe);
  } else if constexpr (Form == int(GateForm::LowerBound)) {
    const float x = graw + bias;
    const float z = p.A_log ? eA * x : x;
    return p.lower_bound * sigmoid_f(z);
  } else {
    return graw;
  }
}

// The gated slab of the off-diagonal blocks: 32 channels (rows of the slab) x 192 columns:
// [0, 48) q_r o exp2(g_r - g_p) and [48, 96) k_r o exp2(g_r - g_p) for r = 16..63 (p = 16 (r / 16)),
// [96, 192) k_s o exp2(g_p - g_s) for the pivots p = 16, 32, 48 and s < p (kSlabB: column base).
inline constexpr int kSlabC = 32;  // channels per slab
inline constexpr int kSlabA = 48;  // rows 16..63, each gated q and k
inline constexpr int kSlabCols = 4 * kSlabA;
inline constexpr int kSlabLd = kSlabCols + 8;  // = 8 mod 32: 8 columns x 4 channels hit 32 banks
__host__ __device__ constexpr int slab_b(int R) { return 2 * kSlabA + 8 * R * (R - 1); }  // K_S of pivot 16 R

template <int K>
struct KdaIntraSmem {
  static_assert(K % kSlabC == 0, "whole channel slabs");
  static constexpr int kLd16 = K + 8;  // 16-bit q, k rows, 16-byte aligned
  static constexpr int kLdG = K + 4;   // = 4 mod 32: 8 rows x 4 channels hit 32 banks
  static constexpr size_t q16 = 0, k16 = q16 + size_t(kC) * kLd16 * 2, g = k16 + size_t(kC) * kLd16 * 2;
  static constexpr size_t slab = g + size_t(kC) * kLdG * 4, pi = slab + size_t(kSlabC) * kSlabLd * 4;
  static constexpr size_t beta = pi + size_t(kC) * kPiLd * 4, bytes = beta + kC * 4;
  static_assert((size_t(kC) * kPiLd + 3 * 256) * 4 <= size_t(kSlabC) * kSlabLd * 4, "Phi, scratch in slab");
  static_assert(2 * bytes + 2048 <= 228 * 1024, "two blocks per SM");
};

// (1a) The activated gates a (fp32, natural log) of channel c = tid % K, rows r0 + kStep u < L
// (r0 = tid / K), into sG (rows beyond L: 0, activated from a 0 input but not stored): every gate
// load of the thread issued before the first activation; no branch of ours among the activations
// (LowerBound's IEEE division keeps its own slow path).
template <int K, int Form>
__device__ __forceinline__ void kda_gate_rows(const KdaIntraParams& p, const KdaIx& ix, const ChunkItem& w, float* sG) {
  using Sm = KdaIntraSmem<K>;
  constexpr int kStep = kThreads / K, kIters = kC / kStep;
  static_assert(kThreads % K == 0, "a thread keeps its channel");
  const int c = threadIdx.x % K, r0 = threadIdx.x / K, L = w.L;
  const float eA = expf(p.A_log ? p.A_log[w.j] : 0.0f);
  const float bias = p.dt_bias ? p.dt_bias[int64_t(w.j) * K + c] : 0.0f;
  const float* src = p.g + ix.hk(w.t0 + r0, w.j) + c;  // row r0 + kStep u at u * ld
  const int ld = kStep * int(ix.HV) * K;               // (a chunk of [T, HV, K] spans < 2^31 elements)
  float graw[kIters];
#pragma unroll
  for (int u = 0; u < kIters; ++u) graw[u] = r0 + kStep * u < L ? src[u * ld] : 0.0f;
#pragma unroll
  for (int u = 0; u < kIters; ++u) {
    const int r = r0 + kStep * u;
    const float a = kda_activate<Form>(p, graw[u], eA, bias);
    sG[r * Sm::kLdG + c] = r < L ? a : 0.0f;
  }
}

// (1a) q, k rows of the chunk (cp.async, 16-bit, zero rows beyond L), beta, and the activated
// gates into sG (kda_gate_rows, one branch on the gate form per block). No barrier.
template <int K>
__device__ __forceinline__ void kda_gate_stage(const KdaIntraParams& p, const KdaIx& ix, const ChunkItem& w,
                                               uint16_t* sq, uint16_t* sk, float* sG, float* sB) {
  using Sm = KdaIntraSmem<K>;
  const int tid = threadIdx.x, L = w.L;
  cp_async_rows<uint16_t, kC, K>(sq, Sm::kLd16, p.q + ix.qk(w.t0, w.i), ix.H * K, L);
  cp_async_rows<uint16_t, kC, K>(sk, Sm::kLd16, p.k + ix.qk(w.t0, w.i), ix.H * K, L);
  cp_async_commit();
  if (tid < kC) sB[tid] = tid < L ? p.beta[ix.th(w.t0 + tid, w.j)] : 0.0f;
  if (p.gate == int(GateForm::Softplus))
    kda_gate_rows<K, int(GateForm::Softplus)>(p, ix, w, sG);
  else if (p.gate == int(GateForm::LowerBound))
    kda_gate_rows<K, int(GateForm::LowerBound)>(p, ix, w, sG);
  else
    kda_gate_rows<K, int(GateForm::Direct)>(p, ix, w, sG);
}

// (1b) [P2] cumsum of channel c = tid < K in token order, in log2 units, to sG and gcum; rows
// beyond L hold 0 (never exponentiated: 7.1). Rows in groups of 16: the group's activations are
// read into registers first, so the chain is one fp32 add per row. Between two barriers.
template <int K>
__device__ __forceinline__ void kda_gate_cumsum(const KdaIntraParams& p, const KdaIx& ix, const ChunkItem& w,
                                                float* sG) {
  using Sm = KdaIntraSmem<K>;
  constexpr int kGroup = 16;
  const int c = threadIdx.x, L = w.L;
  if (c >= K) return;
  const int ld = int(ix.HV) * K;               // (a chunk of [T, HV, K] spans < 2^31 elements)
  float* dst = p.gcum + ix.hk(w.t0, w.j) + c;  // row r0 + u at u * ld
  float acc = 0.0f;
#pragma unroll 1
  for (int r0 = 0; r0 < kC; r0 += kGroup, dst += kGroup * ld) {
    float* row = sG + r0 * Sm::kLdG + c;
    float a[kGroup];
#pragma unroll
    for (int u = 0; u < kGroup; ++u) a[u] = r0 + u < L ? row[u * Sm::kLdG] : 0.0f;
#pragma unroll
    for (int u = 0; u < kGroup; ++u) {
      float v = 0.0f;
      if (r0 + u < L) {
        acc += a[u];
        v = acc * kRcpLn2;
        dst[u * ld] = v;
      }
      row[u * Sm::kLdG] = v;
    }
  }
}

// Four consecutive 16-bit dtype values of a shared-memory row (8-byte aligned) as fp32. A bf16
// value is the high half of its fp32 value, so bf16 takes one shift or mask per value (the bits of
// from_raw, which sm_90 also forms by a shift).
template <class DT>
__device__ __forceinline__ void ld4_16(const uint16_t* src, float (&x)[4]) {
  const uint2 w = *reinterpret_cast<const uint2*>(src);
  if constexpr (std::is_same_v<DT, Bf16>) {
    x[0] = __uint_as_float(w.x << 16);
    x[1] = __uint_as_float(w.x & 0xffff0000u);
    x[2] = __uint_as_float(w.y << 16);
    x[3] = __uint_as_float(w.y & 0xffff0000u);
  } else {
    x[0] = DT::from_raw(uint16_t(w.x & 0xffffu));
    x[1] = DT::from_raw(uint16_t(w.x >> 16));
    x[2] = DT::from_raw(uint16_t(w.y & 0xffffu));
    x[3] = DT::from_raw(uint16_t(w.y >> 16));
  }
}
__device__ __forceinline__ void ld4(const float* src, float (&x)[4]) {
  const float4 v = *reinterpret_cast<const float4*>(src);
  x[0] = v.x;
  x[1] = v.y;
  x[2] = v.z;
  x[3] = v.w;
}

// Pi and Aqk of one pair (r, s), s <= r, from its sums over the channels: Aqk (row r at aqk_r) for
// r < L, Pi (0 on the diagonal and beyond the chunk).
template <class DT>
__device__ __forceinline__ void kda_store_pair(const KdaIntraParams& p, const ChunkItem& w, float* sPi, const float* sB,
                                               float* aqk_r, int r, int s, float aq, float ak) {
  sPi[r * kPiLd + s] = (s < r && r < w.L) ? sB[r] * ak : 0.0f;
  if (r < w.L) aqk_r[s] = DT::rnd(aq * p.sh.scale);
}

// (2a) [K1] the diagonal 16 x 16 blocks, per pair and channel (136 pairs a block). Thread
// (unit = tid / 8, slice h = tid % 8): block B = unit / 8, rows r1 = 16 B + i, r2 = 16 B + 15 - i
// (i = unit % 8): their 17 pairs u (u <= i: (r1, 16 B + u), else (r2, 16 B + u - i - 1)) over
// the channel quads h, h + 8, ... (conflict-free float4 reads of a row); then the 8 slices are
// summed by a fixed xor butterfly (same bits in every lane). Pairs with r >= L are never
// evaluated. kda_diag_pairs does the pairs [U0, U1); kFull (L = 64, every chunk but a sequence's
// last) drops the test r >= L, so the pairs' reads and exp2 interleave. No barrier.
template <class DT, int K, bool kFull, int U0, int U1>
__device__ __forceinline__ void kda_diag_pairs(const KdaIntraParams& p, const KdaIx& ix, const ChunkItem& w,
                                               const uint16_t* sq, const uint16_t* sk, const float* sG, float* sPi,
                                               const float* sB) {
  using Sm = KdaIntraSmem<K>;
  const int h = threadIdx.x & 7, unit = threadIdx.x >> 3, b = 16 * (unit >> 3), i = unit & 7;
  const int r1 = b + i, r2 = b + 15 - i;
  float aq[U1 - U0], ak[U1 - U0];
#pragma unroll
  for (int u = 0; u < U1 - U0; ++u) aq[u] = ak[u] = 0.0f;
  for (int c = 4 * h; c < K; c += 32) {
    float g1[4], g2[4], q1[4], q2[4], k1[4], k2[4];
    if constexpr (U0 < 8) {  // pairs of r1 only among u <= i <= 7
      ld4(sG + r1 * Sm::kLdG + c, g1);
      ld4_16<DT>(sq + r1 * Sm::kLd16 + c, q1);
      ld4_16<DT>(sk + r1 * Sm::kLd16 + c, k1);
    }
    ld4(sG + r2 * Sm::kLdG + c, g2);
    ld4_16<DT>(sq + r2 * Sm::kLd16 + c, q2);
    ld4_16<DT>(sk + r2 * Sm::kLd16 + c, k2);
#pragma unroll
    for (int u = U0; u < U1; ++u) {
      const bool first = u <= 7 && u <= i;  // (i <= 7)
      const int r = first ? r1 : r2, s = b + (first ? u : u - i - 1);
      if (!kFull && r >= w.L) continue;
      float gs[4], ks[4];
      ld4(sG + s * Sm::kLdG + c, gs);
      ld4_16<DT>(sk + s * Sm::kLd16 + c, ks);
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const float kse = ks[x] * exp2f((first ? g1[x] : g2[x]) - gs[x]);
        aq[u - U0] += (first ? q1[x] : q2[x]) * kse;
        ak[u - U0] += (first ? k1[x] : k2[x]) * kse;
      }
    }
  }
  float* const aqk1 = p.Aqk + ix.cc(w.t0 + r1, w.j);  // Aqk rows r1, r2
  float* const aqk2 = p.Aqk + ix.cc(w.t0 + r2, w.j);
#pragma unroll
  for (int u = U0; u < U1; ++u) {
#pragma unroll
    for (int m = 1; m < 8; m <<= 1) {
      aq[u - U0] += __shfl_xor_sync(0xffffffffu, aq[u - U0], m);
      ak[u - U0] += __shfl_xor_sync(0xffffffffu, ak[u - U0], m);
    }
    if ((u & 7) == h) {
      const bool first = u <= 7 && u <= i;
      kda_store_pair<DT>(p, w, sPi, sB, first ? aqk1 : aqk2, first ? r1 : r2, b + (first ? u : u - i - 1), aq[u - U0],
                         ak[u - U0]);
    }
  }
}

// (2a) All 17 pairs of the thread: u < 8 (both rows), then u >= 8 (r2 only).
template <class DT, int K, bool kFull>
__device__ __forceinline__ void kda_diag_blocks(const KdaIntraParams& p, const KdaIx& ix, const ChunkItem& w,
                                                const uint16_t* sq, const uint16_t* sk, const float* sG, float* sPi,
                                                const float* sB) {
  kda_diag_pairs<DT, K, kFull, 0, 8>(p, ix, w, sq, sk, sG, sPi, sB);
  kda_diag_pairs<DT, K, kFull, 8, 17>(p, ix, w, sq, sk, sG, sPi, sB);
}

// (2b) F5 pivot operands of channels [c0, c0 + kSlabC) into the slab sX (layout above). Warp w
// owns slab rows 4 w .. 4 w + 3; lane: channel 4 w + lane % 4 and the chunk rows 8 m + lane / 4
// (m < 8), which serve both as gated rows r = 16 + v (m >= 2) and as column rows s of the pivots
// 16 R > s; all of the lane's shared-memory reads are issued first (reads and writes
// conflict-free). Gated rows beyond the chunk (r >= L, or a pivot p >= L) are selected 0, never
// exponentiated (7.1); kFull (L = 64) drops these tests (no branch). Every evaluated exponent is
// <= 0 (7.5). After a barrier that frees sX; no barrier.
template <class DT, int K, bool kFull>
__device__ __forceinline__ void kda_gated_slab(const uint16_t* sq, const uint16_t* sk, const float* sG, float* sX,
                                               int c0, int L) {
  using Sm = KdaIntraSmem<K>;
  constexpr int kM = kC / 8;  // the lane's chunk rows 8 m + l
  const int cl = 4 * warp_id() + (lane_id() & 3), c = c0 + cl, l = lane_id() >> 2;
  float gp[3], g[kM], q[kM], k[kM];  // g of the pivots 16 R; g, q, k of the rows 8 m + l
#pragma unroll
  for (int R = 1; R <= 3; ++R) gp[R - 1] = sG[16 * R * Sm::kLdG + c];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    const int r = 8 * m + l;
    g[m] = sG[r * Sm::kLdG + c];
    q[m] = m >= 2 ? DT::from_raw(sq[r * Sm::kLd16 + c]) : 0.0f;  // (q of rows < 16 is not used)
    k[m] = DT::from_raw(sk[r * Sm::kLd16 + c]);
  }
  float* dst = sX + cl * kSlabLd + l;
#pragma unroll
  for (int m = 2; m < kM; ++m) {  // row r = 16 + v, v = 8 (m - 2) + l, against its pivot 16 (m / 2)
    const int v = 8 * (m - 2), r = 16 + v + l;
    float qg = 0.0f, kg = 0.0f;
    if (kFull || r < L) {
      const float e = exp2f(g[m] - gp[m / 2 - 1]);
      qg = q[m] * e;
      kg = k[m] * e;
    }
    dst[v] = qg;
    dst[kSlabA + v] = kg;
  }
#pragma unroll
  for (int R = 1; R <= 3; ++R) {  // column row s = 8 m + l of pivot 16 R
#pragma unroll
    for (int m = 0; m < 2 * R; ++m)
      dst[slab_b(R) + 8 * m] = kFull || 16 * R < L ? k[m] * exp2f(gp[R - 1] - g[m]) : 0.0f;
  }
}

// Off-diagonal tile of warp w: block (R, S), rows 16 R + h0 + NR (lane / 4) + y (y < NR), columns
// 16 S + 4 (lane % 4) + x (x < 4). Warps 0-3 own whole blocks (NR = 2): (2,0) (2,1) (3,0) (3,1);
// warps 4-7 the halves (NR = 1, h0 = 0 or 8) of (1,0) and (3,2). So the warps w and w + 4 of one
// SM sub-partition form 24 products a lane and channel together.
struct OffdiagTile {
  int R, S, h0;
};
__device__ __forceinline__ OffdiagTile offdiag_tile(int w) {
  if (w < 4) return {2 + (w >> 1), w & 1, 0};
  return {w < 6 ? 1 : 3, w < 6 ? 0 : 2, 8 * (w & 1)};
}

// (2c) One slab's contribution to the warp's tile: aq (gated q) and ak (gated k), fp32 FMAs,
// channels ascending. Register tile NR x 4 x 2 from one float4 and NR-wide reads a channel.
struct OffdiagAcc {
  float aq[2][4], ak[2][4];
};
template <int NR>
__device__ __forceinline__ void kda_offdiag_slab(const float* sX, OffdiagTile t, OffdiagAcc& acc) {
  const int a = 16 * (t.R - 1) + t.h0 + NR * (lane_id() >> 2), bcol = slab_b(t.R) + 16 * t.S + 4 * (lane_id() & 3);
#pragma unroll 8
  for (int c = 0; c < kSlabC; ++c) {
    const float* row = sX + c * kSlabLd;
    float qg[NR], kg[NR], kn[4];
    if constexpr (NR == 2) {
      const float2 q2 = *reinterpret_cast<const float2*>(row + a),
                   k2 = *reinterpret_cast<const float2*>(row + kSlabA + a);
      qg[0] = q2.x, qg[1] = q2.y, kg[0] = k2.x, kg[1] = k2.y;
    } else {
      qg[0] = row[a], kg[0] = row[kSlabA + a];
    }
    ld4(row + bcol, kn);
#pragma unroll
    for (int x = 0; x < 4; ++x) {
#pragma unroll
      for (int y = 0; y < NR; ++y) {
        acc.aq[y][x] += qg[y] * kn[x];
        acc.ak[y][x] += kg[y] * kn[x];
      }
    }
  }
}

// The warp's tile to Aqk (rows < L, 16-byte stores) and Pi.
template <class DT, int NR>
__device__ __forceinline__ void kda_offdiag_store(const KdaIntraParams& p, const KdaIx& ix, const ChunkItem& w,
                                                  OffdiagTile t, const OffdiagAcc& acc, float* sPi, const float* sB) {
  const float scale = p.sh.scale;
#pragma unroll
  for (int y = 0; y < NR; ++y) {
    const int r = 16 * t.R + t.h0 + NR * (lane_id() >> 2) + y, s = 16 * t.S + 4 * (lane_id() & 3);
    const bool in = r < w.L;
#pragma unroll
    for (int x = 0; x < 4; ++x) sPi[r * kPiLd + s + x] = in ? sB[r] * acc.ak[y][x] : 0.0f;
    if (in)
      *reinterpret_cast<float4*>(p.Aqk + ix.cc(w.t0 + r, w.j) + s) =
          make_float4(DT::rnd(acc.aq[y][0] * scale), DT::rnd(acc.aq[y][1] * scale), DT::rnd(acc.aq[y][2] * scale),
                      DT::rnd(acc.aq[y][3] * scale));
  }
}

// Pi and Aqk above the diagonal: 0 (Aqk for rows < L only). Thread: column s = tid % 64, rows
// tid / 64 + kStep u (unrolled, one row pointer). No barrier.
__device__ __forceinline__ void kda_upper_zero(const KdaIntraParams& p, const KdaIx& ix, const ChunkItem& w,
                                               float* sPi) {
  constexpr int kStep = kThreads / kC;
  static_assert(kThreads % kC == 0, "a thread keeps its column");
  const int s = threadIdx.x % kC, r0 = threadIdx.x / kC;
  float* dst = p.Aqk + ix.cc(w.t0 + r0, w.j) + s;  // row r0 + kStep u at u * ld
  const int ld = kStep * int(ix.HV) * kC;
#pragma unroll
  for (int u = 0; u < kC / kStep; ++u) {
    const int r = r0 + kStep * u;
    if (r < s) {
      sPi[r * kPiLd + s] = 0.0f;
      if (r < w.L) dst[u * ld] = 0.0f;
    }
  }
}

// (2) Pi and Aqk: diagonal blocks per pair, off-diagonal blocks slab by slab (8 warps). Ends with
// a barrier that completes sPi and frees sX.
template <class DT, int K>
__device__ __forceinline__ void kda_pairs(const KdaIntraParams& p, const KdaIx& ix, const ChunkItem& w,
                                          const uint16_t* sq, const uint16_t* sk, const float* sG, float* sX,
                                          float* sPi, const float* sB) {
  kda_upper_zero(p, ix, w, sPi);
  if (w.L == kC)
    kda_diag_blocks<DT, K, true>(p, ix, w, sq, sk, sG, sPi, sB);
  else
    kda_diag_blocks<DT, K, false>(p, ix, w, sq, sk, sG, sPi, sB);
  const bool whole = warp_id() < 4;  // (warp-uniform)
  const OffdiagTile t = offdiag_tile(warp_id());
  OffdiagAcc acc = {};
  for (int c0 = 0; c0 < K; c0 += kSlabC) {
    if (w.L == kC)
      kda_gated_slab<DT, K, true>(sq, sk, sG, sX, c0, w.L);
    else
      kda_gated_slab<DT, K, false>(sq, sk, sG, sX, c0, w.L);
    __syncthreads();
    if (whole)
      kda_offdiag_slab<2>(sX, t, acc);
    else
      kda_offdiag_slab<1>(sX, t, acc);
    __syncthreads();
  }
  if (whole)
    kda_offdiag_store<DT, 2>(p, ix, w, t, acc, sPi, sB);
  else
    kda_offdiag_store<DT, 1>(p, ix, w, t, acc, sPi, sB);
  __syncthreads();
}

template <class DT, int K>
__global__ void __launch_bounds__(kThreads, 2) kda_intra_kernel(KdaIntraParams p) {
  using Sm = KdaIntraSmem<K>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* sq = reinterpret_cast<uint16_t*>(smem_raw + Sm::q16);
  uint16_t* sk = reinterpret_cast<uint16_t*>(smem_raw + Sm::k16);
  float* sG = reinterpret_cast<float*>(smem_raw + Sm::g);
  float* sX = reinterpret_cast<float*>(smem_raw + Sm::slab);
  float* sPi = reinterpret_cast<float*>(smem_raw + Sm::pi);
  float* sB = reinterpret_cast<float*>(smem_raw + Sm::beta);
  float* sPhi = sX;                 // (3) reuses the slab
  float* sTmp = sPhi + kC * kPiLd;  // 3 x 16 x 16

  const KdaIx ix = kda_ix(p.sh);
  const ChunkItem w = chunk_item(p.chunks, p.sh, blockIdx.x);

  // (1) gates, q, k, beta ([P2]).
  kda_gate_stage<K>(p, ix, w, sq, sk, sG, sB);
  cp_async_wait_all();
  __syncthreads();
  kda_gate_cumsum<K>(p, ix, w, sG);
  __syncthreads();

  // (2) Pi and Aqk ([K1], F5 pivots off the diagonal).
  kda_pairs<DT, K>(p, ix, w, sq, sk, sG, sX, sPi, sB);

  // (3) Phi ([K2]).
  chunk_inverse_64(sPi, sPhi, sTmp);
  store_phi<DT>(sPhi, p.Phi, w.t0, w.L, w.j, p.sh.HV);
}

}  // namespace kcp::kernels::cuda
