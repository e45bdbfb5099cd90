// KDA forward, operator-specific parts of the CPU twin: the intra-chunk matrices Pi (key-key,
// for the inverse) and Aqk (query-key scores) with per-channel gates, the inverse (prep,
// docs/algorithm.md F1/F2/F5 KDA) and the output (F5). The state recurrence is in chunk_state.cpp.
//
// Rounding points:
//   [K1] Pi and Aqk: per pair (r, s), sum_d x_r[d] (k_s[d] exp2(g_r[d] - g_s[d])) with fp32
//        operands and fp32 accumulation, elementwise exponents (every exponent <= 0, masked pairs
//        never evaluated). kcpbench's CUDA prep (kernels/cuda/kda_prep_kernel.cuh) forms the
//        off-diagonal 16x16 sub-blocks through the pivot row at the later sub-block's first row
//        (F5, docs/algorithm.md 7.5) as fp32 products on CUDA cores (FLA: TF32 tensor cores);
//        the twin stays per pair, so the two differ by fp32 reassociation only.
//        Pi[r,s] = beta_r * sum (r > s); Aqk[r,s] = dtype(scale * sum) (r >= s), stored in dtype.
//   [K2] Phi: fp32 16x16-block inverse, stored rounded to dtype (Akk).
//   [K3] output: qg = dtype(q o exp2(g)) (fp32 product, tensor-core operand), qg h with dtype h,
//        fp32 accumulation; Aqk v_new with dtype operands; o = dtype(scale * inter + intra).
#include <vector>

#include "kernels/cpu/cpu_common.h"

namespace kcp::kernels::cpu {

void kda_intra(const PrepArgs& a) {
  const Dims d(a.ctx);
  const int32_t C = d.C;
  parallel_for(d.NT * d.HV, a.ctx.exec.threads, [&](int64_t w) {
    const ChunkDesc& ch = a.ctx.layout.chunks[w / d.HV];
    const int32_t j = static_cast<int32_t>(w % d.HV), i = j / d.G;
    const int32_t L = ch.len;
    std::vector<float> Pi(size_t(C) * C, 0.0f), Phi(size_t(C) * C);
    for (int32_t r = 0; r < L; ++r) {
      const int64_t tr = ch.begin + r;
      const float* qr = a.q_out.f32() + d.qk(tr, i);
      const float* kr = a.k_out.f32() + d.qk(tr, i);
      const float* gr = a.gcum + d.gg(tr, j);
      const float br = a.beta[d.th(tr, j)];
      float* arow = a.Aqk + d.cc(tr, j);
      for (int32_t s = 0; s < C; ++s) arow[s] = 0.0f;
      for (int32_t s = 0; s <= r; ++s) {
        const int64_t ts = ch.begin + s;
        const float* ks = a.k_out.f32() + d.qk(ts, i);
        const float* gs = a.gcum + d.gg(ts, j);
        float aq = 0.0f, ak = 0.0f;  // [K1]
        for (int32_t c = 0; c < d.K; ++c) {
          const float kse = ks[c] * exp2f_(gr[c] - gs[c]);
          aq += qr[c] * kse;
          ak += kr[c] * kse;
        }
        arow[s] = d.rnd(aq * d.scale);
        if (s < r) Pi[size_t(r) * C + s] = br * ak;
      }
    }
    tril_inverse_64(Pi.data(), Phi.data());  // [K2]
    for (int32_t r = 0; r < L; ++r) {
      float* row = a.Phi.f32() + d.cc(ch.begin + r, j);
      for (int32_t s = 0; s < C; ++s) row[s] = (s <= r && s < L) ? d.rnd(Phi[size_t(r) * C + s]) : 0.0f;
    }
  });
}

void kda_output(const FwdOutputArgs& a) {
  const Dims d(a.ctx);
  CallerOut out(a.o, d.T * d.HV * d.V, d);
  parallel_for(d.NT * d.HV, a.ctx.exec.threads, [&](int64_t w) {
    const int64_t n = w / d.HV;
    const ChunkDesc& ch = a.ctx.layout.chunks[n];
    const int32_t j = static_cast<int32_t>(w % d.HV), i = j / d.G;
    const float* h = a.h.f32() + d.kv(n, j);
    std::vector<float> inter(d.V), intra(d.V);
    for (int32_t r = 0; r < ch.len; ++r) {
      const int64_t tr = ch.begin + r;
      const float* qr = a.q.f32() + d.qk(tr, i);
      const float* gr = a.gcum + d.gg(tr, j);
      std::fill(inter.begin(), inter.end(), 0.0f);
      for (int32_t c = 0; c < d.K; ++c) {
        const float qg = d.rnd(qr[c] * exp2f_(gr[c]));  // [K3]
        const float* hrow = h + int64_t(c) * d.V;
        for (int32_t e = 0; e < d.V; ++e) inter[e] += qg * hrow[e];
      }
      std::fill(intra.begin(), intra.end(), 0.0f);
      const float* arow = a.Aqk + d.cc(tr, j);
      for (int32_t s = 0; s <= r; ++s) {
        const float* vn = a.v_new.f32() + d.vv(ch.begin + s, j);
        const float as = arow[s];
        for (int32_t e = 0; e < d.V; ++e) intra[e] += as * vn[e];
      }
      float* o = out.get() + d.vv(tr, j);
      for (int32_t e = 0; e < d.V; ++e) o[e] = d.rnd(inter[e] * d.scale + intra[e]);
    }
  });
  out.store();
}

}  // namespace kcp::kernels::cpu
