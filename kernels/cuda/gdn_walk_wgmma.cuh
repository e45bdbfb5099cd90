// The state walks of GDN and KDA on Hopper, forward (fwd_summaries, fwd_states) and backward
// (bwd_summaries, bwd_states): wgmma, TMA loads by a producer warp into a two-stage mbarrier
// ring, TMA stores of the 16-bit outputs (the technique of tests/gpu/walk_step_bench.cu, issue
// 17). Included only by gdn_walk_wgmma.cu; launched instead of fwd_walk_kernel / bwd_walk_kernel
// (gdn_chunk_state_kernel.cuh) when launch_fwd_walk_wgmma / launch_bwd_walk_wgmma
// (gdn_walk_wgmma.h) support the problem: K = V in {64, 128}, bf16 / fp16, an sm_90 device and an
// sm_90a build (walk_select.h gives the measurement that made them the default). Same contract,
// same rounding points (every 16-bit operand is rounded where fwd_walk_kernel / bwd_walk_kernel
// round it, from the same fp32 expression), same outputs; bits may differ from those mma.sync
// walks only by the order of fp32 accumulation inside the products (wgmma's k16 steps over all
// 64 rows of a chunk vs mma.sync's up to the chunk's length rounded up to 16; the extra rows are
// exact zeros).
//
// The state tiles (fwd_states, and fwd_summaries' h_ext tiles) are walked by consume_rs
// (gdn_walk_rs.cuh), or, for fwd_states with the output (GDN, K = 128, template flag OUT), by
// consume_out_rec and consume_out_o on two warpgroups (gdn_walk_out.cuh), and both backward walks by consume_bwd_rs
// (gdn_walk_bwd_rs.cuh), with the recurrence's A operands in registers; their headers give the per-chunk steps (the
// shared-memory consumers they name as their reference, consume<.., MT = false> and consume_bwd,
// were removed after commit 00bc928). This file keeps the shared pieces: the shared-memory
// layouts, the TMA maps, the block map, the producers and their ring, stage_rows and the prep
// helpers (prep_k_rows, prep_update_rows), and the forward summaries' M tiles (consume_m).
//
// KDA (template flag KDA; gdn_chunk_state_kernel.cuh's header gives the twin's formulas): the key
// operand is kg [T, HV, K] of the value head (16-bit storage, gated and rounded by wy) instead of
// k of the q/k head, so no key is gated here (rows >= L zeroed); the decay Gam = exp2(gL) is one
// factor per key channel, which the producers write into the stage (K floats) in place of GDN's
// 64 token gates.
//
// fwd_walk_wgmma_kernel<DT, K, STATES, KDA, OUT>: grid S * HV * tiles, block b -> (segment s, value head
//   j, tile) = (b / (tiles HV), (b / tiles) % HV, b % tiles), tiles of kTileV = 64 columns: state
//   tiles S[:, c0 : c0 + 64] for tile < K / 64, and in summary mode (STATES = false) transfer tiles
//   M[:, c0 : c0 + 64] after them. 160 threads: one consumer warpgroup (128 threads) holds the
//   tile in wgmma accumulators (K / 64 m64n64 fp32 fragments, 32 registers each); one producer
//   warp streams each chunk's W (64 x K), k (64 x K, qk head j / G; KDA: kg of value head j), U
//   (64 x 64, state tiles only) with TMA and its gates (and the chunk's begin / length) with plain
//   stores into a two-stage ring: full[stage] completes when the 32 producer lanes have arrived
//   and the TMA bytes have landed, empty[stage] when the 128 consumers have finished the chunk,
//   so chunk n + 1 loads while chunk n computes. OUT: 288 threads, two consumer warpgroups (the
//   recurrence, the output: gdn_walk_out.cuh) whose 256 threads release empty[stage], then the
//   producer warp (its stage also holds q).
//   Summary mode writes seg_h_ext (from S = 0) and seg_Mt = M^T (from M = I); a block whose part
//   nobody reads (kernels/api/summary_needs.h) writes zeros for its tile and returns before any
//   barrier. STATES mode starts from seg_entry and writes h, v_new and ht (the piece's last
//   segment).
//   M tile, per chunk (consume_m; [S1]-[S4] of the twin):
//     X0 + X1 = M 2^e1 split (hi, lo: both dtype); R = W X0 + W X1; Y0 = -dtype(R 2^e2),
//     Y1 = dtype(dtype(R 2^e2) - R 2^e2) (rows >= L: -0, 0); k <- Kt = dtype(k * exp2(gL - g_r))
//     in place in the stage (KDA: Kt = kg); M <- (Gam M 2^(e1 + e2) + Kt^T Y0 + Kt^T Y1)
//     2^-(e1 + e2). fp16: 2^e1, 2^e2 put the largest |M|, |R| into [2^14, 2^15) (SplitScale,
//     gdn_chunk_state_kernel.cuh: an unscaled fp16 split loses values below ~2^-3 and all below
//     2^-25); the largest |M| of the next chunk is published by each warp after the update, that
//     of R takes one more consumer barrier. bf16: e1 = e2 = 0.
//   The products are wgmma m64n64k16 from shared memory: R = W X (A = W K-major, B = X MN-major)
//   and the update (A = Kt^T: the stage's k tile read MN-major, B = Y MN-major). Rows beyond a
//   partial chunk: the TMA box reads them (the next piece's tokens or zeros past T); they are
//   masked where Y is formed and the stage's k rows >= L are set to zero before the update, so
//   nothing of another piece reaches M.
// Shared memory (bytes; 1024-aligned 64-row tiles of 128-byte rows with the 128-byte swizzle):
//   2 stages x (W, k: K / 64 tiles each; U: 1 tile; gates (GDN 64, KDA K floats) + header:
//   1 KiB); X0, X1: K x 64; Y0, Y1: 64 x 64 (an M tile's split operands; a state tile stages h in
//   X0 and v_new in Y1); 4 mbarriers; the 4 consumer warps' largest |M| and |R| (8 floats); + 1
//   KiB for aligning the base. K = 128: 134208 B, one block per SM: a block does the work of two
//   32-column blocks of fwd_walk_kernel, which runs two per SM, so the planner's count of block
//   slots per (segment, value head) (kernels/api/tiles.h) holds for both walks. K = 64: 85056 B,
//   two blocks per SM fit (the planner then counts twice the slots this walk uses). OUT: each
//   stage also holds q (K / 64 tiles); X0 / X1 are the X slots, VS the v_new slots, PS the P
//   tiles, Y0 stages o, XBar the slots' 6 mbarriers: K = 128 199,792 B, one block per SM.
//
// bwd_walk_wgmma_kernel<DT, K, STATES, KDA>: grid S * HV * K / 64, block b -> (segment s, value
//   head j, tile) as above, state tiles only: dS[:, c0 : c0 + 64]. The producer streams each
//   chunk, last to first, into the ring: k, q (64 x K each, q/k head j / G), W (64 x K, value
//   head j), dO and dv_local (64 x 64, the block's columns) by TMA, the chunk's gates and header
//   by plain stores. prep_update_rows forms the update's stage operands: GDN qs =
//   dtype((q scale) exp2(g_r)) in place of q, and rows >= L of q, W and dO zero (a partial chunk;
//   the TMA box read other tokens there). Summary mode starts from 0 and writes seg_dh_ext (a
//   block whose part nobody reads writes zeros and returns before any barrier); STATES mode
//   starts from seg_exit and writes dh, dv2 and dh0 (the first segment of each piece).
//   KDA: kg of value head j in place of k; qs = dtype((q scale) exp2(g)) with one gate per
//   element comes ready: kda_qs_kernel (kda_qs.cu) writes it before the walk ([T, HV, K],
//   16-bit, the backend's scratch), the producer loads the chunk's rows of value head j by TMA
//   into the stage's q tiles, and prep_update_rows only zeroes its rows >= L (with those of W
//   and dO, one pass). Summary mode: the prepass covers only the segments whose seg_dh_ext is
//   read (qs_rows_of_summaries, kda_qs.h), so qs rows of other tokens hold whatever the scratch
//   held (NaN, Inf, anything). No such row reaches a value: a skipped segment's blocks return
//   before any TMA load; a read segment's chunks load rows of their own tokens, except the box's
//   rows >= L of a partial chunk (the piece's last, the next piece's tokens), which stage_rows
//   overwrites with zeros (plain stores, never read first) before the update reads the stage's
//   q, and the product with k does not read q.
// Shared memory of the backward walk (bytes, same tile format): 2 stages x (k, q, W: K / 64
//   tiles each; dO, dv_local: 1 tile each; gates + header: 1 KiB); X0: K x 64 (dh staging); Y0:
//   64 x 64 (unused: -dv2 stays in registers); Y1: 64 x 64 (dv2 staging); 4 mbarriers; + 1 KiB
//   for aligning the base. K = 128: 166944 B, one block per SM: a block does the work of two
//   32-column blocks of bwd_walk_kernel, which runs two per SM, so the planner's count of block
//   slots per (segment, value head) (kernels/api/tiles.h: V / 32 blocks at two per SM) holds as
//   for the forward walk. K = 64: 109600 B, two blocks per SM fit (the planner then counts twice
//   the slots this walk uses, as for the forward walk).
//
// Registers (ptxas -v of the kernels as built: sm_90a, nvcc 13.0; no spills), summaries / states,
// each GDN, KDA (a forward summaries kernel holds both the state tile and the M tile consumer):
//   forward  K = 128: bf16 188, 177 / 176, 174; fp16 223, 206 / 176, 174
//            K = 64:  bf16 140, 136 / 136, 128; fp16 141, 136 / 137, 130
//   backward K = 128: bf16 184, 176 / 213, 178; fp16 184, 175 / 214, 178
//            K = 64:  bf16 154, 137 / 164, 168; fp16 155, 137 / 164, 160
//   (K = 64 runs two blocks per SM: at most 204 registers fit). The GDN states walk with the output
//   (OUT, K = 128 only, 288 threads: at most 168 registers a thread, the bound counted in whole
//   warpgroups): bf16 / fp16 as ptxas gives them in wip/NOTES-ws.md.
#pragma once

