// gdn_bwd_dqk_kernel (B4, gdn_chunk_bwd_kernel.cuh) on Hopper wgmma: the same block (one 64-column
// slice of K of one (chunk, value head)), the same loads, outputs and rounding points [D1]-[D4] of
// the CPU twin (kernels/cpu/gdn_chunk_bwd.cpp), with every product one warpgroup wgmma m64n64k16
// from shared memory (hopper.cuh) instead of 8 warps of mma.sync m16n8k16. Included only by
// gdn_chunk_bwd.cu, which launches it instead of gdn_bwd_dqk_kernel where bwd_grads_use_wgmma()
// (walk_select.h: an sm_90 device, an sm_90a build; the backward walk choice not Mma).
//
// Why: the mma.sync kernel is instruction / latency bound, not waiting on its loads (bwdfast,
// docs/perf-notes.md session 23): 8 warps each issue 160 mma.sync with their ldmatrix address
// arithmetic in ~8 barrier-separated phases. Here a warpgroup issues one wgmma per k16 step of a
// whole 64 x 64 product (20 per warpgroup, no operand loads into registers), and the block has 3
// barriers.
//
// Block b -> (chunk n, value head j, slice kh) as gdn_bwd_dqk_kernel; 256 threads = 2 warpgroups,
// each holding whole 64 x 64 fp32 accumulators (32 registers per product per thread):
//   load      all tiles by cp.async into 128-byte-swizzled 64-row atoms (h, dh: the slice's 64 K
//             rows x V; dO, v_new, dv2: 64 tokens x V; k, q: 64 tokens x the slice's 64 columns;
//             rows >= L zero-filled), gcum; one barrier.
//   phase 1   warpgroup 0: e = dO v_new^T, dQ = dO h^T;  warpgroup 1: dW = dv2 h^T, dK = v_new dh^T
//             (both K-major: every operand row holds the reduction index V); while they run, all
//             256 threads sum <h, dh>. Then wg 0: dQ *= exp2(g) scale, E = dtype(tril(e) exp2(g_r -
//             g_s) scale) -> its own atom; wg 1: dW16 = dtype(-dW), dK *= exp2(gL - g), sum dK o k.
//             One barrier (E visible; the warp partials of <h, dh> and dK o k).
//   phase 2   wg 0: dQ += E k (A = E K-major, B = k MN-major); wg 1: dK += E^T q (A = E read MN-major,
//             B = q MN-major), k16 steps up to the chunk's length rounded up to 16 (as mma.sync).
//             wg 0 writes dq_hv and the row sums q . dQ, wg 1 dk_hv and k . dK; one barrier; the
//             gate rows as gdn_bwd_dqk_kernel.
// Same bits as gdn_bwd_dqk_kernel except for the products' own fp32 summation order (wgmma's k16
// steps vs mma.sync's; the same 16-bit operands, the same k16 steps in the same order): every
// non-tensor sum is formed in gdn_bwd_dqk_kernel's order. A thread here holds the columns
// [0, 32) and [32, 64) of its two rows, which that kernel gives to warps w and w + 4 (Tiling WM =
// 4, WN = 2, same rows, same lanes, same element order inside), so the row sums (q . dQ, k . dK)
// keep one partial per half, quad-summed, then added half 0 + half 1 (row_totals' order), and the
// block sums of <h, dh> and dK o k add the 8 warp partials in that kernel's warp order (block_sum).
// Shared memory (bytes): V / 64 atoms of 8 KiB for each of h, dh, dO, v_new, dv2; one atom each for
// k, q, E; gcum, the row totals and the warp partials; + 1 KiB for aligning the base to 1024 B.
// V = 128: 108,352 B, two blocks per SM (gdn_bwd_dqk_kernel: 107,328 B); V = 64: 67,392 B.
// Registers (ptxas, sm_90a, nvcc 13.0): 112 bf16, 110 fp16, every K and V, no spills (two blocks
// per SM: <= 128; gdn_bwd_dqk_kernel 96 - 103). sm_90a only: elsewhere (the library's compute_90
// PTX) the kernel traps and the launcher never starts it.
#pragma once

#include <type_traits>

#include "kernels/cuda/gdn_chunk_bwd_kernel.cuh"
#include "kernels/cuda/hopper.cuh"

