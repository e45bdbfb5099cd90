// The forward state walks (fwd_summaries, fwd_states) of GDN and KDA on Hopper: wgmma from
// shared memory, TMA loads by a producer warp into a two-stage mbarrier ring, TMA stores of h and
// v_new (the technique of tests/gpu/walk_step_bench.cu, issue 17). Included only by
// gdn_walk_wgmma.cu; launched instead of fwd_walk_kernel (gdn_chunk_state_kernel.cuh) when
// launch_fwd_walk_wgmma (gdn_walk_wgmma.h) supports the problem: GDN or KDA, K = V in {64, 128},
// bf16 / fp16, an sm_90 device and an sm_90a build. Same contract, same rounding points, same
// outputs; bits may differ from fwd_walk_kernel only by the order of fp32 accumulation inside the
// products.
//
// KDA (template flag KDA; gdn_chunk_state_kernel.cuh's header gives the twin's formulas): the key
// operand is kg [T, HV, K] of the value head (16-bit storage, gated and rounded by wy) instead of
// k of the q/k head, so no key is gated here (Kt = kg in both tiles, rows >= L zeroed); the
// update operand is Y0 = dtype(vr) (no row factor); the decay Gam = exp2(gL) is one factor per
// key channel, i.e. per row of the K x 64 tile (state and M tiles alike), which the producer
// writes into the stage (K floats) in place of GDN's 64 token gates.
//
// gdn_fwd_walk_wgmma_kernel<DT, K, STATES>: grid S * HV * tiles, block b -> (segment s, value head
//   j, tile) = (b / (tiles HV), (b / tiles) % HV, b % tiles), tiles of kTileV = 64 columns: state
//   tiles S[:, c0 : c0 + 64] for tile < K / 64, and in summary mode (STATES = false) transfer tiles
//   M[:, c0 : c0 + 64] after them. 160 threads: one consumer warpgroup (128 threads) holds the
//   K x 64 fp32 tile in wgmma accumulators (K / 64 m64n64 fragments, 32 registers each); one
//   producer warp streams each chunk's W (64 x K), k (64 x K, qk head j / G), U (64 x 64, state
//   tiles only) with TMA and its 64 gates (and the chunk's begin / length) with plain loads into a
//   two-stage ring (KDA: kg of value head j instead of k, and K per-channel Gam instead of the
//   64 gates): full[stage] completes when the 32 producer lanes have arrived and the TMA
//   bytes have landed, empty[stage] when the 128 consumers have finished the chunk, so chunk n + 1
//   loads while chunk n computes. Per chunk (the consumers; [S1]-[S4] of the twin):
//     state tile:  X0 = Sb = dtype(S) (-> h[n] by a TMA store in STATES mode); v = W Sb;
//                  vr = U - v; v_new = dtype(vr) (TMA store of a full chunk, plain stores of the
//                  rows of a partial one); Y0 = dtype(vr * exp2(gL - g_r)), rows >= L zero;
//                  S <- Gam S + k^T Y0
//     M tile:      X0 + X1 = M 2^e1 split (hi, lo: both dtype); R = W X0 + W X1; Y0 = -dtype(R 2^e2),
//                  Y1 = dtype(dtype(R 2^e2) - R 2^e2) (rows >= L: -0, 0); k <- Kt = dtype(k * exp2(gL - g_r))
//                  in place in the stage; M <- (Gam M 2^(e1 + e2) + Kt^T Y0 + Kt^T Y1) 2^-(e1 + e2).
//                  fp16: 2^e1, 2^e2 put the largest |M|, |R| into [2^14, 2^15) (SplitScale,
//                  gdn_chunk_state_kernel.cuh: an unscaled fp16 split loses values below ~2^-3 and
//                  all below 2^-25); the largest |M| of the next chunk is published by each warp
//                  after the update, that of R takes one more consumer barrier. bf16: e1 = e2 = 0.
//   The products are wgmma m64n64k16: v = W X (A = W K-major, B = X MN-major) and the update
//   (A = k^T: the stage's k tile read MN-major, B = Y MN-major). Rows beyond a partial chunk:
//   the TMA box reads them (the next piece's tokens or zeros past T); they are masked where a
//   value is formed (v_new, Y) and the stage's k rows >= L are set to zero before the update, so
//   nothing of another piece reaches S and no row >= L of v_new is written.
//   Summary mode writes seg_h_ext (from S = 0) and seg_Mt = M^T (from M = I); a block whose part
//   nobody reads (kernels/api/summary_needs.h) writes zeros for its tile and returns before any
//   barrier. STATES mode starts from seg_entry and writes h, v_new and ht (the piece's last
//   segment).
// Shared memory (bytes; 1024-aligned 64-row tiles of 128-byte rows with the 128-byte swizzle):
//   2 stages x (W, k: K / 64 tiles each; U: 1 tile; gates (GDN 64, KDA K floats) + header:
//   1 KiB); X0, X1: K x 64;
//   Y0, Y1: 64 x 64 (Y1: the v_new staging of a state tile); 4 mbarriers; the 4 consumer warps'
//   largest |M| and |R| (8 floats); + 1 KiB for aligning the base. K = 128: 134208 B, one block
//   per SM: a block does the work of two 32-column blocks of fwd_walk_kernel, which runs two per
//   SM, so the planner's count of block slots per (segment, value head) (kernels/api/tiles.h)
//   holds for both walks. K = 64: 85056 B, two blocks per SM fit (the planner then counts twice
//   the slots this walk uses).
// Registers (ptxas, sm_90a, nvcc 13.0): K = 128 168 (summaries; fp16 208: the scaled M tile) / 150
// (states), K = 64 124 / 116; no spills.
#pragma once

