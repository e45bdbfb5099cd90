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

// One (chunk, value head) of the phase: its rows of every input (value head j, q/k head i,
// tokens t0 .. t0 + L), its gates and betas, its states h and dh.
struct GradChunk {
  const Dims& d;
  const BwdGradArgs& a;
  const CallerIn& dOin;
  const CallerIn& v;
  int64_t t0;
  int32_t j, i, L;
  const float* S;    // h[n]
  const float* dSp;  // dh[n]
  std::vector<float> g, beta;
  const float* q(int32_t r) const { return a.q.f32() + d.qk(t0 + r, i); }
  const float* k(int32_t r) const { return a.k.f32() + d.qk(t0 + r, i); }
  const float* vn(int32_t r) const { return a.v_new.f32() + d.vv(t0 + r, j); }
  const float* dvn(int32_t r) const { return a.dv2.f32() + d.vv(t0 + r, j); }
  const float* dO(int32_t r) const { return dOin.get() + d.vv(t0 + r, j); }
  const float* vin(int32_t r) const { return v.get() + d.vv(t0 + r, j); }
};

GradChunk chunk_of(const Dims& d, const BwdGradArgs& a, const CallerIn& dOin, const CallerIn& v, int64_t w) {
  const int64_t n = w / d.HV;
  const ChunkDesc& ch = a.ctx.layout.chunks[n];
  const int32_t j = static_cast<int32_t>(w % d.HV);
  GradChunk c{d, a, dOin, v, ch.begin, j, j / d.G, ch.len, a.h.f32() + d.kv(n, j), a.dh.f32() + d.kv(n, j), {}, {}};
  c.g.resize(c.L);
  c.beta.resize(c.L);
  for (int32_t r = 0; r < c.L; ++r) {
    c.g[r] = a.gcum[d.gg(c.t0 + r, j)];
    c.beta[r] = a.beta[d.th(c.t0 + r, j)];
  }
  return c;
}

// B4's products [D1]-[D3]: dQ = (dO h^T) exp2(g) scale, dKint = (v_new dh^T) exp2(gL - g), dW =
// dtype(-dv2 h^T), E; returns <h, dh>.
float b4_products(const GradChunk& c, Mat& dQ, Mat& dKint, Mat& dW, Mat& E) {
  const Dims& d = c.d;
  const int32_t K = d.K, V = d.V, L = c.L;
  const float gL = c.g[L - 1];
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
      dQ(r, x) = aq * exp2f_(c.g[r]) * d.scale;
      dKint(r, x) = ak * exp2f_(gL - c.g[r]);
      dW(r, x) = d.rnd(-aw);  // [D2]
    }
    for (int32_t s = 0; s <= r; ++s) {  // [D3]
      float acc = 0.0f;
      for (int32_t e = 0; e < V; ++e) acc += c.dO(r)[e] * c.vn(s)[e];
      E(r, s) = d.rnd(acc * exp2f_(c.g[r] - c.g[s]) * d.scale);
    }
  }
  return hdh;
}

// B4's sums: dQ += E K, dK = dKint + E^T Q, and the gate rows dlam [D4].
void b4_finish(const GradChunk& c, const Mat& E, const Mat& dKint, float hdh, Mat& dQ, Mat& dK,
               std::vector<float>& dlam) {
  const int32_t K = c.d.K, L = c.L;
  float dg_last = hdh * exp2f_(c.g[L - 1]);
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
  Mat X(L, K), Xb(L, K), Yb(L, V);
  for (int32_t r = 0; r < L; ++r) {
    const float eg = exp2f_(c.g[r]);
    for (int32_t x = 0; x < K; ++x) {
      X(r, x) = (c.k(r)[x] * c.beta[r]) * eg;  // [D5] same expression as the forward's [W1]
      Xb(r, x) = d.rnd(X(r, x));
    }
    for (int32_t e = 0; e < V; ++e) Yb(r, e) = d.rnd(c.vin(r)[e] * c.beta[r]);
    const float* ph = c.a.Phi.f32() + d.cc(c.t0 + r, c.j);
    for (int32_t s = 0; s < L; ++s) Phi(r, s) = ph[s];
  }
  dphi_lower(
      dW, Xb, Yb, [&](int32_t r) { return c.dvn(r); }, L, dPhi);
  std::vector<float> dX(K), dY(V);
  for (int32_t r = 0; r < L; ++r) {
    // dX = Phi^T dw, dY = Phi^T dv2 (row r): sums over m >= r in increasing order.
    std::fill(dX.begin(), dX.end(), 0.0f);
    std::fill(dY.begin(), dY.end(), 0.0f);
    for (int32_t m = r; m < L; ++m) {
      const float p = Phi(m, r);
      const float* dv2m = c.dvn(m);
      for (int32_t x = 0; x < K; ++x) dX[x] += p * dW(m, x);
      for (int32_t e = 0; e < V; ++e) dY[e] += p * dv2m[e];
    }
    const float eg = exp2f_(c.g[r]);
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
      dPig(r, s) = dPi(r, s) * exp2f_(c.g[r] - c.g[s]);
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
  const Dims d(a.ctx);
  const CallerIn dOin(a.dO, d.T * d.HV * d.V, d), v(a.v, d.T * d.HV * d.V, d);
  CallerOut dvout(a.dv, d.T * d.HV * d.V, d);
  parallel_for(d.NT * d.HV, a.ctx.exec.threads, [&](int64_t w) {
    const GradChunk c = chunk_of(d, a, dOin, v, w);
    const int32_t K = d.K, L = c.L;
    Mat dQ(L, K), dK(L, K), dKint(L, K), dW(L, K), E(L, L), Phi(L, L), dPhi(L, L);
    std::vector<float> dlam(L), dbeta(L, 0.0f);
    const float hdh = b4_products(c, dQ, dKint, dW, E);
    b4_finish(c, E, dKint, hdh, dQ, dK, dlam);
    b5_wy(c, dW, dvout.get(), Phi, dPhi, dK, dbeta, dlam);
    b5_phi(c, Phi, dPhi, dK, dbeta, dlam);
    for (int32_t r = 0; r < L; ++r) {
      const int64_t t = c.t0 + r;
      float* dq = a.dq_hv + d.hk(t, c.j);
      float* dk = a.dk_hv + d.hk(t, c.j);
      for (int32_t x = 0; x < K; ++x) {
        dq[x] = dQ(r, x);
        dk[x] = dK(r, x);
      }
      a.dbeta[d.th(t, c.j)] = dbeta[r];
      a.dlam[d.gg(t, c.j)] = dlam[r];
    }
  });
  dvout.store();
}

}  // namespace kcp::kernels::cpu
