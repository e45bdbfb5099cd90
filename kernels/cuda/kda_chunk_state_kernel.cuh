// KDA state walks over the chunks of a segment (docs/algorithm.md F4, 4.2, B3, 4.3), the CPU
// twin's chunk_state.cpp fwd_walk / bwd_walk with per-channel gates ([S1]-[S5], [B1]-[B3]).
// Included only by kda_chunk_state.cu.
//
// Both kernels: one block per (segment s, value head j, tile), b -> (b / (tiles HV),
// (b / tiles) % HV, b % tiles), kThreads, tiles of kBV = 32 columns as the GDN walks (tiles.h),
// whose parameters (FwdWalkParams, BwdWalkParams) they take, extended by kg.
// The tile of the carried state (or of M) lives in fp32 shared memory; each output element is
// one thread's sequential fp32 sum.
// kda_fwd_walk_kernel<DT, K, V, STATES>: tiles [0, V/32) are state tiles S[:, c0 : c0 + 32]; in
//   summary mode (STATES = false) tiles [V/32, V/32 + K/32) are transfer tiles M[:, c0 : c0 + 32].
//   Per chunk, first to last:
//     state tile:  Sb = dtype(S) (-> h[n]); vr = U - W Sb (sum over K ascending, then U - sum);
//                  v_new = dtype(vr); S <- S Gam + kg^T dtype(vr) (sum over rows ascending)
//                  -- the twin's [S1]-[S3] in the twin's order;
//     M tile:      R = W M (fp32 M), M <- Gam M - kg^T R: the twin's M_c M = (Diag(Gam) - kg^T W) M
//                  reassociated ([S4]; fp32 throughout, the chain is never rounded, 7.2).
//   Summary mode writes seg_h_ext (from S = 0) and seg_Mt = M^T (from M = I); a block whose part
//   nobody reads (kernels/api/summary_needs.h) writes zeros and returns before the walk. STATES
//   mode starts from seg_entry and writes h, v_new and ht (the piece's last segment).
//   Shared memory (fp32): W, kg 64 x K; U, vr 64 x 32; S, Sb K x 32; Gam K.
// kda_bwd_walk_kernel<DT, K, V, STATES>: tiles of dS[:, c0 : c0 + 32], chunks last to first:
//     dSb = dtype(dS) (-> dh[n]); dv2 = dtype(kg dSb + dv_local);
//     dS <- dS Gam + (qs^T dO - W^T dv2), qs = dtype((q scale) exp2(g))      ([B1]-[B3])
//   Summary mode starts from 0 and writes seg_dh_ext (zeros, without the walk, where nobody reads
//   it); STATES mode starts from seg_exit and writes dh, dv2 and dh0 (first segment of a piece).
//   Shared memory (fp32): kg, qs, W 64 x K; dO, dv_local, dv2 64 x 32; dS, dSb K x 32; Gam K.
// Rows beyond a partial chunk are staged as zeros and never summed over.
#pragma once

#include "kernels/cuda/gdn_chunk_state_kernel.cuh"  // FwdWalkParams, BwdWalkParams, kBV, zero_tile
#include "kernels/cuda/kda_common.cuh"

