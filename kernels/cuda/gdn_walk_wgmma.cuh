// The state walks of GDN and KDA on Hopper, forward (fwd_summaries, fwd_states) and backward
// (bwd_summaries, bwd_states), from one set of pieces: wgmma from shared memory, TMA loads by
// a producer warp into a two-stage mbarrier ring, TMA stores of the 16-bit states (h, dh) and of
// the chunk's 16-bit output (v_new, dv2) (the technique of tests/gpu/walk_step_bench.cu, issue
// 17). Included only by gdn_walk_wgmma.cu; launched instead of fwd_walk_kernel / bwd_walk_kernel
// (gdn_chunk_state_kernel.cuh) when launch_fwd_walk_wgmma / launch_bwd_walk_wgmma
// (gdn_walk_wgmma.h) support the problem: K = V in {64, 128}, bf16 / fp16, an sm_90 device and an
// sm_90a build (KDA's backward walks read qs from the prepass kda_qs.cu; walk_select.h gives the
// measurement that made them the default). Same contract, same rounding
// points, same outputs; bits may differ from the mma.sync walks only by the order of fp32
// accumulation inside the products.
//
// KDA (template flag KDA; gdn_chunk_state_kernel.cuh's header gives the twin's formulas): the key
// operand is kg [T, HV, K] of the value head (16-bit storage, gated and rounded by wy) instead of
// k of the q/k head, so no key is gated here (Kt = kg in both tiles, rows >= L zeroed); the
// update operand is Y0 = dtype(vr) (no row factor); the decay Gam = exp2(gL) is one factor per
// key channel, i.e. per row of the K x 64 tile (state and M tiles alike), which the producer
// writes into the stage (K floats) in place of GDN's 64 token gates.
//
// fwd_walk_wgmma_kernel<DT, K, STATES, KDA>: grid S * HV * tiles, block b -> (segment s, value head
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
// Registers (ptxas, sm_90a, nvcc 13.0; bf16 GDN / KDA, fp16 within 4 except where named): K = 128
// 182 / 180 (summaries; fp16 206: the scaled M tile) / 154 / 148 (states), K = 64 119 / 119 and
// 120 / 111; no spills.
//
// bwd_walk_wgmma_kernel<DT, K, STATES, KDA>: grid S * HV * K / 64, block b -> (segment s, value
//   head j, tile) as above, state tiles only: dS[:, c0 : c0 + 64] (K x 64 fp32 in the consumer
//   warpgroup's accumulators). The producer streams each chunk, last to first, into the ring: k,
//   q (64 x K each, q/k head j / G), W (64 x K, value head j), dO and dv_local (64 x 64, the
//   block's columns) by TMA, the chunk's 64 token gates and header by plain stores. Per chunk (the
//   consumers; [B1]-[B3] of the twin, gdn_chunk_state_kernel.cuh):
//     X0 = dSb = dtype(dS) (-> dh[n] by a TMA store in STATES mode);
//     v = k X0 (A = k K-major, B = X0 MN-major: the forward's W X), issued, and while it runs the
//       stage's q becomes qs = dtype((q scale) exp2(g_r)) in place (rows >= L zero) and the rows
//       >= L of W and dO are zeroed (a partial chunk; the TMA box read other tokens there);
//     dv2 = dtype(v f_r + dv_local), f_r = exp2(gL - g_r), rows r < L (STATES: TMA store of a
//       full chunk from Y1, plain stores of the rows of a partial one); Y0 = -dv2 by the sign bits
//       (rows >= L: -0, as bwd_walk_kernel's pack(-0, -0));
//     dS <- Gam dS + qs^T dO + W^T Y0, Gam = exp2(gL): the two updates read A MN-major from the
//       stage (qs, W: the forward's k^T), B = dO (stage) and Y0, per 64-key block of the tile, in
//       this order (bwd_walk_kernel's order of the terms).
//   KDA: Kt = kg of value head j (TMA, the forward's map) in place of k, f_r = 1 (dv2 =
//   dtype(v + dv_local)), Gam = exp2(gL) per key channel (K floats in the stage, written by the
//   producer as in the forward walk; per row of the tile in the update), and qs = dtype((q scale)
//   exp2(g)) with one gate per element comes ready: kda_qs_kernel (kda_qs.cu) writes it before
//   the walk ([T, HV, K], 16-bit, the backend's scratch), the producer loads the chunk's rows of
//   value head j by TMA into the stage's q tiles, and the consumers only zero its rows >= L (with
//   those of W and dO, one pass) while Kt X0 runs. Summary mode: the prepass covers only the
//   segments whose seg_dh_ext is read (qs_rows_of_summaries, kda_qs.h), so qs rows of other
//   tokens hold whatever the scratch held (NaN, Inf, anything). No such row reaches a value: a
//   skipped segment's blocks return before any TMA load; a read segment's chunks load rows of
//   their own tokens, except the box's rows >= L of a partial chunk (the piece's last, the next
//   piece's tokens), which stage_rows overwrites with zeros (plain stores, never read first)
//   before the update reads the stage's q, and Kt X0 does not read q.
//   Summary mode starts from 0 and writes seg_dh_ext (a block whose part nobody reads writes
//   zeros and returns before any barrier); STATES mode starts from seg_exit and writes dh, dv2
//   and dh0 (the first segment of each piece).
//   Rounding points: dSb, dv2 and qs are rounded to the dtype exactly where bwd_walk_kernel
//   rounds them, from the same fp32 expressions (dv2: v f_r + dv_local, qs: (q scale) exp2(g_r);
//   KDA's qs by kda_qs_kernel, the same expression and conversion as GDN's here),
//   and the products take the same 16-bit operands with fp32 accumulation; only the order of the
//   fp32 sums inside a product differs (wgmma's k16 steps over all 64 rows of a chunk vs mma.sync's
//   k16 steps up to the chunk's length rounded up to 16; the extra rows are exact zeros).
// Shared memory of the backward walk (bytes, same tile format): 2 stages x (k, q, W: K / 64 tiles
//   each; dO, dv_local: 1 tile each; gates + header: 1 KiB); X0: K x 64; Y0, Y1: 64 x 64; 4
//   mbarriers; + 1 KiB for aligning the base. K = 128: 166944 B, one block per SM: a block does
//   the work of two 32-column blocks of bwd_walk_kernel, which runs two per SM, so the planner's
//   count of block slots per (segment, value head) (kernels/api/tiles.h: V / 32 blocks at two per
//   SM) holds as for the forward walk. K = 64: 109600 B, two blocks per SM fit (the planner then
//   counts twice the slots this walk uses, as for the forward walk).
// Registers of the backward walk (ptxas, sm_90a, nvcc 13.0; bf16, fp16 within 2): GDN K = 128 145
//   (summaries) / 162 (states), K = 64 127 / 143; KDA K = 128 153 / 155, K = 64 114 / 134 (qs
//   by TMA; with the per-element gate loads it was 194 / 188 and 148 / 168); no spills (K = 64
//   two blocks per SM: <= 204 registers).
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
inline constexpr int kGateBytes = 1024;             // a stage's gates (at most 128 floats) and header
inline constexpr int kHdrAt = 128 * 4;              // the header's offset in them

