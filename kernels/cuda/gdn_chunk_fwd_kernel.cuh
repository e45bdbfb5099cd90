// GDN chunk-local products with the intra-chunk score matrix: the output (F5) and the local dv of
// the backward (B2). Included only by gdn_chunk_fwd.cu.
//
// gdn_output_kernel: grid NT * HV, block (chunk n, value head j) = (b / HV, b % HV), 256 threads.
//   P = dtype(tril_incl(q k^T) o exp2(g_r - g_s)) (masked entries selected as 0), inter = q h[n],
//   intra = P v_new (tensor cores, fp32 accumulation), o = dtype(inter exp2(g_r) scale +
//   intra scale) ([G3] of the twin). Shared memory (16-bit): q, k 64 x (K+8); h K x (V+8);
//   v_new 64 x (V+8); P 64 x 72; gates 64 fp32. Staging is one memory round trip: q, k, h, v_new
//   by cp.async (raw bits, rows beyond the chunk zero-filled) in three groups in the order of first
//   use ({q, k}, h, v_new: the scores and inter run while the later tiles land), the gates' loads
//   in flight with them.
//   o leaves through the v_new tile in 16-byte row stores.
// gdn_local_dv_kernel: same grid. P' = dtype((q_r . k_s) exp2(g_r - g_s) scale) for s <= r,
//   dv_local = dtype(P'^T dO) ([B4]), 16-bit storage. Shared memory: q, k 64 x (K+8); dO 64 x (V+8);
//   P' 64 x 72; gates 64 fp32. Staging as the output's: q, k, dO by cp.async, one round trip.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace kcp::kernels::cuda {

struct ChunkParams {
  Shape sh;
  const ChunkDesc* chunks;
  const uint16_t* q;      // [T, H, K] dtype, 16-bit storage
  const uint16_t* k;      // [T, H, K] dtype, 16-bit storage
  const float* gcum;      // [T, HV] fp32 log2
  const uint16_t* h;      // [NT, HV, K, V] dtype, 16-bit storage (output only)
  const uint16_t* v_new;  // [T, HV, V] dtype, 16-bit storage (output only)
  uint16_t* o;            // [T, HV, V] dtype, 16-bit (caller storage; output only)
  const uint16_t* dO;     // [T, HV, V] dtype, 16-bit (caller storage; local dv only)
  uint16_t* dv_local;     // [T, HV, V] dtype, 16-bit storage (local dv only)
};

template <int K, int V>
struct OutputSmem {
  static constexpr int kKld = K + 8, kVld = V + 8, kPld = kC + 8;
  static constexpr size_t bytes =
      (2 * size_t(kC) * kKld + size_t(K) * kVld + size_t(kC) * kVld + size_t(kC) * kPld) * 2 + kC * 4;
};

// Issues the cp.async copies of q, k (rows of the chunk, raw bits; rows beyond it zero-filled)
// and stores the gates (0 beyond the chunk); the gate's load is issued before the copies, so both
// are in flight together. The caller adds its own tiles, then cp_async_commit(),
// cp_async_wait_all() and a barrier.
template <int K>
__device__ __forceinline__ void stage_qk_gates_async(const ChunkParams& p, int64_t t0, int L, int i, int j,
                                                     uint16_t* sq, uint16_t* sk, int ld, float* sG) {
  const int tid = threadIdx.x;
  const float g = tid < L ? p.gcum[(t0 + tid) * p.sh.HV + j] : 0.0f;  // used by tid < kC only
  cp_async_rows<uint16_t, kC, K>(sq, ld, p.q + (t0 * p.sh.H + i) * K, int64_t(p.sh.H) * K, L);
  cp_async_rows<uint16_t, kC, K>(sk, ld, p.k + (t0 * p.sh.H + i) * K, int64_t(p.sh.H) * K, L);
  if (tid < kC) sG[tid] = g;
}

