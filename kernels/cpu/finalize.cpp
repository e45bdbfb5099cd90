// Backward finalize of the CPU twin (docs/algorithm.md B6, B7, 3.2 step 6): GVA reduction of dq/dk,
// L2-norm backward, rounding to dtype; chunk-local reverse cumsum of dlam; raw-gate backward
// with this rank's partial sums of dA_log and ddt_bias.
//
// Rounding points:
//   [F1] dq, dk: sum over the G value heads of a group in fixed order (fp32), the L2-norm
//        backward dx = rstd (dy - (dy . y) y) in fp32 with y the stored normalized q/k, then a
//        single rounding to dtype at the end.
//   [F2] dA = chunk-local reverse cumsum of dlam (fp32, sequential from the chunk end).
//   [F3] raw-gate backward in fp32; dA_log / ddt_bias: fp32 partial sum per chunk (rows in
//        order, then channels), chunk partials added in chunk order (the det package's fixed
//        order; the twin uses it for nondet too).
#include <vector>

#include "kernels/cpu/cpu_common.h"

namespace kcp::kernels::cpu {

void bwd_finalize(const BwdFinalizeArgs& a) {
  const char* ph = a.ctx.problem.op == Op::Gdn ? "gdn bwd_finalize" : "kda bwd_finalize";
  check_problem_layout(a.ctx, ph);
  check_bwd_finalize_args(a, ph, twin_storage(a.ctx));
  const Problem& p = a.ctx.problem;
  const Dims d(a.ctx);

  // [F1]
  CallerOut dq(a.dq, d.T * d.H * d.K, d), dk(a.dk, d.T * d.H * d.K, d);
  parallel_for(d.T, a.ctx.exec.threads, [&](int64_t t) {
    std::vector<float> sum(d.K);
    for (int32_t i = 0; i < d.H; ++i)
      for (int pass = 0; pass < 2; ++pass) {
        const float* src = pass == 0 ? a.dq_hv : a.dk_hv;
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (int32_t gi = 0; gi < d.G; ++gi) {
          const float* x = src + d.hk(t, i * d.G + gi);
          for (int32_t c = 0; c < d.K; ++c) sum[c] += x[c];
        }
        float* out = (pass == 0 ? dq.get() : dk.get()) + d.qk(t, i);
        if (p.qk_l2norm) {
          const float* y = (pass == 0 ? a.q.f32() : a.k.f32()) + d.qk(t, i);
          const float r = (pass == 0 ? a.rstd_q : a.rstd_k)[t * d.H + i];
          float dot = 0.0f;
          for (int32_t c = 0; c < d.K; ++c) dot += sum[c] * y[c];
          for (int32_t c = 0; c < d.K; ++c) out[c] = d.rnd(r * (sum[c] - dot * y[c]));
        } else {
          for (int32_t c = 0; c < d.K; ++c) out[c] = d.rnd(sum[c]);
        }
      }
  });
  dq.store();
  dk.store();

  // [F2] + [F3], per value head (the partial sums of a head are one fixed-order chain).
  parallel_for(d.HV, a.ctx.exec.threads, [&](int64_t jj) {
    const int32_t j = static_cast<int32_t>(jj);
    const float ea = p.has_A_log ? std::exp(a.A_log[j]) : 1.0f;
    float tot_A = 0.0f;
    std::vector<float> tot_b(d.gw, 0.0f), part_b(d.gw), dA(d.C);
    for (int64_t n = 0; n < d.NT; ++n) {
      const ChunkDesc& ch = a.ctx.layout.chunks[n];
      float part_A = 0.0f;
      std::fill(part_b.begin(), part_b.end(), 0.0f);
      for (int32_t c = 0; c < d.gw; ++c) {
        float acc = 0.0f;
        for (int32_t r = ch.len - 1; r >= 0; --r) {
          acc += a.dlam[d.gg(ch.begin + r, j) + c];
          dA[r] = acc;
        }
        const float bias = p.has_dt_bias ? a.dt_bias[int64_t(j) * d.gw + c] : 0.0f;
        for (int32_t r = 0; r < ch.len; ++r) {
          const int64_t at = d.gg(ch.begin + r, j) + c;
          float dg = dA[r];
          if (p.gate == GateForm::Softplus) {
            const float x = a.g[at] + bias;
            const float sg = x > 20.0f ? 1.0f : sigmoidf_(x);
            const float av = -ea * softplusf_(x);
            dg = dA[r] * (-ea * sg);
            part_A += dA[r] * av;
          } else if (p.gate == GateForm::LowerBound) {
            const float x = a.g[at] + bias;
            const float z = p.has_A_log ? ea * x : x;
            const float sg = sigmoidf_(z);
            const float dz = dA[r] * p.lower_bound * sg * (1.0f - sg);
            dg = p.has_A_log ? dz * ea : dz;
            part_A += dz * z;
          }
          a.dg[at] = dg;
          part_b[c] += dg;
        }
      }
      tot_A += part_A;
      for (int32_t c = 0; c < d.gw; ++c) tot_b[c] += part_b[c];
    }
    if (a.dA_log) a.dA_log[j] = tot_A;
    if (a.ddt_bias)
      for (int32_t c = 0; c < d.gw; ++c) a.ddt_bias[int64_t(j) * d.gw + c] = tot_b[c];
  });
}

}  // namespace kcp::kernels::cpu
