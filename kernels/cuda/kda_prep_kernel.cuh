// KDA prep, intra-chunk part (docs/algorithm.md 1.2, F0-F2, F5 KDA), the CPU twin's prep.cpp [P2]
// and kda_chunk_fwd.cpp kda_intra [K1], [K2]. Included only by kda_prep.cu; q / k are prepared
// first by the operator-independent prep_qk_kernel (launch_prep_qk, gdn_prep.cu).
//
// kda_intra_kernel: grid NT * HV, block (chunk n, value head j) = (b / HV, b % HV), kThreads,
// two blocks per SM (about 109 KiB of shared memory at K = 128).
//   (1) gate: all gate inputs of the chunk loaded at once and activated in fp32 (kda_gate_stage),
//       then thread c < K forms the chunk-local inclusive cumsum of channel c in token order (the
//       twin's order), times kRcpLn2, to gcum and shared memory. q, k arrive meanwhile (cp.async,
//       16-bit).
//   (2) Pi and Aqk ([K1]) over the 4 x 4 grid of 16 x 16 sub-blocks (R, S) of the chunk, s <= r:
//       * diagonal blocks R == S (kda_diag_blocks): per pair and channel, exactly as the twin,
//         sum_c x_r[c] (k_s[c] exp2(g_r[c] - g_s[c])), masked pairs never evaluated;
//       * off-diagonal blocks R > S (kda_gated_slab, kda_offdiag_slab): pivot row p = 16 R, the
//         first row of sub-chunk R (F5, 7.5): exp2(g_r - g_s) = exp2(g_r - g_p) exp2(g_p - g_s),
//         both exponents <= 0, so each block is (X_R o exp2(G_R - g_p)) (K_S o exp2(g_p - G_S))^T,
//         an fp32 product on CUDA cores over channel slabs of 32 with gated operands formed once
//         per (row, channel) and (pivot, column row, channel). The twin evaluates every pair
//         elementwise; the two differ by fp32 reassociation only.
//       Aqk = dtype(scale * sum) stored for s <= r (0 above), Pi = beta_r * sum for s < r.
//   (3) Phi = (I + Pi)^-1 by chunk_inverse_64 (shared with GDN), stored in dtype (16-bit storage).
//   Shared memory: q, k 16-bit 64 x (K + 8); gcum fp32 64 x (K + 4); one gated slab fp32
//   32 x 200 (Phi and the merge scratch of (3) reuse it); Pi 64 x 65; beta 64.
#pragma once

#include "kernels/cuda/gdn_prep_kernel.cuh"  // chunk_inverse_64, store_phi, kPiLd
#include "kernels/cuda/kda_common.cuh"

