// KDA backward gradients of the CPU twin per (chunk, value head): docs/algorithm.md 3.2 steps 2 (dAqk),
// 4 (inter part + WY backward) and 5 (intra part with per-channel gates). Outputs per value head:
// dq_hv, dk_hv, dlam [.., K] (fp32), final dv (dtype) and dbeta (fp32).
//
// Rounding points:
//   [E1] inter products with dtype operands (dO, v_new, h, dh, dv2), fp32 accumulation;
//        dw = dtype(-dv2 h^T); dq_inter = scale * exp2(g) o (dO h^T), dK_int = exp2(g_L - g) o
//        (v_new dh^T), dg_last = Gam o diag(h dh^T) + sum_r k_r o dK_int_r, all fp32.
//   [E2] WY: operands xb = dtype(k beta gam), ub = dtype(v beta) (as the forward), dtype Phi,
//        dw, dv2, fp32 accumulation; dAkk = -stril(Phi^T dtype(stril(dPhi)) ...) through
//        phi_backward (two dtype roundings), kept fp32.
//   [E3] dAqk = scale * tril_incl(dO v_new^T) (dtype operands, fp32 accumulation), fp32.
//   [E4] intra backward: per pair (r >= s) and channel, fp32 operands and fp32 accumulation with
//        the elementwise factor exp2(g_r - g_s) (exponent <= 0, masked pairs never evaluated).
//        The CUDA kernel (kda_bwd_intra_kernel) evaluates the diagonal 16 x 16 blocks the same
//        way and the off-diagonal blocks through the F5 sub-chunk pivots (docs/algorithm.md F5,
//        7.5) as fp32 products on CUDA cores; it differs from this twin in rounding only
//        (fp32 reassociation), the column-side dk stays fp32 there too (7.6).
//   [E5] dv = dtype(beta * dY); everything else fp32.
#include "kernels/cpu/wy_bwd_common.h"

