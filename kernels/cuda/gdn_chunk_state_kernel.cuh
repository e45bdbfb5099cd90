// State walks of GDN and KDA over the chunks of a segment (docs/algorithm.md F4, 4.2, B3, 4.3): the
// CPU twin's chunk_state.cpp fwd_walk / bwd_walk ([S1]-[S5], [B1]-[B3]), one template per direction
// with KDA = true for KDA's per-channel decay. Included only by gdn_chunk_state.cu and
// kda_chunk_state.cu (and gdn_walk_wgmma.cu, for the parameters and helpers). On an sm_90 device
// with an sm_90a build the forward and backward walks (GDN, KDA) run the wgmma + TMA kernels of
// gdn_walk_wgmma.cuh instead where they apply (dispatch_fwd_walk, dispatch_bwd_walk).
//
// The gates (docs/algorithm.md 7.1, 7.5): GDN has one log2 decay per token (gcum [T, HV]), KDA one
// per token and key channel (gcum [T, HV, K]), and KDA's gated keys kg = dtype(k exp2(gL - g_r))
// come from prep. So every product below is a plain matrix product with dtype operands (exact in
// the 16-bit mma operands, fp32 accumulation); the decay Gam = exp2(gL) multiplies the carried
// state: one scalar (GDN) or one factor per row a = key channel (KDA).
//
// fwd_walk_kernel<DT, K, V, STATES, KDA>: grid S * HV * tiles, block b -> (segment s, value head j,
//   tile) = (b / (tiles HV), (b / tiles) % HV, b % tiles), 256 threads. A tile is kBV = 32
//   columns: tiles [0, V/32) are state tiles S[:, c0 : c0 + 32] (K x 32, fp32 in the mma
//   accumulators); in summary mode (STATES = false) tiles [V/32, V/32 + K/32) are transfer tiles
//   M[:, c0 : c0 + 32] (columns of M are independent). Per chunk, first to last:
//     state tile:  Sb = dtype(S) (-> h[n] in STATES mode); vr = U - W Sb; v_new = dtype(vr);
//                  S <- Gam S + Kt^T op                                   ([S1]-[S3] of the twin)
//                  GDN: Kt = k, op = dtype(vr * exp2(gL - g_r)); KDA: Kt = kg, op = dtype(vr).
//     M tile:      M <- Gam M - Kt^T (W M), GDN Kt = dtype(k * exp2(gL - g_r)), KDA Kt = kg: the
//                  twin's M_c M = (Gam - Kt^T W) M reassociated; W M and Kt^T (W M) use split fp32
//                  operands (hi + lo, both dtype), so the chain stays ~fp32 ([S4]). fp16 splits a
//                  scaled tile (SplitScale below): M 2^e1 and R 2^e2 = (W M) 2^(e1 + e2), each with
//                  its largest magnitude in [2^14, 2^15), and the update runs on the tile scaled the
//                  same way and is scaled back; powers of two, so exact. Unscaled, an fp16 hi + lo
//                  pair keeps 22 bits only for values above ~2^-3 and nothing below 2^-25 (fp16's
//                  smallest normal is 2^-14, its subnormal step 2^-24), and a decaying chain
//                  (M ~ 1e-9 after a few chunks) lost its - Kt^T (W M) part. The tile is M itself
//                  again after every chunk, so M underflows in fp32 where the twin's does.
//   Summary mode writes seg_h_ext (from S = 0) and seg_Mt = M^T (from M = I); a block whose part
//   nobody reads (kernels/api/summary_needs.h) writes zeros for its tile and returns before the
//   walk. STATES mode starts from seg_entry and writes h, v_new and ht (the piece's last segment).
//   Shared memory (16-bit tiles): W, Kt 64 x (K+8); U 64 x 40; X0, X1 K x 40; Y0, Y1 64 x 40;
//   gates (fp32, 64 GDN / K KDA); the warps' largest magnitudes of the M and R tiles (2 x 8
//   floats, fp16 M tiles). Kt (GDN k, KDA kg: both 16-bit storage) comes through registers.
// bwd_walk_kernel<DT, K, V, STATES, KDA>: grid S * HV * V/32, same mapping, chunks last to first:
//     dSb = dtype(dS) (-> dh[n]); dv2 = dtype((Kt dSb) f_r + dv_local);
//     dS <- Gam dS + qs^T dO - W^T dv2, qs = dtype((q scale) exp2(g_r))   ([B1]-[B3])
//     GDN: Kt = k, f_r = exp2(gL - g_r), g_r per token; KDA: Kt = kg, f_r = 1, g_r per channel.
//   Summary mode starts from 0 and writes seg_dh_ext (zeros, without the walk, where nobody reads
//   it); STATES mode starts from seg_exit and writes dh, dv2 and dh0 (first segment of each piece).
//   Shared memory (16-bit): Kt, qs, W 64 x (K+8); dO, dv_local 64 x 40; X0 K x 40; Y0 64 x 40;
//   gates (fp32). KDA's kg and W go by cp.async straight into their tiles (the registers GDN
//   gives them hold qs's per-element gates).
// Rows beyond a partial chunk are zero in every staged tile and masked in every epilogue.
// Tiles of 32 columns keep both kernels at <= 128 registers and <= 113 KB of shared memory, so
// two blocks share an SM: a walk is a chain of dependent steps (loads, barriers, two
// products per chunk), and a second block hides one block's waits. An element's sums do not
// depend on the tile width, so neither do the bits.
#pragma once