// Forward walk: shared memory.
template <int K>
struct Smem {
  static constexpr int NKT = K / 64;  // 64-key tiles of W, k and X
  // Offsets inside a stage.
  // G: GDN's 64 token gates or KDA's K per-channel factors Gam (at most 128 floats), then the header.
  static constexpr int W = 0, Kt = NKT * kAtom, U = 2 * NKT * kAtom, G = U + kAtom, Hdr = G + kHdrAt;
  static constexpr int kStage = G + kGateBytes;
  // Offsets from the aligned base.
  static constexpr int X0 = kStages * kStage, X1 = X0 + NKT * kAtom, Y0 = X1 + NKT * kAtom, Y1 = Y0 + kAtom;
  static constexpr int Bar = Y1 + kAtom;                           // full[kStages], then empty[kStages]
  static constexpr int Red = Bar + 8 * 2 * kStages;                // largest |M| [4], then |R| [4] (fp16 M tiles)
  static constexpr size_t bytes = size_t(Red) + 2 * 4 * 4 + 1024;  // + the base's alignment
  static_assert(bytes <= 227 * 1024, "one block must fit an SM's shared memory");
  static_assert(K <= 128 && kC <= 128 && kHdrAt + 16 <= kGateBytes, "the gates and the header fit the stage's 1 KiB");
};

// Backward walk: shared memory. Stage: k (GDN: of the q/k head; KDA: kg), q (GDN: -> qs in
// place; KDA: qs), W (NKT tiles each), dO, dv_local (one 64 x 64 tile each), the gates (GDN 64,
// KDA K floats) and the header; then X0 (K x 64: dtype(dS), the source of dh's TMA store), Y0
// (64 x 64: -dv2), Y1 (64 x 64: dv2 for its TMA store).
template <int K>
struct BwdSmem {
  static constexpr int NKT = K / 64;
  static constexpr int Kt = 0, Q = NKT * kAtom, W = 2 * NKT * kAtom, dO = 3 * NKT * kAtom, Dl = dO + kAtom;
  static constexpr int G = Dl + kAtom, Hdr = G + kHdrAt, kStage = G + kGateBytes;
  static constexpr int X0 = kStages * kStage, Y0 = X0 + NKT * kAtom, Y1 = Y0 + kAtom;
  static constexpr int Bar = Y1 + kAtom;
  static constexpr size_t bytes = size_t(Bar) + 8 * 2 * kStages + 1024;
  static_assert(bytes <= 227 * 1024, "one block must fit an SM's shared memory");
  static_assert(K != 64 || 2 * (bytes + 1024) <= 228 * 1024, "K = 64: two blocks share an SM");
  static_assert(Q + NKT * kAtom == W && W + NKT * kAtom == dO,
                "q, W and dO are adjacent (their rows >= L are zeroed in one pass)");
};

