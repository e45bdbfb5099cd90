// The forward walk's state tiles (fwd_states, and fwd_summaries' h_ext tiles) with both products'
// A operand in registers, the technique of tests/gpu/walk_step_bench.cu's walk_step_rs_kernel
// (docs/perf-notes.md session 26): the consumer warpgroup holds the transposed tile S^T (the
// block's 64 value columns x K keys, K / 64 m64n64 fp32 accumulators) and per chunk
//   Sb^T = dtype(S^T), as A words in registers (-> h[n]: per-warp stmatrix.trans + TMA store);
//   v^T  = Sb^T W^T           (A: registers, B: the stage's W, K-major);
//   vr^T = U^T - v^T           (U^T by ldmatrix.trans from the stage); v_new = dtype(vr) (per-warp
//                              stmatrix.trans + TMA store of a full chunk, plain stores of the
//                              tokens < L of a partial one);
//   vs^T = dtype(vr^T exp2(gL - g_c)) (KDA: dtype(vr^T)), tokens c >= L zero, as A words;
//   S^T  = Gam S^T + vs^T k    (A: registers, B: the stage's k (KDA: kg), MN-major; GDN Gam =
//                              exp2(gL), KDA per key channel: a column factor of S^T).
// Rounding points [S1]-[S4] of the CPU twin (gdn_chunk_state_kernel.cuh's header gives the
// formulas): Sb, v_new and vs are rounded to the dtype from the same fp32 expressions as the
// mma.sync walk, and the products take the same 16-bit operands with fp32 accumulation in k16
// steps over whole chunks (the shared-memory consumer this replaced, gone after 00bc928, gave the
// same output bits: docs/perf-notes.md session 26). Nothing of the recurrence passes through
// shared memory, so a step has no proxy fence and no consumer barrier (a partial chunk's zeroed
// k rows take one). Shared memory: the stages as before; the X0 region holds the four warps' h staging
// (K rows x 16 values each, 32-byte rows, unswizzled: the box of map hs) and the Y1 region their
// v_new staging (64 tokens x 16 values: map vns). Included only by gdn_walk_wgmma.cuh.
#pragma once

namespace kcp::kernels::cuda::walk_wg {

// The k16 column slices of a 64 x 64 accumulator d as wgmma A words, rounded to DT: slice kk of d
// goes to a[kk0 + kk] (wgmma_64x64x16_rs's word order).
template <class DT, int N>
__device__ __forceinline__ void acc_to_a(const float (&d)[32], uint32_t (&a)[N][4], int kk0) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int q = 0; q < 4; ++q) a[kk0 + kk][q] = DT::pack(d[8 * kk + 2 * q], d[8 * kk + 2 * q + 1]);
}

// The shared address lane `lane` gives to an x4 ldmatrix / stmatrix of fragment words 4 q .. 4 q
// + 3 (word x = 2 nt + h: column block nt, row half h of the warp's 16 fragment rows): matrix m =
// lane / 8 is column block 2 q + m / 2 = 8 stored rows, row half m % 2 = 8 stored columns from
// col0 + 8 (m % 2); at(stored_row, stored_col) is the layout.
template <class At>
__device__ __forceinline__ uint32_t x4_addr(int q, int col0, At at) {
  const int lane = int(threadIdx.x) & 31, m = lane >> 3;
  return at(8 * (2 * q + (m >> 1)) + (lane & 7), col0 + 8 * (m & 1));
}

// A warp's unswizzled staging tile of 16 values a row (32-byte rows).
__device__ __forceinline__ auto staged(uint32_t tile) {
  return [tile](int r, int c) { return tile + uint32_t(r * 32 + c * 2); };
}

