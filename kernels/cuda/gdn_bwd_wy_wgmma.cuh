// gdn_bwd_wy_kernel (B5, the WY backward; gdn_chunk_bwd_kernel.cuh) on Hopper wgmma: the same
// products, epilogues, rounding points ([D5]-[D7] of the CPU twin, kernels/cpu/gdn_chunk_bwd.cpp)
// and row-sum order, with every product an m64nNk16 wgmma from shared-memory descriptors instead
// of m16n8k16 mma.sync fed by ldmatrix. Included by gdn_chunk_bwd.cu, which launches it through
// launch_bwd_wy_wgmma where it runs (K = V = 128, an sm_90 device, an sm_90a build, the backward
// walk choice of walk_select.h not Mma) and the mma.sync kernel otherwise.
//
// Why: the mma.sync kernel is instruction / latency bound (~5000 dynamic instructions per warp,
// ~10 barrier-separated phases of 16-64 mma.sync per warp, each with its fragment loads;
// wip/NOTES-bwdfast.md in commit f5b8e13). A warpgroup's wgmma m64n64k16 does the work of 32
// mma.sync (8 per warp) and reads both operands from shared memory itself.
//
// Work split: the block's 256 threads are two warpgroups; every 64 x N product (N = 64, K or V)
// is split by columns, warpgroup w computing columns [w N / 2, (w + 1) N / 2) with one m64n(N/2)
// wgmma per k16 step. That is exactly the warp partition of the mma.sync kernel's Tiling<64, N>
// (WM = 4, WN = 2: warp w has rows 16 (w % 4) + [0, 16), columns (w / 4) N / 2 + [0, N / 2)), and
// the wgmma accumulator of m64nN' holds element 4 nt + e at (row 16 (warp % 4) + lane / 4 +
// 8 (e >> 1), col 8 nt + 2 (lane % 4) + (e & 1)): the Tiling's acc[0][nt][e]. So the
// accumulators are Tiling<64, N>::Acc arrays, the epilogues are the mma.sync kernel's own loops
// (same element order per thread), and the row totals (gate, dbeta) and column partials are
// summed in the same fixed order: no atomics, same bits on rerun.
//
// Shared memory: every 16-bit operand in 64-row tiles of 64-column atoms (128-byte rows, the
// 128-byte swizzle of hopper.cuh, 8 KiB each, 1024-aligned), read K-major (desc_k: the reduction
// along the row) or MN-major (desc_mn: the reduction down the rows). T1 is stored transposed
// (T1^T), so that dPi = -Phi^T T1 reads it K-major with a 32-row offset per warpgroup (an
// MN-major operand of 32 columns would start inside a 128-byte row). Operands are written by
// ordinary stores, so each writer runs fence.proxy.async before the barrier that precedes the
// wgmma reading them.
//
// Bits: the 16-bit operands and every fp32 expression of the epilogues are the mma.sync kernel's
// ones, and the reductions over tokens stop at the same kend (L rounded up to 16) and the ones over
// K / V run over all of it, as there. Only the order of the fp32 sums inside a product may differ
// (wgmma's internal accumulation vs mma.sync's k16 steps), as for the wgmma walks
// (gdn_walk_wgmma.cuh), which gave the same output bits as the mma.sync walks on an H100.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/cuda/finalize_row.cuh"
#include "kernels/cuda/gdn_chunk_bwd_kernel.cuh"
#include "kernels/cuda/hopper.cuh"
#include "kernels/cuda/walk_select.h"

