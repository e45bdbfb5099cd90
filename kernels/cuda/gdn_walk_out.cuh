// The GDN forward states walk with the output formed in it (fwd_states with args.output,
// kernels/api/chunk_fwd.h): fwd_output's products (gdn_chunk_fwd_kernel.cuh, F5) on the tiles the
// walk already holds, so h never leaves the chip (the 16-bit state h[n] is stored only by the
// backward's recompute) and fwd_output's loads of h, v_new, q, k are gone. Two consumer
// warpgroups and the producer warp (288 threads):
//   warpgroup 0 (consume_out_rec): consume_rs's recurrence without h's store; per chunk it writes
//     X = dtype(S at the chunk's start) ([key][c], swizzled; then arrives on xready[slot]) and
//     v_new (tokens >= L zero, [s][c]; then vready[slot]) into slot m % 2;
//   warpgroup 1 (consume_out_o): per chunk, from the stage and the slot,
//     P       = dtype(tril_incl(q k^T) o exp2(g_r - g_s)), rows r >= L zero  (A: the stage's q,
//               B: its k, both K-major; -> its own swizzled 64 x 64 tile [r][s], two alternating)
//     inter^T = X^T q^T     (A: the X slot, MN-major; B: the stage's q, K-major)
//     intra^T = v_new^T P^T (A: the v_new slot, MN-major; B: the P tile, K-major)
//     o       = dtype(inter exp2(g_r) scale + intra scale)   ([G3]: fwd_output's expression;
//               per-warp stmatrix.trans + TMA store through map os, a partial chunk's tokens < L
//               by plain stores)
//     then arrives on xempty[slot] and, with warpgroup 0, on the stage's empty barrier (256).
// Every 16-bit operand is the one fwd_output reads (h = X, v_new, P from the same fp32
// expressions) and each product accumulates in fp32 over k16 steps in fwd_output's order; the
// k16 steps fwd_output skips (s beyond the chunk's length rounded up to 16) add exact zeros here.
// A partial chunk's k rows >= L are zeroed by warpgroup 0 (for the update) while warpgroup 1's
// q k^T may read them: those entries of P are masked by selects, never multiplied.
// Shared memory (Smem<K, true>): the stage holds q beside W, k and U; X0 / X1 the X slots, VS the
// v_new slots, PS the P tiles, Y0 the output warps' o staging, Y1 the recurrence warps' v_new
// staging; XBar the slots' barriers. Included only by gdn_walk_wgmma.cuh.
#pragma once

namespace kcp::kernels::cuda::walk_wg {

// d = A B over the K keys, issued as one group; B: the stage's 64 x K tile at b, K-major; A at a:
// TA = 0 the stage's q (K-major: P's q k^T), TA = 1 the X slot's K x 64 tile [key][c] (MN-major:
// inter^T = X^T q^T).
template <bool F16, int K, int TA>
__device__ __forceinline__ void issue_keys(float (&d)[32], uint32_t a, uint32_t b) {
  fence_acc(d);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const uint32_t at = a + (kk / 4) * kAtom;
    wgmma_64x64x16<F16, TA, 0>(d, TA ? desc_mn(at, kk % 4) : desc_k(at, kk % 4), desc_k(b + (kk / 4) * kAtom, kk % 4),
                               kk > 0);
  }
  wgmma_commit();
}

// P = dtype(tril_incl(q k^T) o exp2(g_r - g_s)) for rows r < L, else 0, from d = q k^T (rows r,
// columns s), into the swizzled 64 x 64 tile pt ([r][s], the K-major B operand of intra^T).
template <class DT>
__device__ __forceinline__ void put_p(const float (&d)[32], unsigned char* pt, const float* g, int L) {
  const int t = int(threadIdx.x) & 127;  // (the output warpgroup)
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

// intra^T = V^T P^T (A: the v_new slot [s][c], MN-major; B: the P tile [r][s], K-major), issued
// as one group.
template <bool F16>
__device__ __forceinline__ void issue_intra(float (&e)[32], uint32_t vslot, uint32_t pt) {
  fence_acc(e);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kC / 16; ++kk) wgmma_64x64x16<F16, 1, 0>(e, desc_mn(vslot, kk), desc_k(pt, kk), kk > 0);
  wgmma_commit();
}