// h[n] = Sb (a = Sb^T's A words) through the warp's staging tile at hst: rows = keys.
template <int K>
__device__ __forceinline__ void store_h_rs(const uint32_t (&a)[K / 16][4], uint32_t hst, const CUtensorMap* hs,
                                           const Blk& b, int64_t n, int HV) {
  const int lane = int(threadIdx.x) & 31, w = int(threadIdx.x) >> 5;
  if (lane == 0) bulk_wait_read();  // this warp's previous stores have read its staging
  __syncwarp();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) stsm_x4_trans(x4_addr(0, 0, staged(hst)) + kk * 16 * 32, a[kk]);
  fence_proxy_async();
  __syncwarp();
  if (lane == 0) tma_store_3d(hs, hst, b.c0 + 16 * w, 0, int(n * HV + b.j));
}

// A chunk's 16-bit output rows (v_new or dv2; words w: x = 2 nt + h, transposed pairs of tokens 8
// nt + 2 (lane % 4), +1): a full chunk through the warp's staging tile at vst and one TMA store
// (map: boxes of 16 values), a partial one by plain stores of its tokens < L into dst ([T, HV, K]
// of value head j, K = V).
template <int K>
__device__ __forceinline__ void store_rows_rs(const uint32_t (&w)[16], uint32_t vst, const CUtensorMap* map,
                                              uint16_t* dst, int HV, const Blk& b, const ChunkHdr& hd) {
  const int t = int(threadIdx.x) & 127, lane = t & 31, wp = t >> 5;  // (either consumer warpgroup)
  if (hd.len == kC) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t r4[4] = {w[4 * q], w[4 * q + 1], w[4 * q + 2], w[4 * q + 3]};
      stsm_x4_trans(x4_addr(q, 0, staged(vst)), r4);
    }
    fence_proxy_async();
    __syncwarp();
    if (lane == 0) tma_store_3d(map, vst, b.c0 + 16 * wp, b.j, int(hd.begin));
    return;
  }
  uint16_t* o = dst + (hd.begin * HV + b.j) * K + b.c0;
  const int64_t ts = int64_t(HV) * K;
#pragma unroll
  for (int x = 0; x < 16; ++x) {
    const int nt = x >> 1, h = x & 1, c = 8 * nt + 2 * (lane & 3), r = frag_row(t, 4 * nt + 2 * h);
    if (c < hd.len) o[c * ts + r] = uint16_t(w[x] & 0xffffu);
    if (c + 1 < hd.len) o[(c + 1) * ts + r] = uint16_t(w[x] >> 16);
  }
}

// The chunk's v^T epilogue: vr = U - v (U^T words u), v_new words vn, the update's A words vs
// (dtype(vr exp2(gL - g_c)), KDA dtype(vr); tokens c >= L zero).
template <class DT, bool KDA>
__device__ __forceinline__ void epilogue_rs(const float (&v)[32], const uint32_t (&u)[16], const float* g, float gL,
                                            int L, uint32_t (&vn)[16], uint32_t (&vs)[4][4]) {
  const int t4 = int(threadIdx.x) & 3;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    const int c = 8 * nt + 2 * t4;
    float f0 = 1.0f, f1 = 1.0f;
    if constexpr (!KDA) {
      f0 = exp2f(gL - g[c]);  // g: 0 beyond L (the producer's gates), masked below
      f1 = exp2f(gL - g[c + 1]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = 4 * nt + 2 * h, x = 2 * nt + h;
      const float x0 = DT::from_raw(uint16_t(u[x] & 0xffffu)) - v[e];
      const float x1 = DT::from_raw(uint16_t(u[x] >> 16)) - v[e + 1];
      vn[x] = DT::pack(x0, x1);
      const float y0 = c < L ? (KDA ? x0 : x0 * f0) : 0.0f, y1 = c + 1 < L ? (KDA ? x1 : x1 * f1) : 0.0f;
      vs[x >> 2][x & 3] = DT::pack(y0, y1);
    }
  }
}