namespace kcp::kernels::cuda {
namespace wy_wg {

using namespace ::kcp::hopper;

inline constexpr int kAtom = kAtomBytes;  // one 64-row tile of 64 16-bit columns (hopper.cuh)
inline constexpr int kWg = 128;           // threads of a warpgroup

// Byte offsets from the 1024-aligned base; NK, NV atoms per 64-row tile of K, V columns.
template <int K, int V>
struct Smem {
  static constexpr int NK = K / 64, NV = V / 64;
  static constexpr int k = 0, dv2 = NK * kAtom, dW = dv2 + NV * kAtom, Phi = dW + NK * kAtom;
  static constexpr int Xb = Phi + kAtom, Yb = Xb + NK * kAtom, dPhi = Yb + NV * kAtom;
  static constexpr int Kb = dW;           // after dX: dtype(k beta) reuses dW
  static constexpr int T1t = Xb;          // after dPhi: T1^T and dPi' reuse Xb, Yb
  static constexpr int dPi = Xb + kAtom;  // (adjacent tiles)
  static constexpr int F = dPhi + kAtom;  // the fp32 part, offsets in floats below
  static constexpr int G = 0, Beta = kC, Row = 2 * kC, Col = Row + kC * 2 * 3, Tot = Col + 4 * kC;
  static constexpr int Dl = Tot + kC * 3, NF = Dl + kC;
  static constexpr size_t bytes = size_t(F) + size_t(NF) * 4 + 1024;  // + the base's alignment
  // FIN: the block's dk rows (fp32, row stride DkLd floats: + 8 spreads a warp's stores over the
  // banks) over the 16-bit tiles, once every product has read them.
  static constexpr int DkT = 0, DkLd = K + 8;
  static_assert(NK + NV >= 2, "T1^T and dPi' must fit in the Xb, Yb space");
  static_assert(DkT + kC * DkLd * 4 <= F && (DkLd * 4) % 16 == 0,
                "the dk tile below the fp32 part, rows 16-byte aligned");
  static_assert(2 * (bytes + 1024) <= 228 * 1024, "two blocks share an SM");
};

// ---- wgmma on Tiling accumulators ----
// The accumulator of warpgroup w's m64nN part of a 64 x 2N product, in the Tiling<64, 2N> order
// (header): NT = N / 8 fragments of 4.
#define KCP_WY_F4(nt) "+f"(d[0][nt][0]), "+f"(d[0][nt][1]), "+f"(d[0][nt][2]), "+f"(d[0][nt][3])

// D (64 x 32) = [D +] A B, as hopper::wgmma_64x64x16 (transpose flags: MN-major operands).
template <bool FP16, int kTransA, int kTransB>
__device__ __forceinline__ void mma_n32(float (&d)[1][4][4], uint64_t da, uint64_t db, int accumulate) {
#define KCP_WY_N32(TY)                                                                                          \
  asm volatile(                                                                                                 \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                              \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY                                                   \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, %19, %20;\n" \
      "}\n"                                                                                                     \
      : KCP_WY_F4(0), KCP_WY_F4(1), KCP_WY_F4(2), KCP_WY_F4(3)                                                  \
      : "l"(da), "l"(db), "r"(accumulate), "n"(kTransA), "n"(kTransB))
  if constexpr (FP16)
    KCP_WY_N32("f16");
  else
    KCP_WY_N32("bf16");
#undef KCP_WY_N32
}

#undef KCP_WY_F4

template <bool FP16, int kTransA, int kTransB, int NT>
__device__ __forceinline__ void mma_acc(float (&d)[1][NT][4], uint64_t da, uint64_t db, int accumulate) {
  static_assert(NT == 4 || NT == 8, "m64n32 or m64n64");
  if constexpr (NT == 4)
    mma_n32<FP16, kTransA, kTransB>(d, da, db, accumulate);
  else  // hopper's m64n64k16: its 32 registers are d's fragments in order
    wgmma_64x64x16<FP16, kTransA, kTransB>(reinterpret_cast<float(&)[32]>(d), da, db, accumulate);
}

// Keeps the compiler from moving accumulator reads / writes across a wgmma boundary.
template <int NT>
__device__ __forceinline__ void fence_acc(float (&d)[1][NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[0][nt][e])::"memory");
}

// An operand: the low word of the descriptor of its first k16 step. The high word (stride of
// 8-row groups 1024 bytes, the 128-byte swizzle) is the same for every operand, and the low one
// is the base's (K-major or MN-major: they differ in the leading byte offset) plus the operand's
// byte offset / 16 (addresses < 256 KiB: no carry out of the 14-bit address field), so a
// descriptor costs one 32-bit add.
struct Opnd {
  uint32_t lo;
};
inline constexpr uint32_t kDescHi = (1024u >> 4) | (1u << 30);  // hopper::gmma_desc's: SBO 1024, swizzle 128 B
struct Descs {
  uint32_t k, mn;  // low words of the 1024-aligned base's descriptors
  __device__ __forceinline__ explicit Descs(uint32_t base)
      : k(uint32_t(desc_k(base, 0))), mn(uint32_t(desc_mn(base, 0))) {}
  // A tile read K-major (each row one M / N index, the reduction along the row) at byte offset off.
  __device__ __forceinline__ Opnd kmaj(uint32_t off) const { return Opnd{k + (off >> 4)}; }
  // A tile read MN-major (each row one k index, 64 M / N values per atom row).
  __device__ __forceinline__ Opnd mnmaj(uint32_t off) const { return Opnd{mn + (off >> 4)}; }
};
// The descriptor of k16 step kk: MN-major, 16 rows further (2048 bytes); K-major, 32 bytes along
// the row, atom kk / 4.
template <int kTrans>
__device__ __forceinline__ uint64_t step_desc(Opnd o, int kk) {
  const uint32_t lo = o.lo + uint32_t(kTrans ? kk * (2048 >> 4) : (kk / 4) * (kAtom >> 4) + (kk % 4) * (32 >> 4));
  return (uint64_t(kDescHi) << 32) | lo;
}

// Starts a group of products (register and shared-memory accesses before it are ordered before
// its wgmmas).
// (No accumulator fence before: every group starts its accumulators with accumulate = 0.)
__device__ __forceinline__ void begin() { wgmma_fence(); }
// d [+]= A B over S k16 steps, issued only. TA, TB: A, B MN-major. The reductions over the
// chunk's tokens take all 64 rows (S = 4): rows >= L of every such operand are zeros (loaded as
// zeros, or masked where formed), as in the wgmma walks.
template <bool FP16, int TA, int TB, int S, int NT>
__device__ __forceinline__ void issue(float (&d)[1][NT][4], Opnd a, Opnd b, bool accumulate = false) {
#pragma unroll
  for (int kk = 0; kk < S; ++kk)
    mma_acc<FP16, TA, TB>(d, step_desc<TA>(a, kk), step_desc<TB>(b, kk), (accumulate || kk > 0) ? 1 : 0);
}
// Commits the group (the caller may issue other work before waiting).
__device__ __forceinline__ void commit() { wgmma_commit(); }
// Waits for the committed group: its results in d..., its shared-memory reads done.
template <class... D>
__device__ __forceinline__ void wait(D&... d) {
  wgmma_wait();
  (fence_acc(d), ...);
}
template <class... D>
__device__ __forceinline__ void finish(D&... d) {
  commit();
  wait(d...);
}
// d = A B, one group.
template <bool FP16, int TA, int TB, int S, int NT>
__device__ __forceinline__ void product(float (&d)[1][NT][4], Opnd a, Opnd b) {
  begin();
  issue<FP16, TA, TB, S>(d, a, b);
  finish(d);
}

// ---- staging ----
// Tile16::load with the row address stepped by a pointer add (a block's rows, 16-byte loads,
// rows >= L zeros and never read): Tile16's per-load 64-bit index products were ~14 SASS
// instructions a load.
template <int COLS>
__device__ __forceinline__ void load_tile(Tile16<kC, COLS>& t, const uint16_t* src, int64_t stride, int L) {
  using TT = Tile16<kC, COLS>;
  constexpr int kRows = kThreads / TT::V8;  // rows per step of the block
  static_assert(kThreads % TT::V8 == 0 && TT::TOTAL % kThreads == 0, "every step is whole rows");
  const int r = threadIdx.x / TT::V8;
  const uint16_t* at = src + r * stride + (threadIdx.x % TT::V8) * 8;
#pragma unroll
  for (int i = 0; i < TT::ITERS; ++i, at += kRows * stride)
    t.v[i] = r + i * kRows < L ? __ldg(reinterpret_cast<const uint4*>(at)) : make_uint4(0u, 0u, 0u, 0u);
}

// An 8-byte global load that stays where it is written: the dK (B4) loads are issued before
// dPhi's product to hide their latency behind it, and a plain load was sunk by the compiler to
// its first use after dX's product (volatile asm keeps its place among the wgmma asm).
__device__ __forceinline__ void ld_f32x2(const float* src, float& lo, float& hi) {
  asm volatile("ld.global.v2.f32 {%0, %1}, [%2];\n" : "=f"(lo), "=f"(hi) : "l"(src));
}

// A 64 x COLS tile loaded by Tile16 into the atoms at dst (128-byte swizzle): each 16-byte load
// is one 16-byte chunk of the tile, f(i, x) -> the value stored for element x of the thread's
// i-th load (rounded to dtype by the store); Raw: the bits as loaded.
template <class DT, bool Raw, int COLS, class F>
__device__ __forceinline__ void put_tile(const Tile16<kC, COLS>& t, unsigned char* dst, F&& f) {
  using TT = Tile16<kC, COLS>;
  static_assert(TT::TOTAL % kThreads == 0, "every step is a row of the tile");
#pragma unroll
  for (int i = 0; i < TT::ITERS; ++i) {
    const int e = threadIdx.x + i * kThreads, r = e / TT::V8, c = (e % TT::V8) * 8;
    uint4 o = t.v[i];
    if constexpr (!Raw) {
      const uint32_t w[4] = {o.x, o.y, o.z, o.w};
      uint32_t y[4];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        y[u] = DT::pack(f(i, DT::from_raw(uint16_t(w[u] & 0xffffu))), f(i, DT::from_raw(uint16_t(w[u] >> 16))));
      o = make_uint4(y[0], y[1], y[2], y[3]);
    }
    *reinterpret_cast<uint4*>(dst + (c / 64) * kAtom + swz(r, c % 64)) = o;
  }
}

// dst = dtype(src * scale[row]) over ATOMS swizzled atoms (the swizzle moves 16-byte chunks only
// within a row, so chunk q of an atom is row (q / 8) % 64 at the same offset in both tiles):
// scale_rows_batched of gdn_chunk_bwd_kernel.cuh, every load before the first store.
template <class DT, int ATOMS>
__device__ __forceinline__ void scale_rows_swz(unsigned char* dst, const unsigned char* src, const float* scale) {
  constexpr int ITERS = ATOMS * kC * 8 / kThreads;
  static_assert(ATOMS * kC * 8 % kThreads == 0, "whole 16-byte steps per thread");
  uint4 v[ITERS];
  float sc[ITERS];
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int q = threadIdx.x + it * kThreads;
    v[it] = reinterpret_cast<const uint4*>(src)[q];
    sc[it] = scale[(q >> 3) & (kC - 1)];
  }
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const uint32_t w[4] = {v[it].x, v[it].y, v[it].z, v[it].w};
    uint32_t o[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      o[u] = DT::pack(DT::from_raw(uint16_t(w[u] & 0xffffu)) * sc[it], DT::from_raw(uint16_t(w[u] >> 16)) * sc[it]);
    reinterpret_cast<uint4*>(dst)[threadIdx.x + it * kThreads] = make_uint4(o[0], o[1], o[2], o[3]);
  }
}

