// KDA prep, intra-chunk part (docs/algorithm.md 1.2, F0-F2, F5 KDA), the CPU twin's prep.cpp [P2]
// and kda_chunk_fwd.cpp kda_intra [K1], [K2]. Included only by kda_prep.cu; q / k are prepared
// first by the operator-independent prep_qk_kernel (launch_prep_qk, gdn_prep.cu).
//
// kda_intra_kernel: grid NT * HV, block (chunk n, value head j) = (b / HV, b % HV), kThreads.
//   (1) gate: thread c < K owns channel c: activation in fp32 and the chunk-local inclusive cumsum
//       in token order (the twin's order), times kRcpLn2, to gcum and shared memory.
//   (2) pairs: a thread per (r, s) of the 64 x 64 square, for s <= r < L: sum over channels c
//       ascending of q_r[c] (k_s[c] exp2(g_r[c] - g_s[c])) and k_r[c] (...) in fp32 (kda_common.cuh:
//       every exponent <= 0, masked pairs never evaluated); Aqk = dtype(scale * sum) stored for
//       s <= r (0 above), Pi = beta_r * sum for s < r.
//   (3) Phi = (I + Pi)^-1 by chunk_inverse_64 (shared with GDN), stored in dtype (16-bit storage).
//   Shared memory (fp32): q, k, gcum 64 x (K+1); Pi, Phi 64 x 65; merge scratch 3 x 256; beta 64.
#pragma once

#include "kernels/cuda/gdn_prep_kernel.cuh"  // chunk_inverse_64, store_phi, kPiLd
#include "kernels/cuda/kda_common.cuh"

namespace kcp::kernels::cuda {

// The GDN intra parameters (gdn_prep_kernel.cuh: k, g, beta, A_log, dt_bias, gate, gcum, Phi with
// the KDA shapes) plus q, the lower bound and Aqk.
struct KdaIntraParams : IntraParams {
  const uint16_t* q;  // [T, H, K] dtype, 16-bit storage: q after prep
  float lower_bound;  // lb of GateForm::LowerBound
  float* Aqk;         // [T, HV, 64] dtype
};

// Natural-log decay of one gate element (docs/algorithm.md 1.2), fp32: the twin's activate().
__device__ __forceinline__ float kda_activate(const KdaIntraParams& p, float graw, float A_log, float bias) {
  if (p.gate == int(GateForm::Softplus)) return -expf(A_log) * softplus_f(graw + bias);
  if (p.gate == int(GateForm::LowerBound)) {
    const float x = graw + bias;
    const float z = p.A_log ? expf(A_log) * x : x;
    return p.lower_bound * sigmoid_f(z);
  }
  return graw;
}

template <int K>
struct KdaIntraSmem {
  static constexpr int kLd = K + 1;  // odd: a warp reading column c of 32 rows hits 32 banks
  static constexpr size_t bytes = (3 * size_t(kC) * kLd + 2 * size_t(kC) * kPiLd + 3 * 256 + kC) * 4;
};

template <class DT, int K>
__global__ void __launch_bounds__(kThreads) kda_intra_kernel(KdaIntraParams p) {
  using Sm = KdaIntraSmem<K>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* sq = reinterpret_cast<float*>(smem_raw);
  float* sk = sq + kC * Sm::kLd;
  float* sG = sk + kC * Sm::kLd;
  float* sPi = sG + kC * Sm::kLd;
  float* sPhi = sPi + kC * kPiLd;
  float* sTmp = sPhi + kC * kPiLd;
  float* sB = sTmp + 3 * 256;

  const KdaIx ix = kda_ix(p.sh);
  const ChunkItem w = chunk_item(p.chunks, p.sh, blockIdx.x);
  const int L = w.L, j = w.j, i = w.i;
  const int64_t t0 = w.t0;
  const int tid = threadIdx.x;

  // (1) gate activation + chunk-local cumsum per channel ([P2]).
  if (tid < K) {
    const int c = tid;
    const float A_log = p.A_log ? p.A_log[j] : 0.0f;
    const float bias = p.dt_bias ? p.dt_bias[int64_t(j) * K + c] : 0.0f;
    float acc = 0.0f;
    for (int r = 0; r < kC; ++r) {
      float v = 0.0f;
      if (r < L) {
        const int64_t at = ix.hk(t0 + r, j) + c;
        acc += kda_activate(p, p.g[at], A_log, bias);
        v = acc * kRcpLn2;
        p.gcum[at] = v;
      }
      sG[r * Sm::kLd + c] = v;
    }
  }
  if (tid < kC) sB[tid] = tid < L ? p.beta[ix.th(t0 + tid, j)] : 0.0f;
  stage_tile(sq, Sm::kLd, kC, K, L, [&](int r, int c) { return DT::from_raw(p.q[ix.qk(t0 + r, i) + c]); });
  stage_tile(sk, Sm::kLd, kC, K, L, [&](int r, int c) { return DT::from_raw(p.k[ix.qk(t0 + r, i) + c]); });
  __syncthreads();

  // (2) Pi and Aqk ([K1]).
  const float scale = p.sh.scale;
  for (int e = tid; e < kC * kC; e += kThreads) {
    const int r = e / kC, s = e % kC;
    const bool in = s <= r && r < L;
    float aq = 0.0f, ak = 0.0f;
    if (in) {
      const float* qr = sq + r * Sm::kLd;
      const float* kr = sk + r * Sm::kLd;
      const float* ks = sk + s * Sm::kLd;
      const float* gr = sG + r * Sm::kLd;
      const float* gs = sG + s * Sm::kLd;
      for (int c = 0; c < K; ++c) {
        const float kse = ks[c] * exp2f(gr[c] - gs[c]);
        aq += qr[c] * kse;
        ak += kr[c] * kse;
      }
    }
    sPi[r * kPiLd + s] = (in && s < r) ? sB[r] * ak : 0.0f;
    if (r < L) p.Aqk[ix.cc(t0 + r, j) + s] = in ? DT::rnd(aq * scale) : 0.0f;
  }
  __syncthreads();

  // (3) Phi ([K2]).
  chunk_inverse_64(sPi, sPhi, sTmp);
  store_phi<DT>(sPhi, p.Phi, t0, L, j, p.sh.HV);
}

}  // namespace kcp::kernels::cuda