namespace kcp::kernels::cuda {

namespace dqk_wg {

using namespace ::kcp::hopper;

inline constexpr int kAtom = kAtomBytes;  // one 64-row atom of 128-byte rows (hopper.cuh)
inline constexpr int kWg = 128;           // threads of a warpgroup

template <int V>
struct Smem {
  static constexpr int NVA = V / 64;  // atoms of a V-wide tile
  static constexpr int S = 0, dS = S + NVA * kAtom, dO = dS + NVA * kAtom, VN = dO + NVA * kAtom;
  static constexpr int Dv2 = VN + NVA * kAtom, Kt = Dv2 + NVA * kAtom, Q = Kt + kAtom, E = Q + kAtom;
  static constexpr int G = E + kAtom;                                   // gcum of the chunk's 64 rows (0 beyond L)
  static constexpr int Tot = G + kC * 4;                                // [64][2]: q . dQ, k . dK per row
  static constexpr int Red = Tot + kC * 2 * 4;                          // [2][kWarps]: warp partials of <h, dh>, dK o k
  static constexpr size_t bytes = size_t(Red) + 2 * kWarps * 4 + 1024;  // + the base's alignment
  static_assert(V % 64 == 0, "whole atoms");
  static_assert(2 * (bytes + 1024) <= 228 * 1024, "two blocks share an SM");
};

// A 64 x COLS 16-bit row-major global tile (row stride `stride` elements) into COLS / 64 swizzled
// atoms at dst by cp.async, 16 bytes (one swizzle chunk) per copy; rows >= rows_valid zero-filled.
// A thread's copies are RSTEP rows apart in one column, a multiple of the swizzle's 8-row period,
// so they share one swizzled column offset.
template <int COLS>
__device__ __forceinline__ void cp_async_swz(unsigned char* dst, const uint16_t* src, int64_t stride, int rows_valid) {
  constexpr int C8 = COLS / 8, RSTEP = kThreads / C8, ITERS = kC / RSTEP;
  static_assert(kThreads % C8 == 0 && RSTEP % 8 == 0 && kC % RSTEP == 0, "whole copies per thread");
  const int r0 = int(threadIdx.x) / C8, c = (int(threadIdx.x) % C8) * 8;
  unsigned char* d0 = dst + (c >> 6) * kAtom + swz(r0, c & 63);
  const uint16_t* s0 = src + r0 * stride + c;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const bool ok = r0 + it * RSTEP < rows_valid;
    cp_async16(d0 + it * RSTEP * 128, ok ? s0 + it * RSTEP * stride : src, ok);
  }
}

// The 32-bit word of values (c, c + 1), c even, of row r of a swizzled tile (COLS / 64 atoms): the
// value at hopper's swz_word, written out here because calling it changed this kernel's address
// arithmetic in the PTX (session 26); switch when a GPU run can judge it.
__device__ __forceinline__ uint32_t word_at(const unsigned char* t, int r, int c) {
  return *reinterpret_cast<const uint32_t*>(t + (c >> 6) * kAtom + swz(r, c & 63));
}
template <class DT>
__device__ __forceinline__ float lo16(uint32_t w) {
  return DT::from_raw(uint16_t(w & 0xffffu));
}
template <class DT>
__device__ __forceinline__ float hi16(uint32_t w) {
  return DT::from_raw(uint16_t(w >> 16));
}

// The descriptor of the tile `off` bytes after that of d (a k16 step: desc_k's and desc_mn's
// steps): the start address field is the descriptor's low bits in 16-byte units and stays below
// 2^14 (shared memory), so the offset adds to it without a carry; one add instead of forming each
// descriptor from its address.
__device__ __forceinline__ uint64_t at(uint64_t d, uint32_t off) { return d + (off >> 4); }

// d = A B^T over V (A: 64 rows of dO / v_new / dv2, B: 64 rows of h / dh; both K-major V-wide
// tiles at shared addresses a, b), issued, not waited for.
template <bool F16, int V>
__device__ __forceinline__ void issue_abt(float (&d)[32], uint32_t a, uint32_t b) {
  const uint64_t da = desc_k(a, 0), db = desc_k(b, 0);
#pragma unroll
  for (int kk = 0; kk < V / 16; ++kk)
    wgmma_64x64x16<F16, 0, 0>(d, at(da, (kk / 4) * kAtom + (kk % 4) * 32), at(db, (kk / 4) * kAtom + (kk % 4) * 32),
                              kk > 0);
}

// Phase 1 of a warpgroup: d0 = A0 B0^T, d1 = A1 B1^T over V, one commit group.
template <bool F16, int V>
__device__ __forceinline__ void issue_pair(float (&d0)[32], float (&d1)[32], uint32_t a0, uint32_t b0, uint32_t a1,
                                           uint32_t b1) {
  fence_acc(d0);
  fence_acc(d1);
  wgmma_fence();
  issue_abt<F16, V>(d0, a0, b0);
  issue_abt<F16, V>(d1, a1, b1);
  wgmma_commit();
}

// d += A B over the first 16 N tokens (A: E at e, K-major for E k, MN-major for E^T q; B: k or q
// at b, MN-major), issued and waited for in straight-line code.
template <bool F16, int TRANS_A, int N>
__device__ __forceinline__ void e_steps(float (&d)[32], uint32_t e, uint32_t b) {
  const uint64_t da = TRANS_A ? desc_mn(e, 0) : desc_k(e, 0), db = desc_mn(b, 0);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < N; ++kk)
    wgmma_64x64x16<F16, TRANS_A, 1>(d, at(da, kk * (TRANS_A ? 2048 : 32)), at(db, kk * 2048), 1);
  wgmma_commit();
  wgmma_wait();
}