// The 32-bit word (two 16-bit values) at (r, c), c even, of a swizzled tile of 64-column atoms.
__device__ __forceinline__ uint32_t* word_at(unsigned char* tile, int r, int c) { return swz_word(tile, r, c); }

// smem_pairs of gdn_chunk_bwd_kernel.cuh on a swizzled tile: the words at the element pairs of
// the thread's Tiling TT accumulator, in TT::pairs order, all loads before the caller's stores.
template <class TT>
__device__ __forceinline__ void swz_pairs(uint32_t (&w)[TT::NT * 2], unsigned char* t) {
  const int g8 = lane_id() >> 2, t4 = lane_id() & 3;
#pragma unroll
  for (int nt = 0; nt < TT::NT; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h) w[2 * nt + h] = *word_at(t, TT::m0() + g8 + 8 * h, TT::n0() + nt * 8 + 2 * t4);
}

// Row r of the chunk (first token t0) in a [T, HV, N] tensor, value head j, at the column of the
// thread's first accumulator pair of Tiling TT (n0 + 2 (lane % 4)); pair nt is at + 8 nt. One
// address product per row, not per pair.
template <class TT, int N, class T>
__device__ __forceinline__ T* row_at(T* base, int64_t t0, int r, int HV, int j) {
  return base + ((t0 + r) * HV + j) * N + TT::n0() + 2 * (lane_id() & 3);
}

