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

void kda_bwd_grads(const BwdGradArgs& a) {
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
    auto g = [&](int32_t r) { return a.gcum + d.gg(t0 + r, j); };
    auto vn = [&](int32_t r) { return a.v_new.f32() + d.vv(t0 + r, j); };
    auto dvn = [&](int32_t r) { return a.dv2.f32() + d.vv(t0 + r, j); };
    auto dO = [&](int32_t r) { return dOin.get() + d.vv(t0 + r, j); };
    auto vin = [&](int32_t r) { return v.get() + d.vv(t0 + r, j); };
    std::vector<float> beta(L);
    for (int32_t r = 0; r < L; ++r) beta[r] = a.beta[d.th(t0 + r, j)];
    const float* gL = g(L - 1);

    // ---- step 4, inter part [E1] ----
    Mat dQi(L, K), dKint(L, K), dW(L, K), dlam(L, K), dK(L, K);
    for (int32_t r = 0; r < L; ++r)
      for (int32_t x = 0; x < K; ++x) {
        const float* Sx = S + int64_t(x) * V;
        const float* dSx = dSp + int64_t(x) * V;
        float aq = 0.0f, ak = 0.0f, aw = 0.0f;
        for (int32_t e = 0; e < V; ++e) {
          aq += dO(r)[e] * Sx[e];
          ak += vn(r)[e] * dSx[e];
          aw += dvn(r)[e] * Sx[e];
        }
        dQi(r, x) = aq * exp2f_(g(r)[x]) * d.scale;
        dKint(r, x) = ak * exp2f_(gL[x] - g(r)[x]);
        dW(r, x) = d.rnd(-aw);
      }
    std::vector<float> dg_last(K);
    for (int32_t x = 0; x < K; ++x) {
      const float* Sx = S + int64_t(x) * V;
      const float* dSx = dSp + int64_t(x) * V;
      float acc = 0.0f;
      for (int32_t e = 0; e < V; ++e) acc += Sx[e] * dSx[e];
      acc *= exp2f_(gL[x]);
      for (int32_t r = 0; r < L; ++r) acc += k(r)[x] * dKint(r, x);
      dg_last[x] = acc;
    }
    for (int32_t r = 0; r < L; ++r)
      for (int32_t x = 0; x < K; ++x) {
        dlam(r, x) = q(r)[x] * dQi(r, x) - k(r)[x] * dKint(r, x);
        dK(r, x) = dKint(r, x);
      }
    for (int32_t x = 0; x < K; ++x) dlam(L - 1, x) += dg_last[x];

    // ---- step 4, WY part [E2] ----
    Mat X(L, K), Xb(L, K), Yb(L, V), Phi(L, L), dPhi(L, L), dAkk(L, L), dAqk(L, L);
    std::vector<float> dbeta(L, 0.0f);
    for (int32_t r = 0; r < L; ++r) {
      for (int32_t x = 0; x < K; ++x) {
        X(r, x) = (k(r)[x] * beta[r]) * exp2f_(g(r)[x]);
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
      float db = 0.0f;
      for (int32_t x = 0; x < K; ++x) {
        const float eg = exp2f_(g(r)[x]);
        dK(r, x) += dX[x] * (beta[r] * eg);
        db += dX[x] * (k(r)[x] * eg);
        dlam(r, x) += dX[x] * X(r, x);
      }
      float* dv = dvout.get() + d.vv(t0 + r, j);
      for (int32_t e = 0; e < V; ++e) {
        dv[e] = d.rnd(beta[r] * dY[e]);  // [E5]
        db += dY[e] * vin(r)[e];
      }
      dbeta[r] += db;
    }
    phi_backward(d, Phi, dPhi, L, dAkk);

    // ---- step 2: dAqk [E3] ----
    for (int32_t r = 0; r < L; ++r)
      for (int32_t s = 0; s <= r; ++s) {
        float acc = 0.0f;
        for (int32_t e = 0; e < V; ++e) acc += dO(r)[e] * vn(s)[e];
        dAqk(r, s) = d.scale * acc;
      }

    // ---- step 5: intra part [E4] ----
    Mat dq2(L, K), dk2n(L, K), dkt(L, K);
    for (int32_t r = 0; r < L; ++r) {
      const float* qr = q(r);
      const float* kr = k(r);
      const float* gr = g(r);
      for (int32_t s = 0; s <= r; ++s) {
        const float* ks = k(s);
        const float* gs = g(s);
        const float aq = dAqk(r, s);
        const float ak = s < r ? dAkk(r, s) : 0.0f;
        const float akb = ak * beta[r];
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
        const float dk2 = beta[r] * dk2n(r, x);
        db += k(r)[x] * dk2n(r, x);
        dlam(r, x) += q(r)[x] * dq2(r, x) + k(r)[x] * (dk2 - dkt(r, x));
        dK(r, x) += dk2 + dkt(r, x);
      }
      dbeta[r] += db;
    }

    for (int32_t r = 0; r < L; ++r) {
      const int64_t t = t0 + r;
      float* dq = a.dq_hv + d.hk(t, j);
      float* dk = a.dk_hv + d.hk(t, j);
      float* dl = a.dlam + d.gg(t, j);
      for (int32_t x = 0; x < K; ++x) {
        dq[x] = dQi(r, x) + dq2(r, x);
        dk[x] = dK(r, x);
        dl[x] = dlam(r, x);
      }
      a.dbeta[d.th(t, j)] = dbeta[r];
    }
  });
  dvout.store();
}

}  // namespace kcp::kernels::cpu