// S^T <- Gam S^T [+ A0 B0] + Y^T B1 per 64-key block a, the terms in this order: A0 (64 x 64 at a0,
// MN-major: dO^T) and B0, B1 (the stage's 64 tokens x K tiles at b0, b1, MN-major; block a at + a
// kAtom) from shared memory, Y^T (64 x 64 tokens) as A words. Forward: Y = vs, B1 = k (KDA: kg);
// backward (SMEM_TERM): A0 = dO^T, B0 = qs, Y = -dv2, B1 = W. Gam: `gam` (GDN) or per key gk[64 a
// + column] (KDA).
template <bool F16, int K, bool KDA, bool SMEM_TERM>
__device__ __forceinline__ void update_rs(float (&sT)[K / 64][32], const uint32_t (&y)[4][4], uint32_t b1, uint32_t a0,
                                          uint32_t b0, float gam, const float* gk) {
  const int t = int(threadIdx.x);
#pragma unroll
  for (int a = 0; a < K / 64; ++a) {
#pragma unroll
    for (int x = 0; x < 32; ++x) sT[a][x] *= KDA ? gk[64 * a + frag_col(t, x)] : gam;
    fence_acc(sT[a]);
  }
  wgmma_fence();
#pragma unroll
  for (int a = 0; a < K / 64; ++a) {
    if constexpr (SMEM_TERM) {
#pragma unroll
      for (int kk = 0; kk < kC / 16; ++kk)
        wgmma_64x64x16<F16, 1, 1>(sT[a], desc_mn(a0, kk), desc_mn(b0 + a * kAtom, kk), 1);
    }
#pragma unroll
    for (int kk = 0; kk < kC / 16; ++kk) wgmma_64x64x16_rs<F16, 1>(sT[a], y[kk], desc_mn(b1 + a * kAtom, kk), 1);
  }
  wgmma_commit();
  wgmma_wait();
#pragma unroll
  for (int a = 0; a < K / 64; ++a) fence_acc(sT[a]);
}

// A chunk's start: X^T = dtype(S^T) as A words (the K / 16 key slices), with STORE also the
// 16-bit state of chunk n (h / dh) through the warp's staging tile at hst (map: boxes of 16
// values); then v^T = X^T A^T issued (B: the stage's 64 tokens x K tile at `tile`, K-major: W,
// or the backward's k); wait_acc completes it.
template <class DT, int K, bool STORE>
__device__ __forceinline__ void start_chunk_rs(const float (&sT)[K / 64][32], uint32_t (&a)[K / 16][4], float (&v)[32],
                                               uint32_t hst, const CUtensorMap* map, const Blk& b, int64_t n, int HV,
                                               uint32_t full, uint32_t parity, uint32_t tile) {
#pragma unroll
  for (int kb = 0; kb < K / 64; ++kb) acc_to_a<DT>(sT[kb], a, 4 * kb);
  if constexpr (STORE) store_h_rs<K>(a, hst, map, b, n, HV);
  mbar_wait(full, parity);
  fence_acc(v);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    wgmma_64x64x16_rs<std::is_same_v<DT, Fp16>, 0>(v, a[kk], desc_k(tile + (kk / 4) * kAtom, kk % 4), kk > 0);
  wgmma_commit();
}

// The transposed tile at the start: from e (a K x K fp32 matrix), or zeros for e null.
template <int K>
__device__ __forceinline__ void init_rs(float (&sT)[K / 64][32], const float* e, int c0) {
  const int t = int(threadIdx.x);
#pragma unroll
  for (int a = 0; a < K / 64; ++a)
#pragma unroll
    for (int x = 0; x < 32; ++x) sT[a][x] = e ? e[int64_t(64 * a + frag_col(t, x)) * K + c0 + frag_row(t, x)] : 0.0f;
}
// The transposed tile into o (a K x K fp32 matrix: o[key * K + c0 + column]); nothing for o null.
template <int K>
__device__ __forceinline__ void store_tile_rs(const float (&sT)[K / 64][32], float* o, int c0) {
  if (!o) return;
  const int t = int(threadIdx.x);
#pragma unroll
  for (int a = 0; a < K / 64; ++a)
#pragma unroll
    for (int x = 0; x < 32; ++x) o[int64_t(64 * a + frag_col(t, x)) * K + c0 + frag_row(t, x)] = sT[a][x];
}