#include <type_traits>

#include "kernels/cuda/gdn_chunk_state_kernel.cuh"
#include "kernels/cuda/hopper.cuh"

namespace kcp::kernels::cuda::walk_wg {

using namespace ::kcp::hopper;

inline constexpr int kTileV = 64;                   // columns of a block's tile
inline constexpr int kConsumers = 128;              // one warpgroup
inline constexpr int kWgThreads = kConsumers + 32;  // + the producer warp
inline constexpr int kStages = 2;                   // the ring
inline constexpr int kAtom = kC * 128;              // one 64-row tile: 8 KiB
inline constexpr int kConsumerBar = 1;              // named barrier of the consumers
inline constexpr uint32_t kNegZero2 = 0x80008000u;  // two 16-bit -0

template <int K>
struct Smem {
  static constexpr int NKT = K / 64;  // 64-key tiles of W, k and X
  // Offsets inside a stage.
  // G: GDN's 64 token gates or KDA's K per-channel factors Gam (at most 128 floats), then the header.
  static constexpr int W = 0, Kt = NKT * kAtom, U = 2 * NKT * kAtom, G = U + kAtom, Hdr = G + 128 * 4;
  static constexpr int kStage = G + 1024;
  // Offsets from the aligned base.
  static constexpr int X0 = kStages * kStage, X1 = X0 + NKT * kAtom, Y0 = X1 + NKT * kAtom, Y1 = Y0 + kAtom;
  static constexpr int Bar = Y1 + kAtom;                           // full[kStages], then empty[kStages]
  static constexpr int Red = Bar + 8 * 2 * kStages;                // largest |M| [4], then |R| [4] (fp16 M tiles)
  static constexpr size_t bytes = size_t(Red) + 2 * 4 * 4 + 1024;  // + the base's alignment
  static_assert(bytes <= 227 * 1024, "one block must fit an SM's shared memory");
  static_assert(K <= 128 && kC <= 128 && Hdr + 16 <= G + 1024, "the gates and the header fit the stage's 1 KiB");
};

// The chunk as the producer hands it over (after the stage's gates).
struct ChunkHdr {
  int64_t begin;
  int32_t len;
};

// TMA descriptors: W, U, v_new [T, HV, 64-col tiles], k [T, H, K] (GDN) or kg [T, HV, K] (KDA),
// h [NT * HV, K, V].
struct Maps {
  CUtensorMap W, k, U, h, vn;
};

// What a block walks.
struct Blk {
  SegmentDesc seg;
  int s, j, i, c0;
  bool mtile;
};

template <int NVT, int NTILES>
__device__ __forceinline__ Blk block_of(const FwdWalkParams& p) {
  Blk b;
  const int tile = int(blockIdx.x % NTILES);
  b.j = int((blockIdx.x / NTILES) % p.sh.HV);
  b.i = b.j / p.sh.G;
  b.s = int(blockIdx.x / (NTILES * p.sh.HV));
  b.mtile = tile >= NVT;
  b.c0 = (b.mtile ? tile - NVT : tile) * kTileV;
  b.seg = p.segments[b.s];
  return b;
}

// Summary mode: zeros for a tile nobody reads (true: the block is done).
template <int K>
__device__ __forceinline__ bool skip_unread_tile(const FwdWalkParams& p, const Blk& b) {
  const SummaryNeeds need = summary_needs(p.pieces, p.sh.N, b.seg, p.has_h0, p.has_dht);
  if (b.mtile ? need.M : need.h_ext) return false;
  const int64_t sj = int64_t(b.s) * p.sh.HV + b.j;
  if (b.mtile)
    zero_tile(p.seg_Mt + sj * K * K + int64_t(b.c0) * K, K, kTileV, K);
  else
    zero_tile(p.seg_h_ext + sj * K * K + b.c0, K, K, kTileV);
  return true;
}

__device__ __forceinline__ uint32_t full_bar(uint32_t bars, int s) { return bars + 8 * s; }
__device__ __forceinline__ uint32_t empty_bar(uint32_t bars, int s) { return bars + 8 * (kStages + s); }

// The producer warp: per chunk of the segment, wait for the stage to be free, then TMA W, k (KDA:
// kg) (and U) and store the gates (KDA: Gam = exp2(gL) per key channel) and the chunk header;
// every lane arrives on full (lane 0 first adds the TMA bytes, without arriving, so the phase
// cannot complete before the last lane's stores).
template <int K, bool KDA>
__device__ __forceinline__ void produce(const Maps& maps, const FwdWalkParams& p, const Blk& b, uint32_t base,
                                        unsigned char* sb) {
  using Sm = Smem<K>;
  const int lane = int(threadIdx.x) & 31, HV = p.sh.HV;
  const uint32_t bars = base + Sm::Bar, bytes = uint32_t((2 * Sm::NKT + (b.mtile ? 0 : 1)) * kAtom);
  int m = 0;
  for (int64_t n = b.seg.chunk_begin; n < b.seg.chunk_end; ++n, ++m) {
    const int s = m % kStages;
    if (m >= kStages) mbar_wait(empty_bar(bars, s), uint32_t((m / kStages - 1) & 1));
    const ChunkDesc ch = p.chunks[n];
    const uint32_t st = base + s * Sm::kStage, full = full_bar(bars, s);
    const int t0 = int(ch.begin);
    if (lane == 0) {
      mbar_expect_tx(full, bytes);
#pragma unroll
      for (int a = 0; a < Sm::NKT; ++a) {
        tma_load_3d(st + Sm::W + a * kAtom, &maps.W, full, 64 * a, b.j, t0);
        tma_load_3d(st + Sm::Kt + a * kAtom, &maps.k, full, 64 * a, KDA ? b.j : b.i, t0);
      }
      if (!b.mtile) tma_load_3d(st + Sm::U, &maps.U, full, b.c0, b.j, t0);
    }
    unsigned char* sst = sb + s * Sm::kStage;
    float* g = reinterpret_cast<float*>(sst + Sm::G);
    if constexpr (KDA) {
      const float* gl = p.gcum + ((ch.begin + ch.len - 1) * HV + b.j) * K;  // chunks have len >= 1
      for (int c = lane; c < K; c += 32) g[c] = exp2f(gl[c]);
    } else {
      for (int r = lane; r < kC; r += 32) g[r] = r < ch.len ? p.gcum[(ch.begin + r) * HV + b.j] : 0.0f;
    }
    if (lane == 0) *reinterpret_cast<ChunkHdr*>(sst + Sm::Hdr) = ChunkHdr{ch.begin, ch.len};
    mbar_arrive(full);
  }
}

// The block's tile at the start: seg_entry (STATES), zeros (state tile) or I (M tile).
template <int K, bool STATES>
__device__ __forceinline__ void init_acc(float (&acc)[K / 64][32], const FwdWalkParams& p, const Blk& b) {
  const int t = int(threadIdx.x);
  const float* e = STATES ? p.seg_entry + (int64_t(b.s) * p.sh.HV + b.j) * K * K + b.c0 : nullptr;
#pragma unroll
  for (int a = 0; a < K / 64; ++a)
#pragma unroll
    for (int x = 0; x < 32; ++x) {
      const int r = 64 * a + frag_row(t, x), c = frag_col(t, x);
      if constexpr (STATES)
        acc[a][x] = e[int64_t(r) * K + c];
      else
        acc[a][x] = (b.mtile && r == b.c0 + c) ? 1.0f : 0.0f;
    }
}

// X0 = dtype(S) (state tile), or X0 + X1 = M sc as hi + lo (M tile; sc: a power of two, 1 for
// bf16): the B operand of W X.
template <class DT, int K, bool MT>
__device__ __forceinline__ void put_operand(float (&acc)[K / 64][32], unsigned char* sb, float sc) {
  using Sm = Smem<K>;
  const int t = int(threadIdx.x);
#pragma unroll
  for (int a = 0; a < K / 64; ++a)
#pragma unroll
    for (int x = 0; x < 32; x += 2) {
      const uint32_t o = swz(64 * a + frag_row(t, x), frag_col(t, x));
      const float v0 = acc[a][x], v1 = acc[a][x + 1];
      if constexpr (!MT) {
        *reinterpret_cast<uint32_t*>(sb + Sm::X0 + o) = DT::pack(v0, v1);
      } else {
        const float x0 = v0 * sc, x1 = v1 * sc;
        const float h0 = DT::rnd(x0), h1 = DT::rnd(x1);
        *reinterpret_cast<uint32_t*>(sb + Sm::X0 + o) = DT::pack(h0, h1);
        *reinterpret_cast<uint32_t*>(sb + Sm::X1 + o) = DT::pack(x0 - h0, x1 - h1);
      }
    }
}

// The stage's k tiles (rows = the chunk's tokens): GDN M tile: Kt = dtype(k * exp2(gL - g_r)) for
// r < L; every kind: rows >= L set to zero (only a partial chunk has them). KDA's kg comes gated.
template <class DT, int K, bool MT, bool KDA>
__device__ __forceinline__ void prep_k_rows(unsigned char* kt, int L, float gL, const float* g) {
  constexpr bool gate = MT && !KDA;
  if (!gate && L == kC) return;
  for (int q = int(threadIdx.x); q < (K / 64) * kC * 8; q += kConsumers) {  // 16-byte chunks, 8 a row
    const int r = (q >> 3) & (kC - 1);
    uint4* w = reinterpret_cast<uint4*>(kt) + q;
    if (r >= L) {
      *w = make_uint4(0u, 0u, 0u, 0u);
    } else if constexpr (gate) {
      const float f = exp2f(gL - g[r]);
      uint4 u = *w;
      uint32_t* x = &u.x;
#pragma unroll
      for (int h = 0; h < 4; ++h)
        x[h] = DT::pack(DT::from_raw(uint16_t(x[h] & 0xffffu)) * f, DT::from_raw(uint16_t(x[h] >> 16)) * f);
      *w = u;
    }
  }
}

// v = W X0 [+ W X1] (64 tokens x 64 columns).
template <bool F16, int K, bool MT>
__device__ __forceinline__ void product_wx(float (&v)[32], uint32_t st, uint32_t base) {
  using Sm = Smem<K>;
  fence_acc(v);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    wgmma_64x64x16<F16, 0, 1>(v, desc_k(st + Sm::W + (kk / 4) * kAtom, kk % 4), desc_mn(base + Sm::X0, kk), kk > 0);
  if constexpr (MT) {
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk)
      wgmma_64x64x16<F16, 0, 1>(v, desc_k(st + Sm::W + (kk / 4) * kAtom, kk % 4), desc_mn(base + Sm::X1, kk), 1);
  }
  wgmma_commit();
  wgmma_wait();
  fence_acc(v);
}