// The chunk as the producer hands it over (after the stage's gates).
struct ChunkHdr {
  int64_t begin;
  int32_t len;
};

// TMA descriptors of the forward walk: W, U, v_new [T, HV, 64-col tiles], k [T, H, K] (GDN) or
// kg [T, HV, K] (KDA), h [NT * HV, K, V].
struct Maps {
  CUtensorMap W, k, U, h, vn;
  CUtensorMap hs, vns;  // h and v_new in boxes of 16 values, unswizzled (the state tiles' per-warp stores)
};

// TMA descriptors of the backward walk: k, q [T, H, K] (KDA: k is kg, q is qs, both [T, HV, K]);
// W [T, HV, K]; dO, dv_local, dv2 [T, HV, V]; dh [NT * HV, K, V].
struct BwdMaps {
  CUtensorMap k, q, W, dO, dl, dh, dv2;
  CUtensorMap dhs, dv2s;  // dh and dv2 in boxes of 16 values, unswizzled (per-warp stores, gdn_walk_bwd_rs.cuh)
};

// What a block walks.
struct Blk {
  SegmentDesc seg;
  int s, j, i, c0;
  bool mtile;
};

// P: FwdWalkParams or BwdWalkParams. Tiles [NVT, NTILES) are the forward summaries' M tiles.
template <int NVT, int NTILES, class P>
__device__ __forceinline__ Blk block_of(const P& p) {
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
template <int K>
__device__ __forceinline__ bool skip_unread_tile(const BwdWalkParams& p, const Blk& b) {
  if (summary_needs(p.pieces, p.sh.N, b.seg, p.has_h0, p.has_dht).dh_ext) return false;
  zero_tile(p.seg_dh_ext + (int64_t(b.s) * p.sh.HV + b.j) * K * K + b.c0, K, K, kTileV);
  return true;
}

__device__ __forceinline__ uint32_t full_bar(uint32_t bars, int s) { return bars + 8 * s; }
__device__ __forceinline__ uint32_t empty_bar(uint32_t bars, int s) { return bars + 8 * (kStages + s); }

// The block's 1024-aligned base in shared memory (sb: its generic address) and the ring's
// barriers at base + bar_off (full: the 32 producer lanes, empty: the consumers), behind a
// block barrier.
__device__ __forceinline__ uint32_t setup_ring(unsigned char* raw, int bar_off, unsigned char*& sb) {
  const uint32_t r = smem_u32(raw), base = (r + 1023u) & ~1023u;
  sb = raw + (base - r);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar(base + bar_off, s), 32);
      mbar_init(empty_bar(base + bar_off, s), kConsumers);
    }
    mbar_init_fence();
  }
  __syncthreads();
  return base;
}

// The producer warp's ring: the m-th chunk of the walk (chunk n_of(m), m < count) goes to stage
// m % kStages once the consumers have released its previous use; fill(st, sst, full, ch) issues
// its TMA loads (lane 0: first adds their bytes to full, without arriving) and writes the stage's
// gates (st: the stage's shared address, sst: its generic pointer); lane 0 writes the chunk
// header at hdr; then every lane arrives on full, so the phase cannot complete before the last
// lane's stores.
template <int kStageBytes, int kHdr, class NOf, class Fill>
__device__ __forceinline__ void produce_ring(uint32_t base, unsigned char* sb, uint32_t bars, int64_t count,
                                             const ChunkDesc* chunks, NOf n_of, Fill fill) {
  const int lane = int(threadIdx.x) & 31;
  for (int64_t m = 0; m < count; ++m) {
    const int s = int(m % kStages);
    if (m >= kStages) mbar_wait(empty_bar(bars, s), uint32_t((m / kStages - 1) & 1));
    const ChunkDesc ch = chunks[n_of(m)];
    unsigned char* sst = sb + s * kStageBytes;
    fill(base + s * kStageBytes, sst, full_bar(bars, s), ch);
    if (lane == 0) *reinterpret_cast<ChunkHdr*>(sst + kHdr) = ChunkHdr{ch.begin, ch.len};
    mbar_arrive(full_bar(bars, s));
  }
}

// The chunk's gates in the stage, by the producer lanes: GDN its 64 token gates (gcum of value
// head j; rows >= len: 0), KDA Gam = exp2(gL) per key channel (K floats).
template <int K, bool KDA>
__device__ __forceinline__ void put_gates(float* g, const float* gcum, int HV, int j, const ChunkDesc& ch) {
  const int lane = int(threadIdx.x) & 31;
  if constexpr (KDA) {
    const float* gl = gcum + ((ch.begin + ch.len - 1) * HV + j) * K;  // chunks have len >= 1
    for (int c = lane; c < K; c += 32) g[c] = exp2f(gl[c]);
  } else {
    for (int r = lane; r < kC; r += 32) g[r] = r < ch.len ? gcum[(ch.begin + r) * HV + j] : 0.0f;
  }
}

