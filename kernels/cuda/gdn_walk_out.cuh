// The GDN forward states walk with the output formed in it (fwd_states with args.output,
// kernels/api/chunk_fwd.h): consume_rs's recurrence (gdn_walk_rs.cuh) and, per chunk, fwd_output's
// products (gdn_chunk_fwd_kernel.cuh, F5) on the tiles the walk already holds, so h never leaves
// the chip (the 16-bit state h[n] is stored only by the backward's recompute) and fwd_output's
// loads of h, v_new, q, k are gone. For chunk n of the block's segment, value head j, columns c0
// .. c0 + 63, with X^T = dtype(S^T) the A words of the state at the chunk's start:
//   P       = dtype(tril_incl(q k^T) o exp2(g_r - g_s)), rows r >= L zero   (A: the stage's q,
//             B: its k, both K-major; -> a swizzled 64 x 64 tile [r][s] in shared memory)
//   v^T     = X^T W^T, inter^T = X^T q^T (A: X^T's words; B: the stage's W and q, K-major)
//   v_new, vs and S^T as consume_rs;
//   intra^T = v_new^T P^T (A: the v_new words, tokens >= L zero; B: the P tile, K-major)
//   o       = dtype(inter exp2(g_r) scale + intra scale)                   ([G3]: fwd_output's
//             expression; per-warp stmatrix.trans + TMA store through map os, a partial chunk's
//             tokens < L by plain stores)
// Every 16-bit operand is the one fwd_output reads (h = X, v_new, P from the same fp32
// expressions) and each product accumulates in fp32 over k16 steps in fwd_output's order; the
// k16 steps fwd_output skips (s beyond the chunk's length rounded up to 16) add exact zeros here.
// Shared memory: the stage holds q beside W, k and U (Smem<K, true>); the P tiles alternate
// between X0 and X1 (so a warp writing chunk n + 1's P cannot overtake one still reading chunk
// n's: the barrier after each P's writes orders them); Y0 stages the warps' o rows, Y1 their
// v_new rows. Included only by gdn_walk_wgmma.cuh.
#pragma once

namespace kcp::kernels::cuda::walk_wg {

// d = A B^T over K (A, B: the stage's 64 x K tiles at a and b, K-major: q k^T), issued as one
// group.
template <bool F16, int K>
__device__ __forceinline__ void issue_qk(float (&d)[32], uint32_t a, uint32_t b) {
  fence_acc(d);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    wgmma_64x64x16<F16, 0, 0>(d, desc_k(a + (kk / 4) * kAtom, kk % 4), desc_k(b + (kk / 4) * kAtom, kk % 4), kk > 0);
  wgmma_commit();
}

// v^T = X^T W^T and inter^T = X^T q^T (A: x, X^T's words; B: the stage's W and q tiles, K-major),
// issued as one group.
template <bool F16, int K>
__device__ __forceinline__ void issue_v_inter(float (&v)[32], float (&oi)[32], const uint32_t (&x)[K / 16][4],
                                              uint32_t w, uint32_t q) {
  fence_acc(v);
  fence_acc(oi);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) wgmma_64x64x16_rs<F16, 0>(v, x[kk], desc_k(w + (kk / 4) * kAtom, kk % 4), kk > 0);
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    wgmma_64x64x16_rs<F16, 0>(oi, x[kk], desc_k(q + (kk / 4) * kAtom, kk % 4), kk > 0);
  wgmma_commit();
}

// P = dtype(tril_incl(q k^T) o exp2(g_r - g_s)) for rows r < L, else 0, from d = q k^T (rows r,
// columns s), into the swizzled 64 x 64 tile pt ([r][s], the K-major B operand of intra^T).
template <class DT>
__device__ __forceinline__ void put_p(const float (&d)[32], unsigned char* pt, const float* g, int L) {
  const int t = int(threadIdx.x);
#pragma unroll
  for (int x = 0; x < 32; x += 2) {
    const int r = frag_row(t, x), s = frag_col(t, x);
    const float p0 = (s <= r && r < L) ? d[x] * exp2f(g[r] - g[s]) : 0.0f;
    const float p1 = (s + 1 <= r && r < L) ? d[x + 1] * exp2f(g[r] - g[s + 1]) : 0.0f;
    *reinterpret_cast<uint32_t*>(pt + swz(r, s)) = DT::pack(p0, p1);
  }
}

// A partial chunk's v_new words (x = 2 nt + h: tokens 8 nt + 2 (lane % 4), +1 in the low, high
// half) with the tokens >= L set to zero (the box's rows there are other tokens).
__device__ __forceinline__ void zero_tokens_from(uint32_t (&vn)[16], int L) {
  const int t4 = int(threadIdx.x) & 3;
#pragma unroll
  for (int x = 0; x < 16; ++x) {
    const int c = 8 * (x >> 1) + 2 * t4;
    vn[x] &= (c < L ? 0x0000ffffu : 0u) | (c + 1 < L ? 0xffff0000u : 0u);
  }
}

