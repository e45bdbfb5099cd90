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

void gdn_bwd_grads(const BwdGradArgs& a) {
  const Dims d(a.ctx);
  const int32_t K = d.K, V = d.V;
  const CallerIn dOin(a.dO, d.T * d.HV * V, d), v(a.v, d.T * d.HV * V, d);
  CallerOut dvout(a.dv, d.T * d.HV * V, d);
  parallel_for(d.NT * d.HV, a.ctx.exec.threads, [&](int64_t w) {
    const int64_t n = w / d.HV;
    const ChunkDesc& ch = a.ctx.layout.chunks[n];
    const int32_t j = static_cast<int32_t>(w % d.HV), i = j / d.G;
    const int32_t L = ch.len;
    const int64_t t0 = ch.begin;
    const float* S = a.h.f32() + d.kv(n, j);
    const float* dSp = a.dh.f32() + d.kv(n, j);
    auto q = [&](int32_t r) { return a.q.f32() + d.qk(t0 + r, i); };
    auto k = [&](int32_t r) { return a.k.f32() + d.qk(t0 + r, i); };
    auto vn = [&](int32_t r) { return a.v_new.f32() + d.vv(t0 + r, j); };
    auto dvn = [&](int32_t r) { return a.dv2.f32() + d.vv(t0 + r, j); };
    auto dO = [&](int32_t r) { return dOin.get() + d.vv(t0 + r, j); };
    auto vin = [&](int32_t r) { return v.get() + d.vv(t0 + r, j); };
    std::vector<float> g(L), beta(L);
    for (int32_t r = 0; r < L; ++r) {
      g[r] = a.gcum[d.gg(t0 + r, j)];
      beta[r] = a.beta[d.th(t0 + r, j)];
    }
    const float gL = g[L - 1];

    // ---- B4 ----
    float hdh = 0.0f;  // [D1] <h, dh>
    for (int64_t e = 0; e < int64_t(K) * V; ++e) hdh += S[e] * dSp[e];
    Mat dQ(L, K), dK(L, K), dKint(L, K), dW(L, K), E(L, L);
    for (int32_t r = 0; r < L; ++r) {
      for (int32_t x = 0; x < K; ++x) {
        const float* Sx = S + int64_t(x) * V;
        const float* dSx = dSp + int64_t(x) * V;
        float aq = 0.0f, ak = 0.0f, aw = 0.0f;
        for (int32_t e = 0; e < V; ++e) {
          aq += dO(r)[e] * Sx[e];
          ak += vn(r)[e] * dSx[e];
          aw += dvn(r)[e] * Sx[e];
        }
        dQ(r, x) = aq * exp2f_(g[r]) * d.scale;
        dKint(r, x) = ak * exp2f_(gL - g[r]);
        dW(r, x) = d.rnd(-aw);  // [D2]
      }
      for (int32_t s = 0; s <= r; ++s) {  // [D3]
        float acc = 0.0f;
        for (int32_t e = 0; e < V; ++e) acc += dO(r)[e] * vn(s)[e];
        E(r, s) = d.rnd(acc * exp2f_(g[r] - g[s]) * d.scale);
      }
    }
    float dg_last = hdh * exp2f_(gL);
    for (int32_t r = 0; r < L; ++r)
      for (int32_t x = 0; x < K; ++x) dg_last += dKint(r, x) * k(r)[x];
    // E K and E^T Q; per element the sums run over s in increasing order (contiguous rows).
    std::vector<float> aq(K), ak(K);
    for (int32_t r = 0; r < L; ++r) {
      std::fill(aq.begin(), aq.end(), 0.0f);
      std::fill(ak.begin(), ak.end(), 0.0f);
      for (int32_t s = 0; s <= r; ++s) {
        const float e = E(r, s);
        const float* ks = k(s);
        for (int32_t x = 0; x < K; ++x) aq[x] += e * ks[x];
      }
      for (int32_t s = r; s < L; ++s) {
        const float e = E(s, r);
        const float* qs = q(s);
        for (int32_t x = 0; x < K; ++x) ak[x] += e * qs[x];
      }
      for (int32_t x = 0; x < K; ++x) {
        dQ(r, x) += aq[x];
        dK(r, x) = dKint(r, x) + ak[x];
      }
    }
    std::vector<float> dlam(L), dbeta(L, 0.0f);
    for (int32_t r = 0; r < L; ++r) {  // [D4]
      float sq = 0.0f, sk = 0.0f;
      for (int32_t x = 0; x < K; ++x) {
        sq += q(r)[x] * dQ(r, x);
        sk += k(r)[x] * dK(r, x);
      }
      dlam[r] = sq - sk;
    }
    dlam[L - 1] += dg_last;

    // ---- B5 ----
    Mat X(L, K), Xb(L, K), Yb(L, V), Phi(L, L), dPhi(L, L), dPi(L, L), kk(L, L);
    for (int32_t r = 0; r < L; ++r) {
      const float eg = exp2f_(g[r]);
      for (int32_t x = 0; x < K; ++x) {
        X(r, x) = (k(r)[x] * beta[r]) * eg;  // [D5] same expression as the forward's [W1]
        Xb(r, x) = d.rnd(X(r, x));
      }
      for (int32_t e = 0; e < V; ++e) Yb(r, e) = d.rnd(vin(r)[e] * beta[r]);
      const float* ph = a.Phi.f32() + d.cc(t0 + r, j);
      for (int32_t s = 0; s < L; ++s) Phi(r, s) = ph[s];
    }
    dphi_lower(dW, Xb, Yb, dvn, L, dPhi);
    std::vector<float> dX(K), dY(V);
    for (int32_t r = 0; r < L; ++r) {
      // dX = Phi^T dw, dY = Phi^T dv2 (row r): sums over m >= r in increasing order.
      std::fill(dX.begin(), dX.end(), 0.0f);
      std::fill(dY.begin(), dY.end(), 0.0f);
      for (int32_t m = r; m < L; ++m) {
        const float p = Phi(m, r);
        const float* dv2m = dvn(m);
        for (int32_t x = 0; x < K; ++x) dX[x] += p * dW(m, x);
        for (int32_t e = 0; e < V; ++e) dY[e] += p * dv2m[e];
      }
      const float eg = exp2f_(g[r]);
      float db = 0.0f, dl = 0.0f;
      for (int32_t x = 0; x < K; ++x) {
        dK(r, x) += dX[x] * (beta[r] * eg);
        db += dX[x] * (k(r)[x] * eg);
        dl += dX[x] * X(r, x);
      }
      float* dv = dvout.get() + d.vv(t0 + r, j);
      for (int32_t e = 0; e < V; ++e) {
        dv[e] = d.rnd(beta[r] * dY[e]);  // [D7]
        db += dY[e] * vin(r)[e];
      }
      dbeta[r] += db;
      dlam[r] += dl;
    }
    phi_backward(d, Phi, dPhi, L, dPi);  // [D6]
    Mat dPig(L, L), dPib(L, L);
    for (int32_t r = 0; r < L; ++r)
      for (int32_t s = 0; s < r; ++s) {
        dPig(r, s) = dPi(r, s) * exp2f_(g[r] - g[s]);
        dPib(r, s) = d.rnd(dPig(r, s));
        float acc = 0.0f;
        for (int32_t x = 0; x < K; ++x) acc += k(r)[x] * k(s)[x];
        kk(r, s) = acc;
      }
    Mat Kb(L, K);  // dtype(k beta), operand of dPi'^T (k beta)
    for (int32_t m = 0; m < L; ++m)
      for (int32_t x = 0; x < K; ++x) Kb(m, x) = d.rnd(k(m)[x] * beta[m]);
    std::vector<float> row(K), col(K);
    for (int32_t r = 0; r < L; ++r) {
      std::fill(row.begin(), row.end(), 0.0f);
      std::fill(col.begin(), col.end(), 0.0f);
      for (int32_t s = 0; s < r; ++s) {
        const float p = dPib(r, s);
        const float* ks = k(s);
        for (int32_t x = 0; x < K; ++x) row[x] += p * ks[x];
      }
      for (int32_t m = r + 1; m < L; ++m) {
        const float p = dPib(m, r);
        for (int32_t x = 0; x < K; ++x) col[x] += p * Kb(m, x);
      }
      float db = 0.0f;
      for (int32_t x = 0; x < K; ++x) {
        db += row[x] * k(r)[x];
        dK(r, x) += beta[r] * row[x] + col[x];
      }
      dbeta[r] += db;
      float gl = 0.0f;
      for (int32_t s = 0; s < r; ++s) gl += dPig(r, s) * (beta[r] * kk(r, s));
      for (int32_t m = r + 1; m < L; ++m) gl -= dPig(m, r) * (beta[m] * kk(m, r));
      dlam[r] += gl;
    }

    for (int32_t r = 0; r < L; ++r) {
      const int64_t t = t0 + r;
      float* dq = a.dq_hv + d.hk(t, j);
      float* dk = a.dk_hv + d.hk(t, j);
      for (int32_t x = 0; x < K; ++x) {
        dq[x] = dQ(r, x);
        dk[x] = dK(r, x);
      }
      a.dbeta[d.th(t, j)] = dbeta[r];
      a.dlam[d.gg(t, j)] = dlam[r];
    }
  });
  dvout.store();
}

}  // namespace kcp::kernels::cpu