// The forward producer: W, k (KDA: kg) (and U) by TMA; the gates (KDA: Gam = exp2(gL) per key
// channel).
template <int K, bool KDA>
__device__ __forceinline__ void produce(const Maps& maps, const FwdWalkParams& p, const Blk& b, uint32_t base,
                                        unsigned char* sb) {
  using Sm = Smem<K>;
  const int lane = int(threadIdx.x) & 31;
  const uint32_t bytes = uint32_t((2 * Sm::NKT + (b.mtile ? 0 : 1)) * kAtom);
  const int64_t n0 = b.seg.chunk_begin;
  produce_ring<Sm::kStage, Sm::Hdr>(
      base, sb, base + Sm::Bar, b.seg.chunk_end - n0, p.chunks, [&](int64_t m) { return n0 + m; },
      [&](uint32_t st, unsigned char* sst, uint32_t full, const ChunkDesc& ch) {
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
        put_gates<K, KDA>(reinterpret_cast<float*>(sst + Sm::G), p.gcum, p.sh.HV, b.j, ch);
      });
}

// The block's tile at the start: LOAD: rows of e (row stride K = V), else zeros, or I (ident: an
// M tile).
template <int K, bool LOAD>
__device__ __forceinline__ void init_acc(float (&acc)[K / 64][32], const float* e, int c0, bool ident) {
  const int t = int(threadIdx.x);
#pragma unroll
  for (int a = 0; a < K / 64; ++a)
#pragma unroll
    for (int x = 0; x < 32; ++x) {
      const int r = 64 * a + frag_row(t, x), c = frag_col(t, x);
      if constexpr (LOAD)
        acc[a][x] = e[int64_t(r) * K + c0 + c];
      else
        acc[a][x] = (ident && r == c0 + c) ? 1.0f : 0.0f;
    }
}

// X0 = dtype(S) (a state tile), or X0 + X1 = M sc as hi + lo (M tile; sc: a power of two, 1 for
// bf16): the B operand of W X (backward: of Kt X).
template <class DT, int K, bool MT>
__device__ __forceinline__ void put_operand(float (&acc)[K / 64][32], unsigned char* x0, unsigned char* x1, float sc) {
  const int t = int(threadIdx.x);
#pragma unroll
  for (int a = 0; a < K / 64; ++a)
#pragma unroll
    for (int x = 0; x < 32; x += 2) {
      const uint32_t o = swz(64 * a + frag_row(t, x), frag_col(t, x));
      const float v0 = acc[a][x], v1 = acc[a][x + 1];
      if constexpr (!MT) {
        *reinterpret_cast<uint32_t*>(x0 + o) = DT::pack(v0, v1);
      } else {
        const float y0 = v0 * sc, y1 = v1 * sc;
        const float h0 = DT::rnd(y0), h1 = DT::rnd(y1);
        *reinterpret_cast<uint32_t*>(x0 + o) = DT::pack(h0, h1);
        *reinterpret_cast<uint32_t*>(x1 + o) = DT::pack(y0 - h0, y1 - h1);
      }
    }
}

// ATOMS 64-row stage tiles at t (rows = the chunk's tokens, 16-bit values): rows >= L set to zero
// (only a partial chunk has them); with GATE, every value x of a row r < L replaced by
// dtype(op(e, x)), op = chunk_op(r, c) the map of the 16-byte chunk of 8 values whose first
// column is c (the swizzle undone; e in [0, 8) its element). chunk_op is formed for every chunk
// of the thread, rows >= L too (it must be safe there). The loop is not unrolled (fewer
// registers).
template <class DT, bool GATE, int ATOMS, class ChunkOp>
__device__ __forceinline__ void stage_rows(unsigned char* tile, int L, ChunkOp chunk_op) {
  if (!GATE && L == kC) return;
  constexpr int kIters = ATOMS * kC * 8 / kConsumers;  // 16-byte chunks, 8 a row
#pragma unroll 1
  for (int i = 0; i < kIters; ++i) {
    const int q = int(threadIdx.x) + i * kConsumers, r = (q >> 3) & (kC - 1);
    uint4* w = reinterpret_cast<uint4*>(tile) + q;
    if constexpr (GATE) {
      const auto op = chunk_op(r, 64 * (q >> 9) + 8 * ((q & 7) ^ (r & 7)));
      if (r < L) {
        uint4 u = *w;
        uint32_t* x = &u.x;
#pragma unroll
        for (int h = 0; h < 4; ++h)
          x[h] = DT::pack(op(2 * h, DT::from_raw(uint16_t(x[h] & 0xffffu))),
                          op(2 * h + 1, DT::from_raw(uint16_t(x[h] >> 16))));
        *w = u;
        continue;
      }
    }
    if (r >= L) *w = make_uint4(0u, 0u, 0u, 0u);
  }
}