#include <type_traits>

#include "kernels/api/summary_needs.h"
#include "kernels/api/tiles.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/gdn_walk_wgmma.h"

namespace kcp::kernels::cuda {

inline constexpr int kBV = kStateWalkTileV;  // tile width of the state walks (kernels/api/tiles.h)

struct FwdWalkParams {
  Shape sh;
  const ChunkDesc* chunks;
  const SegmentDesc* segments;
  const PieceDesc* pieces;
  const uint16_t* k;       // [T, H, K] dtype, 16-bit storage (GDN)
  const uint16_t* kg;      // [T, HV, K] dtype, 16-bit storage (KDA)
  const float* gcum;       // [T, HV] (GDN) or [T, HV, K] (KDA) fp32 log2
  const uint16_t* W;       // [T, HV, K] dtype, 16-bit storage
  const uint16_t* U;       // [T, HV, V] dtype, 16-bit storage
  const float* seg_entry;  // [S, HV, K, V] fp32 (STATES)
  uint16_t* h;             // [NT, HV, K, V] dtype, 16-bit storage (STATES)
  uint16_t* v_new;         // [T, HV, V] dtype, 16-bit storage (STATES)
  float* ht;               // [N, HV, K, V] fp32 or null (STATES)
  const uint16_t* q;       // [T, H, K] dtype, 16-bit storage (the output in the walk: GDN STATES)
  uint16_t* o;             // [T, HV, V] dtype, 16-bit caller storage, or null: no output in the walk
  float* seg_h_ext;        // [S, HV, K, V] fp32 (summaries)
  float* seg_Mt;           // [S, HV, K, K] fp32 (summaries)
  bool has_h0, has_dht;    // Problem's flags (summaries: which parts are read)
};

// Zeros for the rows x cols tile at o (row stride ld) by the whole block: the summary tile of a
// block whose part nobody reads.
__device__ __forceinline__ void zero_tile(float* o, int64_t ld, int rows, int cols) {
  for (int e = int(threadIdx.x); e < rows * cols; e += int(blockDim.x)) o[int64_t(e / cols) * ld + e % cols] = 0.0f;
}

// The gates a walk keeps per chunk in shared memory (sG) and their register prefetch: GDN the
// chunk's gcum rows (one per token, kC floats), KDA Gam = exp2(gL) per key channel (K floats).
template <int K, bool KDA>
struct WalkGates {
  static constexpr int kN = KDA ? K : kC;
  // This thread's gate of chunk c (threads [0, kN) hold one each).
  static __device__ __forceinline__ float load(const float* gcum, int HV, int j, const ChunkDesc& c) {
    const int t = int(threadIdx.x);
    if constexpr (KDA)
      return t < K ? gcum[((c.begin + c.len - 1) * HV + j) * K + t] : 0.0f;
    else
      return t < c.len ? gcum[(c.begin + t) * HV + j] : 0.0f;
  }
  static __device__ __forceinline__ void store(float* sG, float g) {
    if (int(threadIdx.x) < kN) sG[threadIdx.x] = KDA ? exp2f(g) : g;
  }
  // gL of a chunk of L rows (GDN; KDA keeps Gam per channel instead).
  static __device__ __forceinline__ float last(const float* sG, int L) { return KDA ? 0.0f : sG[L - 1]; }
  // Gam of row (key channel) a; Gam0 = exp2(gL) (GDN).
  static __device__ __forceinline__ float gam(const float* sG, float Gam0, int a) { return KDA ? sG[a] : Gam0; }
  // The factor exp2(gL - g_r) of chunk row r (GDN); 1 for KDA, whose keys come gated.
  static __device__ __forceinline__ float row_factor(const float* sG, float gL, int r) {
    if constexpr (KDA)
      return 1.0f;
    else
      return exp2f(gL - sG[r]);
  }
};

// The rows of the walk's key operand Kt of chunk c (16-bit storage, row stride returned in ld):
// GDN k of the chunk's q/k head, KDA kg of its value head.
template <int K, bool KDA, class P>
__device__ __forceinline__ const uint16_t* key_rows(const P& p, int j, const ChunkDesc& c, int64_t& ld) {
  ld = int64_t(KDA ? p.sh.HV : p.sh.H) * K;
  return KDA ? p.kg + (c.begin * p.sh.HV + j) * K : p.k + (c.begin * p.sh.H + j / p.sh.G) * K;
}

template <int K, bool KDA>
struct WalkSmem {
  static constexpr int kKld = K + 8, kTld = kBV + 8;
  static constexpr size_t kRed = 2 * kWarps * 4;  // the warps' largest |M| and |R| (fp16 M tiles)
  static constexpr size_t bytes =
      (2 * size_t(kC) * kKld + size_t(kC) * kTld + 2 * size_t(K) * kTld + 2 * size_t(kC) * kTld) * 2 +
      WalkGates<K, KDA>::kN * 4 + kRed;
};

// [S4] The scaling of the split operands (fp16 only). A split x = hi + lo with both parts dtype
// keeps about 2 x 11 bits in fp16 only while lo is normal (|x| >~ 2^-3) and nothing of |x| <
// 2^-25 (fp16's smallest normal is 2^-14, its subnormal step 2^-24); bf16 has fp32's exponent
// range, so its split (2 x 8 bits) needs no scaling and is not scaled. The tile is scaled by
// 2^e, the power of two that puts its largest magnitude m into [2^14, 2^15) (hi stays below
// fp16's 65504); exact, as no product leaves fp32's normal range (caps below). m = 0, inf or NaN:
// no scaling (e = 0), so NaN and inf still propagate.
template <class DT>
inline constexpr bool kScaledSplit = std::is_same_v<DT, Fp16>;
struct SplitScale {
  // e with m 2^e in [2^14, 2^15), clamped to [-126, cap] (cap <= 126); fp32 subnormal m
  // (exponent field 0) counts as 2^-127 and takes the cap.
  static __device__ __forceinline__ int exponent(float m, int cap) {
    if (!(m > 0.0f) || !(m <= 3.402823466e38f)) return 0;
    const int x = int((__float_as_uint(m) >> 23) & 0xffu) - 127;
    return min(max(14 - x, -126), cap);
  }
  // 2^e as a float, e in [-126, 127].
  static __device__ __forceinline__ float pow2(int e) { return __uint_as_float(uint32_t(e + 127) << 23); }
  // The largest |x| over the warp (every lane gets it).
  static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
  }
  // Lane 0 of each warp writes the warp's largest of m (each lane's largest |x|) to red[warp].
  static __device__ __forceinline__ void publish(float m, float* red) {
    m = warp_max(m);
    if (lane_id() == 0) red[warp_id()] = m;
  }
  // This thread's largest |x| of a Tiling T accumulator.
  template <class T, class Acc>
  static __device__ __forceinline__ float tile_max(Acc& acc) {
    float m = 0.0f;
    T::each(acc, [&](int, int, float& v) { m = fmaxf(m, fabsf(v)); });
    return m;
  }
  // The block's largest |x| from red (after a barrier behind every warp's publish).
  static __device__ __forceinline__ float gather(const float* red, int warps) {
    float m = 0.0f;
    for (int w = 0; w < warps; ++w) m = fmaxf(m, red[w]);
    return m;
  }
};
// Caps: M's exponent e1 <= 126 (2^-e1 must be a float); R's e2 <= 100: the update runs on
// Gam M 2^(e1 + e2) with |M 2^e1| < 2^15 and adds at most 64 x 2^16 x 2^15 (Kt^T R''), so it stays
// below 2^115 + 2^37. e2 reaches the cap only where |R| < 2^-86 |M| (R then carries nothing).
inline constexpr int kSplitCapM = 126, kSplitCapR = 100;