// The v words at the thread's dY pairs (rows >= L: 0), vv[h][nt] = v[r0 + 8 h][n0 + 8 nt + 2
// (lane % 4) ..+1]: loaded while dY's product runs (wy_dy_out loaded them after it).
template <class TV, int V>
__device__ __forceinline__ void dy_v_words(uint32_t (&vv)[2][TV::NT], const uint16_t* v, int64_t t0, int HV, int j,
                                           int r0, int L) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint16_t* at = row_at<TV, V>(v, t0, r0 + 8 * h, HV, j);
#pragma unroll
    for (int nt = 0; nt < TV::NT; ++nt)
      vv[h][nt] = r0 + 8 * h < L ? __ldg(reinterpret_cast<const unsigned int*>(at + 8 * nt)) : 0u;
  }
}

// wy_dy_out of gdn_chunk_bwd_kernel.cuh (dY = Phi^T dv2 epilogue: dv = dtype(beta dY), dbeta +=
// dY v) with row addresses and v's words vv from dy_v_words: the same sums per row.
template <class DT, class TV, int V>
__device__ __forceinline__ void dy_out(const float (&a)[1][TV::NT][4], const uint32_t (&vv)[2][TV::NT], uint16_t* dv,
                                       int64_t t0, int HV, int j, const float (&bh)[2], int r0, int L, Row2& rdb) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (r0 + 8 * h >= L) continue;
    uint16_t* o = row_at<TV, V>(dv, t0, r0 + 8 * h, HV, j);