#include <type_traits>

#include "kernels/cuda/gdn_chunk_state_kernel.cuh"
#include "kernels/cuda/hopper.cuh"

namespace kcp::kernels::cuda::walk_wg {

using namespace ::kcp::hopper;

inline constexpr int kTileV = 64;                     // columns of a block's tile
inline constexpr int kConsumers = 128;                // one warpgroup
inline constexpr int kWgThreads = kConsumers + 32;    // + the producer warp
inline constexpr int kOutConsumers = 2 * kConsumers;  // the walk with the output: two warpgroups
inline constexpr int kOutThreads = kOutConsumers + 32;
inline constexpr int kOutputBar = 2;                // named barrier of the output warpgroup
inline constexpr int kStages = 2;                   // the ring
inline constexpr int kAtom = kAtomBytes;            // one 64-row tile: 8 KiB (hopper.cuh)
inline constexpr int kConsumerBar = 1;              // named barrier of the consumers
inline constexpr uint32_t kNegZero2 = 0x80008000u;  // two 16-bit -0
inline constexpr int kGateBytes = 1024;             // a stage's gates (at most 128 floats) and header
inline constexpr int kHdrAt = 128 * 4;              // the header's offset in them

// Forward walk: shared memory. OUT: the states walk that forms the output (gdn_walk_out.cuh).
template <int K, bool OUT = false>
struct Smem {
  static constexpr int NKT = K / 64;         // 64-key tiles of W, k and X
  static constexpr int NQT = OUT ? NKT : 0;  // 64-key tiles of q (OUT)
  // Offsets inside a stage.
  // G: GDN's 64 token gates or KDA's K per-channel factors Gam (at most 128 floats), then the header.
  static constexpr int W = 0, Kt = NKT * kAtom, U = 2 * NKT * kAtom, Q = U + kAtom, G = Q + NQT * kAtom;
  static constexpr int Hdr = G + kHdrAt;
  static constexpr int kStage = G + kGateBytes;
  // Offsets from the aligned base. X0, X1, Y0, Y1: an M tile's split operands; a state tile's
  // warps stage h in X0 and v_new in Y1 (gdn_walk_rs.cuh); OUT: the X slots in X0 / X1, o in Y0.
  static constexpr int X0 = kStages * kStage, X1 = X0 + NKT * kAtom, Y0 = X1 + NKT * kAtom, Y1 = Y0 + kAtom;
  // OUT (gdn_walk_out.cuh): X0 / X1 are the two slots of X handed to the output warpgroup, VS the
  // two slots of v_new (one tile each), PS the output warpgroup's two P tiles.
  static constexpr int VS = Y1 + kAtom, PS = VS + 2 * kAtom;
  static constexpr int Bar = Y1 + kAtom + (OUT ? 4 * kAtom : 0);  // full[kStages], then empty[kStages]
  static constexpr int Red = Bar + 8 * 2 * kStages;               // largest |M| [4], then |R| [4] (fp16 M tiles)
  static constexpr int XBar = Red + 2 * 4 * 4;  // OUT: xready[2], vready[2], xempty[2] (gdn_walk_out.cuh)
  static constexpr size_t bytes = size_t(XBar) + (OUT ? 8 * 6 : 0) + 1024;  // + the base's alignment
  static_assert(bytes <= 227 * 1024, "one block must fit an SM's shared memory");
  static_assert(K <= 128 && kC <= 128 && kHdrAt + 16 <= kGateBytes, "the gates and the header fit the stage's 1 KiB");
};

// Backward walk: shared memory. Stage: k (GDN: of the q/k head; KDA: kg), q (GDN: -> qs in
// place; KDA: qs), W (NKT tiles each), dO, dv_local (one 64 x 64 tile each), the gates (GDN 64,
// KDA K floats) and the header; then X0 (K x 64: the warps' dh staging, gdn_walk_bwd_rs.cuh), Y0
// (64 x 64: unused, -dv2 stays in registers), Y1 (64 x 64: the warps' dv2 staging).
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
// kg [T, HV, K] (KDA), h [NT * HV, K, V]. h and vn (64-column boxes) are set by the launcher but
// read by no kernel now: the state tiles store through hs and vns. q [T, H, K] and os (o [T, HV,
// V] in boxes of 16 values) only for the walk that forms the output.
struct Maps {
  CUtensorMap W, k, U, h, vn;
  CUtensorMap hs, vns;  // h and v_new in boxes of 16 values, unswizzled (the state tiles' per-warp stores)
  CUtensorMap q, os;
};

// TMA descriptors of the backward walk: k, q [T, H, K] (KDA: k is kg, q is qs, both [T, HV, K]);
// W [T, HV, K]; dO, dv_local, dv2 [T, HV, V]; dh [NT * HV, K, V]. dh and dv2 (64-column boxes)
// are set by the launcher but read by no kernel now: the walk stores through dhs and dv2s.
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
// barriers at base + bar_off (full: the 32 producer lanes, empty: the `consumers` threads); with
// xbar_off > 0 also the two-slot ring from the recurrence's warpgroup to the output's
// (gdn_walk_out.cuh: xready, vready, xempty, 128 arrivals each); behind a block barrier.
__device__ __forceinline__ uint32_t setup_ring(unsigned char* raw, int bar_off, unsigned char*& sb,
                                               int consumers = kConsumers, int xbar_off = 0) {
  const uint32_t r = smem_u32(raw), base = (r + 1023u) & ~1023u;
  sb = raw + (base - r);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_bar(base + bar_off, s), 32);
      mbar_init(empty_bar(base + bar_off, s), consumers);
    }
    for (int s = 0; xbar_off > 0 && s < 6; ++s) mbar_init(base + xbar_off + 8 * s, kConsumers);
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

