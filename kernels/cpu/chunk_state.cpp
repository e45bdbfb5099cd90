// State recurrences of the CPU twin, GDN and KDA, per (segment, value head): forward summaries
// (h_ext, M from a zero state), the forward recurrence from segment entry states (h, v_new, ht),
// the backward local dv, the reverse summaries (dh_ext from a zero exit gradient) and the dh
// recurrence from segment exit gradients (dh, dv2, dh0). docs/algorithm.md F4, B2, B3, 4.2, 4.3.
// Summaries nobody reads are zeros, not walked (kernels/api/summary_needs.h).
//
// Rounding points (forward walk, per chunk):
//   [S1] h[n] = dtype(S) stored; the same dtype(S) is the operand of W S (docs/algorithm.md 2.1).
//   [S2] v_new: fp32 U - (W dtype(S)) (dtype operands, fp32 accumulation), stored dtype(v_new).
//   [S3] GDN: the update operand is dtype(v_new_fp32 * exp2(g_last - g_r)) with raw dtype k;
//        KDA: the update operand is dtype(v_new) with kg (dtype).
//        S <- S * Gam + (Kt^T v) in fp32 (Gam = exp2(g_last), per channel for KDA).
//   [S4] M chain (summaries): M_c = Diag(Gam) - Kt^T W with dtype operands (GDN
//        Kt = dtype(k * exp2(g_last - g_r)), KDA Kt = kg) and fp32 accumulation; M <- M_c M with
//        fp32 operands and accumulation (never rounded, docs/algorithm.md 7.2). Stored as M^T.
//   [S5] the final state ht stays fp32.
// Rounding points (backward walk, per chunk, last to first):
//   [B1] dh[n] = dtype(dS) stored; the same dtype(dS) is the operand of Kt dS.
//   [B2] dv2 = dtype(Kt dtype(dS) + dv_local): GDN (k dtype(dS)) rows times exp2(g_last - g_r)
//        in fp32, KDA kg dtype(dS); fp32 accumulation; + dv_local (dtype) in fp32.
//   [B3] dS <- dS * Gam + (qs^T dO - W^T dv2) with qs = dtype((q * scale) * exp2(g)) and dtype
//        operands, fp32 accumulation; dh0 / dh_ext fp32.
//   [B4] local dv (B2): GDN P' = dtype((k_s . q_r) * exp2(g_r - g_s) * scale) (dtype operands
//        for the dot), KDA P' = Aqk (dtype); dv_local = dtype(P'^T dO) with fp32 accumulation.
#include <vector>

#include "kernels/api/summary_needs.h"
#include "kernels/cpu/cpu_common.h"