// The stage's k tiles (forward): GDN M tile: Kt = dtype(k * exp2(gL - g_r)) for r < L; every kind:
// rows >= L set to zero. KDA's kg comes gated.
template <class DT, int K, bool MT, bool KDA>
__device__ __forceinline__ void prep_k_rows(unsigned char* kt, int L, float gL, const float* g) {
  stage_rows<DT, MT && !KDA, K / 64>(kt, L, [&](int r, int) {
    const float f = exp2f(gL - g[r]);
    return [f](int, float x) { return x * f; };
  });
}

// v = A X0 [+ A X1] (64 tokens x 64 columns; A: the stage's 64 x K tile at a, K-major, X: K x 64
// at x0, x1, MN-major), issued as one group; wait_acc completes it.
template <bool F16, int K, bool MT>
__device__ __forceinline__ void issue_ax(float (&v)[32], uint32_t a, uint32_t x0, uint32_t x1) {
  fence_acc(v);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    wgmma_64x64x16<F16, 0, 1>(v, desc_k(a + (kk / 4) * kAtom, kk % 4), desc_mn(x0, kk), kk > 0);
  if constexpr (MT) {
#pragma unroll
    for (int kk = 0; kk < K / 16; ++kk)
      wgmma_64x64x16<F16, 0, 1>(v, desc_k(a + (kk / 4) * kAtom, kk % 4), desc_mn(x1, kk), 1);
  }
  wgmma_commit();
}
__device__ __forceinline__ void wait_acc(float (&v)[32]) {
  wgmma_wait();
  fence_acc(v);
}