// [S1] Sb = dtype(S) into X0 (the operand of W Sb) and h[n] (STATES); [S4] M = hi + lo into X0, X1,
// M scaled by sc (a power of two; 1 for bf16).
template <class DT, int K, int V, bool STATES, class TS, class Acc>
__device__ __forceinline__ void walk_split_state(Acc& acc, bool mtile, uint16_t* sX0, uint16_t* sX1, int ld,
                                                 uint16_t* h, int c0, float sc) {
  if (!mtile) {
    TS::pairs(acc, [&](int a, int c, float& v0, float& v1) {
      const uint32_t b = DT::pack(v0, v1);
      *reinterpret_cast<uint32_t*>(sX0 + a * ld + c) = b;
      if constexpr (STATES) *reinterpret_cast<uint32_t*>(h + int64_t(a) * V + c0 + c) = b;
    });
  } else {
    TS::pairs(acc, [&](int a, int c, float& v0, float& v1) {
      const float x0 = v0 * sc, x1 = v1 * sc;
      const float h0 = DT::rnd(x0), h1 = DT::rnd(x1);
      *reinterpret_cast<uint32_t*>(sX0 + a * ld + c) = DT::pack(h0, h1);
      *reinterpret_cast<uint32_t*>(sX1 + a * ld + c) = DT::pack(x0 - h0, x1 - h1);
    });
  }
}

