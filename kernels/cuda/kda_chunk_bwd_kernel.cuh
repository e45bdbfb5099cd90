// KDA backward gradients per (chunk, value head), docs/algorithm.md 3.2 steps 2, 4 and 5, with the
// rounding points [E1]-[E5] of the CPU twin (kernels/cpu/kda_chunk_bwd.cpp, wy_bwd_common.h).
// Included only by kda_chunk_bwd.cu.
//
// Three kernels, each grid NT * HV, block (chunk n, value head j) = (b / HV, b % HV), kThreads;
// they pass partial results through dq_hv, dk_hv, dlam, dbeta (each block owns its chunk's rows)
// and the backend's scratch (dW16, dAqk, dAkk), and add the twin's terms in the twin's order:
// kda_bwd_inter_kernel (step 4 inter part [E1], step 2 [E3]): four tensor-core products over V
//   (dtype operands, fp32 accumulation; issue 16 item 5), each 64 x K or 64 x 64 on 8 warps:
//   dW = dtype(-(dv2 h^T)) -> dW16; dAqk[r][s] = scale (dO v_new^T)[r][s] for s <= r (0 above)
//   -> scratch; dQi = (dO h^T)[r][x] exp2(g_r[x]) scale, dKint = (v_new dh^T)[r][x]
//   exp2(g_L[x] - g_r[x]); dq_hv = dQi, dk_hv = dKint, dlam = q dQi - k dKint; then a thread per
//   channel x adds dg_last[x] = Gam[x] (h dh^T)[x][x] + sum_r k dKint to the last row.
//   Shared memory: (16-bit) dO, v_new, dv2 64 x (V+8); h, dh K x (V+8); (fp32) dKint 64 x K, g_L K
//   (K = V = 128: 155,136 bytes, one block per SM).
// kda_bwd_wy_kernel (step 4 WY part [E2], [E5]): on tensor cores (dtype operands, fp32
//   accumulation; issue 16 item 5): dPhi = dW Xb^T + dv2 Yb^T (s < r, 64 x 64), dX = Phi^T dW
//   (64 x K) and dY = Phi^T dv2 (64 x V) (terms m >= r; Phi is 0 above the diagonal), dX, dY kept
//   fp32 in shared memory over the dW, Xb and dv2, Yb tiles; phi_backward's first product
//   T1 = dtype(stril(dtype(dPhi)) Phi^T). Then a warp per row r, lanes over channels:
//   dk_hv += dX beta exp2(g), dlam += dX X, dv = dtype(beta dY), dbeta = sum dX k exp2(g) +
//   sum dY v (lane partials, fixed-order warp sum); and dAkk = -stril(Phi^T T1) -> scratch.
//   Shared memory (16-bit, ldmatrix rows): dW, Xb 64 x (K+8); dv2, Yb 64 x (V+8); Phi, dPhi, T1
//   64 x 72 (K = V = 128: 97,280 bytes).
// kda_bwd_intra_kernel (step 5 [E4]): a warp per row r, lanes over channels x, every pair with
//   its own factor exp2(g_r[x] - g_s[x]) (r >= s, exponent <= 0): dq2, dk2n (s <= r ascending) and
//   the column side dkt (r' >= r ascending), all fp32 (7.6); dq_hv += dq2, dk_hv += dk2 + dkt,
//   dlam += q dq2 + k (dk2 - dkt), dbeta += sum k dk2n (warp sum).
//   Shared memory (fp32): q, k, g 64 x K; dAqk, dAkk 64 x 64; beta 64.
#pragma once

#include "kernels/cuda/gdn_chunk_bwd_kernel.cuh"  // GradParams
#include "kernels/cuda/kda_common.cuh"