// S <- Gam S + A0^T B0 [+ A1^T B1]: per 64-key block a of the tile, A0 / A1 the stage's tiles at
// a0 / a1 (64 tokens x K, read MN-major: block a at + a kAtom), B0 / B1 (64 tokens x 64, MN-major)
// at b0 / b1; the terms in this order. Forward: A0 = A1 = k (Kt), B0 = Y0, B1 = Y1; backward: A0 =
// qs, B0 = dO, A1 = W, B1 = -dv2. SC (fp16 M tile): on the tile scaled by 2^(e1 + e2) and scaled
// back. Gam: `gam` (GDN), or per row a (a key channel) gk[a] (KDA: the stage's factors).
template <bool F16, int K, bool TWO, bool SC, bool KDA>
__device__ __forceinline__ void update(float (&acc)[K / 64][32], uint32_t a0, uint32_t b0, uint32_t a1, uint32_t b1,
                                       float gam, const float* gk, int e1, int e2) {
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
      wgmma_64x64x16<F16, 1, 1>(acc[a], desc_mn(a0 + a * kAtom, kk), desc_mn(b0, kk), 1);
    if constexpr (TWO) {
#pragma unroll
      for (int kk = 0; kk < kC / 16; ++kk)
        wgmma_64x64x16<F16, 1, 1>(acc[a], desc_mn(a1 + a * kAtom, kk), desc_mn(b1, kk), 1);
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

// A tile's 16-bit output row pair (x0, x1 packed in u) at swizzled offset o of row r: into the
// staging tile y (a full chunk: one TMA store of y follows), else straight to dst (rows < L).
__device__ __forceinline__ void stage_or_store(uint32_t u, unsigned char* y, uint32_t o, int L, uint16_t* dst) {
  if (L == kC)
    *reinterpret_cast<uint32_t*>(y + o) = u;
  else
    *reinterpret_cast<uint32_t*>(dst) = u;
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
      if constexpr (STATES)
        stage_or_store(DT::pack(x0, x1), sb + Sm::Y1, o, L, p.v_new + ((hd.begin + r) * p.sh.HV + b.j) * K + b.c0 + c);
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

// The K x 64 tile into o (a K x V fp32 matrix, V = K), columns c0 + [0, 64); nothing for o null.
template <int K>
__device__ __forceinline__ void store_rows(const float (&acc)[K / 64][32], float* o, int c0) {
  if (!o) return;
  const int t = int(threadIdx.x);
#pragma unroll
  for (int a = 0; a < K / 64; ++a)
#pragma unroll
    for (int x = 0; x < 32; x += 2) {
      const int r = 64 * a + frag_row(t, x), c = c0 + frag_col(t, x);
      *reinterpret_cast<float2*>(o + int64_t(r) * K + c) = make_float2(acc[a][x], acc[a][x + 1]);
    }
}

// The tile after the forward walk: ht (STATES, the piece's last segment), seg_h_ext, or seg_Mt = M^T.
template <int K, bool STATES>
__device__ __forceinline__ void store_result(const float (&acc)[K / 64][32], const FwdWalkParams& p, const Blk& b) {
  const int t = int(threadIdx.x);
  const int64_t KK = int64_t(K) * K;
  if (!STATES && b.mtile) {  // o[col * K + row] = M[row][col]
    float* o = p.seg_Mt + (int64_t(b.s) * p.sh.HV + b.j) * KK;
#pragma unroll
    for (int a = 0; a < K / 64; ++a)
#pragma unroll
      for (int x = 0; x < 32; x += 2) {
        const int r = 64 * a + frag_row(t, x), c = b.c0 + frag_col(t, x);
        o[int64_t(c) * K + r] = acc[a][x];
        o[int64_t(c + 1) * K + r] = acc[a][x + 1];
      }
    return;
  }
  float* o = nullptr;
  if constexpr (STATES) {
    if (p.ht && b.s + 1 == p.pieces[b.seg.piece].seg_end) o = p.ht + (int64_t(b.seg.piece) * p.sh.HV + b.j) * KK;
  } else {
    o = p.seg_h_ext + (int64_t(b.s) * p.sh.HV + b.j) * KK;
  }
  store_rows<K>(acc, o, b.c0);
}

// The start of a chunk's step (both directions): once the previous chunk's TMA stores have read
// X0 / Y1, X0 = dtype(S) (X0 + X1 = the split M sc, MT; sc_of() is called behind the first
// barrier) for every consumer; STORE: X0 -> the 16-bit state of chunk n by a TMA store (map h:
// h or dh).
template <class DT, int K, bool MT, bool STORE, class ScOf>
__device__ __forceinline__ void start_chunk(float (&acc)[K / 64][32], unsigned char* x0, unsigned char* x1, ScOf sc_of,
                                            const CUtensorMap* h, uint32_t x0s, const Blk& b, int64_t n, int HV) {
  const int t = int(threadIdx.x);
  if (t == 0) bulk_wait_read();  // the previous chunk's TMA stores have read X0 / Y1
  named_sync(kConsumerBar, kConsumers);
  put_operand<DT, K, MT>(acc, x0, x1, sc_of());
  fence_proxy_async();
  named_sync(kConsumerBar, kConsumers);
  if (STORE && t == 0) tma_store_3d(h, x0s, b.c0, 0, int(n * HV + b.j));
}

// The consumer warpgroup's forward walk over the segment's chunks (MT: a transfer tile).
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
  init_acc<K, STATES>(acc, STATES ? p.seg_entry + (int64_t(b.s) * p.sh.HV + b.j) * K * K : nullptr, b.c0, MT);
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
    int e1 = 0;
    auto sc_of = [&] {  // behind the first barrier, so behind every warp's publish_m
      if constexpr (SC) e1 = SplitScale::exponent(SplitScale::gather(redM, 4), kSplitCapM);
      return SplitScale::pow2(e1);
    };
    start_chunk<DT, K, MT, vstore>(acc, sb + Sm::X0, sb + Sm::X1, sc_of, &maps.h, base + Sm::X0, b, n, p.sh.HV);
    mbar_wait(full_bar(bars, s), uint32_t((m / kStages) & 1));
    const ChunkHdr hd = *reinterpret_cast<const ChunkHdr*>(sst + Sm::Hdr);
    const float* g = reinterpret_cast<const float*>(sst + Sm::G);
    const float gL = KDA ? 0.0f : g[hd.len - 1];  // KDA: g holds Gam per channel
    prep_k_rows<DT, K, MT, KDA>(sst + Sm::Kt, hd.len, gL, g);
    issue_ax<F16, K, MT>(v, st + Sm::W, base + Sm::X0, base + Sm::X1);
    wait_acc(v);
    int e2 = 0;
    if constexpr (MT)
      e2 = epilogue_m<DT, K>(v, hd.len, sb);
    else
      epilogue_state<DT, K, STATES, KDA>(v, sst, sb, p, b);
    fence_proxy_async();
    named_sync(kConsumerBar, kConsumers);
    if (vstore && t == 0 && hd.len == kC) tma_store_3d(&maps.vn, base + Sm::Y1, b.c0, b.j, int(hd.begin));
    update<F16, K, MT, SC, KDA>(acc, st + Sm::Kt, base + Sm::Y0, st + Sm::Kt, base + Sm::Y1, KDA ? 1.0f : exp2f(gL), g,
                                e1, e2);
    if constexpr (SC) publish_m();  // read behind the next chunk's first barrier
    mbar_arrive(empty_bar(bars, s));
  }
  if (t == 0) bulk_wait_all();  // the stores have read shared memory before the block ends
  store_result<K, STATES>(acc, p, b);
}

}  // namespace kcp::kernels::cuda::walk_wg

#include "kernels/cuda/gdn_walk_rs.cuh"

