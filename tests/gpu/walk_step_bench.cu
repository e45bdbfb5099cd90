// Walk-step microbenchmark (issue 17 item 2): the time of one chunk step of the GDN forward state
// recurrence (docs/algorithm.md F4) written with Hopper's own machinery, to learn how far a
// walk-based design can go before the chunk kernels are redesigned. Not a test; not linked to the
// product. Prints one table line per T and checks the result against an fp32 CPU walk.
//
// One step, chunk n of C = 64 tokens, value head j, a 64-column tile of the K x V state S (fp32):
//   Sb = bf16(S)                          -> h[n] (TMA store)
//   vr = U - W Sb                         wgmma m64n64k16, A = W (K-major), B = Sb (MN-major)
//   v_new = bf16(vr)                      -> v_new (TMA store)
//   vs = bf16(vr * exp2(gL - g_r))
//   S = exp2(gL) S + k^T vs               wgmma, A = k^T (MN-major: the k tile read transposed)
// which is the CPU twin's [S1]-[S3] and the CUDA walk's step (gdn_chunk_state_kernel.cuh).
//
// Block: one warpgroup of consumers (128 threads: the state in wgmma accumulators, 64 fp32
// registers a thread for a 128 x 64 tile) and one producer warp that streams W, k, U and the
// chunk's gate cumsum into a two-stage ring with TMA (cp.async.bulk.tensor, 128-byte swizzle)
// completing on mbarriers, so chunk n + 1's operands arrive while chunk n computes. Grid: HV x
// (V / 64) blocks per segment; the step time is the kernel time over the chunks a block walks.
// Variants timed after the check (which runs P = 1 with stores): no h / v_new stores (what the
// stores cost), and P = 2, 4 segments per head (each block walks NT / P chunks from the same entry
// state: the KCP split's throughput when more blocks fill the 132 SMs); for rs at P = 2 also v_new
// stored without h (what a forward walk that forms the output on chip, h never leaving it, would
// store) and no stores.
//
// Register-A variant (walk_step_rs_kernel, the rows marked "rs"): the consumers hold the
// transposed tile S^T (64 value columns x K keys, two m64n64 accumulators) so that both products
// take their A operand from registers, the way an accumulator becomes the next product's A in
// FlashAttention-3: v^T = Sb^T W^T (A = bf16(S^T) converted in registers, B = W K-major) and
// S^T = Gam S^T + vs^T k (A = vs^T from v^T's accumulator, B = k MN-major). No operand of the
// recurrence goes through shared memory, so a step has no proxy fence and no consumer barrier on
// its chain; U^T arrives by ldmatrix.trans from the stage, and h, v_new leave through per-warp
// stmatrix.trans staging and per-warp TMA stores (unswizzled 16-value boxes) off the chain. Same
// values and rounding points as walk_step_kernel.
//
// Layouts: W, U, v_new [T, HV, 128] bf16; k [T, H, 128] bf16 (GVA: head j reads qk head j / G);
// g [HV, T] fp32 log2 cumsum within each chunk (head-major so a chunk's 64 gates are one 256-byte
// bulk copy); h [NT, HV, K, V] bf16; S0 / S_out [HV, K, V] fp32.
//
// Build: sm_90a only (wgmma). Run: kcp_walk_step_bench [T ...] (default 8192 32768).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/hopper.cuh"