namespace kcp::kernels::cpu {

namespace {

struct FwdWalk {
  const Dims& d;
  bool kda;
  const ChunkDesc* chunks;
  const float* k;  // [T, H, K] (GDN)
  const float* gcum;
  const float* W;
  const float* U;
  const float* kg;  // (KDA)
  float* h_out;     // may be null
  float* vnew_out;  // may be null
};

// The walk's inputs from a forward walk phase's args; h, v_new: where fwd_states writes (null:
// the summaries write neither).
template <class Args>
FwdWalk fwd_walk_of(const Dims& d, const Args& a, float* h, float* v_new) {
  return FwdWalk{
      d,    a.ctx.problem.op == Op::Kda, a.ctx.layout.chunks, a.k.f32(), a.gcum, a.W.f32(), a.U.f32(), a.kg.f32(), h,
      v_new};
}

// Runs the chunks [c0, c1) of one segment for value head j. S: K x V fp32 in/out, or null (no
// state walk: h, v_new are not written). M: K x K fp32 in/out (natural orientation), or null.
// The two walks are independent: each gives the same bits with or without the other.
void fwd_walk(const FwdWalk& fw, int64_t c0, int64_t c1, int32_t j, float* S, float* M) {
  const Dims& d = fw.d;
  const int32_t i = j / d.G, K = d.K, V = d.V;
  std::vector<float> Sb(size_t(K) * V), vn(size_t(d.C) * V), vop(size_t(d.C) * V), upd(size_t(K) * V), gam(K), Kt, KtW,
      Mn;
  if (M) {
    Kt.resize(size_t(d.C) * K);
    KtW.resize(size_t(K) * K);
    Mn.resize(size_t(K) * K);
  }
  for (int64_t n = c0; n < c1; ++n) {
    const ChunkDesc& ch = fw.chunks[n];
    const int32_t L = ch.len;
    const float* gL = fw.gcum + d.gg(ch.begin + L - 1, j);
    for (int32_t a = 0; a < K; ++a) gam[a] = exp2f_(gL[fw.kda ? a : 0]);
    if (S) {
      // [S1]
      for (size_t e = 0; e < Sb.size(); ++e) Sb[e] = d.rnd(S[e]);
      if (fw.h_out) std::copy(Sb.begin(), Sb.end(), fw.h_out + d.kv(n, j));
      // [S2]
      for (int32_t r = 0; r < L; ++r) {
        const int64_t tr = ch.begin + r;
        const float* Wr = fw.W + d.hk(tr, j);
        const float* Ur = fw.U + d.vv(tr, j);
        float* vr = vn.data() + size_t(r) * V;
        std::fill(vr, vr + V, 0.0f);
        for (int32_t a = 0; a < K; ++a) {
          const float wa = Wr[a];
          const float* srow = Sb.data() + size_t(a) * V;
          for (int32_t e = 0; e < V; ++e) vr[e] += wa * srow[e];
        }
        for (int32_t e = 0; e < V; ++e) vr[e] = Ur[e] - vr[e];
        if (fw.vnew_out) {
          float* out = fw.vnew_out + d.vv(tr, j);
          for (int32_t e = 0; e < V; ++e) out[e] = d.rnd(vr[e]);
        }
        // [S3] update operand
        float* op = vop.data() + size_t(r) * V;
        if (fw.kda) {
          for (int32_t e = 0; e < V; ++e) op[e] = d.rnd(vr[e]);
        } else {
          const float f = exp2f_(gL[0] - fw.gcum[d.gg(tr, j)]);
          for (int32_t e = 0; e < V; ++e) op[e] = d.rnd(vr[e] * f);
        }
      }
      std::fill(upd.begin(), upd.end(), 0.0f);
      for (int32_t r = 0; r < L; ++r) {
        const int64_t tr = ch.begin + r;
        const float* kr = fw.kda ? fw.kg + d.hk(tr, j) : fw.k + d.qk(tr, i);
        const float* op = vop.data() + size_t(r) * V;
        for (int32_t a = 0; a < K; ++a) {
          const float ka = kr[a];
          float* u = upd.data() + size_t(a) * V;
          for (int32_t e = 0; e < V; ++e) u[e] += ka * op[e];
        }
      }
      for (int32_t a = 0; a < K; ++a)
        for (int32_t e = 0; e < V; ++e) S[size_t(a) * V + e] = S[size_t(a) * V + e] * gam[a] + upd[size_t(a) * V + e];
    }
    if (!M) continue;
    // [S4]
    for (int32_t r = 0; r < L; ++r) {
      const int64_t tr = ch.begin + r;
      if (fw.kda) {
        const float* kg = fw.kg + d.hk(tr, j);
        for (int32_t a = 0; a < K; ++a) Kt[size_t(r) * K + a] = kg[a];
      } else {
        const float* kr = fw.k + d.qk(tr, i);
        const float f = exp2f_(gL[0] - fw.gcum[d.gg(tr, j)]);
        for (int32_t a = 0; a < K; ++a) Kt[size_t(r) * K + a] = d.rnd(kr[a] * f);
      }
    }
    std::fill(KtW.begin(), KtW.end(), 0.0f);
    for (int32_t r = 0; r < L; ++r) {
      const float* Wr = fw.W + d.hk(ch.begin + r, j);
      for (int32_t a = 0; a < K; ++a) {
        const float ka = Kt[size_t(r) * K + a];
        float* row = KtW.data() + size_t(a) * K;
        for (int32_t b = 0; b < K; ++b) row[b] += ka * Wr[b];
      }
    }
    // M_c = Diag(Gam) - KtW (in KtW); Mn = M_c M
    for (int32_t a = 0; a < K; ++a)
      for (int32_t b = 0; b < K; ++b) KtW[size_t(a) * K + b] = (a == b ? gam[a] : 0.0f) - KtW[size_t(a) * K + b];
    std::fill(Mn.begin(), Mn.end(), 0.0f);
    for (int32_t a = 0; a < K; ++a) {
      float* out = Mn.data() + size_t(a) * K;
      for (int32_t m = 0; m < K; ++m) {
        const float x = KtW[size_t(a) * K + m];
        const float* mrow = M + size_t(m) * K;
        for (int32_t b = 0; b < K; ++b) out[b] += x * mrow[b];
      }
    }
    std::copy(Mn.begin(), Mn.end(), M);
  }
}

struct BwdWalk {
  const Dims& d;
  bool kda;
  const ChunkDesc* chunks;
  const float* q;
  const float* k;  // (GDN)
  const float* gcum;
  const float* W;
  const float* kg;  // (KDA)
  const float* dO;
  const float* dvl;
  float* dh_out;   // may be null
  float* dv2_out;  // may be null
};

// Runs the chunks [c0, c1) of one segment last to first for value head j. dS: K x V in/out.
void bwd_walk(const BwdWalk& bw, int64_t c0, int64_t c1, int32_t j, float* dS) {
  const Dims& d = bw.d;
  const int32_t i = j / d.G, K = d.K, V = d.V;
  std::vector<float> dSb(size_t(K) * V), dv2(size_t(d.C) * V), qs(size_t(d.C) * K), p1(size_t(K) * V),
      p2(size_t(K) * V), gam(K);
  for (int64_t n = c1 - 1; n >= c0; --n) {
    const ChunkDesc& ch = bw.chunks[n];
    const int32_t L = ch.len;
    const float* gL = bw.gcum + d.gg(ch.begin + L - 1, j);
    for (int32_t a = 0; a < K; ++a) gam[a] = exp2f_(gL[bw.kda ? a : 0]);
    // [B1]
    for (size_t e = 0; e < dSb.size(); ++e) dSb[e] = d.rnd(dS[e]);
    if (bw.dh_out) std::copy(dSb.begin(), dSb.end(), bw.dh_out + d.kv(n, j));
    // [B2]
    for (int32_t r = 0; r < L; ++r) {
      const int64_t tr = ch.begin + r;
      const float* kr = bw.kda ? bw.kg + d.hk(tr, j) : bw.k + d.qk(tr, i);
      float* out = dv2.data() + size_t(r) * V;
      std::fill(out, out + V, 0.0f);
      for (int32_t a = 0; a < K; ++a) {
        const float ka = kr[a];
        const float* srow = dSb.data() + size_t(a) * V;
        for (int32_t e = 0; e < V; ++e) out[e] += ka * srow[e];
      }
      const float* dl = bw.dvl + d.vv(tr, j);
      if (bw.kda) {
        for (int32_t e = 0; e < V; ++e) out[e] = d.rnd(out[e] + dl[e]);
      } else {
        const float f = exp2f_(gL[0] - bw.gcum[d.gg(tr, j)]);
        for (int32_t e = 0; e < V; ++e) out[e] = d.rnd(out[e] * f + dl[e]);
      }
      if (bw.dv2_out) std::copy(out, out + V, bw.dv2_out + d.vv(tr, j));
      // [B3] operand qs
      const float* qr = bw.q + d.qk(tr, i);
      const float* gr = bw.gcum + d.gg(tr, j);
      for (int32_t a = 0; a < K; ++a) qs[size_t(r) * K + a] = d.rnd((qr[a] * d.scale) * exp2f_(gr[bw.kda ? a : 0]));
    }
    std::fill(p1.begin(), p1.end(), 0.0f);
    std::fill(p2.begin(), p2.end(), 0.0f);
    for (int32_t r = 0; r < L; ++r) {
      const int64_t tr = ch.begin + r;
      const float* dOr = bw.dO + d.vv(tr, j);
      const float* Wr = bw.W + d.hk(tr, j);
      const float* dvr = dv2.data() + size_t(r) * V;
      for (int32_t a = 0; a < K; ++a) {
        const float qa = qs[size_t(r) * K + a], wa = Wr[a];
        float* r1 = p1.data() + size_t(a) * V;
        float* r2 = p2.data() + size_t(a) * V;
        for (int32_t e = 0; e < V; ++e) {
          r1[e] += qa * dOr[e];
          r2[e] += wa * dvr[e];
        }
      }
    }
    for (int32_t a = 0; a < K; ++a)
      for (int32_t e = 0; e < V; ++e) {
        const size_t x = size_t(a) * V + e;
        dS[x] = dS[x] * gam[a] + (p1[x] - p2[x]);
      }
  }
}

const char* op_name(const PhaseCtx& c, const char* gdn, const char* kda) { return c.problem.op == Op::Gdn ? gdn : kda; }

}  // namespace

void fwd_summaries(const FwdSummaryArgs& a) {
  const char* ph = op_name(a.ctx, "gdn fwd_summaries", "kda fwd_summaries");
  check_problem_layout(a.ctx, ph);
  check_fwd_summaries_args(a, ph, twin_storage(a.ctx));
  const Dims d(a.ctx);
  const FwdWalk fw = fwd_walk_of(d, a, nullptr, nullptr);
  parallel_for(d.S * d.HV, a.ctx.exec.threads, [&](int64_t w) {
    const int64_t s = w / d.HV;
    const int32_t j = static_cast<int32_t>(w % d.HV);
    const SegmentDesc& sg = a.ctx.layout.segments[s];
    // Parts nobody reads are written as zeros without walking them (kernels/api/summary_needs.h).
    const SummaryNeeds need =
        summary_needs(a.ctx.layout.pieces, a.ctx.layout.n_pieces, sg, a.ctx.problem.has_h0, a.ctx.problem.has_dht);
    std::vector<float> S(size_t(d.K) * d.V, 0.0f), M(size_t(d.K) * d.K, 0.0f);
    if (need.M)
      for (int32_t x = 0; x < d.K; ++x) M[size_t(x) * d.K + x] = 1.0f;
    if (need.h_ext || need.M)
      fwd_walk(fw, sg.chunk_begin, sg.chunk_end, j, need.h_ext ? S.data() : nullptr, need.M ? M.data() : nullptr);
    std::copy(S.begin(), S.end(), a.seg_h_ext + d.kv(s, j));
    float* Mt = a.seg_Mt + d.kk(s, j);
    for (int32_t r = 0; r < d.K; ++r)
      for (int32_t c = 0; c < d.K; ++c) Mt[size_t(r) * d.K + c] = M[size_t(c) * d.K + r];
  });
}

void fwd_states(const FwdStateArgs& a) {
  const char* ph = op_name(a.ctx, "gdn fwd_states", "kda fwd_states");
  check_problem_layout(a.ctx, ph);
  check_fwd_states_args(a, ph, twin_storage(a.ctx));
  const Dims d(a.ctx);
  const FwdWalk fw = fwd_walk_of(d, a, a.h.f32(), a.v_new.f32());
  parallel_for(d.S * d.HV, a.ctx.exec.threads, [&](int64_t w) {
    const int64_t s = w / d.HV;
    const int32_t j = static_cast<int32_t>(w % d.HV);
    const SegmentDesc& sg = a.ctx.layout.segments[s];
    const float* entry = a.seg_entry + d.kv(s, j);
    std::vector<float> S(entry, entry + size_t(d.K) * d.V);
    fwd_walk(fw, sg.chunk_begin, sg.chunk_end, j, S.data(), nullptr);
    const PieceDesc& pc = a.ctx.layout.pieces[sg.piece];
    if (a.ht && s + 1 == pc.seg_end) std::copy(S.begin(), S.end(), a.ht + d.kv(sg.piece, j));  // [S5]
  });
}

void bwd_local_dv(const BwdLocalDvArgs& a) {
  const char* ph = op_name(a.ctx, "gdn bwd_local_dv", "kda bwd_local_dv");
  check_problem_layout(a.ctx, ph);
  check_bwd_local_dv_args(a, ph, twin_storage(a.ctx));
  const bool kda = a.ctx.problem.op == Op::Kda;
  const Dims d(a.ctx);
  const CallerIn dO(a.dO, d.T * d.HV * d.V, d);
  parallel_for(d.NT * d.HV, a.ctx.exec.threads, [&](int64_t w) {
    const ChunkDesc& ch = a.ctx.layout.chunks[w / d.HV];
    const int32_t j = static_cast<int32_t>(w % d.HV), i = j / d.G;
    const int32_t L = ch.len;
    std::vector<float> acc(d.V);
    for (int32_t s = 0; s < L; ++s) {
      const int64_t ts = ch.begin + s;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int32_t r = s; r < L; ++r) {
        const int64_t tr = ch.begin + r;
        float p;  // [B4]
        if (kda) {
          p = a.Aqk[d.cc(tr, j) + s];
        } else {
          const float* ks = a.k.f32() + d.qk(ts, i);
          const float* qr = a.q.f32() + d.qk(tr, i);
          float kq = 0.0f;
          for (int32_t c = 0; c < d.K; ++c) kq += ks[c] * qr[c];
          p = d.rnd(kq * exp2f_(a.gcum[d.gg(tr, j)] - a.gcum[d.gg(ts, j)]) * d.scale);
        }
        const float* dOr = dO.get() + d.vv(tr, j);
        for (int32_t e = 0; e < d.V; ++e) acc[e] += p * dOr[e];
      }
      float* out = a.dv_local.f32() + d.vv(ts, j);
      for (int32_t e = 0; e < d.V; ++e) out[e] = d.rnd(acc[e]);
    }
  });
}

