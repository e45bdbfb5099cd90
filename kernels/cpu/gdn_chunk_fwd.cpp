// GDN forward, operator-specific parts of the CPU twin: the intra-chunk key-key matrix and its
// inverse (prep, docs/algorithm.md F1/F2) and the output (F5). The state recurrence is in chunk_state.cpp.
//
// Rounding points:
//   [G1] K K^T: dtype operands (k as stored), fp32 accumulation; then beta_r and the gate
//        exp2(g_r - g_s) in fp32 (docs/algorithm.md 2.1). Only r > s inside the chunk is computed: masked
//        entries are selected as 0, never multiplied (docs/algorithm.md 7.1); exponents are <= 0.
//   [G2] Phi: fp32 16x16-block inverse (tril_inverse_64), stored rounded to dtype.
//   [G3] output: Q h with dtype q and dtype h, fp32 accumulation, times exp2(g_r) in fp32;
//        P[r,s] = (q_r . k_s) exp2(g_r - g_s) in fp32 (dtype operands for q.k), rounded to
//        dtype for P v_new (fp32 accumulation); o = dtype(scale * inter + scale * intra).
//        (scale is applied after the P v_new product, as the GPU kernel does.)
#include <vector>

#include "kernels/cpu/cpu_common.h"

namespace kcp::kernels::cpu {

void gdn_intra(const PrepArgs& a) {
  const Dims d(a.ctx);
  const int32_t C = d.C;
  parallel_for(d.NT * d.HV, a.ctx.exec.threads, [&](int64_t w) {
    const ChunkDesc& ch = a.ctx.layout.chunks[w / d.HV];
    const int32_t j = static_cast<int32_t>(w % d.HV), i = j / d.G;
    const int32_t L = ch.len;
    std::vector<float> Pi(size_t(C) * C, 0.0f), Phi(size_t(C) * C);
    for (int32_t r = 1; r < L; ++r) {
      const int64_t tr = ch.begin + r;
      const float* kr = a.k_out.f32() + d.qk(tr, i);
      const float br = a.beta[d.th(tr, j)];
      const float gr = a.gcum[d.gg(tr, j)];
      for (int32_t s = 0; s < r; ++s) {
        const int64_t ts = ch.begin + s;
        const float* ks = a.k_out.f32() + d.qk(ts, i);
        float kk = 0.0f;  // [G1]
        for (int32_t c = 0; c < d.K; ++c) kk += kr[c] * ks[c];
        Pi[size_t(r) * C + s] = (br * kk) * exp2f_(gr - a.gcum[d.gg(ts, j)]);
      }
    }
    tril_inverse_64(Pi.data(), Phi.data());  // [G2]
    for (int32_t r = 0; r < L; ++r) {
      float* row = a.Phi.f32() + d.cc(ch.begin + r, j);
      for (int32_t s = 0; s < C; ++s) row[s] = (s <= r && s < L) ? d.rnd(Phi[size_t(r) * C + s]) : 0.0f;
    }
  });
}

void gdn_output(const FwdOutputArgs& a) {
  const Dims d(a.ctx);
  CallerOut out(a.o, d.T * d.HV * d.V, d);
  parallel_for(d.NT * d.HV, a.ctx.exec.threads, [&](int64_t w) {
    const int64_t n = w / d.HV;
    const ChunkDesc& ch = a.ctx.layout.chunks[n];
    const int32_t j = static_cast<int32_t>(w % d.HV), i = j / d.G;
    const float* h = a.h.f32() + d.kv(n, j);
    std::vector<float> inter(d.V), intra(d.V), P(ch.len);
    for (int32_t r = 0; r < ch.len; ++r) {
      const int64_t tr = ch.begin + r;
      const float* qr = a.q.f32() + d.qk(tr, i);
      const float gr = a.gcum[d.gg(tr, j)];
      std::fill(inter.begin(), inter.end(), 0.0f);
      for (int32_t c = 0; c < d.K; ++c) {
        const float qc = qr[c];
        const float* hrow = h + int64_t(c) * d.V;
        for (int32_t e = 0; e < d.V; ++e) inter[e] += qc * hrow[e];
      }
      for (int32_t s = 0; s <= r; ++s) {
        const int64_t ts = ch.begin + s;
        const float* ks = a.k.f32() + d.qk(ts, i);
        float qk = 0.0f;
        for (int32_t c = 0; c < d.K; ++c) qk += qr[c] * ks[c];
        P[s] = d.rnd(qk * exp2f_(gr - a.gcum[d.gg(ts, j)]));  // [G3] P rounded for P v_new
      }
      std::fill(intra.begin(), intra.end(), 0.0f);
      for (int32_t s = 0; s <= r; ++s) {
        const float* vn = a.v_new.f32() + d.vv(ch.begin + s, j);
        for (int32_t e = 0; e < d.V; ++e) intra[e] += P[s] * vn[e];
      }
      const float eg = exp2f_(gr);
      float* o = out.get() + d.vv(tr, j);
      for (int32_t e = 0; e < d.V; ++e) o[e] = d.rnd(inter[e] * eg * d.scale + intra[e] * d.scale);
    }
  });
  out.store();
}

}  // namespace kcp::kernels::cpu