// S <- Gam S + k^T Y0 [+ k^T Y1] (each 64-key block of the tile from the stage's k tile). SC (fp16
// M tile): on the tile scaled by 2^(e1 + e2) and scaled back. Gam: `gam` (GDN), or per row a (a
// key channel) gk[a] (KDA: the stage's factors).
template <bool F16, int K, bool MT, bool SC, bool KDA>
__device__ __forceinline__ void update(float (&acc)[K / 64][32], uint32_t st, uint32_t base, float gam, const float* gk,
                                       int e1, int e2) {
  using Sm = Smem<K>;
  const float s1 = SplitScale::pow2(e1), s2 = SplitScale::pow2(e2);
  const int t = int(threadIdx.x);
#pragma unroll
  for (int a = 0; a < K / 64; ++a) {
    // A thread's fragment has two rows (frag_row of x with bit 1 of x clear, and set).
    const float g0 = KDA ? gk[64 * a + frag_row(t, 0)] : gam, g1 = KDA ? gk[64 * a + frag_row(t, 2)] : gam;
#pragma unroll
    for (int x = 0; x < 32; ++x) {
      const float f = ((x >> 1) & 1) ? g1 : g0;
      if constexpr (SC)
        acc[a][x] = ((acc[a][x] * f) * s1) * s2;
      else
        acc[a][x] *= f;
    }
    fence_acc(acc[a]);
  }
  wgmma_fence();
#pragma unroll
  for (int a = 0; a < K / 64; ++a) {
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk)
      wgmma_64x64x16<F16, 1, 1>(acc[a], desc_mn(st + Sm::Kt + a * kAtom, kk), desc_mn(base + Sm::Y0, kk), 1);
    if constexpr (MT) {
#pragma unroll
      for (int kk = 0; kk < kC / 16; ++kk)
        wgmma_64x64x16<F16, 1, 1>(acc[a], desc_mn(st + Sm::Kt + a * kAtom, kk), desc_mn(base + Sm::Y1, kk), 1);
    }
  }
  wgmma_commit();
  wgmma_wait();