// The forward producer: W, k (KDA: kg) (and U; OUT: q) by TMA; the gates (KDA: Gam = exp2(gL) per
// key channel).
template <int K, bool KDA, bool OUT>
__device__ __forceinline__ void produce(const Maps& maps, const FwdWalkParams& p, const Blk& b, uint32_t base,
                                        unsigned char* sb) {
  using Sm = Smem<K, OUT>;
  const int lane = int(threadIdx.x) & 31;
  const uint32_t bytes = uint32_t((2 * Sm::NKT + Sm::NQT + (b.mtile ? 0 : 1)) * kAtom);
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
            if constexpr (OUT) tma_load_3d(st + Sm::Q + a * kAtom, &maps.q, full, 64 * a, b.i, t0);
          }
          if (!b.mtile) tma_load_3d(st + Sm::U, &maps.U, full, b.c0, b.j, t0);
        }
        put_gates<K, KDA>(reinterpret_cast<float*>(sst + Sm::G), p.gcum, p.sh.HV, b.j, ch);
      });
}

// The M tile at the start: I (rows r, columns c0 + c of the K x K identity).
template <int K>
__device__ __forceinline__ void init_ident(float (&acc)[K / 64][32], int c0) {
  const int t = int(threadIdx.x);
#pragma unroll
  for (int a = 0; a < K / 64; ++a)
#pragma unroll
    for (int x = 0; x < 32; ++x) {
      const int r = 64 * a + frag_row(t, x), c = frag_col(t, x);
      acc[a][x] = r == c0 + c ? 1.0f : 0.0f;
    }
}