// Phase 2: d += A B over the chunk's first kend tokens (kend: its length rounded up to 16, the
// k16 steps of gdn_bwd_dqk_kernel's mma.sync). One path per step count, each complete: a wgmma
// behind a per-step condition, or one still in flight where the paths join, made ptxas fence the
// accumulators there (C7519).
template <bool F16, int TRANS_A>
__device__ __forceinline__ void add_e_product(float (&d)[32], uint32_t e, uint32_t b, int kend) {
  fence_acc(d);
  switch (kend / 16) {
    case 1:
      e_steps<F16, TRANS_A, 1>(d, e, b);
      break;
    case 2:
      e_steps<F16, TRANS_A, 2>(d, e, b);
      break;
    case 3:
      e_steps<F16, TRANS_A, 3>(d, e, b);
      break;
    default:
      e_steps<F16, TRANS_A, 4>(d, e, b);
      break;
  }
  fence_acc(d);
}

// The sum of <h, dh> over this thread's pairs of the slice, in gdn_bwd_dqk_kernel's order (pair
// t = tid + it * kThreads, it ascending: row x0 + it STEP, column c). STEP is a multiple of 4, so
// the row's swizzle phase is that of x0 with bit 2 flipped on odd steps where STEP % 8 == 4: the
// pairs' addresses are one offset plus constants.
template <class DT, int V>
__device__ __forceinline__ float hdh_part(const unsigned char* sS, const unsigned char* sdS) {
  constexpr int STEP = kThreads / (V / 2), ITERS = kKS / STEP;
  static_assert(kThreads % (V / 2) == 0 && STEP % 4 == 0 && kKS % STEP == 0, "whole pairs per thread");
  const int x0 = int(threadIdx.x) / (V / 2), c = (int(threadIdx.x) % (V / 2)) * 2;
  const uint32_t o0 = (c >> 6) * kAtom + swz(x0, c & 63);
  float hdh = 0.0f;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const uint32_t o = (o0 + it * STEP * 128) ^ (((it * STEP) & 7) << 4);
    const uint32_t s = *reinterpret_cast<const uint32_t*>(sS + o), d = *reinterpret_cast<const uint32_t*>(sdS + o);
    hdh += lo16<DT>(s) * lo16<DT>(d) + hi16<DT>(s) * hi16<DT>(d);
  }
  return hdh;
}

// A sum of the 8 warp partials at red in warp order, as block_sum adds them.
__device__ __forceinline__ float sum_warps(const float* red) {
  float s = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) s += red[w];
  return s;
}