#pragma unroll
  for (int a = 0; a < K / 64; ++a) fence_acc(acc[a]);
  if constexpr (SC) {
    const float u2 = SplitScale::pow2(-e2), u1 = SplitScale::pow2(-e1);
#pragma unroll
    for (int a = 0; a < K / 64; ++a)
#pragma unroll
      for (int x = 0; x < 32; ++x) acc[a][x] = (acc[a][x] * u2) * u1;
  }
}

// State tile: vr = U - v; v_new (Y1 for the TMA store of a full chunk, else plain stores of the
// rows < L); Y0 = dtype(vr * exp2(gL - g_r)) (GDN) or dtype(vr) (KDA), zero rows >= L.
template <class DT, int K, bool STATES, bool KDA>
__device__ __forceinline__ void epilogue_state(const float (&v)[32], const unsigned char* sst, unsigned char* sb,
                                               const FwdWalkParams& p, const Blk& b) {
  using Sm = Smem<K>;
  const int t = int(threadIdx.x);
  const float* g = reinterpret_cast<const float*>(sst + Sm::G);
  const ChunkHdr hd = *reinterpret_cast<const ChunkHdr*>(sst + Sm::Hdr);
  const int L = hd.len;
  const float gL = KDA ? 0.0f : g[L - 1];  // KDA: g holds Gam per channel, no token gates
#pragma unroll
  for (int x = 0; x < 32; x += 2) {
    const int r = frag_row(t, x), c = frag_col(t, x);
    const uint32_t o = swz(r, c);
    uint32_t y = 0u;
    if (r < L) {
      const uint32_t u = *reinterpret_cast<const uint32_t*>(sst + Sm::U + o);
      const float x0 = DT::from_raw(uint16_t(u & 0xffffu)) - v[x];
      const float x1 = DT::from_raw(uint16_t(u >> 16)) - v[x + 1];
      if constexpr (STATES) {
        if (L == kC)
          *reinterpret_cast<uint32_t*>(sb + Sm::Y1 + o) = DT::pack(x0, x1);
        else
          st16x2<DT>(p.v_new + ((hd.begin + r) * p.sh.HV + b.j) * K + b.c0 + c, x0, x1);
      }
      if constexpr (KDA) {
        y = DT::pack(x0, x1);
      } else {
        const float f = exp2f(gL - g[r]);
        y = DT::pack(x0 * f, x1 * f);
      }
    }
    *reinterpret_cast<uint32_t*>(sb + Sm::Y0 + o) = y;
  }
}