// Both modes run two blocks per SM (32-wide tiles, 16-bit operands: <= 128 registers with the
// next chunk's tiles prefetched into registers), so one block's loads and barriers overlap the
// other's products.
template <class DT, int K, int V, bool STATES, bool KDA>
__global__ void __launch_bounds__(kThreads, kStateWalkBlocksPerSm) fwd_walk_kernel(FwdWalkParams p) {
  using Sm = WalkSmem<K, KDA>;
  using Gt = WalkGates<K, KDA>;
  using TS = Tiling<K, kBV>;   // the K x 32 state / transfer tile
  using TC = Tiling<kC, kBV>;  // 64 x 32 chunk products
  constexpr int NVT = V / kBV;
  constexpr int NTILES = STATES ? NVT : NVT + K / kBV;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* sW = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* sk = sW + kC * Sm::kKld;
  uint16_t* sU = sk + kC * Sm::kKld;
  uint16_t* sX0 = sU + kC * Sm::kTld;
  uint16_t* sX1 = sX0 + K * Sm::kTld;
  uint16_t* sY0 = sX1 + K * Sm::kTld;
  uint16_t* sY1 = sY0 + kC * Sm::kTld;
  float* sG = reinterpret_cast<float*>(sY1 + kC * Sm::kTld);
  float* sRedM = sG + Gt::kN;     // the warps' largest |M| (fp16 M tiles)
  float* sRedR = sRedM + kWarps;  // the warps' largest |R|
  constexpr bool SCALED = kScaledSplit<DT>;

  const int HV = p.sh.HV;
  const int tile = blockIdx.x % NTILES;
  const int j = (blockIdx.x / NTILES) % HV;
  const int s = blockIdx.x / (NTILES * HV);
  const bool mtile = tile >= NVT;
  const int c0 = (mtile ? tile - NVT : tile) * kBV;
  const SegmentDesc seg = p.segments[s];
  const int64_t KV = int64_t(K) * V;
  if constexpr (!STATES) {
    const SummaryNeeds need = summary_needs(p.pieces, p.sh.N, seg, p.has_h0, p.has_dht);
    if (mtile ? !need.M : !need.h_ext) {  // uniform over the block: before any barrier
      if (mtile)
        zero_tile(p.seg_Mt + (int64_t(s) * HV + j) * int64_t(K) * K + int64_t(c0) * K, K, kBV, K);
      else
        zero_tile(p.seg_h_ext + (int64_t(s) * HV + j) * KV + c0, V, K, kBV);
      return;
    }
  }

  float acc[TS::MT][TS::NT][4];
  if constexpr (STATES) {
    const float* e = p.seg_entry + (int64_t(s) * HV + j) * KV;
    TS::each(acc, [&](int a, int c, float& v) { v = e[int64_t(a) * V + c0 + c]; });
  } else {
    TS::each(acc, [&](int a, int c, float& v) { v = (mtile && a == c0 + c) ? 1.0f : 0.0f; });
  }
  // fp16 M tile: the largest |M| of each chunk's start is published at the end of the previous
  // chunk (here for the first) and read behind the loop's barriers.
  if (SCALED && mtile) SplitScale::publish(SplitScale::tile_max<TS>(acc), sRedM);

  // Prefetch: the next chunk's tiles are loaded while this chunk computes.
  Tile16<kC, K> tW, tK;
  Tile16<kC, kBV> tU;
  float gpre = 0.0f;
  auto issue = [&](int64_t n) {
    const ChunkDesc c = p.chunks[n];
    tW.load(p.W + (c.begin * HV + j) * K, int64_t(HV) * K, c.len);
    int64_t kld = 0;
    const uint16_t* kr = key_rows<K, KDA>(p, j, c, kld);
    tK.load(kr, kld, c.len);
    if (!mtile) tU.load(p.U + (c.begin * HV + j) * V + c0, int64_t(HV) * V, c.len);
    gpre = Gt::load(p.gcum, HV, j, c);
  };
  if (seg.chunk_end > seg.chunk_begin) issue(seg.chunk_begin);
  for (int64_t n = seg.chunk_begin; n < seg.chunk_end; ++n) {
    const ChunkDesc ch = p.chunks[n];
    const int L = ch.len;
    const int64_t t0 = ch.begin;
    __syncthreads();  // the previous chunk is done with every tile
    tW.template store<DT>(sW, Sm::kKld);
    tK.template store<DT>(sk, Sm::kKld);
    if (!mtile) tU.template store<DT>(sU, Sm::kTld);
    Gt::store(sG, gpre);
    __syncthreads();
    if (n + 1 < seg.chunk_end) issue(n + 1);
    const float gL = Gt::last(sG, L);
    const float Gam0 = KDA ? 0.0f : exp2f(gL);
    if (!KDA && mtile)  // GDN Kt = dtype(k * exp2(gL - g_r)) in place (read before the next barrier's users)
      map_rows<DT, K>(sk, Sm::kKld, L, [&](int r, float x) { return x * Gt::row_factor(sG, gL, r); });
    const int kend = (L + 15) & ~15;
    // (1) [S1] Sb = dtype(S) (-> h[n]); [S4] M 2^e1 = hi + lo (fp16; bf16: e1 = 0).
    uint16_t* h = STATES ? p.h + (n * HV + j) * KV : nullptr;
    const int e1 = SCALED && mtile ? SplitScale::exponent(SplitScale::gather(sRedM, kWarps), kSplitCapM) : 0;
    walk_split_state<DT, K, V, STATES, TS>(acc, mtile, sX0, sX1, Sm::kTld, h, c0, SplitScale::pow2(e1));
    __syncthreads();
    float acc2[TC::MT][TC::NT][4];
    TC::zero(acc2);
    TC::template mma<DT>(acc2, AView<uint16_t, true>{sW, Sm::kKld}, BView<uint16_t, false>{sX0, Sm::kTld}, 0, K);
    int e2 = 0;
    if (!mtile) {
      // (2) [S2] vr = U - W Sb; v_new; [S3] the update operand dtype(vr f_r).
      TC::pairs(acc2, [&](int r, int c, float& v0, float& v1) {
        float o0 = 0.0f, o1 = 0.0f;
        if (r < L) {
          const uint32_t u = *reinterpret_cast<const uint32_t*>(sU + r * Sm::kTld + c);
          const float x0 = DT::from_raw(uint16_t(u & 0xffffu)) - v0;
          const float x1 = DT::from_raw(uint16_t(u >> 16)) - v1;
          if constexpr (STATES) st16x2<DT>(p.v_new + ((t0 + r) * HV + j) * V + c0 + c, x0, x1);
          const float f = Gt::row_factor(sG, gL, r);
          o0 = x0 * f;  // rounded by the pack below
          o1 = x1 * f;
        }
        *reinterpret_cast<uint32_t*>(sY0 + r * Sm::kTld + c) = DT::pack(o0, o1);
      });
    } else {
      // (2') [S4] R 2^e1 = W (M 2^e1) (two products); R 2^(e1 + e2) stored negated and split
      // (fp16: e2 from the block's largest |R 2^e1|, one more barrier; bf16: e2 = 0).
      TC::template mma<DT>(acc2, AView<uint16_t, true>{sW, Sm::kKld}, BView<uint16_t, false>{sX1, Sm::kTld}, 0, K);
      if constexpr (SCALED) {
        SplitScale::publish(SplitScale::tile_max<TC>(acc2), sRedR);
        __syncthreads();
        e2 = SplitScale::exponent(SplitScale::gather(sRedR, kWarps), kSplitCapR);
      }
      const float sc = SplitScale::pow2(e2);
      TC::pairs(acc2, [&](int r, int c, float& v0, float& v1) {
        const float x0 = v0 * sc, x1 = v1 * sc;
        const float h0 = DT::rnd(x0), h1 = DT::rnd(x1);
        *reinterpret_cast<uint32_t*>(sY0 + r * Sm::kTld + c) = DT::pack(-h0, -h1);
        *reinterpret_cast<uint32_t*>(sY1 + r * Sm::kTld + c) = DT::pack(h0 - x0, h1 - x1);
      });
    }
    __syncthreads();
    // (3) [S3] S <- Gam S + Kt^T op; [S4] M <- Gam M - Kt^T R, on the tile scaled by 2^(e1 + e2)
    // and scaled back (fp16; exact: powers of two).
    if (SCALED && mtile) {
      const float s1 = SplitScale::pow2(e1), s2 = SplitScale::pow2(e2);
      TS::each(acc, [&](int a, int, float& v) { v = ((v * Gt::gam(sG, Gam0, a)) * s1) * s2; });
    } else {
      TS::each(acc, [&](int a, int, float& v) { v *= Gt::gam(sG, Gam0, a); });
    }
    TS::template mma<DT>(acc, AView<uint16_t, false>{sk, Sm::kKld}, BView<uint16_t, false>{sY0, Sm::kTld}, 0, kend);
    if (mtile)
      TS::template mma<DT>(acc, AView<uint16_t, false>{sk, Sm::kKld}, BView<uint16_t, false>{sY1, Sm::kTld}, 0, kend);
    if (SCALED && mtile) {
      const float u2 = SplitScale::pow2(-e2), u1 = SplitScale::pow2(-e1);
      TS::each(acc, [&](int, int, float& v) { v = (v * u2) * u1; });
      SplitScale::publish(SplitScale::tile_max<TS>(acc), sRedM);  // read behind the next chunk's barriers
    }
  }

  if constexpr (STATES) {
    const PieceDesc pc = p.pieces[seg.piece];
    if (p.ht && s + 1 == pc.seg_end) {  // [S5]
      float* o = p.ht + (int64_t(seg.piece) * HV + j) * KV;
      TS::pairs(acc, [&](int a, int c, float& v0, float& v1) {
        *reinterpret_cast<float2*>(o + int64_t(a) * V + c0 + c) = make_float2(v0, v1);
      });
    }
  } else if (!mtile) {
    float* o = p.seg_h_ext + (int64_t(s) * HV + j) * KV;
    TS::pairs(acc, [&](int a, int c, float& v0, float& v1) {
      *reinterpret_cast<float2*>(o + int64_t(a) * V + c0 + c) = make_float2(v0, v1);
    });
  } else {
    float* o = p.seg_Mt + (int64_t(s) * HV + j) * int64_t(K) * K;  // M^T: o[b * K + a] = M[a][b]
    TS::each(acc, [&](int a, int c, float& v) { o[int64_t(c0 + c) * K + a] = v; });
  }
}