template <class DT, int K, int V>
__global__ void __launch_bounds__(kThreads) gdn_output_kernel(ChunkParams p) {
  using Sm = OutputSmem<K, V>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* sq = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* sk = sq + kC * Sm::kKld;
  uint16_t* sh = sk + kC * Sm::kKld;
  uint16_t* svn = sh + K * Sm::kVld;
  uint16_t* sP = svn + kC * Sm::kVld;
  float* sG = reinterpret_cast<float*>(sP + kC * Sm::kPld);

  const int HV = p.sh.HV;
  const int64_t n = blockIdx.x / HV;
  const int j = blockIdx.x % HV, i = j / p.sh.G;
  const ChunkDesc ch = p.chunks[n];
  const int L = ch.len;
  const int64_t t0 = ch.begin;

  // One memory round trip: q, k, h, v_new by cp.async in three groups in the order of first use,
  // the gates meanwhile. Each product waits only for its own group: the scores start once q and k
  // have landed, inter once h has, while the later tiles are still in flight.
  stage_qk_gates_async<K>(p, t0, L, i, j, sq, sk, Sm::kKld, sG);
  cp_async_commit();  // group 0: the scores q k^T
  cp_async_tile<uint16_t, K, V>(sh, Sm::kVld, p.h + (n * HV + j) * int64_t(K) * V, V, K);
  cp_async_commit();  // group 1: inter = q h
  cp_async_tile<uint16_t, kC, V>(svn, Sm::kVld, p.v_new + (t0 * HV + j) * V, int64_t(HV) * V, L);
  cp_async_commit();  // group 2: intra = P v_new
  cp_async_wait_group<2>();
  __syncthreads();  // q, k, gates
  {
    using T64 = Tiling<kC, kC>;
    float acc[T64::MT][T64::NT][4];
    T64::zero(acc);
    T64::template mma<DT>(acc, AView<uint16_t, true>{sq, Sm::kKld}, BView<uint16_t, true>{sk, Sm::kKld}, 0, K);
    T64::pairs(acc, [&](int r, int s, float& v0, float& v1) {
      const float p0 = (s <= r && r < L) ? v0 * exp2f(sG[r] - sG[s]) : 0.0f;
      const float p1 = (s + 1 <= r && r < L) ? v1 * exp2f(sG[r] - sG[s + 1]) : 0.0f;
      *reinterpret_cast<uint32_t*>(sP + r * Sm::kPld + s) = DT::pack(p0, p1);
    });
  }
  cp_async_wait_group<1>();
  __syncthreads();  // h, P
  using TO = Tiling<kC, V>;
  float inter[TO::MT][TO::NT][4], intra[TO::MT][TO::NT][4];
  TO::zero(inter);
  TO::zero(intra);
  TO::template mma<DT>(inter, AView<uint16_t, true>{sq, Sm::kKld}, BView<uint16_t, false>{sh, Sm::kVld}, 0, K);
  cp_async_wait_all();
  __syncthreads();  // v_new
  TO::template mma<DT>(intra, AView<uint16_t, true>{sP, Sm::kPld}, BView<uint16_t, false>{svn, Sm::kVld}, 0,
                       (L + 15) & ~15);
  const float scale = p.sh.scale;
  // Staged in the v_new tile (after a barrier: every warp has read it) so the rows leave in 16-byte
  // stores (a fragment's 4-byte stores fill half of each 32-byte sector).
  __syncthreads();
  TO::zip_pairs(inter, intra, [&](int r, int c, float& a0, float& a1, float& b0, float& b1) {
    if (r >= L) return;
    const float eg = exp2f(sG[r]);
    st16x2<DT>(svn + r * Sm::kVld + c, a0 * eg * scale + b0 * scale, a1 * eg * scale + b1 * scale);
  });
  __syncthreads();
  store_rows16<V>(p.o + (t0 * HV + j) * V, int64_t(HV) * V, svn, Sm::kVld, L);
}

template <int K, int V>
struct LocalDvSmem {
  static constexpr int kKld = K + 8, kVld = V + 8, kPld = kC + 8;
  static constexpr size_t bytes = (2 * size_t(kC) * kKld + size_t(kC) * kVld + size_t(kC) * kPld) * 2 + kC * 4;
};