// M tile: Y0 = -dtype(R sc), Y1 = dtype(dtype(R sc) - R sc) (rows >= L: -0 and 0, as zero rows of W
// gave); sc = 2^e2, e2 returned (fp16: from the largest |R| of the consumers, one barrier; bf16: 0).
template <class DT, int K>
__device__ __forceinline__ int epilogue_m(const float (&v)[32], int L, unsigned char* sb) {
  using Sm = Smem<K>;
  const int t = int(threadIdx.x);
  int e2 = 0;
  if constexpr (kScaledSplit<DT>) {
    float m = 0.0f;
#pragma unroll
    for (int x = 0; x < 32; ++x)
      if (frag_row(t, x) < L) m = fmaxf(m, fabsf(v[x]));  // rows >= L: W rows of other tokens
    float* red = reinterpret_cast<float*>(sb + Sm::Red) + 4;
    SplitScale::publish(m, red);
    named_sync(kConsumerBar, kConsumers);
    e2 = SplitScale::exponent(SplitScale::gather(red, 4), kSplitCapR);
  }
  const float sc = SplitScale::pow2(e2);
#pragma unroll
  for (int x = 0; x < 32; x += 2) {
    const int r = frag_row(t, x);
    const uint32_t o = swz(r, frag_col(t, x));
    uint32_t hi = kNegZero2, lo = 0u;
    if (r < L) {
      const float x0 = v[x] * sc, x1 = v[x + 1] * sc;
      const float h0 = DT::rnd(x0), h1 = DT::rnd(x1);
      hi = DT::pack(-h0, -h1);
      lo = DT::pack(h0 - x0, h1 - x1);
    }
    *reinterpret_cast<uint32_t*>(sb + Sm::Y0 + o) = hi;
    *reinterpret_cast<uint32_t*>(sb + Sm::Y1 + o) = lo;
  }
  return e2;
}