namespace {

#define CHECK_CUDA(x)                                                                                   \
  do {                                                                                                  \
    cudaError_t e_ = (x);                                                                               \
    if (e_ != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "CUDA %s at %s:%d in '%s'\n", cudaGetErrorName(e_), __FILE__, __LINE__, #x); \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)

constexpr int kK = 128, kV = 128, kC = 64, kBV = 64;
constexpr int kH = 16, kHV = 32;  // the issue's shape: GVA with G = 2
constexpr int kConsumers = 128, kThreads = kConsumers + 32;
constexpr int kTile = kC * 64 * 2;  // one 64 x 64 bf16 tile: 8 KiB
// Shared memory (byte offsets from a 1024-aligned base; swizzled tiles need 1024 alignment).
constexpr int kStageW0 = 0, kStageW1 = kTile, kStageK0 = 2 * kTile, kStageK1 = 3 * kTile, kStageU = 4 * kTile,
              kStageG = 5 * kTile;
constexpr int kStageBytes = 42 * 1024;  // 5 tiles + 256 bytes of gates, rounded to 1 KiB
constexpr int kStages = 2;
constexpr int kSS = kStages * kStageBytes;  // Sb: 128 keys x 64 columns bf16 (16 KiB)
constexpr int kSV = kSS + 2 * kTile;        // vs: 64 tokens x 64 columns
constexpr int kSVn = kSV + kTile;           // v_new staging for its TMA store
constexpr int kBar = kSVn + kTile;          // full[2], empty[2]
constexpr int kSmemBytes = kBar + 64 + 1024;
constexpr uint32_t kStageTx = 5 * kTile + kC * 4;
// walk_step_rs_kernel: the stages, then per consumer warp an h staging tile (K keys x 16 values,
// 32-byte rows: 4 KiB) and a v_new staging tile (64 tokens x 16 values: 2 KiB), then the barriers.
constexpr int kRsH = kStages * kStageBytes, kRsV = kRsH + 4 * 4096, kRsBar = kRsV + 4 * 2048;
constexpr int kRsSmemBytes = kRsBar + 64 + 1024;

// PTX wrappers, wgmma and the fragment map: kernels/cuda/hopper.cuh (shared with the product's
// wgmma walk, kernels/cuda/gdn_walk_wgmma.cuh).
using namespace kcp::hopper;
__device__ __forceinline__ void consumers_sync() { named_sync(1, kConsumers); }

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

struct Params {
  int NT, G;
  int seg_chunks;   // chunks a block walks (NT / P); block (segment, head, tile) walks its segment
  const float* g;   // [HV, T]
  const float* S0;  // [HV, K, V]
  float* S_out;     // [HV, K, V]
};

// The producer lane: every chunk's W, k, U tiles (TMA) and 64 gates (bulk copy) into the ring.
__device__ __forceinline__ void produce(const CUtensorMap& tmW, const CUtensorMap& tmK, const CUtensorMap& tmU,
                                        const Params& p, uint32_t base, uint32_t full0, uint32_t empty0, int j, int i,
                                        int c0, int n0) {
  for (int m = 0; m < p.seg_chunks; ++m) {
    const int s = m % kStages, n = n0 + m;
    if (m >= kStages) mbar_wait(empty0 + 8 * s, uint32_t((m / kStages - 1) & 1));
    const uint32_t st = base + s * kStageBytes, full = full0 + 8 * s;
    mbar_arrive_expect_tx(full, kStageTx);
    tma_load_3d(st + kStageW0, &tmW, full, 0, j, n * kC);
    tma_load_3d(st + kStageW1, &tmW, full, 64, j, n * kC);
    tma_load_3d(st + kStageK0, &tmK, full, 0, i, n * kC);
    tma_load_3d(st + kStageK1, &tmK, full, 64, i, n * kC);
    tma_load_3d(st + kStageU, &tmU, full, c0, j, n * kC);
    bulk_load(st + kStageG, p.g + (int64_t(j) * p.NT + n) * kC, kC * 4, full);
  }
}

// What a block walks, and its ring: block b -> (segment, value head j, column tile); the ring's
// barriers at `bar` (full[kStages], then empty[kStages]) are initialised here (a block barrier).
struct Blk {
  int j, i, c0, n0;
  uint32_t full0, empty0;
};
__device__ __forceinline__ Blk block_setup(const Params& p, uint32_t bar) {
  constexpr int kTiles = kV / kBV;
  Blk b;
  const int tile = int(blockIdx.x) % kTiles;
  b.j = (int(blockIdx.x) / kTiles) % kHV;
  b.i = b.j / p.G;
  b.c0 = tile * kBV;
  b.n0 = (int(blockIdx.x) / (kTiles * kHV)) * p.seg_chunks;
  b.full0 = bar;
  b.empty0 = bar + 8 * kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(b.full0 + 8 * s, 1);
      mbar_init(b.empty0 + 8 * s, kConsumers / 32);
    }
    mbar_init_fence();
  }
  __syncthreads();
  return b;
}

// kStores: write h and v_new (false: the timing variant that leaves both TMA stores out).
template <bool kStores>
__global__ void __launch_bounds__(kThreads, 1)
    walk_step_kernel(const __grid_constant__ CUtensorMap tmW, const __grid_constant__ CUtensorMap tmK,
                     const __grid_constant__ CUtensorMap tmU, const __grid_constant__ CUtensorMap tmH,
                     const __grid_constant__ CUtensorMap tmVn, Params p) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  unsigned char* sbase = smem_raw + (base - smem_u32(smem_raw));
  const int tid = int(threadIdx.x);
  const Blk b = block_setup(p, base + kBar);
  const int j = b.j, i = b.i, c0 = b.c0, n0 = b.n0;
  const uint32_t full0 = b.full0, empty0 = b.empty0;