template <class DT, int K, int V>
__global__ void __launch_bounds__(kThreads) gdn_local_dv_kernel(ChunkParams p) {
  using Sm = LocalDvSmem<K, V>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* sq = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* sk = sq + kC * Sm::kKld;
  uint16_t* sdO = sk + kC * Sm::kKld;
  uint16_t* sP = sdO + kC * Sm::kVld;
  float* sG = reinterpret_cast<float*>(sP + kC * Sm::kPld);

  const int HV = p.sh.HV;
  const int64_t n = blockIdx.x / HV;
  const int j = blockIdx.x % HV, i = j / p.sh.G;
  const ChunkDesc ch = p.chunks[n];
  const int L = ch.len;
  const int64_t t0 = ch.begin;
  const float scale = p.sh.scale;

  // One memory round trip: q, k, dO by cp.async, the gates meanwhile.
  stage_qk_gates_async<K>(p, t0, L, i, j, sq, sk, Sm::kKld, sG);
  cp_async_rows<uint16_t, kC, V>(sdO, Sm::kVld, p.dO + (t0 * HV + j) * V, int64_t(HV) * V, L);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();
  {
    using T64 = Tiling<kC, kC>;
    float acc[T64::MT][T64::NT][4];
    T64::zero(acc);
    T64::template mma<DT>(acc, AView<uint16_t, true>{sq, Sm::kKld}, BView<uint16_t, true>{sk, Sm::kKld}, 0, K);
    T64::pairs(acc, [&](int r, int s, float& v0, float& v1) {
      const float p0 = (s <= r && r < L) ? v0 * exp2f(sG[r] - sG[s]) * scale : 0.0f;
      const float p1 = (s + 1 <= r && r < L) ? v1 * exp2f(sG[r] - sG[s + 1]) * scale : 0.0f;
      *reinterpret_cast<uint32_t*>(sP + r * Sm::kPld + s) = DT::pack(p0, p1);
    });
  }
  __syncthreads();
  using TO = Tiling<kC, V>;
  float acc[TO::MT][TO::NT][4];
  TO::zero(acc);
  // dv_local[s] = sum_r P'[r][s] dO[r]: A(m = s, k = r) = P'[r][s].
  TO::template mma<DT>(acc, AView<uint16_t, false>{sP, Sm::kPld}, BView<uint16_t, false>{sdO, Sm::kVld}, 0,
                       (L + 15) & ~15);
  // Staged in the dO tile so the rows leave in 16-byte stores (a fragment's 4-byte stores fill
  // half of each 32-byte sector).
  __syncthreads();
  TO::pairs(acc, [&](int s, int c, float& v0, float& v1) {
    *reinterpret_cast<uint32_t*>(sdO + s * Sm::kVld + c) = DT::pack(v0, v1);
  });
  __syncthreads();
  store_rows16<V>(p.dv_local + (t0 * HV + j) * V, int64_t(HV) * V, sdO, Sm::kVld, L);
}

// The parameters from the phases' Args (host); the KDA kernels' extend them by Aqk. Both phases
// read the layout, q, k and the gate cumsum.
template <class Args>
inline ChunkParams chunk_params(const Args& a, const DevLayout& L) {
  ChunkParams p{};
  p.sh = shape_of(a.ctx.problem, L);
  p.chunks = L.chunks;
  p.q = a.q.packed16();
  p.k = a.k.packed16();
  p.gcum = a.gcum;
  return p;
}
inline ChunkParams output_params(const FwdOutputArgs& a, const DevLayout& L) {
  ChunkParams p = chunk_params(a, L);
  p.h = a.h.packed16();
  p.v_new = a.v_new.packed16();
  p.o = a.o.packed16();
  return p;
}
inline ChunkParams local_dv_params(const BwdLocalDvArgs& a, const DevLayout& L) {
  ChunkParams p = chunk_params(a, L);
  p.dO = a.dO.packed16();
  p.dv_local = a.dv_local.packed16();
  return p;
}

}  // namespace kcp::kernels::cuda