void bwd_summaries(const BwdSummaryArgs& a) {
  const char* ph = op_name(a.ctx, "gdn bwd_summaries", "kda bwd_summaries");
  check_problem_layout(a.ctx, ph);
  check_bwd_summaries_args(a, ph, twin_storage(a.ctx));
  const Dims d(a.ctx);
  const CallerIn dO(a.dO, d.T * d.HV * d.V, d);
  const BwdWalk bw{d,
                   a.ctx.problem.op == Op::Kda,
                   a.ctx.layout.chunks,
                   a.q.f32(),
                   a.k.f32(),
                   a.gcum,
                   a.W.f32(),
                   a.kg.f32(),
                   dO.get(),
                   a.dv_local.f32(),
                   nullptr,
                   nullptr};
  parallel_for(d.S * d.HV, a.ctx.exec.threads, [&](int64_t w) {
    const int64_t s = w / d.HV;
    const int32_t j = static_cast<int32_t>(w % d.HV);
    const SegmentDesc& sg = a.ctx.layout.segments[s];
    std::vector<float> dS(size_t(d.K) * d.V, 0.0f);
    // Zeros when nobody reads this dh_ext (kernels/api/summary_needs.h).
    if (summary_needs(a.ctx.layout.pieces, a.ctx.layout.n_pieces, sg, a.ctx.problem.has_h0, a.ctx.problem.has_dht)
            .dh_ext)
      bwd_walk(bw, sg.chunk_begin, sg.chunk_end, j, dS.data());
    std::copy(dS.begin(), dS.end(), a.seg_dh_ext + d.kv(s, j));
  });
}