struct BwdWalkParams {
  Shape sh;
  const ChunkDesc* chunks;
  const SegmentDesc* segments;
  const uint16_t* q;         // [T, H, K] dtype, 16-bit storage
  const uint16_t* k;         // [T, H, K] dtype, 16-bit storage (GDN)
  const uint16_t* kg;        // [T, HV, K] dtype, 16-bit storage (KDA)
  const float* gcum;         // [T, HV] (GDN) or [T, HV, K] (KDA) fp32 log2
  const uint16_t* W;         // [T, HV, K] dtype, 16-bit storage
  const uint16_t* dO;        // [T, HV, V] dtype, 16-bit (caller storage)
  const uint16_t* dv_local;  // [T, HV, V] dtype, 16-bit storage
  const float* seg_exit;     // [S, HV, K, V] fp32 (STATES)
  uint16_t* dh;              // [NT, HV, K, V] dtype, 16-bit storage (STATES)
  uint16_t* dv2;             // [T, HV, V] dtype, 16-bit storage (STATES)
  float* dh0;                // [N, HV, K, V] fp32 or null (STATES)
  float* seg_dh_ext;         // [S, HV, K, V] fp32 (summaries)
  const PieceDesc* pieces;   // (summaries: which parts are read)
  bool has_h0, has_dht;
  uint16_t* qs;  // [T, HV, K] dtype, 16-bit scratch (KDA, the wgmma walk: written by kda_qs_kernel before it)
};

