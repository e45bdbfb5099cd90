// GDN backward gradients of the CPU twin per (chunk, value head): B4 (dq, dk, dw, dgate from
// h, dh, v_new, dv2) and B5 (WY backward), docs/algorithm.md 3.1. Outputs per value head: dq_hv, dk_hv,
// dlam (fp32), final dv (dtype) and dbeta (fp32).
//
// Rounding points:
//   [D1] B4 products with dtype operands (dO, v_new, h, dh, dv2) and fp32 accumulation:
//        dO v_new^T, dO h^T, v_new dh^T, dv2 h^T, <h, dh>.
//   [D2] dw = dtype(-dv2 h^T) (the GPU stores dw in dtype before the WY backward reads it).
//   [D3] E = tril(dO v_new^T * exp2(g_r - g_s) * scale) in fp32 (masked pairs selected as 0),
//        rounded to dtype for E K and E^T Q (fp32 accumulation).
//   [D4] gate: dlam_r = q_r . dQ_r - k_r . dK_r (fp32 dQ, dK) + last row Gam <h, dh> +
//        sum k . dK_inter, all fp32.
//   [D5] WY: operands xb = dtype(k beta gam), ub = dtype(v beta) (as the forward), dtype Phi,
//        dw, dv2; dX = Phi^T dw, dY = Phi^T dv2, dPhi = dw xb^T + dv2 ub^T, fp32 accumulation.
//   [D6] dPi via phi_backward (dtype operands, two roundings), dPi' = dPi * exp2(g_r - g_s) fp32,
//        dtype(dPi') as the operand of dPi' K and dPi'^T dtype(k beta); the gate term uses fp32
//        dPi' times fp32 beta_r (k_r . k_s).
//   [D7] dv = dtype(beta * dY); dbeta, dq_hv, dk_hv, dlam stay fp32.
#include "kernels/cpu/wy_bwd_common.h"