  if (tid >= kConsumers) {  // producer warp: one lane issues every copy
    if (tid == kConsumers) produce(tmW, tmK, tmU, p, base, full0, empty0, j, i, c0, n0);
    return;
  }

  // Consumers: S rows 0-63 in acc0, rows 64-127 in acc1 (columns c0 .. c0 + 63).
  float acc0[32], acc1[32], v[32] = {};
  const float* S0 = p.S0 + int64_t(j) * kK * kV + c0;
#pragma unroll
  for (int e = 0; e < 32; ++e) {
    acc0[e] = S0[frag_row(tid, e) * kV + frag_col(tid, e)];
    acc1[e] = S0[(64 + frag_row(tid, e)) * kV + frag_col(tid, e)];
  }
  for (int m = 0; m < p.seg_chunks; ++m) {
    const int s = m % kStages, n = n0 + m;
    const uint32_t st = base + s * kStageBytes;
    if (tid == 0) bulk_wait_read();  // the previous chunk's h / v_new stores have read sS / sVn
    consumers_sync();
    // Sb -> sS (rows = keys), the B operand of W Sb and the h[n] tile.
#pragma unroll
    for (int e = 0; e < 32; e += 2) {
      const int r = frag_row(tid, e), c = frag_col(tid, e);
      *reinterpret_cast<uint32_t*>(sbase + kSS + swz(r, c)) = pack_bf16(acc0[e], acc0[e + 1]);
      *reinterpret_cast<uint32_t*>(sbase + kSS + swz(64 + r, c)) = pack_bf16(acc1[e], acc1[e + 1]);
    }
    fence_proxy_async();
    consumers_sync();
    if (kStores && tid == 0) tma_store_3d(&tmH, base + kSS, c0, 0, n * kHV + j);

    mbar_wait(full0 + 8 * s, uint32_t((m / kStages) & 1));
    const float* g = reinterpret_cast<const float*>(sbase + s * kStageBytes + kStageG);
    const float gL = g[kC - 1];
    // vr = U - W Sb
    fence_acc(v);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kK / 16; ++kk)
      wgmma_64x64x16<false, 0, 1>(v, desc_k(st + (kk < 4 ? kStageW0 : kStageW1), kk % 4), desc_mn(base + kSS, kk),
                                  kk > 0);
    wgmma_commit();
    wgmma_wait();
    fence_acc(v);
#pragma unroll
    for (int e = 0; e < 32; e += 2) {
      const int r = frag_row(tid, e), c = frag_col(tid, e);
      const __nv_bfloat162 u = *reinterpret_cast<const __nv_bfloat162*>(sbase + s * kStageBytes + kStageU + swz(r, c));
      const float vr0 = __low2float(u) - v[e], vr1 = __high2float(u) - v[e + 1];
      const float f = exp2f(gL - g[r]);
      *reinterpret_cast<uint32_t*>(sbase + kSVn + swz(r, c)) = pack_bf16(vr0, vr1);
      *reinterpret_cast<uint32_t*>(sbase + kSV + swz(r, c)) = pack_bf16(vr0 * f, vr1 * f);
    }
    fence_proxy_async();
    consumers_sync();
    if (kStores && tid == 0) tma_store_3d(&tmVn, base + kSVn, c0, j, n * kC);
    // S = exp2(gL) S + k^T vs
    const float gam = exp2f(gL);
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      acc0[e] *= gam;
      acc1[e] *= gam;
    }
    fence_acc(acc0);
    fence_acc(acc1);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk)
      wgmma_64x64x16<false, 1, 1>(acc0, desc_mn(st + kStageK0, kk), desc_mn(base + kSV, kk), 1);
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk)
      wgmma_64x64x16<false, 1, 1>(acc1, desc_mn(st + kStageK1, kk), desc_mn(base + kSV, kk), 1);
    wgmma_commit();
    wgmma_wait();
    fence_acc(acc0);
    fence_acc(acc1);
    if (tid % 32 == 0) mbar_arrive(empty0 + 8 * s);
  }
  if (tid == 0) bulk_wait_all();          // the stores have read shared memory before the block ends
  if (n0 + p.seg_chunks != p.NT) return;  // the last segment's block writes the final state
  float* So = p.S_out + int64_t(j) * kK * kV + c0;