template <int K, bool KDA>
struct BwdWalkSmem {
  static constexpr int kKld = K + 8, kTld = kBV + 8;
  static constexpr size_t bytes =
      (3 * size_t(kC) * kKld + 2 * size_t(kC) * kTld + size_t(K) * kTld + size_t(kC) * kTld) * 2 +
      WalkGates<K, KDA>::kN * 4;
};

// [B3] operand qs = dtype((q scale) exp2(g_r)) of a chunk, formed while q is stored to shared
// memory (no extra pass or barrier): q through registers with the gates of the rows (GDN) or of
// the elements (KDA) this thread stages.
template <class DT, int K, bool KDA>
struct QsTile {
  Tile16<kC, K> tq;
  float gq[Tile16<kC, K>::ITERS];  // GDN
  GateTile16<kC, K> tg;            // KDA
  template <class P>
  __device__ __forceinline__ void issue_q(const P& p, int j, const ChunkDesc& c) {
    tq.load(p.q + (c.begin * p.sh.H + j / p.sh.G) * K, int64_t(p.sh.H) * K, c.len);
  }
  template <class P>
  __device__ __forceinline__ void issue_gates(const P& p, int j, const ChunkDesc& c) {
    const int HV = p.sh.HV;
    if constexpr (KDA) {
      tg.load(p.gcum + (c.begin * HV + j) * K, int64_t(HV) * K, c.len);
    } else {
#pragma unroll
      for (int it = 0; it < Tile16<kC, K>::ITERS; ++it) {
        const int r = Tile16<kC, K>::row_of(it);
        gq[it] = r < c.len ? p.gcum[(c.begin + r) * HV + j] : 0.0f;
      }
    }
  }
  __device__ __forceinline__ void store(uint16_t* dst, int ld, float scale) const {
    if constexpr (KDA) {
      tq.template store_by_elem<DT>(dst, ld,
                                    [&](int it, int, int u, float x) { return (x * scale) * exp2f(tg.at(it, u)); });
    } else {
      float eq[Tile16<kC, K>::ITERS];
#pragma unroll
      for (int it = 0; it < Tile16<kC, K>::ITERS; ++it) eq[it] = exp2f(gq[it]);
      tq.template store_by_iter<DT>(dst, ld, [&](int it, int, float x) { return (x * scale) * eq[it]; });
    }
  }
};

