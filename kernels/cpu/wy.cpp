// WY factors of the CPU twin (docs/algorithm.md F3), forward and backward recompute, GDN and KDA.
//
// Rounding points:
//   [W1] operands: xb = dtype((k * beta) * exp2(g)) (GDN scalar gate, KDA per channel) and
//        ub = dtype(v * beta), products in fp32 before the rounding.
//   [W2] W = Phi xb and U = Phi ub with dtype Phi, fp32 accumulation over s <= r, stored dtype.
//   [W3] KDA kg = dtype(k * exp2(g_last - g)) (exponent <= 0), stored dtype.
#include <vector>

#include "kernels/cpu/cpu_common.h"

namespace kcp::kernels::cpu {

void wy(const WyArgs& a) {
  const Dims d(a.ctx);
  const bool kda = a.ctx.problem.op == Op::Kda;
  const CallerIn v(a.v, d.T * d.HV * d.V, d);
  parallel_for(d.NT * d.HV, a.ctx.exec.threads, [&](int64_t w) {
    const ChunkDesc& ch = a.ctx.layout.chunks[w / d.HV];
    const int32_t j = static_cast<int32_t>(w % d.HV), i = j / d.G;
    const int32_t L = ch.len;
    std::vector<float> xb(size_t(L) * d.K), ub(size_t(L) * d.V);
    const float* gL = a.gcum + d.gg(ch.begin + L - 1, j);
    for (int32_t s = 0; s < L; ++s) {
      const int64_t ts = ch.begin + s;
      const float* ks = a.k.f32() + d.qk(ts, i);
      const float* vs = v.get() + d.vv(ts, j);
      const float* gs = a.gcum + d.gg(ts, j);
      const float bs = a.beta[d.th(ts, j)];
      for (int32_t c = 0; c < d.K; ++c)
        xb[size_t(s) * d.K + c] = d.rnd((ks[c] * bs) * exp2f_(gs[kda ? c : 0]));  // [W1]
      for (int32_t e = 0; e < d.V; ++e) ub[size_t(s) * d.V + e] = d.rnd(vs[e] * bs);
      if (kda) {
        float* kg = a.kg.f32() + d.hk(ts, j);
        for (int32_t c = 0; c < d.K; ++c) kg[c] = d.rnd(ks[c] * exp2f_(gL[c] - gs[c]));  // [W3]
      }
    }
    std::vector<float> accw(d.K), accu(d.V);
    for (int32_t r = 0; r < L; ++r) {
      const int64_t tr = ch.begin + r;
      const float* phi = a.Phi.f32() + d.cc(tr, j);
      std::fill(accw.begin(), accw.end(), 0.0f);
      std::fill(accu.begin(), accu.end(), 0.0f);
      for (int32_t s = 0; s <= r; ++s) {  // [W2]
        const float p = phi[s];
        for (int32_t c = 0; c < d.K; ++c) accw[c] += p * xb[size_t(s) * d.K + c];
        for (int32_t e = 0; e < d.V; ++e) accu[e] += p * ub[size_t(s) * d.V + e];
      }
      float* Wr = a.W.f32() + d.hk(tr, j);
      float* Ur = a.U.f32() + d.vv(tr, j);
      for (int32_t c = 0; c < d.K; ++c) Wr[c] = d.rnd(accw[c]);
      for (int32_t e = 0; e < d.V; ++e) Ur[e] = d.rnd(accu[e]);
    }
  });
}

}  // namespace kcp::kernels::cpu