#pragma unroll
    for (int nt = 0; nt < TV::NT; ++nt) {
      const float d0 = a[0][nt][2 * h], d1 = a[0][nt][2 * h + 1], b = bh[h];
      const uint32_t w = vv[h][nt];
      st16x2<DT>(o + 8 * nt, b * d0, b * d1);
      row_of(rdb, h) += d0 * DT::from_raw(uint16_t(w & 0xffffu)) + d1 * DT::from_raw(uint16_t(w >> 16));
    }
  }
}

// FIN: the finalize's dk of this block's share of the chunk's rows. The cluster's G blocks are the
// value heads i G .. i G + G - 1 of one chunk (consecutive blocks, cluster dimension G), each with
// its heads' dk rows (fp32, what B5 would add to dk_hv) in its tile; block g of the cluster takes
// rows [g 64 / G, (g + 1) 64 / G) and forms each as finalize_qk_kernel does: the heads added in order
// from 0, then finish_row (the L2-norm backward and the rounding to dtype), into the caller's dk.
template <class DT, int K>
__device__ __forceinline__ void fin_dk_rows(const GradParams& p, uint32_t tile, int ld, int64_t t0, int i, int L) {
  constexpr int E = K / 32;
  static_assert(E == 4, "one 16-byte cluster load per lane: K = 128");
  const int G = p.sh.G, R = kC / G, g = int(cluster_rank());
  cluster_sync();  // every block's tile written
  const int rend = min(L, (g + 1) * R);
  for (int r = g * R + warp_id(); r < rend; r += kWarps) {
    const int64_t row = (t0 + r) * p.sh.H + i;
    uint32_t yu[E / 2] = {};
    float rs = 0.0f;
    if (p.l2norm) {  // the L2-norm operands first (finalize_qk_kernel's order of loads)
      LaneVec<E>::load16(p.yk + row * K + lane_id() * E, yu);
      rs = p.rstd_k[row];
    }
    float sum[E] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint32_t at = tile + uint32_t(r * ld + lane_id() * E) * 4u;
    for (int u = 0; u < G; ++u) {
      const float4 x = ld_cluster_f32x4(cluster_map(at, uint32_t(u)));
      sum[0] += x.x;
      sum[1] += x.y;
      sum[2] += x.z;
      sum[3] += x.w;
    }
    finish_row<DT, E>(sum, yu, rs, p.l2norm, p.dk_out + row * K + lane_id() * E);
  }
  cluster_sync();  // no block leaves while another reads its tile
}