template <class DT, int K, int V, bool STATES, bool KDA>
__global__ void __launch_bounds__(kThreads, kStateWalkBlocksPerSm) bwd_walk_kernel(BwdWalkParams p) {
  using Sm = BwdWalkSmem<K, KDA>;
  using Gt = WalkGates<K, KDA>;
  using TS = Tiling<K, kBV>;
  using TC = Tiling<kC, kBV>;
  constexpr int NTILES = V / kBV;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* sk = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* sQs = sk + kC * Sm::kKld;
  uint16_t* sW = sQs + kC * Sm::kKld;
  uint16_t* sdO = sW + kC * Sm::kKld;
  uint16_t* sdl = sdO + kC * Sm::kTld;
  uint16_t* sX0 = sdl + kC * Sm::kTld;
  uint16_t* sY0 = sX0 + K * Sm::kTld;
  float* sG = reinterpret_cast<float*>(sY0 + kC * Sm::kTld);

  const int HV = p.sh.HV;
  const int tile = blockIdx.x % NTILES;
  const int j = (blockIdx.x / NTILES) % HV;
  const int s = blockIdx.x / (NTILES * HV);
  const int c0 = tile * kBV;
  const SegmentDesc seg = p.segments[s];
  const int64_t KV = int64_t(K) * V;
  const float scale = p.sh.scale;
  if constexpr (!STATES) {
    if (!summary_needs(p.pieces, p.sh.N, seg, p.has_h0, p.has_dht).dh_ext) {  // uniform: before any barrier
      zero_tile(p.seg_dh_ext + (int64_t(s) * HV + j) * KV + c0, V, K, kBV);
      return;
    }
  }

  float acc[TS::MT][TS::NT][4];
  if constexpr (STATES) {
    const float* e = p.seg_exit + (int64_t(s) * HV + j) * KV;
    TS::each(acc, [&](int a, int c, float& v) { v = e[int64_t(a) * V + c0 + c]; });
  } else {
    TS::zero(acc);
  }

  // Prefetch: the previous chunk's tiles are loaded while this chunk computes.
  QsTile<DT, K, KDA> tQ;
  Tile16<kC, K> tK, tW;  // GDN
  Tile16<kC, kBV> tO, tD;
  float gpre = 0.0f;
  auto issue = [&](int64_t n) {
    const ChunkDesc c = p.chunks[n];
    if constexpr (!KDA) {
      int64_t kld = 0;
      const uint16_t* kr = key_rows<K, KDA>(p, j, c, kld);
      tK.load(kr, kld, c.len);
      tW.load(p.W + (c.begin * HV + j) * K, int64_t(HV) * K, c.len);
    }
    tQ.issue_q(p, j, c);
    if constexpr (!KDA) tQ.issue_gates(p, j, c);
    tO.load(p.dO + (c.begin * HV + j) * V + c0, int64_t(HV) * V, c.len);
    tD.load(p.dv_local + (c.begin * HV + j) * V + c0, int64_t(HV) * V, c.len);
    gpre = Gt::load(p.gcum, HV, j, c);
  };
  // KDA: the per-element gates of qs (a K-wide fp32 tile) take the registers GDN gives k and W,
  // so kg and W go by cp.async straight into their tiles once the chunk's last product is done
  // with them, and the gates are loaded then too (fewer registers live across the products).
  // Their latency is not hidden by this block's compute, only by the SM's other block.
  auto issue_late = [&](int64_t n) {
    if constexpr (KDA) {
      const ChunkDesc c = p.chunks[n];
      int64_t kld = 0;
      const uint16_t* kr = key_rows<K, KDA>(p, j, c, kld);
      cp_async_rows<uint16_t, kC, K>(sk, Sm::kKld, kr, kld, c.len);
      cp_async_rows<uint16_t, kC, K>(sW, Sm::kKld, p.W + (c.begin * HV + j) * K, int64_t(HV) * K, c.len);
      cp_async_commit();
      tQ.issue_gates(p, j, c);
    }
  };
  if (seg.chunk_end > seg.chunk_begin) {
    issue(seg.chunk_end - 1);
    issue_late(seg.chunk_end - 1);
  }
  for (int64_t n = seg.chunk_end - 1; n >= seg.chunk_begin; --n) {
    const ChunkDesc ch = p.chunks[n];
    const int L = ch.len;
    const int64_t t0 = ch.begin;
    if constexpr (KDA) cp_async_wait_all();
    __syncthreads();  // the previous chunk is done with every tile; KDA: kg and W are staged
    if constexpr (!KDA) {
      tK.template store<DT>(sk, Sm::kKld);
      tW.template store<DT>(sW, Sm::kKld);
    }
    tQ.store(sQs, Sm::kKld, scale);
    tO.template store<DT>(sdO, Sm::kTld);
    tD.template store<DT>(sdl, Sm::kTld);
    Gt::store(sG, gpre);
    // (1) [B1] dSb = dtype(dS): operand of Kt dSb, and dh[n] (behind the tiles' barrier).
    TS::pairs(acc, [&](int a, int c, float& v0, float& v1) {
      const uint32_t b = DT::pack(v0, v1);
      *reinterpret_cast<uint32_t*>(sX0 + a * Sm::kTld + c) = b;
      if constexpr (STATES) *reinterpret_cast<uint32_t*>(p.dh + (n * HV + j) * KV + int64_t(a) * V + c0 + c) = b;
    });
    __syncthreads();
    if (n > seg.chunk_begin) issue(n - 1);
    const float gL = Gt::last(sG, L);
    const float Gam0 = KDA ? 0.0f : exp2f(gL);
    const int kend = (L + 15) & ~15;
    // (2) [B2] dv2 = dtype((Kt dSb) f_r + dv_local); kept negated for the update.
    float acc2[TC::MT][TC::NT][4];
    TC::zero(acc2);
    TC::template mma<DT>(acc2, AView<uint16_t, true>{sk, Sm::kKld}, BView<uint16_t, false>{sX0, Sm::kTld}, 0, K);
    TC::pairs(acc2, [&](int r, int c, float& v0, float& v1) {
      uint32_t u = 0u;
      if (r < L) {
        const float f = Gt::row_factor(sG, gL, r);
        const uint32_t d = *reinterpret_cast<const uint32_t*>(sdl + r * Sm::kTld + c);
        u = DT::pack(v0 * f + DT::from_raw(uint16_t(d & 0xffffu)), v1 * f + DT::from_raw(uint16_t(d >> 16)));
        if constexpr (STATES) *reinterpret_cast<uint32_t*>(p.dv2 + ((t0 + r) * HV + j) * V + c0 + c) = u;
      }
      // -dv2 by its sign bits (rows beyond the chunk: -0, as pack(-0, -0) gave).
      *reinterpret_cast<uint32_t*>(sY0 + r * Sm::kTld + c) = u ^ 0x80008000u;
    });
    // (3) [B3] dS <- Gam dS + qs^T dO - W^T dv2, in this order; the first two terms need no dv2,
    // so they run before the barrier that waits for every warp's part of it.
    TS::each(acc, [&](int a, int, float& v) { v *= Gt::gam(sG, Gam0, a); });
    TS::template mma<DT>(acc, AView<uint16_t, false>{sQs, Sm::kKld}, BView<uint16_t, false>{sdO, Sm::kTld}, 0, kend);
    __syncthreads();
    TS::template mma<DT>(acc, AView<uint16_t, false>{sW, Sm::kKld}, BView<uint16_t, false>{sY0, Sm::kTld}, 0, kend);
    if (KDA && n > seg.chunk_begin) {  // uniform
      __syncthreads();                 // every warp is done with W
      issue_late(n - 1);
    }
  }

  float* o = nullptr;
  if constexpr (STATES) {
    if (p.dh0 && seg.index_in_piece == 0) o = p.dh0 + (int64_t(seg.piece) * HV + j) * KV;
  } else {
    o = p.seg_dh_ext + (int64_t(s) * HV + j) * KV;
  }
  if (o)
    TS::pairs(acc, [&](int a, int c, float& v0, float& v1) {
      *reinterpret_cast<float2*>(o + int64_t(a) * V + c0 + c) = make_float2(v0, v1);
    });
}