#pragma unroll
  for (int e = 0; e < 32; ++e) {
    So[frag_row(tid, e) * kV + frag_col(tid, e)] = acc0[e];
    So[(64 + frag_row(tid, e)) * kV + frag_col(tid, e)] = acc1[e];
  }
}

// ---- register-A variant -----------------------------------------------------------------------
// The k16 slices of a 64 x 64 accumulator as wgmma A words (wgmma_64x64x16_rs's order): slice kk
// of d goes to a[kk0 + kk]. The pairs are rounded to bf16 here (Sb = bf16(S)).
__device__ __forceinline__ void acc_to_a(const float (&d)[32], uint32_t (&a)[8][4], int kk0) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) a[kk0 + kk][q] = pack_bf16(d[8 * kk + 2 * q], d[8 * kk + 2 * q + 1]);
}

// The shared address lane `lane` gives to an x4 ldmatrix / stmatrix of fragment words {4 q .. 4 q
// + 3} of a 64-column tile (rows = columns of the transposed fragment): matrix m = lane / 8 covers
// column block nt = 2 q + m / 2 (8 columns of the fragment = 8 stored rows) and row half m % 2 of
// the warp's 16 fragment rows (8 stored columns); `row_at(stored_row, stored_col)` is the layout.
template <class RowAt>
__device__ __forceinline__ uint32_t x4_addr(int q, int lane, int w, RowAt row_at) {
  const int m = lane >> 3, i = lane & 7;
  return row_at(8 * (2 * q + (m >> 1)) + i, 16 * w + 8 * (m & 1));
}

// kStoreH / kStoreV: write h / v_new (the timing variants leave either or both out).
template <bool kStoreH, bool kStoreV>
__global__ void __launch_bounds__(kThreads, 1)
    walk_step_rs_kernel(const __grid_constant__ CUtensorMap tmW, const __grid_constant__ CUtensorMap tmK,
                        const __grid_constant__ CUtensorMap tmU, const __grid_constant__ CUtensorMap tmHs,
                        const __grid_constant__ CUtensorMap tmVns, Params p) {
  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  unsigned char* sbase = smem_raw + (base - smem_u32(smem_raw));
  const int tid = int(threadIdx.x);
  const Blk b = block_setup(p, base + kRsBar);
  const int j = b.j, i = b.i, c0 = b.c0, n0 = b.n0;
  const uint32_t full0 = b.full0, empty0 = b.empty0;
  if (tid >= kConsumers) {
    if (tid == kConsumers) produce(tmW, tmK, tmU, p, base, full0, empty0, j, i, c0, n0);
    return;
  }

  // Consumers: S^T (rows: the tile's 64 value columns; columns: keys 0-63 in sT0, 64-127 in sT1).
  const int w = tid / 32, lane = tid % 32, t4 = lane & 3;
  float sT0[32], sT1[32], v[32] = {};
  const float* S0 = p.S0 + int64_t(j) * kK * kV + c0;
#pragma unroll
  for (int e = 0; e < 32; ++e) {
    sT0[e] = S0[frag_col(tid, e) * kV + frag_row(tid, e)];
    sT1[e] = S0[(64 + frag_col(tid, e)) * kV + frag_row(tid, e)];
  }
  const uint32_t hst = base + kRsH + w * 4096, vst = base + kRsV + w * 2048;  // this warp's staging
  auto staged = [](uint32_t t) { return [t](int r, int c) { return t + uint32_t(r * 32 + (c & 15) * 2); }; };
  for (int m = 0; m < p.seg_chunks; ++m) {
    const int s = m % kStages, n = n0 + m;
    const uint32_t st = base + s * kStageBytes;
    uint32_t a[8][4];  // Sb^T as A words: k16 slices of keys
    acc_to_a(sT0, a, 0);
    acc_to_a(sT1, a, 4);
    if (kStoreH) {  // h[n] = Sb: stored rows = keys, 16 values of this warp each
      if (lane == 0) bulk_wait_read();
      __syncwarp();
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) stsm_x4_trans(x4_addr(0, lane, 0, staged(hst)) + kk * 16 * 32, a[kk]);
      fence_proxy_async();
      __syncwarp();
      if (lane == 0) tma_store_3d(&tmHs, hst, c0 + 16 * w, 0, n * kHV + j);
    }
    mbar_wait(full0 + 8 * s, uint32_t((m / kStages) & 1));
    // v^T = Sb^T W^T
    fence_acc(v);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kK / 16; ++kk)
      wgmma_64x64x16_rs<false, 0>(v, a[kk], desc_k(st + (kk < 4 ? kStageW0 : kStageW1), kk % 4), kk > 0);
    wgmma_commit();
    // While it runs: U^T (ldmatrix.trans from the stage's U tile, rows = tokens) and the gates.
    uint32_t u[16];
    auto u_at = [st](int r, int c) { return st + kStageU + swz(r, c); };
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t r4[4];
      ldsm_x4_trans(r4, x4_addr(q, lane, w, u_at));