// ---- the kernel ----
// FIN: dk finalized on chip (fin_dk_rows) instead of added to dk_hv; a cluster launch of G blocks.
template <class DT, int K, int V, bool FIN>
__device__ __forceinline__ void wy_block(const GradParams& p) {
  using Sm = Smem<K, V>;
  using TK = Tiling<kC, K>;
  using TV = Tiling<kC, V>;
  using T64 = Tiling<kC, kC>;
  static_assert(TK::WM == 4 && TV::WM == 4 && T64::WM == 4 && TK::MT == 1 && TV::MT == 1 && T64::MT == 1,
                "warpgroup w's m64 part is Tiling's warp column w");
  constexpr bool F16 = std::is_same_v<DT, Fp16>;
  constexpr int SK = K / 16, SV = V / 16, S64 = kC / 16;  // k16 steps over K, V, the tokens
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
  unsigned char* sb = smem_raw + (base - raw);
  const Descs ds(base);
  float* sf = reinterpret_cast<float*>(sb + Sm::F);
  float *sG = sf + Sm::G, *sBeta = sf + Sm::Beta, *sRow = sf + Sm::Row, *sCol = sf + Sm::Col;
  float *sTot = sf + Sm::Tot, *sDl = sf + Sm::Dl;

  const int HV = p.sh.HV;
  const int64_t n = blockIdx.x / HV;
  const int j = blockIdx.x % HV, i = j / p.sh.G;
  const ChunkDesc ch = p.chunks[n];
  const int L = ch.len;
  const int64_t t0 = ch.begin;
  // The warpgroup, known to the compiler as uniform over the warp (its descriptors go to uniform
  // registers), as CUTLASS's canonical_warp_group_idx.
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / kWg, 0);
  const int64_t qk0 = (t0 * p.sh.H + i) * K, qks = int64_t(p.sh.H) * K;
  const int64_t vv0 = (t0 * HV + j) * V, vvs = int64_t(HV) * V;
  // Byte offset of the warpgroup's columns in a B operand of 64 (K, V) columns: K-major rows
  // (64-column products), or MN-major atoms (K = V = 128: one atom each).
  const uint32_t half64 = uint32_t(wg) * 32 * 128, halfK = uint32_t(wg) * (K / 128) * kAtom;
  const uint32_t halfV = uint32_t(wg) * (V / 128) * kAtom;
  static_assert(K == 128 && V == 128, "MN-major B halves of 32 columns are not set up (K or V = 64)");

  // One memory round trip, as gdn_bwd_wy_kernel: the tiles' loads, then the per-row values.
  {
    Tile16<kC, K> tk, tW;
    Tile16<kC, V> tD, tv;
    Tile16<kC, kC> tP;
    load_tile(tk, p.k + qk0, qks, L);
    load_tile(tW, p.dW16 + (t0 * HV + j) * K, int64_t(HV) * K, L);  // dW from gdn_bwd_dqk_kernel
    load_tile(tD, p.dv2 + vv0, vvs, L);
    load_tile(tv, p.v + vv0, vvs, L);
    load_tile(tP, p.Phi + (t0 * HV + j) * kC, int64_t(HV) * kC, L);
    wy_stage_rows(p, t0 + tid, j, tid < L, sG, sBeta, sDl);
    __syncthreads();  // gcum, beta
    using TTk = Tile16<kC, K>;
    using TTv = Tile16<kC, V>;
    float bk[TTk::ITERS], ek[TTk::ITERS], bv[TTv::ITERS];
#pragma unroll
    for (int it = 0; it < TTk::ITERS; ++it) {
      bk[it] = sBeta[TTk::row_of(it)];
      ek[it] = exp2f(sG[TTk::row_of(it)]);
    }
#pragma unroll
    for (int it = 0; it < TTv::ITERS; ++it) bv[it] = sBeta[TTv::row_of(it)];
    auto same = [](int, float x) { return x; };
    put_tile<DT, true>(tk, sb + Sm::k, same);
    // [D5] Xb = dtype((k beta) exp2(g)), Yb = dtype(v beta)
    put_tile<DT, false>(tk, sb + Sm::Xb, [&](int it, float kx) { return (kx * bk[it]) * ek[it]; });
    put_tile<DT, true>(tW, sb + Sm::dW, same);
    put_tile<DT, true>(tD, sb + Sm::dv2, same);
    put_tile<DT, false>(tv, sb + Sm::Yb, [&](int it, float x) { return x * bv[it]; });
    put_tile<DT, true>(tP, sb + Sm::Phi, same);
  }
  fence_proxy_async();  // the tiles, for the wgmma reads after the barrier
  Row2 rwy, rgl, rdb;
  __syncthreads();
  // dK of the B4 part at this thread's accumulator positions, loaded before dPhi's product.
  float dK[1][TK::NT][4];
  const int r0 = TK::m0() + (lane_id() >> 2);  // the thread's rows r0, r0 + 8 in every product
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float* at = row_at<TK, K>(p.dk_hv, t0, r0 + 8 * h, HV, j);
#pragma unroll
    for (int nt = 0; nt < TK::NT; ++nt) {
      dK[0][nt][2 * h] = dK[0][nt][2 * h + 1] = 0.0f;
      if (r0 + 8 * h < L) ld_f32x2(at + 8 * nt, dK[0][nt][2 * h], dK[0][nt][2 * h + 1]);
    }
  }
  {  // dPhi = dW Xb^T + dv2 Yb^T (strictly lower part, rounded): A, B K-major
    float a[1][T64::NT][4];
    begin();
    issue<F16, 0, 0, SK>(a, ds.kmaj(Sm::dW), ds.kmaj(Sm::Xb + half64));
    issue<F16, 0, 0, SV>(a, ds.kmaj(Sm::dv2), ds.kmaj(Sm::Yb + half64), true);
    finish(a);
    T64::pairs(a, [&](int r, int s, float& v0, float& v1) {
      *word_at(sb + Sm::dPhi, r, s) = DT::pack((s < r && r < L) ? v0 : 0.0f, (s + 1 < r && r < L) ? v1 : 0.0f);
    });
  }
  const float bh[2] = {sBeta[r0], sBeta[r0 + 8]};
  {  // dX = Phi^T dW (A, B MN-major): dK, dbeta, gate
    float a[1][TK::NT][4];
    product<F16, 1, 1, S64>(a, ds.mnmaj(Sm::Phi), ds.mnmaj(Sm::dW + halfK));
    // k at the thread's pairs, read after the product (as wy_dx_out): read before it, the 16 words
    // live across it cost one spilled register at the 128-register cap (ptxas, nvcc 13.0).
    uint32_t kw[TK::NT * 2];
    swz_pairs<TK>(kw, sb + Sm::k);
    wy_dx_update<DT, TK>(a, dK, kw, sG, bh, r0, L, rdb, rwy);
  }
  {  // dY = Phi^T dv2: dv, dbeta
    float a[1][TV::NT][4];
    uint32_t vv[2][TV::NT];
    begin();
    issue<F16, 1, 1, S64>(a, ds.mnmaj(Sm::Phi), ds.mnmaj(Sm::dv2 + halfV));
    commit();
    dy_v_words<TV, V>(vv, p.v, t0, HV, j, r0, L);
    wait(a);
    dy_out<DT, TV, V>(a, vv, p.dv, t0, HV, j, bh, r0, L, rdb);
  }
  fence_proxy_async();  // dPhi, for T1's product
  __syncthreads();      // dPhi visible; Xb, Yb, dW free (every wgmma reading them has completed)
  // Kb = dtype(k beta)
  scale_rows_swz<DT, Sm::NK>(sb + Sm::Kb, sb + Sm::k, sBeta);
  {  // T1 = dtype(dPhi Phi^T), strictly lower, stored transposed (T1^T[s][m] = T1[m][s])
    float a[1][T64::NT][4];
    product<F16, 0, 0, S64>(a, ds.kmaj(Sm::dPhi), ds.kmaj(Sm::Phi + half64));
    T64::each(a, [&](int m, int s, float& v) {
      *reinterpret_cast<uint16_t*>(sb + Sm::T1t + swz(s, m)) = DT::raw(s < m ? v : 0.0f);
    });
  }
  fence_proxy_async();  // Kb, T1^T
  __syncthreads();
  {  // [D6] dPi = -Phi^T T1; dPi' = dPi exp2(g_r - g_s); gate term with beta_r (k_r . k_s)
    float a[1][T64::NT][4], kk[1][T64::NT][4];
    begin();
    issue<F16, 1, 0, S64>(a, ds.mnmaj(Sm::Phi), ds.kmaj(Sm::T1t + half64));
    issue<F16, 0, 0, SK>(kk, ds.kmaj(Sm::k), ds.kmaj(Sm::k + half64));
    finish(a, kk);
    unsigned char* dpi = sb + Sm::dPi;
    dpi_epilogue<DT, T64>(a, kk, sG, sCol, bh, L, rgl, [&](int r, int s, uint32_t w) { *word_at(dpi, r, s) = w; });
  }
  fence_proxy_async();  // dPi'
  __syncthreads();      // dPi' visible
  {                     // dK += beta_r (dPi' k) + dPi'^T Kb; dbeta += (dPi' k) . k_r
    float a[1][TK::NT][4];
    uint32_t kw[TK::NT * 2];  // k at the thread's pairs, read before the epilogue
    swz_pairs<TK>(kw, sb + Sm::k);
    product<F16, 0, 1, S64>(a, ds.kmaj(Sm::dPi), ds.mnmaj(Sm::k + halfK));
#pragma unroll
    for (int nt = 0; nt < TK::NT; ++nt)  // TK::zip_pairs' order
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + 8 * h;
        if (r >= L) continue;
        const float b = bh[h], w0 = a[0][nt][2 * h], w1 = a[0][nt][2 * h + 1];
        row_of(rdb, h) +=
            w0 * DT::from_raw(uint16_t(kw[2 * nt + h] & 0xffffu)) + w1 * DT::from_raw(uint16_t(kw[2 * nt + h] >> 16));
        dK[0][nt][2 * h] += b * w0;
        dK[0][nt][2 * h + 1] += b * w1;
      }
    product<F16, 1, 1, S64>(a, ds.mnmaj(Sm::dPi), ds.mnmaj(Sm::Kb + halfK));
    if constexpr (FIN) __syncthreads();  // every product has read its tiles: the dk tile may go there
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (r0 + 8 * h >= L) continue;
      float* o = FIN ? reinterpret_cast<float*>(sb + Sm::DkT) + (r0 + 8 * h) * Sm::DkLd + TK::n0() + 2 * (lane_id() & 3)
                     : row_at<TK, K>(p.dk_hv, t0, r0 + 8 * h, HV, j);