// X = dtype(S) from X^T's A words into the slot xs ([key][c]: the block's 64 columns of K key
// rows, swizzled; the MN-major A operand of inter^T), by the warp's stmatrix.trans.
template <int K>
__device__ __forceinline__ void put_x_slot(const uint32_t (&a)[K / 16][4], uint32_t xs) {
  const int w = int(threadIdx.x >> 5) & 3;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    auto at = [xs, kk](int r, int c) {
      const int key = 16 * kk + r;
      return xs + uint32_t((key >> 6) * kAtom) + swz(key & 63, c);
    };
    stsm_x4_trans(x4_addr(0, 16 * w, at), a[kk]);
  }
}
// The v_new words (x = 2 nt + h, as store_rows_rs) into the slot vs ([s][c], swizzled: the
// MN-major A operand of intra^T).
__device__ __forceinline__ void put_vn_slot(const uint32_t (&vn)[16], uint32_t vs) {
  const int w = int(threadIdx.x >> 5) & 3;
  auto at = [vs](int r, int c) { return vs + swz(r, c); };
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const uint32_t r4[4] = {vn[4 * q], vn[4 * q + 1], vn[4 * q + 2], vn[4 * q + 3]};
    stsm_x4_trans(x4_addr(q, 16 * w, at), r4);
  }
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

// The slots' barriers (XBar): X written, v_new written, both read (128 arrivals each).
__device__ __forceinline__ uint32_t xready_bar(uint32_t xbars, int slot) { return xbars + 8 * slot; }
__device__ __forceinline__ uint32_t vready_bar(uint32_t xbars, int slot) { return xbars + 8 * (2 + slot); }
__device__ __forceinline__ uint32_t xempty_bar(uint32_t xbars, int slot) { return xbars + 8 * (4 + slot); }

// Warpgroup 0: the recurrence of the state tile (consume_rs's steps without h's store); per
// chunk m it hands X = dtype(S at the chunk's start) and then v_new (tokens >= L zero) to
// warpgroup 1 through slot m % 2 (xready, vready: written; xempty: both read).
template <class DT, int K>
__device__ __forceinline__ void consume_out_rec(const Maps& maps, const FwdWalkParams& p, const Blk& b, uint32_t base,
                                                unsigned char* sb) {
  using Sm = Smem<K, true>;
  constexpr bool F16 = std::is_same_v<DT, Fp16>;
  const int t = int(threadIdx.x), w = t >> 5;
  const uint32_t bars = base + Sm::Bar, xbars = base + Sm::XBar;
  const uint32_t vst = base + Sm::Y1 + w * (kC * 32);  // this warp's v_new staging
  float sT[K / 64][32], v[32] = {};
  init_rs<K>(sT, p.seg_entry + (int64_t(b.s) * p.sh.HV + b.j) * K * K, b.c0);
  int m = 0;
  for (int64_t n = b.seg.chunk_begin; n < b.seg.chunk_end; ++n, ++m) {
    const int s = m % kStages, slot = m & 1;
    const uint32_t st = base + s * Sm::kStage;
    unsigned char* sst = sb + s * Sm::kStage;
    if (m >= 2) mbar_wait(xempty_bar(xbars, slot), uint32_t((m / 2 - 1) & 1));  // chunk m - 2's slot read
    uint32_t a[K / 16][4];
    start_chunk_rs<DT, K, false>(sT, a, v, 0u, nullptr, b, n, p.sh.HV, full_bar(bars, s), uint32_t((m / kStages) & 1),
                                 st + Sm::W);
    put_x_slot<K>(a, base + (slot ? Sm::X1 : Sm::X0));
    fence_proxy_async();  // the slot's X, for warpgroup 1's inter
    mbar_arrive(xready_bar(xbars, slot));
    const ChunkHdr hd = *reinterpret_cast<const ChunkHdr*>(sst + Sm::Hdr);
    const float* g = reinterpret_cast<const float*>(sst + Sm::G);
    const float gL = g[hd.len - 1];
    if (hd.len < kC) {  // a partial chunk: the k rows >= L to zero before the update reads them
      prep_k_rows<DT, K, false, false>(sst + Sm::Kt, hd.len, gL, g);
      fence_proxy_async();
      named_sync(kConsumerBar, kConsumers);
    }
    wait_acc(v);
    // U^T after v (not in flight with it): the registers of a, v and u together spilled at
    // 288 threads (168 registers a thread).
    uint32_t u[16], vn[16], vs[4][4];
    load_t_words(u, st + Sm::U);
    epilogue_rs<DT, false>(v, u, g, gL, hd.len, vn, vs);
    if ((t & 31) == 0) bulk_wait_read();  // this warp's last v_new store has read its staging
    __syncwarp();
    store_rows_rs<K>(vn, vst, &maps.vns, p.v_new, p.sh.HV, b, hd);
    if (hd.len < kC) zero_tokens_from(vn, hd.len);
    put_vn_slot(vn, base + Sm::VS + slot * kAtom);
    fence_proxy_async();  // the slot's v_new, for warpgroup 1's intra
    mbar_arrive(vready_bar(xbars, slot));
    update_rs<F16, K, false, false>(sT, vs, st + Sm::Kt, 0u, 0u, exp2f(gL), g);
    mbar_arrive(empty_bar(bars, s));
  }
  if ((t & 31) == 0) bulk_wait_all();  // this warp's stores have read its staging before the block ends
  const bool last = p.ht && b.s + 1 == p.pieces[b.seg.piece].seg_end;  // ht: the piece's last segment
  store_tile_rs<K>(sT, last ? p.ht + (int64_t(b.seg.piece) * p.sh.HV + b.j) * K * K : nullptr, b.c0);
}