namespace kcp::kernels::cpu {

namespace {

// Step 4, inter part [E1]: dQi, dW = dtype(-dv2 h^T), dK = dK_int, and dlam's inter terms with
// dg_last on the chunk's last row.
void inter_part(const GradChunk& c, Mat& dQi, Mat& dW, Mat& dlam, Mat& dK) {
  const Dims& d = c.d;
  const int32_t K = d.K, V = d.V, L = c.L;
  const float* gL = c.gate(L - 1);
  Mat dKint(L, K);
  for (int32_t r = 0; r < L; ++r)
    for (int32_t x = 0; x < K; ++x) {
      const float* Sx = c.S + int64_t(x) * V;
      const float* dSx = c.dSp + int64_t(x) * V;
      float aq = 0.0f, ak = 0.0f, aw = 0.0f;
      for (int32_t e = 0; e < V; ++e) {
        aq += c.dO(r)[e] * Sx[e];
        ak += c.vn(r)[e] * dSx[e];
        aw += c.dvn(r)[e] * Sx[e];
      }
      dQi(r, x) = aq * exp2f_(c.gate(r)[x]) * d.scale;
      dKint(r, x) = ak * exp2f_(gL[x] - c.gate(r)[x]);
      dW(r, x) = d.rnd(-aw);
    }
  std::vector<float> dg_last(K);
  for (int32_t x = 0; x < K; ++x) {
    const float* Sx = c.S + int64_t(x) * V;
    const float* dSx = c.dSp + int64_t(x) * V;
    float acc = 0.0f;
    for (int32_t e = 0; e < V; ++e) acc += Sx[e] * dSx[e];
    acc *= exp2f_(gL[x]);
    for (int32_t r = 0; r < L; ++r) acc += c.k(r)[x] * dKint(r, x);
    dg_last[x] = acc;
  }
  for (int32_t r = 0; r < L; ++r)
    for (int32_t x = 0; x < K; ++x) {
      dlam(r, x) = c.q(r)[x] * dQi(r, x) - c.k(r)[x] * dKint(r, x);
      dK(r, x) = dKint(r, x);
    }
  for (int32_t x = 0; x < K; ++x) dlam(L - 1, x) += dg_last[x];
}

// Step 4, WY part [E2], [E5]: dX = Phi^T dw and dY = Phi^T dv2 into dK, dlam, dbeta and dv (rows of
// value head j in dv_out); dAkk through phi_backward.
void wy_part(const GradChunk& c, const Mat& dW, float* dv_out, Mat& dK, Mat& dlam, std::vector<float>& dbeta,
             Mat& dAkk) {
  const Dims& d = c.d;
  const int32_t K = d.K, V = d.V, L = c.L;
  Mat X(L, K), Phi(L, L), dPhi(L, L);
  wy_operands(
      c, dW, [&](int32_t r, int32_t x) { return exp2f_(c.gate(r)[x]); }, X, Phi, dPhi);
  std::vector<float> dX(K), dY(V);
  for (int32_t r = 0; r < L; ++r) {
    phi_t_row(c, Phi, dW, r, dX, dY);
    float db = 0.0f;
    for (int32_t x = 0; x < K; ++x) {
      const float eg = exp2f_(c.gate(r)[x]);
      dK(r, x) += dX[x] * (c.beta[r] * eg);
      db += dX[x] * (c.k(r)[x] * eg);
      dlam(r, x) += dX[x] * X(r, x);
    }
    float* dv = dv_out + d.vv(c.t0 + r, c.j);
    for (int32_t e = 0; e < V; ++e) {
      dv[e] = d.rnd(c.beta[r] * dY[e]);  // [E5]
      db += dY[e] * c.vin(r)[e];
    }
    dbeta[r] += db;
  }
  phi_backward(d, Phi, dPhi, L, dAkk);
}

// Step 2, dAqk [E3], then step 5, the intra part [E4]: dq2, and dK, dlam, dbeta's intra terms.
void intra_part(const GradChunk& c, const Mat& dAkk, Mat& dq2, Mat& dK, Mat& dlam, std::vector<float>& dbeta) {
  const Dims& d = c.d;
  const int32_t K = d.K, V = d.V, L = c.L;
  Mat dAqk(L, L);
  for (int32_t r = 0; r < L; ++r)
    for (int32_t s = 0; s <= r; ++s) {
      float acc = 0.0f;
      for (int32_t e = 0; e < V; ++e) acc += c.dO(r)[e] * c.vn(s)[e];
      dAqk(r, s) = d.scale * acc;
    }
  Mat dk2n(L, K), dkt(L, K);
  for (int32_t r = 0; r < L; ++r) {
    const float* qr = c.q(r);
    const float* kr = c.k(r);
    const float* gr = c.gate(r);
    for (int32_t s = 0; s <= r; ++s) {
      const float* ks = c.k(s);
      const float* gs = c.gate(s);
      const float aq = dAqk(r, s);
      const float ak = s < r ? dAkk(r, s) : 0.0f;
      const float akb = ak * c.beta[r];
      for (int32_t x = 0; x < K; ++x) {
        const float e = exp2f_(gr[x] - gs[x]);
        const float kse = ks[x] * e;
        dq2(r, x) += aq * kse;
        dk2n(r, x) += ak * kse;
        dkt(s, x) += (aq * qr[x] + akb * kr[x]) * e;
      }
    }
  }
  for (int32_t r = 0; r < L; ++r) {
    float db = 0.0f;
    for (int32_t x = 0; x < K; ++x) {
      const float dk2 = c.beta[r] * dk2n(r, x);
      db += c.k(r)[x] * dk2n(r, x);
      dlam(r, x) += c.q(r)[x] * dq2(r, x) + c.k(r)[x] * (dk2 - dkt(r, x));
      dK(r, x) += dk2 + dkt(r, x);
    }
    dbeta[r] += db;
  }
}

}  // namespace

void kda_bwd_grads(const BwdGradArgs& a) {
  for_each_grad_chunk(a, [&](const GradChunk& c, float* dv_out) {
    const Dims& d = c.d;
    const int32_t K = d.K, L = c.L;
    Mat dQi(L, K), dW(L, K), dlam(L, K), dK(L, K), dAkk(L, L), dq2(L, K);
    std::vector<float> dbeta(L, 0.0f);
    inter_part(c, dQi, dW, dlam, dK);
    wy_part(c, dW, dv_out, dK, dlam, dbeta, dAkk);
    intra_part(c, dAkk, dq2, dK, dlam, dbeta);
    for (int32_t r = 0; r < L; ++r)
      for (int32_t x = 0; x < K; ++x) dQi(r, x) += dq2(r, x);  // dq = the inter part + the intra part
    store_grad_rows(c, dQi, dK, dlam.v.data(), dbeta);
  });
}

}  // namespace kcp::kernels::cpu
