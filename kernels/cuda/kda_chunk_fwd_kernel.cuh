// KDA chunk-local products with the stored score matrix Aqk: the output (F5, the CPU twin's
// kda_output [K3]) and the local dv of the backward (3.2 step 2, chunk_state.cpp bwd_local_dv
// [B4]). Included only by kda_chunk_fwd.cu.
//
// Both kernels: grid NT * HV, block (chunk n, value head j) = (b / HV, b % HV), kThreads (8 warps,
// Tiling<64, V>: a warp per 16 rows and V / 2 columns), all V columns in one block (as
// gdn_output_kernel, gdn_local_dv_kernel). Tensor cores (mma.sync m16n8k16, 16-bit operands, fp32
// accumulation): every operand is a dtype value (Aqk is stored as fp32 words holding dtype values,
// converted exactly to 16 bits while staged), so the products are exact and the kernels differ
// from the twin only by the order of the fp32 sums. Aqk is staged as tril_incl(Aqk): entries
// above the diagonal are selected as 0 (whatever the buffer holds there), rows >= L of a partial
// chunk are zeros, never read; so are the rows >= L of q, the gates, v_new and dO. Rows >= L are
// never written. Results leave through shared memory in 16-byte row stores.
// kda_output_kernel: qg = dtype(q exp2(g)) (per channel, exponent <= 0; formed while q is stored to
//   shared memory), inter = qg h[n] (over K), intra = tril_incl(Aqk) v_new (over s < L; a warp
//   stops at its last row block, the terms beyond are zeros), o = dtype(scale inter + intra).
//   Shared memory (16-bit, ldmatrix rows): qg 64 x (K+8); h K x (V+8); v_new 64 x (V+8), reused
//   for o; Aqk 64 x 72 (K = V = 128: 78,848 bytes, two blocks per SM). h and v_new arrive by
//   cp.async while q, the gates and Aqk pass through registers.
// kda_local_dv_kernel: dv_local = dtype(tril_incl(Aqk)^T dO), i.e. dv_local[s] =
//   dtype(sum_{r = s}^{L-1} Aqk[r][s] dO[r]) (a warp starts at its first row block, the terms
//   before are zeros), 16-bit storage. Shared memory (16-bit): dO 64 x (V+8), reused for dv_local;
//   Aqk 64 x 72 (V = 128: 26,624 bytes).
#pragma once

#include "kernels/cuda/gdn_chunk_fwd_kernel.cuh"  // ChunkParams
#include "kernels/cuda/kda_common.cuh"