// Warpgroup 1: the output of each chunk from the stage's q, k, gates and warpgroup 0's X and
// v_new slots.
template <class DT, int K>
__device__ __forceinline__ void consume_out_o(const Maps& maps, const FwdWalkParams& p, const Blk& b, uint32_t base,
                                              unsigned char* sb) {
  using Sm = Smem<K, true>;
  constexpr bool F16 = std::is_same_v<DT, Fp16>;
  const int t = int(threadIdx.x) & 127, w = t >> 5;
  const uint32_t bars = base + Sm::Bar, xbars = base + Sm::XBar;
  const uint32_t ost = base + Sm::Y0 + w * (kC * 32);  // this warp's o staging
  float pq[32] = {}, oi[32] = {}, oa[32] = {};         // written by their first wgmma
  int m = 0;
  for (int64_t n = b.seg.chunk_begin; n < b.seg.chunk_end; ++n, ++m) {
    const int s = m % kStages, slot = m & 1;
    const uint32_t st = base + s * Sm::kStage, pt = base + Sm::PS + slot * kAtom;
    unsigned char* sst = sb + s * Sm::kStage;
    mbar_wait(full_bar(bars, s), uint32_t((m / kStages) & 1));
    const ChunkHdr hd = *reinterpret_cast<const ChunkHdr*>(sst + Sm::Hdr);
    const float* g = reinterpret_cast<const float*>(sst + Sm::G);
    issue_keys<F16, K, 0>(pq, st + Sm::Q, st + Sm::Kt);  // k rows >= L of a partial chunk: masked in P
    mbar_wait(xready_bar(xbars, slot), uint32_t((m / 2) & 1));
    issue_keys<F16, K, 1>(oi, base + (slot ? Sm::X1 : Sm::X0), st + Sm::Q);
    wgmma_wait_n<1>();  // q k^T
    fence_acc(pq);
    put_p<DT>(pq, sb + (pt - base), g, hd.len);
    fence_proxy_async();
    named_sync(kOutputBar, kConsumers);  // every warp's rows of P
    mbar_wait(vready_bar(xbars, slot), uint32_t((m / 2) & 1));
    issue_intra<F16>(oa, base + Sm::VS + slot * kAtom, pt);
    wgmma_wait();
    fence_acc(oi);
    fence_acc(oa);
    mbar_arrive(xempty_bar(xbars, slot));
    uint32_t ow[16];
    out_words<DT>(oi, oa, g, p.sh.scale, ow);
    mbar_arrive(empty_bar(bars, s));      // the stage's q, k and gates are read
    if ((t & 31) == 0) bulk_wait_read();  // this warp's last o store has read its staging
    __syncwarp();
    store_rows_rs<K>(ow, ost, &maps.os, p.o, p.sh.HV, b, hd);
  }
  if ((t & 31) == 0) bulk_wait_all();
}

}  // namespace kcp::kernels::cuda::walk_wg