#pragma unroll
      for (int x = 0; x < 4; ++x) u[4 * q + x] = r4[x];
    }
    const float* g = reinterpret_cast<const float*>(sbase + s * kStageBytes + kStageG);
    const float gL = g[kC - 1];
    float f[8][2];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      f[nt][0] = exp2f(gL - g[8 * nt + 2 * t4]);
      f[nt][1] = exp2f(gL - g[8 * nt + 2 * t4 + 1]);
    }
    wgmma_wait();
    fence_acc(v);
    // vr = U - v; v_new = bf16(vr) (words vn); vs = bf16(vr f) as the update's A words (vs).
    uint32_t vn[16], vs[4][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int e = 4 * nt + 2 * h, x = 2 * nt + h;
        const __nv_bfloat162 ub = *reinterpret_cast<const __nv_bfloat162*>(&u[x]);
        const float vr0 = __low2float(ub) - v[e], vr1 = __high2float(ub) - v[e + 1];
        vn[x] = pack_bf16(vr0, vr1);
        vs[x / 4][x % 4] = pack_bf16(vr0 * f[nt][0], vr1 * f[nt][1]);
      }
    if (kStoreV) {  // v_new: stored rows = tokens, 16 values of this warp each
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t r4[4] = {vn[4 * q], vn[4 * q + 1], vn[4 * q + 2], vn[4 * q + 3]};
        stsm_x4_trans(x4_addr(q, lane, 0, staged(vst)), r4);
      }
      fence_proxy_async();
      __syncwarp();
      if (lane == 0) tma_store_3d(&tmVns, vst, c0 + 16 * w, j, n * kC);
    }
    // S^T = exp2(gL) S^T + vs^T k
    const float gam = exp2f(gL);
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      sT0[e] *= gam;
      sT1[e] *= gam;
    }
    fence_acc(sT0);
    fence_acc(sT1);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) wgmma_64x64x16_rs<false, 1>(sT0, vs[kk], desc_mn(st + kStageK0, kk), 1);
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) wgmma_64x64x16_rs<false, 1>(sT1, vs[kk], desc_mn(st + kStageK1, kk), 1);
    wgmma_commit();
    wgmma_wait();
    fence_acc(sT0);
    fence_acc(sT1);
    if (lane == 0) mbar_arrive(empty0 + 8 * s);
  }
  if (lane == 0) bulk_wait_all();  // this warp's stores have read its staging before the block ends
  if (n0 + p.seg_chunks != p.NT) return;
  float* So = p.S_out + int64_t(j) * kK * kV + c0;
#pragma unroll
  for (int e = 0; e < 32; ++e) {
    So[frag_col(tid, e) * kV + frag_row(tid, e)] = sT0[e];
    So[(64 + frag_col(tid, e)) * kV + frag_row(tid, e)] = sT1[e];
  }
}

// ---- host -----------------------------------------------------------------------------------
// A bf16 tensor of dims {d0 (contiguous), d1, d2} and a box {b0, b1, b2}, 128-byte swizzle.
CUtensorMap make_map(void* ptr, uint64_t d0, uint64_t d1, uint64_t d2, uint32_t b0, uint32_t b1, uint32_t b2,
                     CUtensorMapSwizzle sw = CU_TENSOR_MAP_SWIZZLE_128B) {
  CUtensorMap m{};
  const CUresult r = make_map_16bit(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, ptr, d0, d1, d2, b0, b1, b2, sw);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed (%d)\n", int(r));
    std::exit(1);
  }
  return m;
}