// The transposed words (x = 2 nt + h, as store_rows_rs) of a 64 x 64 stage tile at `tile` (rows =
// tokens, swizzled; U, dv_local) for the warp's 16 columns.
__device__ __forceinline__ void load_t_words(uint32_t (&u)[16], uint32_t tile) {
  const int w = int(threadIdx.x) >> 5;
  auto at = [tile](int r, int c) { return tile + swz(r, c); };
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    uint32_t r4[4];
    ldsm_x4_trans(r4, x4_addr(q, 16 * w, at));
#pragma unroll
    for (int x = 0; x < 4; ++x) u[4 * q + x] = r4[x];
  }
}

// The consumer warpgroup's forward walk of a state tile with A operands in registers.
template <class DT, int K, bool STATES, bool KDA>
__device__ __forceinline__ void consume_rs(const Maps& maps, const FwdWalkParams& p, const Blk& b, uint32_t base,
                                           unsigned char* sb) {
  using Sm = Smem<K>;
  constexpr bool F16 = std::is_same_v<DT, Fp16>;
  const int t = int(threadIdx.x), w = t >> 5;
  const uint32_t bars = base + Sm::Bar;
  const uint32_t hst = base + Sm::X0 + w * (K * 32), vst = base + Sm::Y1 + w * (kC * 32);  // this warp's staging
  float sT[K / 64][32], v[32] = {};  // v: written by the first wgmma of each chunk (no accumulate)
  init_rs<K>(sT, STATES ? p.seg_entry + (int64_t(b.s) * p.sh.HV + b.j) * K * K : nullptr, b.c0);
  int m = 0;
  for (int64_t n = b.seg.chunk_begin; n < b.seg.chunk_end; ++n, ++m) {
    const int s = m % kStages;
    const uint32_t st = base + s * Sm::kStage;
    unsigned char* sst = sb + s * Sm::kStage;
    uint32_t a[K / 16][4];  // Sb^T; v^T = Sb^T W^T in flight after this
    start_chunk_rs<DT, K, STATES>(sT, a, v, hst, &maps.hs, b, n, p.sh.HV, full_bar(bars, s),
                                  uint32_t((m / kStages) & 1), st + Sm::W);
    const ChunkHdr hd = *reinterpret_cast<const ChunkHdr*>(sst + Sm::Hdr);
    const float* g = reinterpret_cast<const float*>(sst + Sm::G);
    const float gL = KDA ? 0.0f : g[hd.len - 1];  // KDA: g holds Gam per channel
    uint32_t u[16], vn[16], vs[4][4];
    load_t_words(u, st + Sm::U);
    if (hd.len < kC) {  // a partial chunk: the k rows >= L to zero before the update reads them
      prep_k_rows<DT, K, false, KDA>(sst + Sm::Kt, hd.len, gL, g);
      fence_proxy_async();
      named_sync(kConsumerBar, kConsumers);
    }
    wait_acc(v);
    epilogue_rs<DT, KDA>(v, u, g, gL, hd.len, vn, vs);
    if constexpr (STATES) store_rows_rs<K>(vn, vst, &maps.vns, p.v_new, p.sh.HV, b, hd);
    update_rs<F16, K, KDA, false>(sT, vs, st + Sm::Kt, 0u, 0u, KDA ? 1.0f : exp2f(gL), g);
    mbar_arrive(empty_bar(bars, s));
  }
  if ((t & 31) == 0) bulk_wait_all();  // this warp's stores have read its staging before the block ends
  float* o = nullptr;                  // ht (the piece's last segment) or seg_h_ext
  const int64_t KK = int64_t(K) * K;
  if constexpr (STATES) {
    if (p.ht && b.s + 1 == p.pieces[b.seg.piece].seg_end) o = p.ht + (int64_t(b.seg.piece) * p.sh.HV + b.j) * KK;
  } else {
    o = p.seg_h_ext + (int64_t(b.s) * p.sh.HV + b.j) * KK;
  }
  store_tile_rs<K>(sT, o, b.c0);
}

}  // namespace kcp::kernels::cuda::walk_wg
