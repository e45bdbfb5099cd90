// KDA chunk-local products with the stored score matrix Aqk: the output (F5, the CPU twin's
// kda_output [K3]) and the local dv of the backward (3.2 step 2, chunk_state.cpp bwd_local_dv
// [B4]). Included only by kda_chunk_fwd.cu.
//
// Both kernels: grid NT * HV * V/32, block (chunk n, value head j, tile of 32 value columns) =
// (b / (tiles HV), (b / tiles) % HV, b % tiles), kThreads, a thread per output element.
// kda_output_kernel: qg = dtype(q exp2(g)) (exponent <= 0), inter = qg h[n] (sum over K
//   ascending), intra = Aqk v_new (s <= r ascending), o = dtype(scale inter + intra).
//   Shared memory (fp32): qg 64 x K; h K x 32; Aqk 64 x 64; v_new 64 x 32.
// kda_local_dv_kernel: dv_local[s] = dtype(sum_{r = s}^{L-1} Aqk[r][s] dO[r]) (r ascending),
//   16-bit storage. Shared memory (fp32): Aqk 64 x 64; dO 64 x 32.
#pragma once

#include "kernels/cuda/gdn_chunk_fwd_kernel.cuh"  // ChunkParams
#include "kernels/cuda/kda_common.cuh"

namespace kcp::kernels::cuda {

inline constexpr int kKdaOutBV = 32;  // value columns per block

// The GDN parameters (gdn_chunk_fwd_kernel.cuh: q, gcum, h, v_new, o; dO, dv_local) plus Aqk.
struct KdaChunkParams : ChunkParams {
  const float* Aqk;  // [T, HV, 64] dtype
};

// The work item of a tiled chunk-local kernel: item = (n * HV + j) * tiles + tile.
struct ChunkTileItem {
  ChunkItem w;
  int c0;  // first value column of the tile
};
__device__ __forceinline__ ChunkTileItem chunk_tile_item(const KdaChunkParams& p, int tiles) {
  ChunkTileItem t;
  t.w = chunk_item(p.chunks, p.sh, blockIdx.x / tiles);
  t.c0 = int(blockIdx.x % tiles) * kKdaOutBV;
  return t;
}

template <int K>
struct KdaOutputSmem {
  static constexpr size_t bytes =
      (size_t(kC) * K + size_t(K) * kKdaOutBV + size_t(kC) * kC + size_t(kC) * kKdaOutBV) * 4;
};

template <class DT, int K, int V>
__global__ void __launch_bounds__(kThreads) kda_output_kernel(KdaChunkParams p) {
  constexpr int BV = kKdaOutBV;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sQg = reinterpret_cast<float*>(smem_raw);
  float* sH = sQg + kC * K;
  float* sA = sH + K * BV;
  float* sVn = sA + kC * kC;

  const KdaIx ix = kda_ix(p.sh);
  const ChunkTileItem it = chunk_tile_item(p, V / BV);
  const int L = it.w.L, j = it.w.j, i = it.w.i, c0 = it.c0;
  const int64_t t0 = it.w.t0, n = it.w.n;

  stage_tile(sQg, K, kC, K, L, [&](int r, int c) {  // [K3] qg
    return DT::rnd(DT::from_raw(p.q[ix.qk(t0 + r, i) + c]) * exp2f(p.gcum[ix.hk(t0 + r, j) + c]));
  });
  stage_tile(sH, BV, K, BV, K, [&](int a, int c) { return DT::from_raw(p.h[ix.kv(n, j) + int64_t(a) * V + c0 + c]); });
  stage_tile(sA, kC, kC, kC, L, [&](int r, int s) { return p.Aqk[ix.cc(t0 + r, j) + s]; });
  stage_tile(sVn, BV, kC, BV, L, [&](int r, int c) { return DT::from_raw(p.v_new[ix.vv(t0 + r, j) + c0 + c]); });
  __syncthreads();
  const float scale = p.sh.scale;
  for (int e = threadIdx.x; e < L * BV; e += blockDim.x) {
    const int r = e / BV, c = e % BV;
    float inter = 0.0f, intra = 0.0f;
    for (int a = 0; a < K; ++a) inter += sQg[r * K + a] * sH[a * BV + c];
    for (int s = 0; s <= r; ++s) intra += sA[r * kC + s] * sVn[s * BV + c];
    store_caller<DT>(p.o, ix.vv(t0 + r, j) + c0 + c, inter * scale + intra);
  }
}

template <int K>
struct KdaLocalDvSmem {
  static constexpr size_t bytes = (size_t(kC) * kC + size_t(kC) * kKdaOutBV) * 4;
};

template <class DT, int K, int V>
__global__ void __launch_bounds__(kThreads) kda_local_dv_kernel(KdaChunkParams p) {
  constexpr int BV = kKdaOutBV;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sA = reinterpret_cast<float*>(smem_raw);
  float* sdO = sA + kC * kC;

  const KdaIx ix = kda_ix(p.sh);
  const ChunkTileItem it = chunk_tile_item(p, V / BV);
  const int L = it.w.L, j = it.w.j, c0 = it.c0;
  const int64_t t0 = it.w.t0;

  stage_tile(sA, kC, kC, kC, L, [&](int r, int s) { return p.Aqk[ix.cc(t0 + r, j) + s]; });
  stage_tile(sdO, BV, kC, BV, L, [&](int r, int c) { return load_caller<DT>(p.dO, ix.vv(t0 + r, j) + c0 + c); });
  __syncthreads();
  for (int e = threadIdx.x; e < L * BV; e += blockDim.x) {  // [B4]
    const int s = e / BV, c = e % BV;
    float acc = 0.0f;
    for (int r = s; r < L; ++r) acc += sA[r * kC + s] * sdO[r * BV + c];
    p.dv_local[ix.vv(t0 + s, j) + c0 + c] = DT::raw(acc);
  }
}

}  // namespace kcp::kernels::cuda