// X0 + X1 = M sc as hi + lo (both dtype; sc: a power of two, 1 for bf16): the B operand of W X.
template <class DT, int K>
__device__ __forceinline__ void put_split(float (&acc)[K / 64][32], unsigned char* x0, unsigned char* x1, float sc) {
  const int t = int(threadIdx.x);
#pragma unroll
  for (int a = 0; a < K / 64; ++a)
#pragma unroll
    for (int x = 0; x < 32; x += 2) {
      const uint32_t o = swz(64 * a + frag_row(t, x), frag_col(t, x));
      const float y0 = acc[a][x] * sc, y1 = acc[a][x + 1] * sc;
      const float h0 = DT::rnd(y0), h1 = DT::rnd(y1);
      *reinterpret_cast<uint32_t*>(x0 + o) = DT::pack(h0, h1);
      *reinterpret_cast<uint32_t*>(x1 + o) = DT::pack(y0 - h0, y1 - h1);
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

// v = A X0 + A X1 (64 tokens x 64 columns; A: the stage's 64 x K tile at a, K-major, X: K x 64
// at x0, x1, MN-major), issued as one group; wait_acc completes it.
template <bool F16, int K>
__device__ __forceinline__ void issue_ax(float (&v)[32], uint32_t a, uint32_t x0, uint32_t x1) {
  fence_acc(v);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    wgmma_64x64x16<F16, 0, 1>(v, desc_k(a + (kk / 4) * kAtom, kk % 4), desc_mn(x0, kk), kk > 0);
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    wgmma_64x64x16<F16, 0, 1>(v, desc_k(a + (kk / 4) * kAtom, kk % 4), desc_mn(x1, kk), 1);
  wgmma_commit();
}
__device__ __forceinline__ void wait_acc(float (&v)[32]) {
  wgmma_wait();
  fence_acc(v);
}

// M <- Gam M + Kt^T Y0 + Kt^T Y1: per 64-key block a of the tile, Kt the stage's tile at kt (64
// tokens x K, read MN-major: block a at + a kAtom), Y0 / Y1 (64 tokens x 64, MN-major) at y0 / y1;
// the terms in this order. SC (fp16): on the tile scaled by 2^(e1 + e2) and scaled back. Gam:
// `gam` (GDN), or per row a (a key channel) gk[a] (KDA: the stage's factors).
template <bool F16, int K, bool SC, bool KDA>
__device__ __forceinline__ void update(float (&acc)[K / 64][32], uint32_t kt, uint32_t y0, uint32_t y1, float gam,
                                       const float* gk, int e1, int e2) {
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
      wgmma_64x64x16<F16, 1, 1>(acc[a], desc_mn(kt + a * kAtom, kk), desc_mn(y0, kk), 1);
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk)
      wgmma_64x64x16<F16, 1, 1>(acc[a], desc_mn(kt + a * kAtom, kk), desc_mn(y1, kk), 1);
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

// The M tile after the walk: seg_Mt = M^T (o[col * K + row] = M[row][col]).
template <int K>
__device__ __forceinline__ void store_mt(const float (&acc)[K / 64][32], const FwdWalkParams& p, const Blk& b) {
  const int t = int(threadIdx.x);
  const int64_t KK = int64_t(K) * K;
  float* o = p.seg_Mt + (int64_t(b.s) * p.sh.HV + b.j) * KK;
#pragma unroll
  for (int a = 0; a < K / 64; ++a)
#pragma unroll
    for (int x = 0; x < 32; x += 2) {
      const int r = 64 * a + frag_row(t, x), c = b.c0 + frag_col(t, x);
      o[int64_t(c) * K + r] = acc[a][x];
      o[int64_t(c + 1) * K + r] = acc[a][x + 1];
    }
}

// The start of a chunk's step: X0 + X1 = the split M sc for every consumer, between two consumer
// barriers (sc_of() is called behind the first). The bulk wait is a no-op here (an M tile issues
// no TMA store); it stays from the walks' shared start, so the kernels are unchanged.
template <class DT, int K, class ScOf>
__device__ __forceinline__ void start_chunk(float (&acc)[K / 64][32], unsigned char* x0, unsigned char* x1,
                                            ScOf sc_of) {
  const int t = int(threadIdx.x);
  if (t == 0) bulk_wait_read();
  named_sync(kConsumerBar, kConsumers);
  put_split<DT, K>(acc, x0, x1, sc_of());
  fence_proxy_async();
  named_sync(kConsumerBar, kConsumers);
}

// The consumer warpgroup's walk of a transfer tile M (forward summaries) over the segment's chunks.
template <class DT, int K, bool KDA>
__device__ __forceinline__ void consume_m(const FwdWalkParams& p, const Blk& b, uint32_t base, unsigned char* sb) {
  using Sm = Smem<K>;
  constexpr bool F16 = std::is_same_v<DT, Fp16>;
  const int t = int(threadIdx.x);
  const uint32_t bars = base + Sm::Bar;
  constexpr bool SC = kScaledSplit<DT>;  // fp16: scaled split operands
  float acc[K / 64][32], v[32] = {};     // v: written by the first wgmma of each chunk (no accumulate)
  init_ident<K>(acc, b.c0);
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
    start_chunk<DT, K>(acc, sb + Sm::X0, sb + Sm::X1, sc_of);
    mbar_wait(full_bar(bars, s), uint32_t((m / kStages) & 1));
    const ChunkHdr hd = *reinterpret_cast<const ChunkHdr*>(sst + Sm::Hdr);
    const float* g = reinterpret_cast<const float*>(sst + Sm::G);
    const float gL = KDA ? 0.0f : g[hd.len - 1];  // KDA: g holds Gam per channel
    prep_k_rows<DT, K, true, KDA>(sst + Sm::Kt, hd.len, gL, g);
    issue_ax<F16, K>(v, st + Sm::W, base + Sm::X0, base + Sm::X1);
    wait_acc(v);
    const int e2 = epilogue_m<DT, K>(v, hd.len, sb);
    fence_proxy_async();
    named_sync(kConsumerBar, kConsumers);
    update<F16, K, SC, KDA>(acc, st + Sm::Kt, base + Sm::Y0, base + Sm::Y1, KDA ? 1.0f : exp2f(gL), g, e1, e2);
    if constexpr (SC) publish_m();  // read behind the next chunk's first barrier
    mbar_arrive(empty_bar(bars, s));
  }
  if (t == 0) bulk_wait_all();  // a no-op as start_chunk's bulk wait
  store_mt<K>(acc, p, b);
}

}  // namespace kcp::kernels::cuda::walk_wg