// The gate-row sum of one accumulator (q . dQ or k . dK) for the thread's rows r0 + 8 h, as
// row_totals forms it from gdn_bwd_dqk_kernel's two warp columns: per half of the columns a
// partial in the fragment's order, quad-summed, then half 0 + half 1. The lanes t4 == 0 store it
// at tot[r * 2] (tot: the quantity's column of the row totals).
template <class DT>
__device__ __forceinline__ void row_dot(const float (&d)[32], const unsigned char* tile, int r0, float* tot) {
  const int t4 = lane_id() & 3;
  float part[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};  // [half][h]
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t w = word_at(tile, r0 + 8 * h, nt * 8 + 2 * t4);
      part[nt / 4][h] += lo16<DT>(w) * d[4 * nt + 2 * h] + hi16<DT>(w) * d[4 * nt + 2 * h + 1];
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float s = quad_sum(part[0][h]) + quad_sum(part[1][h]);
    if (t4 == 0) tot[(r0 + 8 * h) * 2] = s;
  }
}

// st_global_f32x2 where `pred`, as one predicated store: behind a branch each store of the
// unrolled loop became its own branch around its own 64-bit address arithmetic.
__device__ __forceinline__ void st_global_f32x2_if(float* dst, float lo, float hi, bool pred) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %3, 0;\n@p st.global.v2.f32 [%0], {%1, %2};\n}\n" ::"l"(dst), "f"(lo),
               "f"(hi), "r"(int(pred)));
}

// The fp32 rows of an accumulator into dst (row r at dst + r * stride), rows < L.
__device__ __forceinline__ void store_rows_f32(const float (&d)[32], float* dst, int64_t stride, int r0, int L) {
  const int t4 = lane_id() & 3;
  float* const row[2] = {dst + r0 * stride + 2 * t4, dst + (r0 + 8) * stride + 2 * t4};
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      st_global_f32x2_if(row[h] + nt * 8, d[4 * nt + 2 * h], d[4 * nt + 2 * h + 1], r0 + 8 * h < L);
}

// What a block works on (gdn_bwd_dqk_kernel's mapping).
struct DqkBlk {
  int64_t t0, n;
  int j, i, kh, L;
};

template <int K>
__device__ __forceinline__ DqkBlk dqk_block(const GradParams& p) {
  constexpr int KS = K / kKS;
  DqkBlk b;
  b.kh = int(blockIdx.x % KS);
  b.n = blockIdx.x / (KS * p.sh.HV);
  b.j = int((blockIdx.x / KS) % p.sh.HV);
  b.i = b.j / p.sh.G;
  const ChunkDesc ch = p.chunks[b.n];
  b.L = ch.len;
  b.t0 = ch.begin;
  return b;
}

// The block's tiles and gates into shared memory (one memory round trip), visible to every thread
// and to the async proxy (wgmma) behind the block barrier.
template <int K, int V>
__device__ __forceinline__ void load_block(const GradParams& p, const DqkBlk& b, unsigned char* sb) {
  using Sm = Smem<V>;
  const int HV = p.sh.HV, x0 = b.kh * kKS;
  const int64_t qk0 = (b.t0 * p.sh.H + b.i) * K + x0, qks = int64_t(p.sh.H) * K;
  const int64_t vv0 = (b.t0 * HV + b.j) * V, vvs = int64_t(HV) * V;
  const int64_t kv0 = ((b.n * HV + b.j) * K + x0) * int64_t(V);
  cp_async_swz<V>(sb + Sm::S, p.h + kv0, V, kKS);
  cp_async_swz<V>(sb + Sm::dS, p.dh + kv0, V, kKS);
  cp_async_swz<V>(sb + Sm::dO, p.dO + vv0, vvs, b.L);
  cp_async_swz<V>(sb + Sm::VN, p.v_new + vv0, vvs, b.L);
  cp_async_swz<V>(sb + Sm::Dv2, p.dv2 + vv0, vvs, b.L);
  cp_async_swz<kKS>(sb + Sm::Kt, p.k + qk0, qks, b.L);
  cp_async_swz<kKS>(sb + Sm::Q, p.q + qk0, qks, b.L);
  cp_async_commit();
  const int tid = int(threadIdx.x);
  float* sG = reinterpret_cast<float*>(sb + Sm::G);
  if (tid < kC) sG[tid] = tid < b.L ? p.gcum[(b.t0 + tid) * HV + b.j] : 0.0f;  // after the copies
  cp_async_wait_all();
  fence_proxy_async();  // the copies' shared-memory writes, before wgmma reads them
  __syncthreads();
}