void bwd_states(const BwdStateArgs& a) {
  const char* ph = op_name(a.ctx, "gdn bwd_states", "kda bwd_states");
  check_problem_layout(a.ctx, ph);
  check_bwd_states_args(a, ph, twin_storage(a.ctx));
  const Dims d(a.ctx);
  const CallerIn dO(a.dO, d.T * d.HV * d.V, d);
  const BwdWalk bw{d,
                   a.ctx.problem.op == Op::Kda,
                   a.ctx.layout.chunks,
                   a.q.f32(),
                   a.k.f32(),
                   a.gcum,
                   a.W.f32(),
                   a.kg.f32(),
                   dO.get(),
                   a.dv_local.f32(),
                   a.dh.f32(),
                   a.dv2.f32()};
  parallel_for(d.S * d.HV, a.ctx.exec.threads, [&](int64_t w) {
    const int64_t s = w / d.HV;
    const int32_t j = static_cast<int32_t>(w % d.HV);
    const SegmentDesc& sg = a.ctx.layout.segments[s];
    const float* ex = a.seg_exit + d.kv(s, j);
    std::vector<float> dS(ex, ex + size_t(d.K) * d.V);
    bwd_walk(bw, sg.chunk_begin, sg.chunk_end, j, dS.data());
    if (a.dh0 && sg.index_in_piece == 0) std::copy(dS.begin(), dS.end(), a.dh0 + d.kv(sg.piece, j));
  });
}

}  // namespace kcp::kernels::cpu