namespace kcp::kernels::cuda {

// The GDN intra parameters (gdn_prep_kernel.cuh: k, g, beta, A_log, dt_bias, gate, gcum, Phi with
// the KDA shapes) plus q, the lower bound and Aqk.
struct KdaIntraParams : IntraParams {
  const uint16_t* q;  // [T, H, K] dtype, 16-bit storage: q after prep
  float lower_bound;  // lb of GateForm::LowerBound
  float* Aqk;         // [T, HV, 64] dtype
};

// Natural-log decay of one gate element (docs/algorithm.md 1.2), fp32: the twin's activate().
__device__ __forceinline__ float kda_activate(const KdaIntraParams& p, float graw, float A_log, float bias) {
  if (p.gate == int(GateForm::Softplus)) return -expf(A_log) * softplus_f(graw + bias);
  if (p.gate == int(GateForm::LowerBound)) {
    const float x = graw + bias;
    const float z = p.A_log ? expf(A_log) * x : x;
    return p.lower_bound * sigmoid_f(z);
  }
  return graw;
}

// The gated slab of the off-diagonal blocks: 32 channels (rows of the slab) x 192 columns:
// [0, 48) q_r o exp2(g_r - g_p) and [48, 96) k_r o exp2(g_r - g_p) for r = 16..63 (p = 16 (r / 16)),
// [96, 192) k_s o exp2(g_p - g_s) for the pivots p = 16, 32, 48 and s < p (kSlabB: column base).
inline constexpr int kSlabC = 32;  // channels per slab
inline constexpr int kSlabA = 48;  // rows 16..63, each gated q and k
inline constexpr int kSlabCols = 4 * kSlabA;
inline constexpr int kSlabLd = kSlabCols + 8;  // = 8 mod 32: 8 columns x 4 channels hit 32 banks
__device__ __forceinline__ int slab_b(int R) { return 2 * kSlabA + 8 * R * (R - 1); }  // K_S of pivot 16 R

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

// (1a) q, k rows of the chunk (cp.async, 16-bit, zero rows beyond L), beta, and the activated
// gates a (fp32, natural log) of rows < L into sG: every gate load of the chunk issued at once.
// No barrier.
template <int K>
__device__ __forceinline__ void kda_gate_stage(const KdaIntraParams& p, const KdaIx& ix, const ChunkItem& w,
                                               uint16_t* sq, uint16_t* sk, float* sG, float* sB) {
  using Sm = KdaIntraSmem<K>;
  constexpr int kIters = kC * K / kThreads;
  static_assert(kThreads % K == 0, "a thread keeps its channel");
  const int tid = threadIdx.x, c = tid % K, L = w.L;
  cp_async_rows<uint16_t, kC, K>(sq, Sm::kLd16, p.q + ix.qk(w.t0, w.i), ix.H * K, L);
  cp_async_rows<uint16_t, kC, K>(sk, Sm::kLd16, p.k + ix.qk(w.t0, w.i), ix.H * K, L);
  cp_async_commit();
  if (tid < kC) sB[tid] = tid < L ? p.beta[ix.th(w.t0 + tid, w.j)] : 0.0f;
  const float A_log = p.A_log ? p.A_log[w.j] : 0.0f;
  const float bias = p.dt_bias ? p.dt_bias[int64_t(w.j) * K + c] : 0.0f;
  float graw[kIters];
#pragma unroll
  for (int u = 0; u < kIters; ++u) {
    const int r = (tid + u * kThreads) / K;
    graw[u] = r < L ? p.g[ix.hk(w.t0 + r, w.j) + c] : 0.0f;
  }
#pragma unroll
  for (int u = 0; u < kIters; ++u) {
    const int r = (tid + u * kThreads) / K;
    if (r < L) sG[r * Sm::kLdG + c] = kda_activate(p, graw[u], A_log, bias);
  }
}

// (1b) [P2] cumsum of channel c = tid < K in token order, in log2 units, to sG and gcum; rows
// beyond L hold 0 (never exponentiated: 7.1). Between two barriers.
template <int K>
__device__ __forceinline__ void kda_gate_cumsum(const KdaIntraParams& p, const KdaIx& ix, const ChunkItem& w,
                                                float* sG) {
  using Sm = KdaIntraSmem<K>;
  const int c = threadIdx.x;
  if (c >= K) return;
  float acc = 0.0f;
  for (int r = 0; r < kC; ++r) {
    float v = 0.0f;
    if (r < w.L) {
      acc += sG[r * Sm::kLdG + c];
      v = acc * kRcpLn2;
      p.gcum[ix.hk(w.t0 + r, w.j) + c] = v;
    }
    sG[r * Sm::kLdG + c] = v;
  }
}

// Four consecutive 16-bit dtype values of a shared-memory row (8-byte aligned) as fp32.
template <class DT>
__device__ __forceinline__ void ld4_16(const uint16_t* src, float (&x)[4]) {
  const uint2 w = *reinterpret_cast<const uint2*>(src);
  x[0] = DT::from_raw(uint16_t(w.x & 0xffffu));
  x[1] = DT::from_raw(uint16_t(w.x >> 16));
  x[2] = DT::from_raw(uint16_t(w.y & 0xffffu));
  x[3] = DT::from_raw(uint16_t(w.y >> 16));
}
__device__ __forceinline__ void ld4(const float* src, float (&x)[4]) {
  const float4 v = *reinterpret_cast<const float4*>(src);
  x[0] = v.x;
  x[1] = v.y;
  x[2] = v.z;
  x[3] = v.w;
}

// Pi and Aqk of one pair (r, s), s <= r, from its sums over the channels: Aqk for r < L, Pi (0 on
// the diagonal and beyond the chunk).
template <class DT>
__device__ __forceinline__ void kda_store_pair(const KdaIntraParams& p, const KdaIx& ix, const ChunkItem& w, float* sPi,
                                               const float* sB, int r, int s, float aq, float ak) {
  sPi[r * kPiLd + s] = (s < r && r < w.L) ? sB[r] * ak : 0.0f;
  if (r < w.L) p.Aqk[ix.cc(w.t0 + r, w.j) + s] = DT::rnd(aq * p.sh.scale);
}

// (2a) [K1] the diagonal 16 x 16 blocks, per pair and channel (136 pairs a block). Thread
// (unit = tid / 8, slice h = tid % 8): block B = unit / 8, rows r1 = 16 B + i, r2 = 16 B + 15 - i
// (i = unit % 8): their 17 pairs u (u <= i: (r1, 16 B + u), else (r2, 16 B + u - i - 1)) over
// the channel quads h, h + 8, ... (conflict-free float4 reads of a row); then the 8 slices are
// summed by a fixed xor butterfly (same bits in every lane). Pairs with r >= L are never
// evaluated. After the staging barriers; no barrier.
template <class DT, int K>
__device__ __forceinline__ void kda_diag_blocks(const KdaIntraParams& p, const KdaIx& ix, const ChunkItem& w,
                                                const uint16_t* sq, const uint16_t* sk, const float* sG, float* sPi,
                                                const float* sB) {
  using Sm = KdaIntraSmem<K>;
  constexpr int kPairs = 17;
  const int h = threadIdx.x & 7, unit = threadIdx.x >> 3, b = 16 * (unit >> 3), i = unit & 7;
  const int r1 = b + i, r2 = b + 15 - i;
  float aq[kPairs], ak[kPairs];
#pragma unroll
  for (int u = 0; u < kPairs; ++u) aq[u] = ak[u] = 0.0f;
  for (int c = 4 * h; c < K; c += 32) {
    float g1[4], g2[4], q1[4], q2[4], k1[4], k2[4];
    ld4(sG + r1 * Sm::kLdG + c, g1);
    ld4(sG + r2 * Sm::kLdG + c, g2);
    ld4_16<DT>(sq + r1 * Sm::kLd16 + c, q1);
    ld4_16<DT>(sq + r2 * Sm::kLd16 + c, q2);
    ld4_16<DT>(sk + r1 * Sm::kLd16 + c, k1);
    ld4_16<DT>(sk + r2 * Sm::kLd16 + c, k2);
#pragma unroll
    for (int u = 0; u < kPairs; ++u) {
      const bool first = u <= i;
      const int r = first ? r1 : r2, s = b + (first ? u : u - i - 1);
      if (r >= w.L) continue;
      float gs[4], ks[4];
      ld4(sG + s * Sm::kLdG + c, gs);
      ld4_16<DT>(sk + s * Sm::kLd16 + c, ks);
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const float kse = ks[x] * exp2f((first ? g1[x] : g2[x]) - gs[x]);
        aq[u] += (first ? q1[x] : q2[x]) * kse;
        ak[u] += (first ? k1[x] : k2[x]) * kse;
      }
    }
  }
#pragma unroll
  for (int u = 0; u < kPairs; ++u) {
#pragma unroll
    for (int m = 1; m < 8; m <<= 1) {
      aq[u] += __shfl_xor_sync(0xffffffffu, aq[u], m);
      ak[u] += __shfl_xor_sync(0xffffffffu, ak[u], m);
    }
    if ((u & 7) == h) {
      const bool first = u <= i;
      kda_store_pair<DT>(p, ix, w, sPi, sB, first ? r1 : r2, b + (first ? u : u - i - 1), aq[u], ak[u]);
    }
  }
}