namespace kcp::kernels::cpu {

namespace {

// B4's products [D1]-[D3]: dQ = (dO h^T) exp2(g) scale, dKint = (v_new dh^T) exp2(gL - g), dW =
// dtype(-dv2 h^T), E; returns <h, dh>.
float b4_products(const GradChunk& c, Mat& dQ, Mat& dKint, Mat& dW, Mat& E) {
  const Dims& d = c.d;
  const int32_t K = d.K, V = d.V, L = c.L;
  const float gL = c.g(L - 1);
  float hdh = 0.0f;  // [D1] <h, dh>
  for (int64_t e = 0; e < int64_t(K) * V; ++e) hdh += c.S[e] * c.dSp[e];
  for (int32_t r = 0; r < L; ++r) {
    for (int32_t x = 0; x < K; ++x) {
      const float* Sx = c.S + int64_t(x) * V;
      const float* dSx = c.dSp + int64_t(x) * V;
      float aq = 0.0f, ak = 0.0f, aw = 0.0f;
      for (int32_t e = 0; e < V; ++e) {
        aq += c.dO(r)[e] * Sx[e];
        ak += c.vn(r)[e] * dSx[e];
        aw += c.dvn(r)[e] * Sx[e];
      }
      dQ(r, x) = aq * exp2f_(c.g(r)) * d.scale;
      dKint(r, x) = ak * exp2f_(gL - c.g(r));
      dW(r, x) = d.rnd(-aw);  // [D2]
    }
    for (int32_t s = 0; s <= r; ++s) {  // [D3]
      float acc = 0.0f;
      for (int32_t e = 0; e < V; ++e) acc += c.dO(r)[e] * c.vn(s)[e];
      E(r, s) = d.rnd(acc * exp2f_(c.g(r) - c.g(s)) * d.scale);
    }
  }
  return hdh;
}

// B4's sums: dQ += E K, dK = dKint + E^T Q, and the gate rows dlam [D4].
void b4_finish(const GradChunk& c, const Mat& E, const Mat& dKint, float hdh, Mat& dQ, Mat& dK,
               std::vector<float>& dlam) {
  const int32_t K = c.d.K, L = c.L;
  float dg_last = hdh * exp2f_(c.g(L - 1));
  for (int32_t r = 0; r < L; ++r)
    for (int32_t x = 0; x < K; ++x) dg_last += dKint(r, x) * c.k(r)[x];
  // E K and E^T Q; per element the sums run over s in increasing order (contiguous rows).
  std::vector<float> aq(K), ak(K);
  for (int32_t r = 0; r < L; ++r) {
    std::fill(aq.begin(), aq.end(), 0.0f);
    std::fill(ak.begin(), ak.end(), 0.0f);
    for (int32_t s = 0; s <= r; ++s) {
      const float e = E(r, s);
      const float* ks = c.k(s);
      for (int32_t x = 0; x < K; ++x) aq[x] += e * ks[x];
    }
    for (int32_t s = r; s < L; ++s) {
      const float e = E(s, r);
      const float* qs = c.q(s);
      for (int32_t x = 0; x < K; ++x) ak[x] += e * qs[x];
    }
    for (int32_t x = 0; x < K; ++x) {
      dQ(r, x) += aq[x];
      dK(r, x) = dKint(r, x) + ak[x];
    }
  }
  for (int32_t r = 0; r < L; ++r) {  // [D4]
    float sq = 0.0f, sk = 0.0f;
    for (int32_t x = 0; x < K; ++x) {
      sq += c.q(r)[x] * dQ(r, x);
      sk += c.k(r)[x] * dK(r, x);
    }
    dlam[r] = sq - sk;
  }
  dlam[L - 1] += dg_last;
}

// B5's WY rows [D5], [D7]: dX = Phi^T dw and dY = Phi^T dv2 into dK, dbeta, dlam and dv (rows of
// value head j in dv_out); Phi and dPhi = dw xb^T + dv2 ub^T for the Phi backward.
void b5_wy(const GradChunk& c, const Mat& dW, float* dv_out, Mat& Phi, Mat& dPhi, Mat& dK, std::vector<float>& dbeta,
           std::vector<float>& dlam) {
  const Dims& d = c.d;
  const int32_t K = d.K, V = d.V, L = c.L;
  Mat X(L, K);  // [D5] X's expression is the forward's [W1]
  wy_operands(
      c, dW, [&](int32_t r, int32_t) { return exp2f_(c.g(r)); }, X, Phi, dPhi);
  std::vector<float> dX(K), dY(V);
  for (int32_t r = 0; r < L; ++r) {
    phi_t_row(c, Phi, dW, r, dX, dY);
    const float eg = exp2f_(c.g(r));
    float db = 0.0f, dl = 0.0f;
    for (int32_t x = 0; x < K; ++x) {
      dK(r, x) += dX[x] * (c.beta[r] * eg);
      db += dX[x] * (c.k(r)[x] * eg);
      dl += dX[x] * X(r, x);
    }
    float* dv = dv_out + d.vv(c.t0 + r, c.j);
    for (int32_t e = 0; e < V; ++e) {
      dv[e] = d.rnd(c.beta[r] * dY[e]);  // [D7]
      db += dY[e] * c.vin(r)[e];
    }
    dbeta[r] += db;
    dlam[r] += dl;
  }
}

// B5's Phi backward [D6]: dPi, gated, into dK, dbeta and dlam.
void b5_phi(const GradChunk& c, const Mat& Phi, const Mat& dPhi, Mat& dK, std::vector<float>& dbeta,
            std::vector<float>& dlam) {
  const Dims& d = c.d;
  const int32_t K = d.K, L = c.L;
  Mat dPi(L, L), kk(L, L);
  phi_backward(d, Phi, dPhi, L, dPi);  // [D6]
  Mat dPig(L, L), dPib(L, L);
  for (int32_t r = 0; r < L; ++r)
    for (int32_t s = 0; s < r; ++s) {
      dPig(r, s) = dPi(r, s) * exp2f_(c.g(r) - c.g(s));
      dPib(r, s) = d.rnd(dPig(r, s));
      float acc = 0.0f;
      for (int32_t x = 0; x < K; ++x) acc += c.k(r)[x] * c.k(s)[x];
      kk(r, s) = acc;
    }
  Mat Kb(L, K);  // dtype(k beta), operand of dPi'^T (k beta)
  for (int32_t m = 0; m < L; ++m)
    for (int32_t x = 0; x < K; ++x) Kb(m, x) = d.rnd(c.k(m)[x] * c.beta[m]);
  std::vector<float> row(K), col(K);
  for (int32_t r = 0; r < L; ++r) {
    std::fill(row.begin(), row.end(), 0.0f);
    std::fill(col.begin(), col.end(), 0.0f);
    for (int32_t s = 0; s < r; ++s) {
      const float p = dPib(r, s);
      const float* ks = c.k(s);
      for (int32_t x = 0; x < K; ++x) row[x] += p * ks[x];
    }
    for (int32_t m = r + 1; m < L; ++m) {
      const float p = dPib(m, r);
      for (int32_t x = 0; x < K; ++x) col[x] += p * Kb(m, x);
    }
    float db = 0.0f;
    for (int32_t x = 0; x < K; ++x) {
      db += row[x] * c.k(r)[x];
      dK(r, x) += c.beta[r] * row[x] + col[x];
    }
    dbeta[r] += db;
    float gl = 0.0f;
    for (int32_t s = 0; s < r; ++s) gl += dPig(r, s) * (c.beta[r] * kk(r, s));
    for (int32_t m = r + 1; m < L; ++m) gl -= dPig(m, r) * (c.beta[m] * kk(m, r));
    dlam[r] += gl;
  }
}

}  // namespace

void gdn_bwd_grads(const BwdGradArgs& a) {
  for_each_grad_chunk(a, [&](const GradChunk& c, float* dv_out) {
    const Dims& d = c.d;
    const int32_t K = d.K, L = c.L;
    Mat dQ(L, K), dK(L, K), dKint(L, K), dW(L, K), E(L, L), Phi(L, L), dPhi(L, L);
    std::vector<float> dlam(L), dbeta(L, 0.0f);
    const float hdh = b4_products(c, dQ, dKint, dW, E);
    b4_finish(c, E, dKint, hdh, dQ, dK, dlam);
    b5_wy(c, dW, dv_out, Phi, dPhi, dK, dbeta, dlam);
    b5_phi(c, Phi, dPhi, dK, dbeta, dlam);
    store_grad_rows(c, dQ, dK, dlam.data(), dbeta);
  });
}

}  // namespace kcp::kernels::cpu