// intra^T = V^T P^T (A: the v_new words vn, slice kk = vn[4 kk .. 4 kk + 3]; B: the P tile at pt,
// K-major), completed.
template <bool F16>
__device__ __forceinline__ void intra_rs(float (&oa)[32], const uint32_t (&vn)[16], uint32_t pt) {
  fence_acc(oa);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kC / 16; ++kk) {
    const uint32_t a4[4] = {vn[4 * kk], vn[4 * kk + 1], vn[4 * kk + 2], vn[4 * kk + 3]};
    wgmma_64x64x16_rs<F16, 0>(oa, a4, desc_k(pt, kk), kk > 0);
  }
  wgmma_commit();
  wgmma_wait();
  fence_acc(oa);
}

// The o words (x = 2 nt + h, as store_rows_rs; token r = the accumulators' column) =
// dtype(inter exp2(g_r) scale + intra scale), fwd_output's expression.
template <class DT>
__device__ __forceinline__ void out_words(const float (&oi)[32], const float (&oa)[32], const float* g, float scale,
                                          uint32_t (&ow)[16]) {
  const int t4 = int(threadIdx.x) & 3;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    const int r = 8 * nt + 2 * t4;
    const float eg0 = exp2f(g[r]), eg1 = exp2f(g[r + 1]);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = 4 * nt + 2 * h;
      ow[2 * nt + h] = DT::pack(oi[e] * eg0 * scale + oa[e] * scale, oi[e + 1] * eg1 * scale + oa[e + 1] * scale);
    }
  }
}

// The consumer warpgroup's forward states walk of a state tile with the output formed per chunk.
template <class DT, int K>
__device__ __forceinline__ void consume_out(const Maps& maps, const FwdWalkParams& p, const Blk& b, uint32_t base,
                                            unsigned char* sb) {
  using Sm = Smem<K, true>;
  constexpr bool F16 = std::is_same_v<DT, Fp16>;
  const int t = int(threadIdx.x), w = t >> 5;
  const uint32_t bars = base + Sm::Bar;
  const uint32_t ost = base + Sm::Y0 + w * (kC * 32), vst = base + Sm::Y1 + w * (kC * 32);  // this warp's staging
  float sT[K / 64][32], v[32] = {}, oi[32] = {}, oa[32] = {}, pq[32] = {};  // written by their first wgmma
  init_rs<K>(sT, p.seg_entry + (int64_t(b.s) * p.sh.HV + b.j) * K * K, b.c0);
  int m = 0;
  for (int64_t n = b.seg.chunk_begin; n < b.seg.chunk_end; ++n, ++m) {
    const int s = m % kStages;
    const uint32_t st = base + s * Sm::kStage, pt = base + ((m & 1) ? Sm::X1 : Sm::X0);
    unsigned char* sst = sb + s * Sm::kStage;
    uint32_t x[K / 16][4];  // X^T = dtype(S^T)
#pragma unroll
    for (int kb = 0; kb < K / 64; ++kb) acc_to_a<DT>(sT[kb], x, 4 * kb);
    if ((t & 31) == 0) bulk_wait_read();  // this warp's stores of the last chunk have read its staging
    __syncwarp();
    mbar_wait(full_bar(bars, s), uint32_t((m / kStages) & 1));
    const ChunkHdr hd = *reinterpret_cast<const ChunkHdr*>(sst + Sm::Hdr);
    const float* g = reinterpret_cast<const float*>(sst + Sm::G);
    const float gL = g[hd.len - 1];
    if (hd.len < kC) {  // a partial chunk: the k rows >= L to zero before the products read them
      prep_k_rows<DT, K, false, false>(sst + Sm::Kt, hd.len, gL, g);
      fence_proxy_async();
      named_sync(kConsumerBar, kConsumers);
    }
    issue_qk<F16, K>(pq, st + Sm::Q, st + Sm::Kt);
    issue_v_inter<F16, K>(v, oi, x, st + Sm::W, st + Sm::Q);
    uint32_t u[16], vn[16], vs[4][4];
    load_t_words(u, st + Sm::U);
    wgmma_wait_n<1>();  // q k^T
    fence_acc(pq);
    put_p<DT>(pq, sb + (pt - base), g, hd.len);
    fence_proxy_async();
    named_sync(kConsumerBar, kConsumers);  // every warp's rows of P
    wait_acc(v);
    fence_acc(oi);
    epilogue_rs<DT, false>(v, u, g, gL, hd.len, vn, vs);
    store_rows_rs<K>(vn, vst, &maps.vns, p.v_new, p.sh.HV, b, hd);
    if (hd.len < kC) zero_tokens_from(vn, hd.len);
    update_rs<F16, K, false, false>(sT, vs, st + Sm::Kt, 0u, 0u, exp2f(gL), g);
    intra_rs<F16>(oa, vn, pt);
    uint32_t ow[16];
    out_words<DT>(oi, oa, g, p.sh.scale, ow);
    store_rows_rs<K>(ow, ost, &maps.os, p.o, p.sh.HV, b, hd);
    mbar_arrive(empty_bar(bars, s));
  }
  if ((t & 31) == 0) bulk_wait_all();  // this warp's stores have read its staging before the block ends
  const bool last = p.ht && b.s + 1 == p.pieces[b.seg.piece].seg_end;  // ht: the piece's last segment
  store_tile_rs<K>(sT, last ? p.ht + (int64_t(b.seg.piece) * p.sh.HV + b.j) * K * K : nullptr, b.c0);
}

}  // namespace kcp::kernels::cuda::walk_wg