float bf(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
uint16_t bits(float x) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  return *reinterpret_cast<const uint16_t*>(&h);
}
float from_bits(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Host {
  int T, NT;
  std::vector<uint16_t> W, k, U;  // bf16 patterns
  std::vector<float> g, S0;
};

Host make_inputs(int T, uint64_t seed) {
  Host h;
  h.T = T;
  h.NT = T / kC;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ud(0.001f, 0.1f);
  h.W.resize(size_t(T) * kHV * kK);
  h.k.resize(size_t(T) * kH * kK);
  h.U.resize(size_t(T) * kHV * kV);
  for (auto& x : h.W) x = bits(nd(rng) * 0.06f);
  for (auto& x : h.k) x = bits(nd(rng) * 0.088f);
  for (auto& x : h.U) x = bits(nd(rng) * 0.5f);
  h.g.resize(size_t(kHV) * T);
  for (int j = 0; j < kHV; ++j)
    for (int n = 0; n < h.NT; ++n) {
      float cum = 0.0f;
      for (int r = 0; r < kC; ++r) {
        cum -= ud(rng) / std::log(2.0f);  // log2 of a per-token decay e^-0.001 .. e^-0.1
        h.g[size_t(j) * T + size_t(n) * kC + r] = cum;
      }
    }
  h.S0.resize(size_t(kHV) * kK * kV);
  for (auto& x : h.S0) x = nd(rng) * 0.3f;
  return h;
}

// The fp32 CPU walk of head j, columns [c0, c0 + 64): the final S, every v_new and the last
// chunk's h (Sb, K x 64).
void cpu_walk(const Host& h, int j, int c0, std::vector<float>& S, std::vector<float>& vnew,
              std::vector<float>& hlast) {
  const int i = j / (kHV / kH);
  S.assign(size_t(kK) * kBV, 0.0f);
  for (int a = 0; a < kK; ++a)
    for (int c = 0; c < kBV; ++c) S[size_t(a) * kBV + c] = h.S0[(size_t(j) * kK + a) * kV + c0 + c];
  vnew.assign(size_t(h.T) * kBV, 0.0f);
  std::vector<float> Sb(size_t(kK) * kBV), vs(size_t(kC) * kBV);
  for (int n = 0; n < h.NT; ++n) {
    for (size_t e = 0; e < Sb.size(); ++e) Sb[e] = bf(S[e]);
    if (n == h.NT - 1) hlast = Sb;
    const float* g = &h.g[size_t(j) * h.T + size_t(n) * kC];
    const float gL = g[kC - 1];
    for (int r = 0; r < kC; ++r) {
      const size_t t = size_t(n) * kC + r;
      for (int c = 0; c < kBV; ++c) {
        float acc = 0.0f;
        for (int a = 0; a < kK; ++a) acc += from_bits(h.W[(t * kHV + j) * kK + a]) * Sb[size_t(a) * kBV + c];
        const float vr = from_bits(h.U[(t * kHV + j) * kV + c0 + c]) - acc;
        vnew[t * kBV + c] = bf(vr);
        vs[size_t(r) * kBV + c] = bf(vr * std::exp2(gL - g[r]));
      }
    }
    const float gam = std::exp2(gL);
    for (int a = 0; a < kK; ++a)
      for (int c = 0; c < kBV; ++c) {
        float acc = 0.0f;
        for (int r = 0; r < kC; ++r)
          acc += from_bits(h.k[((size_t(n) * kC + r) * kH + i) * kK + a]) * vs[size_t(r) * kBV + c];
        S[size_t(a) * kBV + c] = gam * S[size_t(a) * kBV + c] + acc;
      }
  }
}

double rel_rms(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0.0, den = 0.0;
  for (size_t e = 0; e < got.size(); ++e) {
    const double d = double(got[e]) - want[e];
    num += d * d;
    den += double(want[e]) * want[e];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

template <class T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, v.size() * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// The two kernels: walk_step_kernel (operands through shared memory) and walk_step_rs_kernel.
enum class Kind { Smem, Rs };

struct Check {
  double S, v, h;  // worst rel-RMS of the final state, v_new and the last chunk's h
  bool ok() const { return S < 1e-2 && v < 1e-2 && h < 1e-2; }
};

// Two heads (one per GVA group parity) and both column tiles against the CPU walk, after a P = 1
// launch with stores (v_new and h poisoned before).
Check check(const Host& h, const float* dS, const uint16_t* dvn, const uint16_t* dh) {
  const int T = h.T;
  std::vector<float> S(h.S0.size());
  std::vector<uint16_t> vn_bits(size_t(T) * kHV * kV), h_bits(size_t(kHV) * kK * kV);
  CHECK_CUDA(cudaMemcpy(S.data(), dS, S.size() * 4, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(vn_bits.data(), dvn, vn_bits.size() * 2, cudaMemcpyDeviceToHost));
  CHECK_CUDA(
      cudaMemcpy(h_bits.data(), dh + size_t(h.NT - 1) * kHV * kK * kV, h_bits.size() * 2, cudaMemcpyDeviceToHost));
  Check c{0.0, 0.0, 0.0};
  for (int j : {0, kHV - 1})
    for (int c0 : {0, 64}) {
      std::vector<float> Sw, vw, hw, Sg(size_t(kK) * kBV), vg(size_t(T) * kBV), hg(size_t(kK) * kBV);
      cpu_walk(h, j, c0, Sw, vw, hw);
      for (int a = 0; a < kK; ++a)
        for (int x = 0; x < kBV; ++x) {
          Sg[size_t(a) * kBV + x] = S[(size_t(j) * kK + a) * kV + c0 + x];
          hg[size_t(a) * kBV + x] = from_bits(h_bits[(size_t(j) * kK + a) * kV + c0 + x]);
        }
      for (size_t t = 0; t < size_t(T); ++t)
        for (int x = 0; x < kBV; ++x) vg[t * kBV + x] = from_bits(vn_bits[(t * kHV + j) * kV + c0 + x]);
      c.S = std::max(c.S, rel_rms(Sg, Sw));
      c.v = std::max(c.v, rel_rms(vg, vw));
      c.h = std::max(c.h, rel_rms(hg, hw));
    }
  return c;
}

// Prints the variants' lines; false where a kernel's check failed.
bool run(int T) {
  const Host h = make_inputs(T, 1234 + T);
  uint16_t *dW = upload(h.W), *dk = upload(h.k), *dU = upload(h.U), *dh = nullptr, *dvn = nullptr;
  float *dg = upload(h.g), *dS0 = upload(h.S0), *dS = nullptr;
  const size_t h_bytes = size_t(h.NT) * kHV * kK * kV * 2, vn_bytes = size_t(T) * kHV * kV * 2;
  CHECK_CUDA(cudaMalloc(&dh, h_bytes));
  CHECK_CUDA(cudaMalloc(&dvn, vn_bytes));
  CHECK_CUDA(cudaMalloc(&dS, h.S0.size() * 4));
  const CUtensorMap mW = make_map(dW, kK, kHV, T, 64, 1, kC), mK = make_map(dk, kK, kH, T, 64, 1, kC),
                    mU = make_map(dU, kV, kHV, T, 64, 1, kC), mVn = make_map(dvn, kV, kHV, T, 64, 1, kC),
                    mH = make_map(dh, kV, kK, uint64_t(h.NT) * kHV, 64, kK, 1),
                    mVns = make_map(dvn, kV, kHV, T, 16, 1, kC, CU_TENSOR_MAP_SWIZZLE_NONE),
                    mHs = make_map(dh, kV, kK, uint64_t(h.NT) * kHV, 16, kK, 1, CU_TENSOR_MAP_SWIZZLE_NONE);
  Params p{h.NT, kHV / kH, h.NT, dg, dS0, dS};
  for (auto* f : {walk_step_kernel<true>, walk_step_kernel<false>})
    CHECK_CUDA(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  for (auto* f : {walk_step_rs_kernel<true, true>, walk_step_rs_kernel<false, true>, walk_step_rs_kernel<false, false>})
    CHECK_CUDA(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kRsSmemBytes));
  // One launch of a variant: kernel, stores on or off (h_store false, rs only: v_new alone), P
  // segments per (head, tile), each walking NT / P chunks.
  auto launch = [&](Kind kind, bool stores, int P, bool h_store) {
    Params q = p;
    q.seg_chunks = h.NT / P;
    const dim3 grid(unsigned(P * kHV * (kV / kBV)));
    if (kind == Kind::Smem)
      (stores ? walk_step_kernel<true> : walk_step_kernel<false>)<<<grid, kThreads, kSmemBytes>>>(mW, mK, mU, mH, mVn,
                                                                                                  q);
    else
      (!stores   ? walk_step_rs_kernel<false, false>
       : h_store ? walk_step_rs_kernel<true, true>
                 : walk_step_rs_kernel<false, true>)<<<grid, kThreads, kRsSmemBytes>>>(mW, mK, mU, mHs, mVns, q);
    CHECK_CUDA(cudaGetLastError());
  };
  Check checks[2];
  for (Kind kind : {Kind::Smem, Kind::Rs}) {
    CHECK_CUDA(cudaMemset(dvn, 0xFF, vn_bytes));  // NaN poison
    CHECK_CUDA(cudaMemset(dh, 0xFF, h_bytes));
    launch(kind, true, 1, true);
    CHECK_CUDA(cudaDeviceSynchronize());
    checks[int(kind)] = check(h, dS, dvn, dh);
  }

  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  // Median of 20 launches after 3 warm-ups; the step time is the kernel time over NT / P steps.
  auto median_ms = [&](Kind kind, bool stores, int P, bool h_store) {
    for (int w = 0; w < 3; ++w) launch(kind, stores, P, h_store);
    std::vector<float> ms;
    for (int r = 0; r < 20; ++r) {
      CHECK_CUDA(cudaEventRecord(e0));
      launch(kind, stores, P, h_store);
      CHECK_CUDA(cudaEventRecord(e1));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float t = 0.0f;
      CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return double(ms[ms.size() / 2]);
  };
  struct Variant {
    Kind kind;
    bool stores;
    int P;
    const char* what;
    bool h_store = true;  // rs, false: v_new only (what a walk that forms the output on chip stores)
  };
  for (const Variant& v :
       {Variant{Kind::Smem, true, 1, "h, v_new stored"}, Variant{Kind::Smem, false, 1, "no stores"},
        Variant{Kind::Smem, true, 2, "h, v_new stored"}, Variant{Kind::Smem, true, 4, "h, v_new stored"},
        Variant{Kind::Rs, true, 1, "rs: h, v_new stored"}, Variant{Kind::Rs, false, 1, "rs: no stores"},
        Variant{Kind::Rs, true, 2, "rs: h, v_new stored"}, Variant{Kind::Rs, true, 2, "rs: v_new stored", false},
        Variant{Kind::Rs, false, 2, "rs: no stores"}}) {
    if (h.NT % v.P) continue;
    const double med = median_ms(v.kind, v.stores, v.P, v.h_store);
    const Check& c = checks[int(v.kind)];
    std::printf("%-6d %5d %2d %5d %10.4f %10.3f %12.3e %12.3e %12.3e %-6s %s\n", T, h.NT, v.P, v.P * kHV * (kV / kBV),
                med, med * 1e3 / (h.NT / v.P), c.S, c.v, c.h, c.ok() ? "ok" : "WRONG", v.what);
  }
  for (void* q : {static_cast<void*>(dW), static_cast<void*>(dk), static_cast<void*>(dU), static_cast<void*>(dh),
                  static_cast<void*>(dvn), static_cast<void*>(dg), static_cast<void*>(dS0), static_cast<void*>(dS)})
    CHECK_CUDA(cudaFree(q));
  return checks[0].ok() && checks[1].ok();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> Ts;
  for (int a = 1; a < argc; ++a) Ts.push_back(std::atoi(argv[a]));
  if (Ts.empty()) Ts = {8192, 32768};
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf(
      "walk step: GDN forward, H=%d HV=%d K=V=%d, bf16, one segment per head, %d blocks of %d threads, "
      "%d B shared, on %s\n",
      kH, kHV, kK, kHV * (kV / kBV), kThreads, kSmemBytes, prop.name);
  std::printf("%-6s %5s %2s %5s %10s %10s %12s %12s %12s %-6s %s\n", "T", "NT", "P", "blks", "ms(med20)", "us/step",
              "S rel-RMS", "v_new rel-RMS", "h rel-RMS", "check", "variant");
  bool ok = true;
  for (int T : Ts) {
    if (T <= 0 || T % kC) {
      std::fprintf(stderr, "T must be a positive multiple of %d (got %d)\n", kC, T);
      return 2;
    }
    if (!run(T)) ok = false;
  }
  return ok ? 0 : 1;
}