// ---- launch helpers (host), shared by the GDN and KDA walks ----
// Blocks per (segment, value head) of a forward walk (V / kBV state tiles, plus the K / kBV
// transfer tiles of the summaries: M is K x K) and of a backward walk (V / kBV state tiles).
template <int K, int V, bool STATES>
constexpr int fwd_walk_tiles() {
  return V / kBV + (STATES ? 0 : K / kBV);
}
template <int V>
constexpr int bwd_walk_tiles() {
  return V / kBV;
}
// One walk kernel over S * HV * tiles blocks.
template <class Kernel, class Params>
void launch_walk(Kernel kernel, size_t smem, int tiles, const Params& p, cudaStream_t st) {
  if (p.sh.S == 0) return;
  allow_smem(kernel, smem);
  kernel<<<unsigned(int64_t(p.sh.S) * p.sh.HV * tiles), kThreads, smem, st>>>(p);
  KCP_CUDA_LAUNCH_CHECK(st);
}
// The forward walk for the problem's dtype and dims (KDA: the op's gates): the wgmma walk where it
// applies (gdn_walk_wgmma.h), else the mma.sync walk. The same for the backward walk.
template <bool KDA, bool STATES>
void dispatch_fwd_walk(const Problem& pb, const FwdWalkParams& p, cudaStream_t st) {
  if (launch_fwd_walk_wgmma(pb, p, STATES, st)) return;  // the Hopper walk where it applies
  dispatch_dtype_dims<Bf16, Fp16>(pb, [&](auto dt, auto k, auto v) {
    using DT = typename decltype(dt)::type;
    constexpr int K = decltype(k)::value, V = decltype(v)::value;
    launch_walk(fwd_walk_kernel<DT, K, V, STATES, KDA>, WalkSmem<K, KDA>::bytes, fwd_walk_tiles<K, V, STATES>(), p, st);
  });
}
// qs_rows: KDA's wgmma walk, the tokens whose qs it reads (null: every token; kda_qs.h).
template <bool KDA, bool STATES>
void dispatch_bwd_walk(const Problem& pb, const BwdWalkParams& p, cudaStream_t st, const QsRows* qs_rows = nullptr) {
  if (launch_bwd_walk_wgmma(pb, p, STATES, st, qs_rows)) return;  // the Hopper walk where it applies
  dispatch_dtype_dims<Bf16, Fp16>(pb, [&](auto dt, auto k, auto v) {
    using DT = typename decltype(dt)::type;
    constexpr int K = decltype(k)::value, V = decltype(v)::value;
    launch_walk(bwd_walk_kernel<DT, K, V, STATES, KDA>, BwdWalkSmem<K, KDA>::bytes, bwd_walk_tiles<V>(), p, st);
  });
}

// ---- the parameters of the four walk phases from their Args (host), GDN and KDA ----
// The layout tables, flags and inputs every walk of a direction reads (Args: the phase's args).
template <class Params, class Args>
inline Params walk_params(const Args& a, const DevLayout& L) {
  Params p{};
  p.sh = shape_of(a.ctx.problem, L);
  p.chunks = L.chunks;
  p.segments = L.segments;
  p.pieces = L.pieces;
  p.has_h0 = a.ctx.problem.has_h0;
  p.has_dht = a.ctx.problem.has_dht;
  p.k = a.k.packed16();
  p.kg = a.kg.packed16();
  p.gcum = a.gcum;
  p.W = a.W.packed16();
  return p;
}
template <class Args>
inline FwdWalkParams fwd_params(const Args& a, const DevLayout& L) {
  FwdWalkParams p = walk_params<FwdWalkParams>(a, L);
  p.U = a.U.packed16();
  return p;
}
template <class Args>
inline BwdWalkParams bwd_params(const Args& a, const DevLayout& L) {
  BwdWalkParams p = walk_params<BwdWalkParams>(a, L);
  p.q = a.q.packed16();
  p.dO = a.dO.packed16();
  p.dv_local = a.dv_local.packed16();
  return p;
}

inline FwdWalkParams fwd_summaries_params(const FwdSummaryArgs& a, const DevLayout& L) {
  FwdWalkParams p = fwd_params(a, L);
  p.seg_h_ext = a.seg_h_ext;
  p.seg_Mt = a.seg_Mt;
  return p;
}
inline FwdWalkParams fwd_states_params(const FwdStateArgs& a, const DevLayout& L) {
  FwdWalkParams p = fwd_params(a, L);
  p.seg_entry = a.seg_entry;
  p.h = a.h.packed16();
  p.v_new = a.v_new.packed16();
  p.ht = a.ht;
  return p;
}
inline BwdWalkParams bwd_summaries_params(const BwdSummaryArgs& a, const DevLayout& L) {
  BwdWalkParams p = bwd_params(a, L);
  p.seg_dh_ext = a.seg_dh_ext;
  return p;
}
inline BwdWalkParams bwd_states_params(const BwdStateArgs& a, const DevLayout& L) {
  BwdWalkParams p = bwd_params(a, L);
  p.seg_exit = a.seg_exit;
  p.dh = a.dh.packed16();
  p.dv2 = a.dv2.packed16();
  p.dh0 = a.dh0;
  return p;
}

}  // namespace kcp::kernels::cuda