// (2b) F5 pivot operands of channels [c0, c0 + kSlabC) into the slab sX (layout above). Warp w
// owns slab rows 4 w .. 4 w + 3; lane: channel 4 w + lane % 4, column 8 it + lane / 4 (reads and
// writes conflict-free). Gated rows beyond the chunk (r >= L, or a pivot p >= L) are selected 0,
// never exponentiated (7.1); every evaluated exponent is <= 0 (7.5). After a barrier that frees
// sX; no barrier.
template <class DT, int K>
__device__ __forceinline__ void kda_gated_slab(const uint16_t* sq, const uint16_t* sk, const float* sG, float* sX,
                                               int c0, int L) {
  using Sm = KdaIntraSmem<K>;
  const int cl = 4 * warp_id() + (lane_id() & 3), c = c0 + cl;
  float* dst = sX + cl * kSlabLd;
#pragma unroll 2
  for (int it = 0; it < (kSlabA + 2 * kSlabA) / 8; ++it) {
    const int v = 8 * it + (lane_id() >> 2);
    if (v < kSlabA) {  // row r = 16 + v against its pivot
      const int r = 16 + v, pv = r & ~15;
      float qg = 0.0f, kg = 0.0f;
      if (r < L) {
        const float e = exp2f(sG[r * Sm::kLdG + c] - sG[pv * Sm::kLdG + c]);
        qg = DT::from_raw(sq[r * Sm::kLd16 + c]) * e;
        kg = DT::from_raw(sk[r * Sm::kLd16 + c]) * e;
      }
      dst[v] = qg;
      dst[kSlabA + v] = kg;
    } else {  // column row s of pivot 16 R
      const int x = v - kSlabA, R = x < 16 ? 1 : (x < 48 ? 2 : 3), s = x + 2 * kSlabA - slab_b(R), pv = 16 * R;
      dst[2 * kSlabA + x] =
          pv < L ? DT::from_raw(sk[s * Sm::kLd16 + c]) * exp2f(sG[pv * Sm::kLdG + c] - sG[s * Sm::kLdG + c]) : 0.0f;
    }
  }
}