#pragma unroll
      for (int nt = 0; nt < TK::NT; ++nt)
        *reinterpret_cast<float2*>(o + 8 * nt) =
            make_float2(dK[0][nt][2 * h] + a[0][nt][2 * h], dK[0][nt][2 * h + 1] + a[0][nt][2 * h + 1]);
    }
  }
  wy_finish_rows(p, rwy, rgl, rdb, sRow, sCol, sTot, sDl, t0, HV, j, L);
  if constexpr (FIN) fin_dk_rows<DT, K>(p, base + Sm::DkT, Sm::DkLd, t0, i, L);
}

// Compiled for sm_90a only (wgmma); elsewhere (the compute_90 PTX) it traps, and
// launch_bwd_wy_wgmma never starts it there.
template <class DT, int K, int V, bool FIN>
__global__ void __launch_bounds__(kThreads, 2) gdn_bwd_wy_wgmma_kernel(GradParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  wy_block<DT, K, V, FIN>(p);
#else
  __trap();
#endif
}

}  // namespace wy_wg

// Launches gdn_bwd_wy_wgmma_kernel over `grid` blocks (NT HV) and returns true where it runs: K = V
// = 128 (the only shapes whose warpgroup halves of MN-major operands are whole atoms), bf16 and
// fp16 (fp16 judged by the GPU phase case raw_K128_fp16), and
// bwd_grads_use_wgmma() (walk_select.h: an sm_90a build, an sm_90 device, the backward choice not
// WalkChoice::Mma, the tests' and gpu_bench's switch to the mma.sync kernels); returns false
// having launched nothing otherwise (the caller runs gdn_bwd_wy_kernel).
template <class DT, int K, int V>
bool launch_bwd_wy_wgmma(const GradParams& p, unsigned grid, cudaStream_t st) {
#if defined(KCP_HAVE_SM90A)
  if constexpr (K == 128 && V == 128) {
    if (!bwd_grads_use_wgmma()) return false;
    constexpr size_t smem = wy_wg::Smem<K, V>::bytes;
    if (!p.dk_out) {
      allow_smem(wy_wg::gdn_bwd_wy_wgmma_kernel<DT, K, V, false>, smem);
      wy_wg::gdn_bwd_wy_wgmma_kernel<DT, K, V, false><<<grid, kThreads, smem, st>>>(p);
      KCP_CUDA_LAUNCH_CHECK(st);
      return true;
    }
    auto* kernel = wy_wg::gdn_bwd_wy_wgmma_kernel<DT, K, V, true>;
    allow_smem(kernel, smem);
    cudaLaunchAttribute cluster[1];
    cluster[0].id = cudaLaunchAttributeClusterDimension;
    cluster[0].val.clusterDim.x = unsigned(p.sh.G);  // the value heads of one q/k head (fin_dk_rows)
    cluster[0].val.clusterDim.y = cluster[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cfg.attrs = cluster;
    cfg.numAttrs = 1;
    KCP_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, p));
    return true;
  }
#endif
  (void)p, (void)grid, (void)st;
  return false;
}

}  // namespace kcp::kernels::cuda