// The tile after the walk: ht (STATES, the piece's last segment), seg_h_ext, or seg_Mt = M^T.
template <int K, bool STATES>
__device__ __forceinline__ void store_result(const float (&acc)[K / 64][32], const FwdWalkParams& p, const Blk& b) {
  const int t = int(threadIdx.x);
  const int64_t KK = int64_t(K) * K;
  float* o = nullptr;
  if constexpr (STATES) {
    if (p.ht && b.s + 1 == p.pieces[b.seg.piece].seg_end) o = p.ht + (int64_t(b.seg.piece) * p.sh.HV + b.j) * KK;
  } else {
    o = (b.mtile ? p.seg_Mt : p.seg_h_ext) + (int64_t(b.s) * p.sh.HV + b.j) * KK;
  }
  if (!o) return;
#pragma unroll
  for (int a = 0; a < K / 64; ++a)
#pragma unroll
    for (int x = 0; x < 32; x += 2) {
      const int r = 64 * a + frag_row(t, x), c = b.c0 + frag_col(t, x);
      if (!STATES && b.mtile) {  // o[col * K + row] = M[row][col]
        o[int64_t(c) * K + r] = acc[a][x];
        o[int64_t(c + 1) * K + r] = acc[a][x + 1];
      } else {
        *reinterpret_cast<float2*>(o + int64_t(r) * K + c) = make_float2(acc[a][x], acc[a][x + 1]);
      }
    }
}