// Warpgroup 1, phase 1 epilogue: dW16 = dtype(-dW) (rows < L), dK *= exp2(gL - g_r) (rows >= L:
// 0), and the thread's partials of sum(dK o k) over column halves 0 and 1 (gdn_bwd_dqk_kernel's
// warps w and w + 4) into kint[0], kint[1].
template <class DT, int K>
__device__ __forceinline__ void dw_dk_epilogue(const float (&w)[32], float (&dK)[32], const GradParams& p,
                                               const DqkBlk& b, const unsigned char* sk, const float* sG, float gL,
                                               int r0, float (&kint)[2]) {
  const int t4 = lane_id() & 3, L = b.L;
  uint16_t* dW = p.dW16 + (b.t0 * p.sh.HV + b.j) * K + b.kh * kKS + 2 * t4;
  const int64_t ws = int64_t(p.sh.HV) * K;
  uint16_t* const row[2] = {dW + r0 * ws, dW + (r0 + 8) * ws};
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      if (r0 + 8 * h < L) st16x2<DT>(row[h] + nt * 8, -w[4 * nt + 2 * h], -w[4 * nt + 2 * h + 1]);
  const float ek[2] = {exp2f(gL - sG[r0]), exp2f(gL - sG[r0 + 8])};
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    const uint32_t kw[2] = {word_at(sk, r0, nt * 8 + 2 * t4), word_at(sk, r0 + 8, nt * 8 + 2 * t4)};
#pragma unroll
    for (int e = 0; e < 4; ++e) {  // Tiling::each's order inside an 8-column block
      const int h = e >> 1, r = r0 + 8 * h;
      float& v = dK[4 * nt + e];
      v = r < L ? v * ek[h] : 0.0f;
      kint[nt / 4] += v * ((e & 1) ? hi16<DT>(kw[h]) : lo16<DT>(kw[h]));
    }
  }
}

// Warpgroup 0, phase 1 epilogue: dQ *= exp2(g_r) scale (rows >= L: 0) and E = dtype(tril(e)
// exp2(g_r - g_s) scale) into its atom at sE (rows >= L and s > r: 0).
template <class DT>
__device__ __forceinline__ void dq_e_epilogue(const float (&e)[32], float (&dQ)[32], unsigned char* sE, const float* sG,
                                              float scale, int r0, int L) {
  const int t4 = lane_id() & 3;
  // The gates of the rows and columns, read before E's first store (which would hold them back).
  const float gr[2] = {sG[r0], sG[r0 + 8]};
  const float eq[2] = {exp2f(gr[0]), exp2f(gr[1])};
  float gs[8][2];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    gs[nt][0] = sG[nt * 8 + 2 * t4];
    gs[nt][1] = sG[nt * 8 + 2 * t4 + 1];
  }
#pragma unroll
  for (int x = 0; x < 32; ++x) {
    const int h = (x >> 1) & 1;
    dQ[x] = r0 + 8 * h < L ? dQ[x] * eq[h] * scale : 0.0f;
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = r0 + 8 * h, s = nt * 8 + 2 * t4;
      float ev[2];
#pragma unroll
      for (int u = 0; u < 2; ++u)
        ev[u] = (s + u <= r && r < L) ? e[4 * nt + 2 * h + u] * exp2f(gr[h] - gs[nt][u]) * scale : 0.0f;
      *reinterpret_cast<uint32_t*>(sE + swz(r, s)) = DT::pack(ev[0], ev[1]);
    }
  fence_proxy_async();  // E's generic writes, before the other warpgroup's wgmma reads them
}