namespace kcp::kernels::cuda {

// The GDN walks' parameters (gdn_chunk_state_kernel.cuh) plus the gated keys; k is unused.
struct KdaFwdWalkParams : FwdWalkParams {
  const float* kg;  // [T, HV, K] dtype
};
struct KdaBwdWalkParams : BwdWalkParams {
  const float* kg;  // [T, HV, K] dtype
};
template <class Kda, class Base>
Kda with_kg(const Base& base, const float* kg) {
  Kda p{};
  static_cast<Base&>(p) = base;
  p.kg = kg;
  return p;
}

template <int K>
struct KdaFwdWalkSmem {
  static constexpr size_t bytes = (2 * size_t(kC) * K + 2 * size_t(kC) * kBV + 2 * size_t(K) * kBV + K) * 4;
};

// Every element (row, col) of a rows x kBV tile, spread over the block (the same thread for
// the same element in every call).
template <class F>
__device__ __forceinline__ void each_tile_elem(int rows, F&& f) {
  for (int e = threadIdx.x; e < rows * kBV; e += blockDim.x) f(e / kBV, e % kBV);
}

template <class DT, int K, int V, bool STATES>
__global__ void __launch_bounds__(kThreads) kda_fwd_walk_kernel(KdaFwdWalkParams p) {
  constexpr int BV = kBV;
  constexpr int NVT = V / BV;
  constexpr int NTILES = STATES ? NVT : NVT + K / BV;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sW = reinterpret_cast<float*>(smem_raw);
  float* skg = sW + kC * K;
  float* sU = skg + kC * K;
  float* sR = sU + kC * BV;  // vr (state tiles) or R = W M (transfer tiles)
  float* sS = sR + kC * BV;  // the carried tile, fp32
  float* sSb = sS + K * BV;  // dtype(S)
  float* sGam = sSb + K * BV;

  const KdaIx ix = kda_ix(p.sh);
  const int HV = p.sh.HV;
  const int tile = blockIdx.x % NTILES;
  const int j = (blockIdx.x / NTILES) % HV;
  const int s = blockIdx.x / (NTILES * HV);
  const bool mtile = tile >= NVT;
  const int c0 = (mtile ? tile - NVT : tile) * BV;
  const SegmentDesc seg = p.segments[s];
  if constexpr (!STATES) {
    const SummaryNeeds need = summary_needs(p.pieces, p.sh.N, seg, p.has_h0, p.has_dht);
    if (mtile ? !need.M : !need.h_ext) {  // uniform over the block: before any barrier
      if (mtile)
        zero_tile(p.seg_Mt + ix.kk(s, j) + int64_t(c0) * K, K, BV, K);
      else
        zero_tile(p.seg_h_ext + ix.kv(s, j) + c0, V, K, BV);
      return;
    }
  }

  if constexpr (STATES) {
    const float* entry = p.seg_entry + ix.kv(s, j);
    each_tile_elem(K, [&](int a, int c) { sS[a * BV + c] = entry[int64_t(a) * V + c0 + c]; });
  } else {
    each_tile_elem(K, [&](int a, int c) { sS[a * BV + c] = (mtile && a == c0 + c) ? 1.0f : 0.0f; });
  }

  for (int64_t n = seg.chunk_begin; n < seg.chunk_end; ++n) {
    const ChunkDesc ch = p.chunks[n];
    const int L = ch.len;
    const int64_t t0 = ch.begin;
    __syncthreads();  // the previous chunk is done with every tile
    stage_tile(sW, K, kC, K, L, [&](int r, int a) { return DT::from_raw(p.W[ix.hk(t0 + r, j) + a]); });
    stage_tile(skg, K, kC, K, L, [&](int r, int a) { return p.kg[ix.hk(t0 + r, j) + a]; });
    if (threadIdx.x < K) sGam[threadIdx.x] = exp2f(p.gcum[ix.hk(t0 + L - 1, j) + threadIdx.x]);
    if (!mtile) {
      stage_tile(sU, BV, kC, BV, L, [&](int r, int c) { return DT::from_raw(p.U[ix.vv(t0 + r, j) + c0 + c]); });
      each_tile_elem(K, [&](int a, int c) {  // [S1]
        const float b = DT::rnd(sS[a * BV + c]);
        sSb[a * BV + c] = b;
        if constexpr (STATES) p.h[ix.kv(n, j) + int64_t(a) * V + c0 + c] = DT::raw(b);
      });
    }
    __syncthreads();
    if (!mtile) {
      each_tile_elem(L, [&](int r, int c) {  // [S2]
        float acc = 0.0f;
        for (int a = 0; a < K; ++a) acc += sW[r * K + a] * sSb[a * BV + c];
        const float vr = sU[r * BV + c] - acc;
        if constexpr (STATES) p.v_new[ix.vv(t0 + r, j) + c0 + c] = DT::raw(vr);
        sR[r * BV + c] = DT::rnd(vr);  // [S3] the update operand
      });
      __syncthreads();
      each_tile_elem(K, [&](int a, int c) {  // [S3]
        float upd = 0.0f;
        for (int r = 0; r < L; ++r) upd += skg[r * K + a] * sR[r * BV + c];
        sS[a * BV + c] = sS[a * BV + c] * sGam[a] + upd;
      });
    } else {
      each_tile_elem(L, [&](int r, int c) {  // [S4] R = W M
        float acc = 0.0f;
        for (int m = 0; m < K; ++m) acc += sW[r * K + m] * sS[m * BV + c];
        sR[r * BV + c] = acc;
      });
      __syncthreads();
      each_tile_elem(K, [&](int a, int c) {  // M <- Gam M - kg^T R
        float acc = 0.0f;
        for (int r = 0; r < L; ++r) acc += skg[r * K + a] * sR[r * BV + c];
        sS[a * BV + c] = sGam[a] * sS[a * BV + c] - acc;
      });
    }
  }
  __syncthreads();

  if constexpr (STATES) {
    const PieceDesc pc = p.pieces[seg.piece];
    if (p.ht && s + 1 == pc.seg_end) {  // [S5]
      float* o = p.ht + ix.kv(seg.piece, j);
      each_tile_elem(K, [&](int a, int c) { o[int64_t(a) * V + c0 + c] = sS[a * BV + c]; });
    }
  } else if (!mtile) {
    float* o = p.seg_h_ext + ix.kv(s, j);
    each_tile_elem(K, [&](int a, int c) { o[int64_t(a) * V + c0 + c] = sS[a * BV + c]; });
  } else {
    float* o = p.seg_Mt + ix.kk(s, j);  // M^T: o[b * K + a] = M[a][b]
    for (int e = threadIdx.x; e < BV * K; e += blockDim.x) {
      const int c = e / K, a = e % K;
      o[int64_t(c0 + c) * K + a] = sS[a * BV + c];
    }
  }
}

template <int K>
struct KdaBwdWalkSmem {
  static constexpr size_t bytes = (3 * size_t(kC) * K + 3 * size_t(kC) * kBV + 2 * size_t(K) * kBV + K) * 4;
};

template <class DT, int K, int V, bool STATES>
__global__ void __launch_bounds__(kThreads) kda_bwd_walk_kernel(KdaBwdWalkParams p) {
  constexpr int BV = kBV;
  constexpr int NTILES = V / BV;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* skg = reinterpret_cast<float*>(smem_raw);
  float* sQs = skg + kC * K;
  float* sW = sQs + kC * K;
  float* sdO = sW + kC * K;
  float* sdl = sdO + kC * BV;
  float* sdv2 = sdl + kC * BV;
  float* sdS = sdv2 + kC * BV;
  float* sdSb = sdS + K * BV;
  float* sGam = sdSb + K * BV;

  const KdaIx ix = kda_ix(p.sh);
  const int HV = p.sh.HV;
  const int tile = blockIdx.x % NTILES;
  const int j = (blockIdx.x / NTILES) % HV, i = j / p.sh.G;
  const int s = blockIdx.x / (NTILES * HV);
  const int c0 = tile * BV;
  const SegmentDesc seg = p.segments[s];
  const float scale = p.sh.scale;
  if constexpr (!STATES) {
    if (!summary_needs(p.pieces, p.sh.N, seg, p.has_h0, p.has_dht).dh_ext) {  // uniform: before any barrier
      zero_tile(p.seg_dh_ext + ix.kv(s, j) + c0, V, K, BV);
      return;
    }
  }

  if constexpr (STATES) {
    const float* ex = p.seg_exit + ix.kv(s, j);
    each_tile_elem(K, [&](int a, int c) { sdS[a * BV + c] = ex[int64_t(a) * V + c0 + c]; });
  } else {
    each_tile_elem(K, [&](int a, int c) { sdS[a * BV + c] = 0.0f; });
  }

  for (int64_t n = seg.chunk_end - 1; n >= seg.chunk_begin; --n) {
    const ChunkDesc ch = p.chunks[n];
    const int L = ch.len;
    const int64_t t0 = ch.begin;
    __syncthreads();
    stage_tile(skg, K, kC, K, L, [&](int r, int a) { return p.kg[ix.hk(t0 + r, j) + a]; });
    stage_tile(sW, K, kC, K, L, [&](int r, int a) { return DT::from_raw(p.W[ix.hk(t0 + r, j) + a]); });
    stage_tile(sQs, K, kC, K, L, [&](int r, int a) {  // [B3] operand qs
      const float qv = DT::from_raw(p.q[ix.qk(t0 + r, i) + a]);
      return DT::rnd((qv * scale) * exp2f(p.gcum[ix.hk(t0 + r, j) + a]));
    });
    stage_tile(sdO, BV, kC, BV, L, [&](int r, int c) { return load_caller<DT>(p.dO, ix.vv(t0 + r, j) + c0 + c); });
    stage_tile(sdl, BV, kC, BV, L, [&](int r, int c) { return DT::from_raw(p.dv_local[ix.vv(t0 + r, j) + c0 + c]); });
    if (threadIdx.x < K) sGam[threadIdx.x] = exp2f(p.gcum[ix.hk(t0 + L - 1, j) + threadIdx.x]);
    each_tile_elem(K, [&](int a, int c) {  // [B1]
      const float b = DT::rnd(sdS[a * BV + c]);
      sdSb[a * BV + c] = b;
      if constexpr (STATES) p.dh[ix.kv(n, j) + int64_t(a) * V + c0 + c] = DT::raw(b);
    });
    __syncthreads();
    each_tile_elem(L, [&](int r, int c) {  // [B2]
      float acc = 0.0f;
      for (int a = 0; a < K; ++a) acc += skg[r * K + a] * sdSb[a * BV + c];
      const float x = DT::rnd(acc + sdl[r * BV + c]);
      sdv2[r * BV + c] = x;
      if constexpr (STATES) p.dv2[ix.vv(t0 + r, j) + c0 + c] = DT::raw(x);
    });
    __syncthreads();
    each_tile_elem(K, [&](int a, int c) {  // [B3]
      float p1 = 0.0f, p2 = 0.0f;
      for (int r = 0; r < L; ++r) {
        p1 += sQs[r * K + a] * sdO[r * BV + c];
        p2 += sW[r * K + a] * sdv2[r * BV + c];
      }
      sdS[a * BV + c] = sdS[a * BV + c] * sGam[a] + (p1 - p2);
    });
  }
  __syncthreads();

  float* o = nullptr;
  if constexpr (STATES) {
    if (p.dh0 && seg.index_in_piece == 0) o = p.dh0 + ix.kv(seg.piece, j);
  } else {
    o = p.seg_dh_ext + ix.kv(s, j);
  }
  if (o) each_tile_elem(K, [&](int a, int c) { o[int64_t(a) * V + c0 + c] = sdS[a * BV + c]; });
}

}  // namespace kcp::kernels::cuda