namespace kcp::kernels::cuda {

// The GDN parameters (gdn_chunk_fwd_kernel.cuh: q, gcum, h, v_new, o; dO, dv_local) plus Aqk.
struct KdaChunkParams : ChunkParams {
  const float* Aqk;  // [T, HV, 64] dtype
};

// tril_incl(Aqk) of a chunk as a 16-bit operand tile (64 x 64, row r = token t0 + r): load()
// issues the fp32 loads (rows >= L are zeros, never read), store() converts them exactly and
// selects 0 above the diagonal.
struct AqkTile {
  Tile<kC, kC> t;
  __device__ __forceinline__ void load(const KdaChunkParams& p, const KdaIx& ix, const ChunkItem& w) {
    t.load(p.Aqk + ix.cc(w.t0, w.j), ix.HV * kC, w.L);
  }
  template <class DT>
  __device__ __forceinline__ void store(uint16_t* dst, int ld) const {
    t.template store_rc<DT>(dst, ld, [](int r, int s, float x) { return s <= r ? x : 0.0f; });
  }
};

template <int K, int V>
struct KdaOutputSmem {
  static constexpr int kKld = K + 8, kVld = V + 8, kCld = kC + 8;  // ldmatrix rows (cuda_common.cuh)
  static constexpr size_t bytes = (size_t(kC) * kKld + size_t(K) * kVld + size_t(kC) * kVld + size_t(kC) * kCld) * 2;
};

template <class DT, int K, int V>
__global__ void __launch_bounds__(kThreads) kda_output_kernel(KdaChunkParams p) {
  using Sm = KdaOutputSmem<K, V>;
  using TO = Tiling<kC, V>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* sqg = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* sh = sqg + kC * Sm::kKld;
  uint16_t* svn = sh + K * Sm::kVld;
  uint16_t* sA = svn + kC * Sm::kVld;

  const KdaIx ix = kda_ix(p.sh);
  const ChunkItem w = chunk_item(p.chunks, p.sh, blockIdx.x);
  const int L = w.L, j = w.j, i = w.i;
  const int64_t t0 = w.t0, n = w.n;
  const int64_t ldv = int64_t(p.sh.HV) * V;

  cp_async_rows<uint16_t, K, V>(sh, Sm::kVld, p.h + ix.kv(n, j), V, K);
  cp_async_rows<uint16_t, kC, V>(svn, Sm::kVld, p.v_new + ix.vv(t0, j), ldv, L);
  cp_async_commit();
  Tile16<kC, K> tq;
  GateTile16<kC, K> tg;
  AqkTile ta;
  tq.load(p.q + ix.qk(t0, i), int64_t(p.sh.H) * K, L);
  tg.load(p.gcum + ix.hk(t0, j), int64_t(p.sh.HV) * K, L);
  ta.load(p, ix, w);
  // [K3] qg = dtype(q exp2(g)) per channel.
  tq.template store_by_elem<DT>(sqg, Sm::kKld, [&](int it, int, int u, float x) { return x * exp2f(tg.at(it, u)); });
  ta.template store<DT>(sA, Sm::kCld);
  cp_async_wait_all();
  __syncthreads();

  float inter[TO::MT][TO::NT][4], intra[TO::MT][TO::NT][4];
  TO::zero(inter);
  TO::zero(intra);
  TO::template mma<DT>(inter, AView<uint16_t, true>{sqg, Sm::kKld}, BView<uint16_t, false>{sh, Sm::kVld}, 0, K);
  // Columns s > r of the warp's rows are zeros: stop after its last row block (and at L).
  const int ke = min((L + 15) & ~15, TO::m0() + TO::MT * 16);
  TO::template mma<DT>(intra, AView<uint16_t, true>{sA, Sm::kCld}, BView<uint16_t, false>{svn, Sm::kVld}, 0, ke);
  __syncthreads();  // every warp has read v_new: o goes to its tile
  const float scale = p.sh.scale;
  TO::zip_pairs(inter, intra, [&](int r, int c, float& a0, float& a1, float& b0, float& b1) {
    *reinterpret_cast<uint32_t*>(svn + r * Sm::kVld + c) = DT::pack(a0 * scale + b0, a1 * scale + b1);
  });
  __syncthreads();
  store_rows16<V>(p.o + ix.vv(t0, j), ldv, svn, Sm::kVld, L);
}

template <int V>
struct KdaLocalDvSmem {
  static constexpr int kVld = V + 8, kCld = kC + 8;  // ldmatrix rows (cuda_common.cuh)
  static constexpr size_t bytes = (size_t(kC) * kVld + size_t(kC) * kCld) * 2;
};

template <class DT, int K, int V>
__global__ void __launch_bounds__(kThreads) kda_local_dv_kernel(KdaChunkParams p) {
  using Sm = KdaLocalDvSmem<V>;
  using TO = Tiling<kC, V>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* sdO = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* sA = sdO + kC * Sm::kVld;

  const KdaIx ix = kda_ix(p.sh);
  const ChunkItem w = chunk_item(p.chunks, p.sh, blockIdx.x);
  const int L = w.L, j = w.j;
  const int64_t t0 = w.t0;
  const int64_t ldv = int64_t(p.sh.HV) * V;

  cp_async_rows<uint16_t, kC, V>(sdO, Sm::kVld, p.dO + ix.vv(t0, j), ldv, L);
  cp_async_commit();
  AqkTile ta;
  ta.load(p, ix, w);
  ta.template store<DT>(sA, Sm::kCld);
  cp_async_wait_all();
  __syncthreads();

  float acc[TO::MT][TO::NT][4];
  TO::zero(acc);
  // [B4] dv_local[s] = sum_r Aqk[r][s] dO[r]: A(m = s, k = r) = Aqk[r][s], zero for r < s, so a
  // warp starts at its first row block.
  TO::template mma<DT>(acc, AView<uint16_t, false>{sA, Sm::kCld}, BView<uint16_t, false>{sdO, Sm::kVld}, TO::m0(),
                       (L + 15) & ~15);
  __syncthreads();  // every warp has read dO: dv_local goes to its tile
  TO::pairs(acc, [&](int s, int c, float& v0, float& v1) {
    *reinterpret_cast<uint32_t*>(sdO + s * Sm::kVld + c) = DT::pack(v0, v1);
  });
  __syncthreads();
  store_rows16<V>(p.dv_local + ix.vv(t0, j), ldv, sdO, Sm::kVld, L);
}

}  // namespace kcp::kernels::cuda