template <class DT, int K, int V>
__device__ __forceinline__ void dqk_block_body(const GradParams& p) {
  using Sm = Smem<V>;
  constexpr bool F16 = std::is_same_v<DT, Fp16>;
  static_assert(K % kKS == 0 && K / kKS <= 2, "the gate partials have two places: dlam and dlam_hi");
  static_assert(kThreads == 2 * kWg, "two warpgroups");
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023u) & ~1023u;
  unsigned char* sb = smem_raw + (base - raw);
  const DqkBlk b = dqk_block<K>(p);
  load_block<K, V>(p, b, sb);
  const float* sG = reinterpret_cast<const float*>(sb + Sm::G);
  float* red = reinterpret_cast<float*>(sb + Sm::Red);
  float* tot = reinterpret_cast<float*>(sb + Sm::Tot);
  // wg by a broadcast: the compiler then knows it is warp-uniform, and so are the descriptors.
  const int tid = int(threadIdx.x), wg = __shfl_sync(0xffffffffu, tid / kWg, 0);
  const int wq = warp_id() % 4, r0 = 16 * wq + (lane_id() >> 2);
  const float gL = sG[b.L - 1];
  const int64_t os = int64_t(p.sh.HV) * K, o0 = (b.t0 * p.sh.HV + b.j) * K + b.kh * kKS;  // dq_hv, dk_hv
  // Phase 1: warpgroup 0 a0 = e = dO v_new^T, a1 = dQ = dO h^T; warpgroup 1 a0 = dW = dv2 h^T,
  // a1 = dK = v_new dh^T (operands chosen by address: one code path). <h, dh> while they run.
  float a0[32] = {}, a1[32] = {};  // written by the first wgmma of each product (no accumulate)
  issue_pair<F16, V>(a0, a1, base + (wg ? Sm::Dv2 : Sm::dO), base + (wg ? Sm::S : Sm::VN),
                     base + (wg ? Sm::VN : Sm::dO), base + (wg ? Sm::dS : Sm::S));
  const float hdh = warp_sum(hdh_part<DT, V>(sb + Sm::S, sb + Sm::dS));
  wgmma_wait();
  fence_acc(a0);
  fence_acc(a1);
  if (lane_id() == 0) red[warp_id()] = hdh;
  if (wg == 0) {
    dq_e_epilogue<DT>(a0, a1, sb + Sm::E, sG, p.sh.scale, r0, b.L);
  } else {
    float kint[2] = {0.0f, 0.0f};
    dw_dk_epilogue<DT, K>(a0, a1, p, b, sb + Sm::Kt, sG, gL, r0, kint);
    kint[0] = warp_sum(kint[0]);
    kint[1] = warp_sum(kint[1]);
    if (lane_id() == 0) {  // as gdn_bwd_dqk_kernel's warps wq (columns [0, 32)) and wq + 4
      red[kWarps + wq] = kint[0];
      red[kWarps + wq + 4] = kint[1];
    }
  }
  __syncthreads();  // E and the warp partials
  // Phase 2: dQ += E k (warpgroup 0), dK += E^T q (warpgroup 1); then dq_hv / dk_hv and the
  // rows' q . dQ / k . dK.
  const int kend = (b.L + 15) & ~15;
  if (wg == 0)
    add_e_product<F16, 0>(a1, base + Sm::E, base + Sm::Kt, kend);
  else
    add_e_product<F16, 1>(a1, base + Sm::E, base + Sm::Q, kend);
  store_rows_f32(a1, (wg ? p.dk_hv : p.dq_hv) + o0, os, r0, b.L);
  row_dot<DT>(a1, sb + (wg ? Sm::Kt : Sm::Q), r0, tot + wg);
  __syncthreads();  // the row totals
  if (tid < b.L) {
    float dl = tot[tid * 2] - tot[tid * 2 + 1];
    if (tid == b.L - 1) {
      const float hdh_all = sum_warps(red), kint = sum_warps(red + kWarps);
      // This slice's part, rounded as gdn_bwd_dqk_kernel rounds it: a product, then a sum (nvcc
      // does not contract them there; a fused multiply-add would change dlam's bits).
      const float dg_last = __fmul_rn(hdh_all, exp2f(gL)) + kint;
      dl += dg_last;
    }
    (b.kh == 0 ? p.dlam : p.dlam_hi)[(b.t0 + tid) * p.sh.HV + b.j] = dl;
  }
}

}  // namespace dqk_wg

// sm_90a only (wgmma); elsewhere it traps, and the launcher never starts it there.
template <class DT, int K, int V>
__global__ void __launch_bounds__(kThreads, 2) gdn_bwd_dqk_wgmma_kernel(GradParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  dqk_wg::dqk_block_body<DT, K, V>(p);
#else
  __trap();
#endif
}

}  // namespace kcp::kernels::cuda
