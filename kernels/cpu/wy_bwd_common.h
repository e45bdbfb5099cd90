// Chunk-local helpers shared by the GDN and KDA backward of the CPU twin (B4 inter part and the
// WY backward B5), working on one (chunk, value head). Internal to kernels/cpu.
#pragma once

#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_common.h"

namespace kcp::kernels::cpu {

// One (chunk, value head) of bwd_grads (work item w = n HV + j): its rows of every input (value
// head j, q/k head i, tokens t0 .. t0 + L), its betas, its states h and dh. GDN and KDA.
struct GradChunk {
  const Dims& d;
  const BwdGradArgs& a;
  const CallerIn& dOin;
  const CallerIn& v;
  int64_t t0;
  int32_t j, i, L;
  const float* S;    // h[n]
  const float* dSp;  // dh[n]
  std::vector<float> beta;
  const float* q(int32_t r) const { return a.q.f32() + d.qk(t0 + r, i); }
  const float* k(int32_t r) const { return a.k.f32() + d.qk(t0 + r, i); }
  const float* vn(int32_t r) const { return a.v_new.f32() + d.vv(t0 + r, j); }
  const float* dvn(int32_t r) const { return a.dv2.f32() + d.vv(t0 + r, j); }
  const float* dO(int32_t r) const { return dOin.get() + d.vv(t0 + r, j); }
  const float* vin(int32_t r) const { return v.get() + d.vv(t0 + r, j); }
  const float* gate(int32_t r) const { return a.gcum + d.gg(t0 + r, j); }  // gw floats: GDN 1, KDA K
  float g(int32_t r) const { return gate(r)[0]; }                          // GDN's gate of row r
};

inline GradChunk grad_chunk(const Dims& d, const BwdGradArgs& a, const CallerIn& dOin, const CallerIn& v, int64_t w) {
  const int64_t n = w / d.HV;
  const ChunkDesc& ch = a.ctx.layout.chunks[n];
  const int32_t j = static_cast<int32_t>(w % d.HV);
  GradChunk c{d, a, dOin, v, ch.begin, j, j / d.G, ch.len, a.h.f32() + d.kv(n, j), a.dh.f32() + d.kv(n, j), {}};
  c.beta.resize(c.L);
  for (int32_t r = 0; r < c.L; ++r) c.beta[r] = a.beta[d.th(c.t0 + r, j)];
  return c;
}

// Runs f(c, dv_out) for every (chunk, value head) c of the phase, in parallel (dv_out: the decoded
// dv of every row, encoded into a.dv at the end).
template <class F>
void for_each_grad_chunk(const BwdGradArgs& a, F&& f) {
  const Dims d(a.ctx);
  const CallerIn dOin(a.dO, d.T * d.HV * d.V, d), v(a.v, d.T * d.HV * d.V, d);
  CallerOut dvout(a.dv, d.T * d.HV * d.V, d);
  parallel_for(d.NT * d.HV, a.ctx.exec.threads, [&](int64_t w) { f(grad_chunk(d, a, dOin, v, w), dvout.get()); });
  dvout.store();
}

// Row-major L x N scratch matrix.
struct Mat {
  int32_t rows = 0, cols = 0;
  std::vector<float> v;
  Mat(int32_t r, int32_t c) : rows(r), cols(c), v(size_t(r) * c, 0.0f) {}
  float& operator()(int32_t r, int32_t c) { return v[size_t(r) * cols + c]; }
  float operator()(int32_t r, int32_t c) const { return v[size_t(r) * cols + c]; }
};

// dPhi = dW Xb^T + dv2 Yb^T, strictly lower (fp32; the sum over K, then over V, in increasing
// order). dv2(r): row r of dv2 (V floats).
template <class Dv2>
void dphi_lower(const Mat& dW, const Mat& Xb, const Mat& Yb, Dv2&& dv2, int32_t L, Mat& dPhi) {
  const int32_t K = dW.cols, V = Yb.cols;
  for (int32_t r = 0; r < L; ++r)
    for (int32_t s = 0; s < r; ++s) {
      float acc = 0.0f;
      for (int32_t x = 0; x < K; ++x) acc += dW(r, x) * Xb(s, x);
      for (int32_t e = 0; e < V; ++e) acc += dv2(r)[e] * Yb(s, e);
      dPhi(r, s) = acc;
    }
}

// dPi (pre-gate gradient w.r.t. Pi, strictly lower, fp32) from dPhi (fp32, only its strictly
// lower part is used) and Phi (dtype), docs/algorithm.md B5:
//   dPi = -stril(Phi^T dtype(stril(dPhi)) ... ) as two dtype-operand products:
//   T1 = dtype(stril(dPhi)) Phi^T (fp32 accumulation), T2 = Phi^T dtype(T1), dPi = -stril(T2).
inline void phi_backward(const Dims& d, const Mat& Phi, const Mat& dPhi, int32_t L, Mat& dPi) {
  Mat dPhib(L, L), T1b(L, L);
  for (int32_t r = 0; r < L; ++r)
    for (int32_t s = 0; s < r; ++s) dPhib(r, s) = d.rnd(dPhi(r, s));
  for (int32_t m = 0; m < L; ++m)
    for (int32_t s = 0; s < m; ++s) {  // only the strictly lower part of T1 reaches stril(T2)
      float acc = 0.0f;
      for (int32_t x = 0; x < m && x <= s; ++x) acc += dPhib(m, x) * Phi(s, x);
      T1b(m, s) = d.rnd(acc);
    }
  for (int32_t r = 0; r < L; ++r)
    for (int32_t s = 0; s < L; ++s) {
      if (s >= r) {
        dPi(r, s) = 0.0f;
        continue;
      }
      float acc = 0.0f;
      for (int32_t m = r; m < L; ++m) acc += Phi(m, r) * T1b(m, s);
      dPi(r, s) = -acc;
    }
}

// The WY backward's operands of a chunk ([D5] / [E2]): X = (k beta) gam with gam(r, x) the gate
// factor of row r, channel x (GDN exp2(g_r), KDA exp2(g_r[x])), and Phi; dPhi = dw Xb^T + dv2
// Yb^T with Xb = dtype(X), Yb = dtype(v beta) (as the forward).
template <class Gam>
void wy_operands(const GradChunk& c, const Mat& dW, Gam gam, Mat& X, Mat& Phi, Mat& dPhi) {
  const Dims& d = c.d;
  const int32_t K = d.K, V = d.V, L = c.L;
  Mat Xb(L, K), Yb(L, V);
  for (int32_t r = 0; r < L; ++r) {
    for (int32_t x = 0; x < K; ++x) {
      X(r, x) = (c.k(r)[x] * c.beta[r]) * gam(r, x);
      Xb(r, x) = d.rnd(X(r, x));
    }
    for (int32_t e = 0; e < V; ++e) Yb(r, e) = d.rnd(c.vin(r)[e] * c.beta[r]);
    const float* ph = c.a.Phi.f32() + d.cc(c.t0 + r, c.j);
    for (int32_t s = 0; s < L; ++s) Phi(r, s) = ph[s];
  }
  dphi_lower(
      dW, Xb, Yb, [&](int32_t r) { return c.dvn(r); }, L, dPhi);
}

// dX = Phi^T dw and dY = Phi^T dv2 of row r: sums over m >= r in increasing order.
inline void phi_t_row(const GradChunk& c, const Mat& Phi, const Mat& dW, int32_t r, std::vector<float>& dX,
                      std::vector<float>& dY) {
  std::fill(dX.begin(), dX.end(), 0.0f);
  std::fill(dY.begin(), dY.end(), 0.0f);
  for (int32_t m = r; m < c.L; ++m) {
    const float p = Phi(m, r);
    const float* dv2m = c.dvn(m);
    for (int32_t x = 0; x < c.d.K; ++x) dX[x] += p * dW(m, x);
    for (int32_t e = 0; e < c.d.V; ++e) dY[e] += p * dv2m[e];
  }
}

// The chunk's rows of the phase's outputs: dq_hv = dQ, dk_hv = dK, dbeta, and dlam from the
// row-major L x gw floats at dlam (GDN one a row, KDA K).
inline void store_grad_rows(const GradChunk& c, const Mat& dQ, const Mat& dK, const float* dlam,
                            const std::vector<float>& dbeta) {
  const Dims& d = c.d;
  for (int32_t r = 0; r < c.L; ++r) {
    const int64_t t = c.t0 + r;
    float* dq = c.a.dq_hv + d.hk(t, c.j);
    float* dk = c.a.dk_hv + d.hk(t, c.j);
    float* dl = c.a.dlam + d.gg(t, c.j);
    for (int32_t x = 0; x < d.K; ++x) {
      dq[x] = dQ(r, x);
      dk[x] = dK(r, x);
    }
    for (int32_t x = 0; x < d.gw; ++x) dl[x] = dlam[int64_t(r) * d.gw + x];
    c.a.dbeta[d.th(t, c.j)] = dbeta[r];
  }
}

}  // namespace kcp::kernels::cpu