#include "kernels/cuda/gdn_walk_rs.cuh"
// consume_out_rec / consume_out_o build on consume_rs's helpers.
#include "kernels/cuda/gdn_walk_out.cuh"

namespace kcp::kernels::cuda::walk_wg {

template <class DT, int K, bool STATES, bool KDA, bool OUT>
__device__ __forceinline__ void walk_block(const Maps& maps, const FwdWalkParams& p) {
  static_assert(!OUT || (STATES && !KDA), "the output is formed by GDN's states walk");
  using Sm = Smem<K, OUT>;
  constexpr int NVT = K / kTileV, NTILES = STATES ? NVT : 2 * NVT;
  const Blk b = block_of<NVT, NTILES>(p);
  if constexpr (!STATES)
    if (skip_unread_tile<K>(p, b)) return;  // uniform over the block, before any barrier
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sb = nullptr;
  const uint32_t base = setup_ring(smem_raw, Sm::Bar, sb, OUT ? kOutConsumers : kConsumers, OUT ? Sm::XBar : 0);
  if (threadIdx.x >= (OUT ? kOutConsumers : kConsumers)) {
    produce<K, KDA, OUT>(maps, p, b, base, sb);
  } else if constexpr (OUT) {
    if (threadIdx.x < kConsumers)
      consume_out_rec<DT, K>(maps, p, b, base, sb);
    else
      consume_out_o<DT, K>(maps, p, b, base, sb);
  } else if constexpr (STATES) {
    consume_rs<DT, K, true, KDA>(maps, p, b, base, sb);
  } else {
    if (b.mtile)
      consume_m<DT, K, KDA>(p, b, base, sb);
    else
      consume_rs<DT, K, false, KDA>(maps, p, b, base, sb);
  }
}

// The kernel is compiled for sm_90a only (wgmma); elsewhere (the compute_90 PTX) it traps, and
// the launcher never starts it there.
template <class DT, int K, bool STATES, bool KDA, bool OUT>
__global__ void __launch_bounds__(OUT ? kOutThreads : kWgThreads, 1)
    fwd_walk_wgmma_kernel(const __grid_constant__ Maps maps, const __grid_constant__ FwdWalkParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  walk_block<DT, K, STATES, KDA, OUT>(maps, p);
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