// Off-diagonal block (R, S) of warp w < 6: (1,0) (2,0) (2,1) (3,0) (3,1) (3,2).
struct OffdiagBlock {
  int R, S;
};
__device__ __forceinline__ OffdiagBlock offdiag_block(int w) {
  const int R = w < 1 ? 1 : (w < 3 ? 2 : 3);
  return {R, w - R * (R - 1) / 2};
}

// (2c) One slab's contribution to the warp's off-diagonal block (R, S): lane rows
// 16 R + 2 (lane / 4) + {0, 1} x columns 16 S + 4 (lane % 4) + {0..3}, aq (gated q) and ak
// (gated k), fp32 FMAs, channels ascending. Register tile 2 x 4 x 2 from one float4 and two
// float2 reads a channel.
struct OffdiagAcc {
  float aq[2][4], ak[2][4];
};
__device__ __forceinline__ void kda_offdiag_slab(const float* sX, OffdiagBlock bk, OffdiagAcc& acc) {
  const int a = 16 * (bk.R - 1) + 2 * (lane_id() >> 2), bcol = slab_b(bk.R) + 16 * bk.S + 4 * (lane_id() & 3);
#pragma unroll 8
  for (int c = 0; c < kSlabC; ++c) {
    const float* row = sX + c * kSlabLd;
    const float2 qg = *reinterpret_cast<const float2*>(row + a);
    const float2 kg = *reinterpret_cast<const float2*>(row + kSlabA + a);
    float kn[4];
    ld4(row + bcol, kn);
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      acc.aq[0][x] += qg.x * kn[x];
      acc.aq[1][x] += qg.y * kn[x];
      acc.ak[0][x] += kg.x * kn[x];
      acc.ak[1][x] += kg.y * kn[x];
    }
  }
}

// The warp's block to Aqk (rows < L, 16-byte stores) and Pi.
template <class DT>
__device__ __forceinline__ void kda_offdiag_store(const KdaIntraParams& p, const KdaIx& ix, const ChunkItem& w,
                                                  OffdiagBlock bk, const OffdiagAcc& acc, float* sPi, const float* sB) {
  const float scale = p.sh.scale;
#pragma unroll
  for (int y = 0; y < 2; ++y) {
    const int r = 16 * bk.R + 2 * (lane_id() >> 2) + y, s = 16 * bk.S + 4 * (lane_id() & 3);
    const bool in = r < w.L;
#pragma unroll
    for (int x = 0; x < 4; ++x) sPi[r * kPiLd + s + x] = in ? sB[r] * acc.ak[y][x] : 0.0f;
    if (in)
      *reinterpret_cast<float4*>(p.Aqk + ix.cc(w.t0 + r, w.j) + s) =
          make_float4(DT::rnd(acc.aq[y][0] * scale), DT::rnd(acc.aq[y][1] * scale), DT::rnd(acc.aq[y][2] * scale),
                      DT::rnd(acc.aq[y][3] * scale));
  }
}

// Pi and Aqk above the diagonal: 0 (Aqk for rows < L only). No barrier.
__device__ __forceinline__ void kda_upper_zero(const KdaIntraParams& p, const KdaIx& ix, const ChunkItem& w,
                                               float* sPi) {
  for (int e = threadIdx.x; e < kC * kC; e += kThreads) {
    const int r = e / kC, s = e % kC;
    if (s <= r) continue;
    sPi[r * kPiLd + s] = 0.0f;
    if (r < w.L) p.Aqk[ix.cc(w.t0 + r, w.j) + s] = 0.0f;
  }
}

// (2) Pi and Aqk: diagonal blocks per pair, off-diagonal blocks slab by slab (6 warps). Ends with
// a barrier that completes sPi and frees sX.
template <class DT, int K>
__device__ __forceinline__ void kda_pairs(const KdaIntraParams& p, const KdaIx& ix, const ChunkItem& w,
                                          const uint16_t* sq, const uint16_t* sk, const float* sG, float* sX,
                                          float* sPi, const float* sB) {
  kda_upper_zero(p, ix, w, sPi);
  kda_diag_blocks<DT, K>(p, ix, w, sq, sk, sG, sPi, sB);
  const bool owner = warp_id() < 6;
  const OffdiagBlock bk = offdiag_block(warp_id());
  OffdiagAcc acc = {};
  for (int c0 = 0; c0 < K; c0 += kSlabC) {
    kda_gated_slab<DT, K>(sq, sk, sG, sX, c0, w.L);
    __syncthreads();
    if (owner) kda_offdiag_slab(sX, bk, acc);
    __syncthreads();
  }
  if (owner) kda_offdiag_store<DT>(p, ix, w, bk, acc, sPi, sB);
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