namespace kcp::kernels::cuda::walk_wg {

template <class DT, int K, bool STATES, bool KDA>
__device__ __forceinline__ void walk_block(const Maps& maps, const FwdWalkParams& p) {
  using Sm = Smem<K>;
  constexpr int NVT = K / kTileV, NTILES = STATES ? NVT : 2 * NVT;
  const Blk b = block_of<NVT, NTILES>(p);
  if constexpr (!STATES)
    if (skip_unread_tile<K>(p, b)) return;  // uniform over the block, before any barrier
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sb = nullptr;
  const uint32_t base = setup_ring(smem_raw, Sm::Bar, sb);
  if (threadIdx.x >= kConsumers) {
    produce<K, KDA>(maps, p, b, base, sb);
  } else if constexpr (STATES) {
    consume_rs<DT, K, true, KDA>(maps, p, b, base, sb);
  } else {
    if (b.mtile)
      consume<DT, K, false, true, KDA>(maps, p, b, base, sb);
    else
      consume_rs<DT, K, false, KDA>(maps, p, b, base, sb);
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

// ---- the backward walk ----

// The backward producer, chunks last to first: k (of the q/k head; KDA: kg of value head j), q
// (of the q/k head; KDA: qs of value head j), W (NKT tiles each), dO and dv_local (the block's 64
// columns) by TMA; the chunk's gates (GDN: 64 token gates, KDA: Gam per key channel).
template <int K, bool KDA>
__device__ __forceinline__ void produce_bwd(const BwdMaps& maps, const BwdWalkParams& p, const Blk& b, uint32_t base,
                                            unsigned char* sb) {
  using Sm = BwdSmem<K>;
  const int lane = int(threadIdx.x) & 31;
  constexpr uint32_t bytes = uint32_t((3 * Sm::NKT + 2) * kAtom);
  const int64_t last = b.seg.chunk_end - 1;
  produce_ring<Sm::kStage, Sm::Hdr>(
      base, sb, base + Sm::Bar, b.seg.chunk_end - b.seg.chunk_begin, p.chunks, [&](int64_t m) { return last - m; },
      [&](uint32_t st, unsigned char* sst, uint32_t full, const ChunkDesc& ch) {
        const int t0 = int(ch.begin);
        if (lane == 0) {
          mbar_expect_tx(full, bytes);
#pragma unroll
          for (int a = 0; a < Sm::NKT; ++a) {
            tma_load_3d(st + Sm::Kt + a * kAtom, &maps.k, full, 64 * a, KDA ? b.j : b.i, t0);
            tma_load_3d(st + Sm::Q + a * kAtom, &maps.q, full, 64 * a, KDA ? b.j : b.i, t0);
            tma_load_3d(st + Sm::W + a * kAtom, &maps.W, full, 64 * a, b.j, t0);
          }
          tma_load_3d(st + Sm::dO, &maps.dO, full, b.c0, b.j, t0);
          tma_load_3d(st + Sm::Dl, &maps.dl, full, b.c0, b.j, t0);
        }
        put_gates<K, KDA>(reinterpret_cast<float*>(sst + Sm::G), p.gcum, p.sh.HV, b.j, ch);
      });
}

// [B2] dv2 = dtype((Kt X0) f_r + dv_local), GDN f_r = exp2(gL - g_r), KDA f_r = 1, rows r < L:
// STATES: to dv2 (Y1 for the TMA store of a full chunk, else plain stores); Y0 = -dv2 by its sign
// bits (rows >= L: -0, as the mma walk's pack(-0, -0)).
template <class DT, int K, bool STATES, bool KDA>
__device__ __forceinline__ void epilogue_dv2(const float (&v)[32], const unsigned char* sst, unsigned char* sb,
                                             const BwdWalkParams& p, const Blk& b, const ChunkHdr& hd, float gL) {
  using Sm = BwdSmem<K>;
  const int t = int(threadIdx.x), L = hd.len;
  const float* g = reinterpret_cast<const float*>(sst + Sm::G);
#pragma unroll
  for (int x = 0; x < 32; x += 2) {
    const int r = frag_row(t, x), c = frag_col(t, x);
    const uint32_t o = swz(r, c);
    uint32_t u = 0u;
    if (r < L) {
      const float f = KDA ? 1.0f : exp2f(gL - g[r]);  // as bwd_walk_kernel's row_factor
      const uint32_t d = *reinterpret_cast<const uint32_t*>(sst + Sm::Dl + o);
      u = DT::pack(v[x] * f + DT::from_raw(uint16_t(d & 0xffffu)), v[x + 1] * f + DT::from_raw(uint16_t(d >> 16)));
      if constexpr (STATES)
        stage_or_store(u, sb + Sm::Y1, o, L, p.dv2 + ((hd.begin + r) * p.sh.HV + b.j) * K + b.c0 + c);
    }
    *reinterpret_cast<uint32_t*>(sb + Sm::Y0 + o) = u ^ kNegZero2;
  }
}

// [B3] the stage's operands of the update: rows >= L of q, W and dO zero (a partial chunk; the
// TMA box read other tokens there) and, GDN, qs = dtype((q scale) exp2(g_r)) in place of q, one
// gate per row (the stage's g). KDA's q tiles hold qs already (kda_qs_kernel).
template <class DT, int K, bool KDA>
__device__ __forceinline__ void prep_update_rows(unsigned char* sst, int L, const float* g, float scale) {
  using Sm = BwdSmem<K>;
  if constexpr (!KDA) {
    stage_rows<DT, true, K / 64>(sst + Sm::Q, L, [&](int r, int) {
      const float e = exp2f(g[r]);
      return [=](int, float x) { return (x * scale) * e; };
    });
  }
  constexpr int kFrom = KDA ? Sm::Q : Sm::W, kAtoms = (KDA ? 2 : 1) * Sm::NKT + 1;
  stage_rows<DT, false, kAtoms>(sst + kFrom, L, [](int, int) { return [](int, float x) { return x; }; });
}

// The consumer warpgroup's backward walk over the segment's chunks, last to first ([B1]-[B3]).
template <class DT, int K, bool STATES, bool KDA>
__device__ __forceinline__ void consume_bwd(const BwdMaps& maps, const BwdWalkParams& p, const Blk& b, uint32_t base,
                                            unsigned char* sb) {
  using Sm = BwdSmem<K>;
  constexpr bool F16 = std::is_same_v<DT, Fp16>;
  const int t = int(threadIdx.x);
  const uint32_t bars = base + Sm::Bar;
  const int64_t sj = int64_t(b.s) * p.sh.HV + b.j, KK = int64_t(K) * K;
  const float scale = p.sh.scale;
  float acc[K / 64][32], v[32] = {};  // v: written by the first wgmma of each chunk (no accumulate)
  init_acc<K, STATES>(acc, STATES ? p.seg_exit + sj * KK : nullptr, b.c0, false);
  const int64_t count = b.seg.chunk_end - b.seg.chunk_begin;
  for (int64_t m = 0; m < count; ++m) {
    const int64_t n = b.seg.chunk_end - 1 - m;
    const int s = int(m % kStages);
    const uint32_t st = base + s * Sm::kStage;
    unsigned char* sst = sb + s * Sm::kStage;
    // (1) [B1] X0 = dSb = dtype(dS) (-> dh[n]).
    start_chunk<DT, K, false, STATES>(
        acc, sb + Sm::X0, nullptr, [] { return 1.0f; }, &maps.dh, base + Sm::X0, b, n, p.sh.HV);
    mbar_wait(full_bar(bars, s), uint32_t((m / kStages) & 1));
    const ChunkHdr hd = *reinterpret_cast<const ChunkHdr*>(sst + Sm::Hdr);
    const float* g = reinterpret_cast<const float*>(sst + Sm::G);
    const int L = hd.len;
    const float gL = KDA ? 0.0f : g[L - 1];  // KDA: g holds Gam per channel
    // (2) [B2] v = Kt X0 on the tensor cores while the stage's operands of (3) are formed (GDN: qs
    // in place of q; rows >= L of qs, W and dO zero).
    issue_ax<F16, K, false>(v, st + Sm::Kt, base + Sm::X0, 0u);
    prep_update_rows<DT, K, KDA>(sst, L, g, scale);
    wait_acc(v);
    epilogue_dv2<DT, K, STATES, KDA>(v, sst, sb, p, b, hd, gL);
    fence_proxy_async();
    named_sync(kConsumerBar, kConsumers);
    if (STATES && t == 0 && L == kC) tma_store_3d(&maps.dv2, base + Sm::Y1, b.c0, b.j, int(hd.begin));
    // (3) [B3] dS <- Gam dS + qs^T dO - W^T dv2, in this order.
    update<F16, K, true, false, KDA>(acc, st + Sm::Q, st + Sm::dO, st + Sm::W, base + Sm::Y0, KDA ? 1.0f : exp2f(gL), g,
                                     0, 0);
    mbar_arrive(empty_bar(bars, s));
  }
  if (t == 0) bulk_wait_all();  // the stores have read shared memory before the block ends
  float* o = nullptr;
  if constexpr (STATES) {
    if (p.dh0 && b.seg.index_in_piece == 0) o = p.dh0 + (int64_t(b.seg.piece) * p.sh.HV + b.j) * KK;
  } else {
    o = p.seg_dh_ext + sj * KK;
  }
  store_rows<K>(acc, o, b.c0);
}

}  // namespace kcp::kernels::cuda::walk_wg

#include "kernels/cuda/gdn_walk_bwd_rs.cuh"

namespace kcp::kernels::cuda::walk_wg {

template <class DT, int K, bool STATES, bool KDA>
__device__ __forceinline__ void bwd_walk_block(const BwdMaps& maps, const BwdWalkParams& p) {
  using Sm = BwdSmem<K>;
  constexpr int NVT = K / kTileV;
  const Blk b = block_of<NVT, NVT>(p);
  if constexpr (!STATES)
    if (skip_unread_tile<K>(p, b)) return;  // uniform over the block, before any barrier
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sb = nullptr;
  const uint32_t base = setup_ring(smem_raw, Sm::Bar, sb);
  if (threadIdx.x >= kConsumers)
    produce_bwd<K, KDA>(maps, p, b, base, sb);
  else
    consume_bwd_rs<DT, K, STATES, KDA>(maps, p, b, base, sb);
}

// sm_90a only, as the forward kernel.
template <class DT, int K, bool STATES, bool KDA>
__global__ void __launch_bounds__(kWgThreads, 1)
    bwd_walk_wgmma_kernel(const __grid_constant__ BwdMaps maps, const __grid_constant__ BwdWalkParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  bwd_walk_block<DT, K, STATES, KDA>(maps, p);
#else
  __trap();
#endif
}

}  // namespace kcp::kernels::cuda::walk_wg