namespace kcp::kernels::cuda {

// The GDN parameters (gdn_chunk_bwd_kernel.cuh; dlam_hi unused, dW16: dW = dtype(-dv2 h^T)) plus
// the scratch of the intra part.
struct KdaGradParams : GradParams {
  float* dAqk;  // [T, HV, 64] fp32, scratch: scale tril(dO v_new^T)
  float* dAkk;  // [T, HV, 64] fp32, scratch: -stril(Phi^T dtype(...) ...)
};

template <int K, int V>
struct KdaInterSmem {
  static constexpr int kVld = V + 8;  // 16-bit tiles read by ldmatrix (cuda_common.cuh)
  static constexpr size_t bytes = (3 * size_t(kC) + 2 * size_t(K)) * kVld * 2 + (size_t(kC) + 1) * K * 4;
};

template <class DT, int K, int V>
__global__ void __launch_bounds__(kThreads) kda_bwd_inter_kernel(KdaGradParams p) {
  using Sm = KdaInterSmem<K, V>;
  using TK = Tiling<kC, K>;   // 64 x K products over V
  using TA = Tiling<kC, kC>;  // 64 x 64 dAqk
  constexpr int ld = Sm::kVld;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* sdO = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* svn = sdO + kC * ld;
  uint16_t* sdv = svn + kC * ld;
  uint16_t* sS = sdv + kC * ld;
  uint16_t* sdS = sS + K * ld;
  float* sKint = reinterpret_cast<float*>(sdS + K * ld);
  float* sgL = sKint + kC * K;

  const KdaIx ix = kda_ix(p.sh);
  const ChunkItem w = chunk_item(p.chunks, p.sh, blockIdx.x);
  const int L = w.L, j = w.j, i = w.i;
  const int64_t t0 = w.t0, n = w.n;
  const float scale = p.sh.scale;
  const int64_t ldv = int64_t(p.sh.HV) * V;

  stage_rows16<DT, kC, V>(sdO, ld, p.dO + ix.vv(t0, j), ldv, L);
  stage_rows16<DT, kC, V>(svn, ld, p.v_new + ix.vv(t0, j), ldv, L);
  stage_rows16<DT, kC, V>(sdv, ld, p.dv2 + ix.vv(t0, j), ldv, L);
  stage_rows16<DT, K, V>(sS, ld, p.h + ix.kv(n, j), V, K);
  stage_rows16<DT, K, V>(sdS, ld, p.dh + ix.kv(n, j), V, K);
  if (threadIdx.x < K) sgL[threadIdx.x] = p.gcum[ix.hk(t0 + L - 1, j) + threadIdx.x];
  __syncthreads();

  const AView<uint16_t, true> dO{sdO, ld}, vn{svn, ld}, dv{sdv, ld};
  const BView<uint16_t, true> hT{sS, ld}, dhT{sdS, ld}, vnT{svn, ld};
  {  // [E1] dW = dtype(-(dv2 h^T)) -> dW16
    float aw[TK::MT][TK::NT][4];
    TK::zero(aw);
    TK::template mma<DT>(aw, dv, hT, 0, V);
    TK::pairs(aw, [&](int r, int x, float& v0, float& v1) {
      if (r < L) st16x2<DT>(p.dW16 + ix.hk(t0 + r, j) + x, -v0, -v1);
    });
  }
  {  // [E3] dAqk[r][s] = scale (dO v_new^T)[r][s] for s <= r (0 above)
    float aa[TA::MT][TA::NT][4];
    TA::zero(aa);
    TA::template mma<DT>(aa, dO, vnT, 0, V);
    TA::pairs(aa, [&](int r, int s, float& v0, float& v1) {
      if (r < L)
        *reinterpret_cast<float2*>(p.dAqk + ix.cc(t0 + r, j) + s) =
            make_float2(s <= r ? scale * v0 : 0.0f, s + 1 <= r ? scale * v1 : 0.0f);
    });
  }
  {  // [E1] dQi = (dO h^T) exp2(g_r) scale, dKint = (v_new dh^T) exp2(g_L - g_r); dq_hv, dk_hv, dlam
    float aq[TK::MT][TK::NT][4], ak[TK::MT][TK::NT][4];
    TK::zero(aq);
    TK::zero(ak);
    TK::template mma<DT>(aq, dO, hT, 0, V);
    TK::template mma<DT>(ak, vn, dhT, 0, V);
    TK::zip_pairs(aq, ak, [&](int r, int x, float& q0, float& q1, float& k0, float& k1) {
      if (r >= L) return;
      const int64_t at = ix.hk(t0 + r, j) + x;
      const float2 gr = *reinterpret_cast<const float2*>(p.gcum + at);
      const float dQ0 = q0 * exp2f(gr.x) * scale, dQ1 = q1 * exp2f(gr.y) * scale;
      const float dK0 = k0 * exp2f(sgL[x] - gr.x), dK1 = k1 * exp2f(sgL[x + 1] - gr.y);
      *reinterpret_cast<float2*>(p.dq_hv + at) = make_float2(dQ0, dQ1);
      *reinterpret_cast<float2*>(p.dk_hv + at) = make_float2(dK0, dK1);
      *reinterpret_cast<float2*>(sKint + r * K + x) = make_float2(dK0, dK1);
      const int64_t aq2 = ix.qk(t0 + r, i) + x;
      const uint32_t qq = *reinterpret_cast<const uint32_t*>(p.q + aq2);
      const uint32_t kk = *reinterpret_cast<const uint32_t*>(p.k + aq2);
      const float qx0 = DT::from_raw(uint16_t(qq & 0xffffu)), qx1 = DT::from_raw(uint16_t(qq >> 16));
      const float kx0 = DT::from_raw(uint16_t(kk & 0xffffu)), kx1 = DT::from_raw(uint16_t(kk >> 16));
      *reinterpret_cast<float2*>(p.dlam + at) = make_float2(qx0 * dQ0 - kx0 * dK0, qx1 * dQ1 - kx1 * dK1);
    });
  }
  __syncthreads();        // sKint and the dlam rows of every thread (global writes of this block)
  if (threadIdx.x < K) {  // dg_last on the last row
    const int x = threadIdx.x;
    float acc = 0.0f;
    for (int c = 0; c < V; ++c) acc += DT::from_raw(sS[x * ld + c]) * DT::from_raw(sdS[x * ld + c]);
    acc *= exp2f(sgL[x]);
    for (int r = 0; r < L; ++r) acc += DT::from_raw(p.k[ix.qk(t0 + r, i) + x]) * sKint[r * K + x];
    p.dlam[ix.hk(t0 + L - 1, j) + x] += acc;
  }
}

template <int K, int V>
struct KdaWyBwdSmem {
  static constexpr int kKld = K + 8, kVld = V + 8, kCld = kC + 8;  // ldmatrix rows (cuda_common.cuh)
  static constexpr size_t bytes = (2 * size_t(kC) * kKld + 2 * size_t(kC) * kVld + 3 * size_t(kC) * kCld) * 2;
};

template <class DT, int K, int V>
__global__ void __launch_bounds__(kThreads) kda_bwd_wy_kernel(KdaGradParams p) {
  using Sm = KdaWyBwdSmem<K, V>;
  using TA = Tiling<kC, kC>;
  using TX = Tiling<kC, K>;
  using TY = Tiling<kC, V>;
  constexpr int kld = Sm::kKld, vld = Sm::kVld, cld = Sm::kCld;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* sdW = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* sXb = sdW + kC * kld;
  uint16_t* sdv = sXb + kC * kld;
  uint16_t* sYb = sdv + kC * vld;
  uint16_t* sPhi = sYb + kC * vld;
  uint16_t* sdPhi = sPhi + kC * cld;
  uint16_t* sT1 = sdPhi + kC * cld;
  float* sdX = reinterpret_cast<float*>(sdW);  // dX (fp32, ld kld) over dW, Xb once they are read
  float* sdY = reinterpret_cast<float*>(sdv);  // dY (fp32, ld vld) over dv2, Yb

  const KdaIx ix = kda_ix(p.sh);
  const ChunkItem w = chunk_item(p.chunks, p.sh, blockIdx.x);
  const int L = w.L, j = w.j, i = w.i;
  const int64_t t0 = w.t0;
  auto beta = [&](int r) { return p.beta[ix.th(t0 + r, j)]; };

  stage_tile16<DT>(sdW, kld, kC, K, L, [&](int r, int x) { return DT::from_raw(p.dW16[ix.hk(t0 + r, j) + x]); });
  stage_tile16<DT>(sXb, kld, kC, K, L, [&](int r, int x) {  // [E2] xb = dtype((k beta) exp2(g))
    return (DT::from_raw(p.k[ix.qk(t0 + r, i) + x]) * beta(r)) * exp2f(p.gcum[ix.hk(t0 + r, j) + x]);
  });
  stage_tile16<DT>(sdv, vld, kC, V, L, [&](int r, int e) { return DT::from_raw(p.dv2[ix.vv(t0 + r, j) + e]); });
  stage_tile16<DT>(sYb, vld, kC, V, L, [&](int r, int e) {  // ub = dtype(v beta)
    return load_caller<DT>(p.v, ix.vv(t0 + r, j) + e) * beta(r);
  });
  stage_rows16<DT, kC, kC>(sPhi, cld, p.Phi + ix.cc(t0, j), int64_t(p.sh.HV) * kC, L);
  __syncthreads();

  // dPhi (strictly lower), rounded: the operand of phi_backward; sums over K, then V.
  {
    float acc[TA::MT][TA::NT][4];
    TA::zero(acc);
    TA::template mma<DT>(acc, AView<uint16_t, true>{sdW, kld}, BView<uint16_t, true>{sXb, kld}, 0, K);
    TA::template mma<DT>(acc, AView<uint16_t, true>{sdv, vld}, BView<uint16_t, true>{sYb, vld}, 0, V);
    TA::pairs(acc, [&](int r, int s, float& v0, float& v1) {
      const bool in = r < L;
      *reinterpret_cast<uint32_t*>(sdPhi + r * cld + s) =
          DT::pack(in && s < r ? v0 : 0.0f, in && s + 1 < r ? v1 : 0.0f);
    });
  }
  // dX = Phi^T dW (64 x K), then dY = Phi^T dv2 (64 x V), kept fp32: A(m = r, k = m) = Phi[m][r],
  // zero for m < r (Phi's zeros above the diagonal), so a warp starts at its first row block;
  // rows m >= L are zeros. Each goes to an fp32 tile (ld in floats as the 16-bit one) over the two
  // 16-bit tiles every warp has finished reading at the barrier before (dX over dW, Xb; dY over
  // dv2, Yb), one accumulator at a time (two would cost a block per SM).
  const int ke = (L + 15) & ~15;
  {
    float ax[TX::MT][TX::NT][4];
    TX::zero(ax);
    TX::template mma<DT>(ax, AView<uint16_t, false>{sPhi, cld}, BView<uint16_t, false>{sdW, kld}, TX::m0(), ke);
    __syncthreads();
    TX::pairs(ax, [&](int r, int x, float& v0, float& v1) {
      *reinterpret_cast<float2*>(sdX + r * kld + x) = make_float2(v0, v1);
    });
  }
  {
    float ay[TY::MT][TY::NT][4];
    TY::zero(ay);
    TY::template mma<DT>(ay, AView<uint16_t, false>{sPhi, cld}, BView<uint16_t, false>{sdv, vld}, TY::m0(), ke);
    __syncthreads();
    TY::pairs(ay, [&](int r, int e, float& v0, float& v1) {
      *reinterpret_cast<float2*>(sdY + r * vld + e) = make_float2(v0, v1);
    });
  }
  // T1 = dtype(dPhib Phi^T), strictly lower (the terms x > s are Phi's zeros above the diagonal).
  {
    float acc[TA::MT][TA::NT][4];
    TA::zero(acc);
    TA::template mma<DT>(acc, AView<uint16_t, true>{sdPhi, cld}, BView<uint16_t, true>{sPhi, cld}, 0, kC);
    TA::pairs(acc, [&](int m, int s, float& v0, float& v1) {
      const bool in = m < L;
      *reinterpret_cast<uint32_t*>(sT1 + m * cld + s) = DT::pack(in && s < m ? v0 : 0.0f, in && s + 1 < m ? v1 : 0.0f);
    });
  }
  __syncthreads();
  // Per row: a warp per row, lanes over channels; dbeta by a fixed-order warp sum.
  for (int r = warp_id(); r < L; r += kWarps) {
    const float br = beta(r);
    float db = 0.0f;
    for (int x = lane_id(); x < K; x += 32) {
      const float dX = sdX[r * kld + x];
      const int64_t at = ix.hk(t0 + r, j) + x;
      const float kx = DT::from_raw(p.k[ix.qk(t0 + r, i) + x]);
      const float eg = exp2f(p.gcum[at]);
      const float X = (kx * br) * eg;
      p.dk_hv[at] += dX * (br * eg);
      db += dX * (kx * eg);
      p.dlam[at] += dX * X;
    }
    for (int e = lane_id(); e < V; e += 32) {
      const float dY = sdY[r * vld + e];
      const int64_t at = ix.vv(t0 + r, j) + e;
      store_caller<DT>(p.dv, at, br * dY);  // [E5]
      db += dY * load_caller<DT>(p.v, at);
    }
    db = warp_sum(db);
    if (lane_id() == 0) p.dbeta[ix.th(t0 + r, j)] = db;
  }
  // dAkk = -stril(Phi^T T1) (the terms m < r are Phi's zeros, m >= L T1's zero rows).
  {
    float acc[TA::MT][TA::NT][4];
    TA::zero(acc);
    TA::template mma<DT>(acc, AView<uint16_t, false>{sPhi, cld}, BView<uint16_t, false>{sT1, cld}, 0, kC);
    TA::pairs(acc, [&](int r, int s, float& v0, float& v1) {
      if (r < L)
        *reinterpret_cast<float2*>(p.dAkk + ix.cc(t0 + r, j) + s) =
            make_float2(s < r ? -v0 : 0.0f, s + 1 < r ? -v1 : 0.0f);
    });
  }
}

template <int K>
struct KdaIntraBwdSmem {
  static constexpr size_t bytes = (3 * size_t(kC) * K + 2 * size_t(kC) * kC + kC) * 4;
};

template <class DT, int K>
__global__ void __launch_bounds__(kThreads) kda_bwd_intra_kernel(KdaGradParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sq = reinterpret_cast<float*>(smem_raw);
  float* sk = sq + kC * K;
  float* sg = sk + kC * K;
  float* sAq = sg + kC * K;
  float* sAk = sAq + kC * kC;
  float* sB = sAk + kC * kC;

  const KdaIx ix = kda_ix(p.sh);
  const ChunkItem w = chunk_item(p.chunks, p.sh, blockIdx.x);
  const int L = w.L, j = w.j, i = w.i;
  const int64_t t0 = w.t0;

  stage_tile(sq, K, kC, K, L, [&](int r, int x) { return DT::from_raw(p.q[ix.qk(t0 + r, i) + x]); });
  stage_tile(sk, K, kC, K, L, [&](int r, int x) { return DT::from_raw(p.k[ix.qk(t0 + r, i) + x]); });
  stage_tile(sg, K, kC, K, L, [&](int r, int x) { return p.gcum[ix.hk(t0 + r, j) + x]; });
  stage_tile(sAq, kC, kC, kC, L, [&](int r, int s) { return p.dAqk[ix.cc(t0 + r, j) + s]; });
  stage_tile(sAk, kC, kC, kC, L, [&](int r, int s) { return p.dAkk[ix.cc(t0 + r, j) + s]; });
  if (threadIdx.x < kC) sB[threadIdx.x] = int(threadIdx.x) < L ? p.beta[ix.th(t0 + threadIdx.x, j)] : 0.0f;
  __syncthreads();

  for (int r = warp_id(); r < L; r += kWarps) {
    const float br = sB[r];
    float db = 0.0f;
    for (int x = lane_id(); x < K; x += 32) {
      const float gr = sg[r * K + x], qr = sq[r * K + x], kr = sk[r * K + x];
      // Row side: pairs (r, s), s <= r.
      float dq2 = 0.0f, dk2n = 0.0f;
      for (int s = 0; s <= r; ++s) {
        const float kse = sk[s * K + x] * exp2f(gr - sg[s * K + x]);
        dq2 += sAq[r * kC + s] * kse;
        dk2n += (s < r ? sAk[r * kC + s] : 0.0f) * kse;
      }
      // Column side: pairs (r2, r), r2 >= r, r2 ascending.
      float dkt = 0.0f;
      for (int r2 = r; r2 < L; ++r2) {
        const float e2 = exp2f(sg[r2 * K + x] - gr);
        const float akb = (r2 > r ? sAk[r2 * kC + r] : 0.0f) * sB[r2];
        dkt += (sAq[r2 * kC + r] * sq[r2 * K + x] + akb * sk[r2 * K + x]) * e2;
      }
      const int64_t at = ix.hk(t0 + r, j) + x;
      const float dk2 = br * dk2n;
      db += kr * dk2n;
      p.dlam[at] += qr * dq2 + kr * (dk2 - dkt);
      p.dk_hv[at] += dk2 + dkt;
      p.dq_hv[at] += dq2;
    }
    db = warp_sum(db);
    if (lane_id() == 0) p.dbeta[ix.th(t0 + r, j)] += db;
  }
}

}  // namespace kcp::kernels::cuda