// The consumer warpgroup's walk over the segment's chunks (MT: a transfer tile).
template <class DT, int K, bool STATES, bool MT, bool KDA>
__device__ __forceinline__ void consume(const Maps& maps, const FwdWalkParams& p, const Blk& b, uint32_t base,
                                        unsigned char* sb) {
  using Sm = Smem<K>;
  constexpr bool F16 = std::is_same_v<DT, Fp16>;
  const int t = int(threadIdx.x);
  const uint32_t bars = base + Sm::Bar;
  constexpr bool vstore = STATES && !MT;       // this block writes h and v_new
  constexpr bool SC = MT && kScaledSplit<DT>;  // fp16 M tile: scaled split operands
  float acc[K / 64][32], v[32] = {};           // v: written by the first wgmma of each chunk (no accumulate)
  init_acc<K, STATES>(acc, p, b);
  float* redM = reinterpret_cast<float*>(sb + Sm::Red);  // the warps' largest |M| (SC)
  // SC: each warp publishes its largest |M| of a chunk's start after the previous chunk's update
  // (here for the first); it is read behind the loop's first consumer barrier.
  auto publish_m = [&] {
    float mx = 0.0f;
#pragma unroll
    for (int a = 0; a < K / 64; ++a)
#pragma unroll
      for (int x = 0; x < 32; ++x) mx = fmaxf(mx, fabsf(acc[a][x]));
    SplitScale::publish(mx, redM);
  };
  if constexpr (SC) publish_m();
  int m = 0;
  for (int64_t n = b.seg.chunk_begin; n < b.seg.chunk_end; ++n, ++m) {
    const int s = m % kStages;
    const uint32_t st = base + s * Sm::kStage;
    unsigned char* sst = sb + s * Sm::kStage;
    if (t == 0) bulk_wait_read();  // the previous chunk's TMA stores have read X0 / Y1
    named_sync(kConsumerBar, kConsumers);
    const int e1 = SC ? SplitScale::exponent(SplitScale::gather(redM, 4), kSplitCapM) : 0;
    put_operand<DT, K, MT>(acc, sb, SplitScale::pow2(e1));
    fence_proxy_async();
    named_sync(kConsumerBar, kConsumers);
    if (vstore && t == 0) tma_store_3d(&maps.h, base + Sm::X0, b.c0, 0, int(n * p.sh.HV + b.j));
    mbar_wait(full_bar(bars, s), uint32_t((m / kStages) & 1));
    const ChunkHdr hd = *reinterpret_cast<const ChunkHdr*>(sst + Sm::Hdr);
    const float* g = reinterpret_cast<const float*>(sst + Sm::G);
    const float gL = KDA ? 0.0f : g[hd.len - 1];  // KDA: g holds Gam per channel
    prep_k_rows<DT, K, MT, KDA>(sst + Sm::Kt, hd.len, gL, g);
    product_wx<F16, K, MT>(v, st, base);
    int e2 = 0;
    if constexpr (MT)
      e2 = epilogue_m<DT, K>(v, hd.len, sb);
    else
      epilogue_state<DT, K, STATES, KDA>(v, sst, sb, p, b);
    fence_proxy_async();
    named_sync(kConsumerBar, kConsumers);
    if (vstore && t == 0 && hd.len == kC) tma_store_3d(&maps.vn, base + Sm::Y1, b.c0, b.j, int(hd.begin));
    update<F16, K, MT, SC, KDA>(acc, st, base, KDA ? 1.0f : exp2f(gL), g, e1, e2);
    if constexpr (SC) publish_m();  // read behind the next chunk's first barrier
    mbar_arrive(empty_bar(bars, s));
  }
  if (t == 0) bulk_wait_all();  // the stores have read shared memory before the block ends
  store_result<K, STATES>(acc, p, b);
}

template <class DT, int K, bool STATES, bool KDA>
__device__ __forceinline__ void walk_block(const Maps& maps, const FwdWalkParams& p) {
  using Sm = Smem<K>;
  constexpr int NVT = K / kTileV, NTILES = STATES ? NVT : 2 * NVT;
  const Blk b = block_of<NVT, NTILES>(p);
  if constexpr (!STATES)
    if (skip_unread_tile<K>(p, b)) return;  // uniform over the block, before any barrier
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
  unsigned char* sb = smem_raw + (base - raw);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar(base + Sm::Bar, s), 32);
      mbar_init(empty_bar(base + Sm::Bar, s), kConsumers);
    }
    mbar_init_fence();
  }
  __syncthreads();
  if (threadIdx.x >= kConsumers) {
    produce<K, KDA>(maps, p, b, base, sb);
  } else if constexpr (STATES) {
    consume<DT, K, true, false, KDA>(maps, p, b, base, sb);
  } else {
    if (b.mtile)
      consume<DT, K, false, true, KDA>(maps, p, b, base, sb);
    else
      consume<DT, K, false, false, KDA>(maps, p, b, base, sb);
  }
}

// The kernel is compiled for sm_90a only (wgmma); elsewhere (the compute_90 PTX) it traps, and
// the launcher never starts it there.
template <class DT, int K, bool STATES, bool KDA>
__global__ void __launch_bounds__(kWgThreads, 1)
    fwd_walk_wgmma_kernel(const __grid_constant__ Maps maps, const __grid_constant__ FwdWalkParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  walk_block<DT, K, STATES, KDA>(maps, p);
#else
  __trap();
#endif
}

}  // namespace kcp::kernels::cuda::walk_wg
