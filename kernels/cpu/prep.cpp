// Phase 1 (local prep) of the CPU twin, shared by GDN and KDA: Q/K L2 norm, gate activation and
// chunk-local cumsum; then the operator's intra-chunk part (gdn_intra / kda_intra).
//
// Rounding points:
//   [P1] L2 norm: sum of squares, rstd and the product in fp32; the normalized q/k are stored
//        rounded to dtype, rstd in fp32 (docs/algorithm.md 1.3). Without L2 norm q/k are copied as given.
//   [P2] gate: activation in fp32; chunk-local inclusive cumsum in fp32 (sequential), then
//        multiplied by kRcpLn2 and stored fp32 (log2 units, docs/algorithm.md 1.2 / 7.4).
#include "kernels/cpu/cpu_common.h"

namespace kcp::kernels::cpu {

namespace {

// Natural-log decay a of one gate element (docs/algorithm.md 1.2), fp32.
float activate(const Problem& p, float graw, float A_log, float bias) {
  switch (p.gate) {
    case GateForm::Direct:
      return graw;
    case GateForm::Softplus:
      return -std::exp(A_log) * softplusf_(graw + bias);
    case GateForm::LowerBound: {
      const float x = graw + bias;
      const float z = p.has_A_log ? std::exp(A_log) * x : x;
      return p.lower_bound * sigmoidf_(z);
    }
  }
  return graw;
}

}  // namespace

void prep(const PrepArgs& a) {
  const char* ph = a.ctx.problem.op == Op::Gdn ? "gdn prep" : "kda prep";
  check_problem_layout(a.ctx, ph);
  check_prep_args(a, ph, twin_storage(a.ctx));
  const Problem& p = a.ctx.problem;
  const Dims d(a.ctx);

  // [P1] q/k after prep, per (t, i) row of length K.
  const CallerIn q(a.q, d.T * d.H * d.K, d), k(a.k, d.T * d.H * d.K, d);
  parallel_for(d.T, a.ctx.exec.threads, [&](int64_t t) {
    for (int32_t i = 0; i < d.H; ++i) {
      const int64_t o = d.qk(t, i);
      for (int pass = 0; pass < 2; ++pass) {
        const float* x = (pass == 0 ? q.get() : k.get()) + o;
        float* y = (pass == 0 ? a.q_out.f32() : a.k_out.f32()) + o;
        if (!p.qk_l2norm) {
          for (int32_t c = 0; c < d.K; ++c) y[c] = x[c];
          continue;
        }
        float ss = 0.0f;
        for (int32_t c = 0; c < d.K; ++c) ss += x[c] * x[c];
        const float r = 1.0f / std::sqrt(ss + kL2NormEps);
        for (int32_t c = 0; c < d.K; ++c) y[c] = d.rnd(x[c] * r);
        (pass == 0 ? a.rstd_q : a.rstd_k)[t * d.H + i] = r;
      }
    }
  });

  // [P2] gate activation + chunk-local cumsum, per (chunk, head).
  parallel_for(d.NT * d.HV, a.ctx.exec.threads, [&](int64_t w) {
    const ChunkDesc& ch = a.ctx.layout.chunks[w / d.HV];
    const int32_t j = static_cast<int32_t>(w % d.HV);
    const float A_log = p.has_A_log ? a.A_log[j] : 0.0f;
    for (int32_t c = 0; c < d.gw; ++c) {
      const float bias = p.has_dt_bias ? a.dt_bias[int64_t(j) * d.gw + c] : 0.0f;
      float acc = 0.0f;
      for (int32_t r = 0; r < ch.len; ++r) {
        const int64_t t = ch.begin + r;
        acc += activate(p, a.g[d.gg(t, j) + c], A_log, bias);
        a.gcum[d.gg(t, j) + c] = acc * kRcpLn2;
      }
    }
  });

  if (p.op == Op::Gdn)
    gdn_intra(a);
  else
    kda_intra(a);
}

}  // namespace kcp::kernels::cpu
