// The backward walk (bwd_states, bwd_summaries) with A operands in registers where the recurrence
// forms them (gdn_walk_rs.cuh gives the forward's form and the helpers): the consumer warpgroup
// holds dS^T (the block's 64 value columns x K keys) and per chunk, last to first,
//   dSb^T = dtype(dS^T), A words in registers (-> dh[n]: per-warp stmatrix.trans + TMA store);
//   v^T   = dSb^T k^T                (A: registers, B: the stage's k (KDA: kg), K-major);
//   dv2^T = dtype(v^T f_c + dv_local^T) (dv_local^T by ldmatrix.trans; GDN f_c = exp2(gL - g_c),
//           KDA 1), tokens c < L (STATES: to dv2 by per-warp stmatrix.trans + TMA store, or plain
//           stores of a partial chunk); Y0^T = -dv2^T by the sign bits (c >= L: -0) as A words;
//   dS^T  = Gam dS^T + dO^T qs + Y0^T W (dO^T: A from the stage, MN-major; Y0^T: A from
//           registers; qs, W: B from the stage, MN-major), per 64-key block, the terms in this order
//           (bwd_walk_kernel's, gdn_chunk_state_kernel.cuh).
// The stage's operands of the update (GDN: qs in place of q; rows >= L of q, W, dO zero) are formed
// by prep_update_rows (gdn_walk_wgmma.cuh) while v^T runs, then one proxy fence and one consumer
// barrier (GDN every chunk, KDA a partial chunk only). Same values and rounding points as
// bwd_walk_kernel ([B1]-[B3]: dSb, dv2 and qs rounded to the dtype from the same fp32
// expressions; the products' 16-bit operands the same, fp32 accumulation in k16 steps). Shared
// memory: dh staging in the X0 region, dv2 staging in the Y1 region (as the forward). Included
// only by gdn_walk_wgmma.cuh, after prep_update_rows.
#pragma once

namespace kcp::kernels::cuda::walk_wg {

// dv2 and Y0 = -dv2 (words, as epilogue_rs) from v^T and the dv_local^T words dl.
template <class DT, bool KDA>
__device__ __forceinline__ void epilogue_dv2_rs(const float (&v)[32], const uint32_t (&dl)[16], const float* g,
                                                float gL, int L, uint32_t (&dv2)[16], uint32_t (&y0)[4][4]) {
  const int t4 = int(threadIdx.x) & 3;
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    const int c = 8 * nt + 2 * t4;
    float f0 = 1.0f, f1 = 1.0f;
    if constexpr (!KDA) {
      f0 = exp2f(gL - g[c]);  // as bwd_walk_kernel's row_factor (g: 0 beyond L, masked below)
      f1 = exp2f(gL - g[c + 1]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int e = 4 * nt + 2 * h, x = 2 * nt + h;
      const float d0 = c < L ? v[e] * f0 + DT::from_raw(uint16_t(dl[x] & 0xffffu)) : 0.0f;
      const float d1 = c + 1 < L ? v[e + 1] * f1 + DT::from_raw(uint16_t(dl[x] >> 16)) : 0.0f;
      dv2[x] = DT::pack(d0, d1);
      y0[x >> 2][x & 3] = dv2[x] ^ kNegZero2;
    }
  }
}

// The consumer warpgroup's backward walk over the segment's chunks, last to first.
template <class DT, int K, bool STATES, bool KDA>
__device__ __forceinline__ void consume_bwd_rs(const BwdMaps& maps, const BwdWalkParams& p, const Blk& b, uint32_t base,
                                               unsigned char* sb) {
  using Sm = BwdSmem<K>;
  constexpr bool F16 = std::is_same_v<DT, Fp16>;
  const int t = int(threadIdx.x), w = t >> 5;
  const uint32_t bars = base + Sm::Bar;
  const uint32_t hst = base + Sm::X0 + w * (K * 32), vst = base + Sm::Y1 + w * (kC * 32);  // this warp's staging
  const int64_t sj = int64_t(b.s) * p.sh.HV + b.j, KK = int64_t(K) * K;
  float sT[K / 64][32], v[32] = {};  // v: written by the first wgmma of each chunk (no accumulate)
  init_rs<K>(sT, STATES ? p.seg_exit + sj * KK : nullptr, b.c0);
  const int64_t count = b.seg.chunk_end - b.seg.chunk_begin;
  for (int64_t m = 0; m < count; ++m) {
    const int64_t n = b.seg.chunk_end - 1 - m;
    const int s = int(m % kStages);
    const uint32_t st = base + s * Sm::kStage;
    unsigned char* sst = sb + s * Sm::kStage;
    uint32_t a[K / 16][4];  // dSb^T; v^T = dSb^T k^T in flight after this
    start_chunk_rs<DT, K, STATES>(sT, a, v, hst, &maps.dhs, b, n, p.sh.HV, full_bar(bars, s),
                                  uint32_t((m / kStages) & 1), st + Sm::Kt);
    const ChunkHdr hd = *reinterpret_cast<const ChunkHdr*>(sst + Sm::Hdr);
    const float* g = reinterpret_cast<const float*>(sst + Sm::G);
    const int L = hd.len;
    const float gL = KDA ? 0.0f : g[L - 1];  // KDA: g holds Gam per channel
    uint32_t dl[16], dv2[16], y0[4][4];
    load_t_words(dl, st + Sm::Dl);
    if (!KDA || L < kC) {  // the update's stage operands (GDN: qs; rows >= L zero)
      prep_update_rows<DT, K, KDA>(sst, L, g, p.sh.scale);
      fence_proxy_async();
      named_sync(kConsumerBar, kConsumers);
    }
    wait_acc(v);
    epilogue_dv2_rs<DT, KDA>(v, dl, g, gL, L, dv2, y0);
    if constexpr (STATES) store_rows_rs<K>(dv2, vst, &maps.dv2s, p.dv2, p.sh.HV, b, hd);
    update_rs<F16, K, KDA, true>(sT, y0, st + Sm::W, st + Sm::dO, st + Sm::Q, KDA ? 1.0f : exp2f(gL), g);
    mbar_arrive(empty_bar(bars, s));
  }
  if ((t & 31) == 0) bulk_wait_all();  // this warp's stores have read its staging before the block ends
  float* o = nullptr;                  // dh0 (the piece's first segment) or seg_dh_ext
  if constexpr (STATES) {
    if (p.dh0 && b.seg.index_in_piece == 0) o = p.dh0 + (int64_t(b.seg.piece) * p.sh.HV + b.j) * KK;
  } else {
    o = p.seg_dh_ext + sj * KK;
  }
  store_tile_rs<K>(sT, o, b.c0);
}

}  // namespace kcp::kernels::cuda::walk_wg
