// Single-rank driver: the phase sequence of docs/design.md 4 on one rank, against the abstract Backend.
#include "core/kcp/rank_driver.h"

#include <stdexcept>
#include <string>

namespace kcp {

using namespace kernels;  // the driver speaks the kernel API only

namespace {

PhaseCtx ctx_of(const RankRun& r) { return PhaseCtx{r.problem, r.layout, r.exec, r.ws.scratch, r.ws.scratch_floats}; }
int64_t hvkv(const Problem& p) { return int64_t(p.HV) * p.K * p.V; }
int64_t hvkk(const Problem& p) { return int64_t(p.HV) * p.K * p.K; }

void check_run(const RankRun& r, const char* where) {
  try {
    validate_problem(r.problem);
    validate_layout(r.layout, r.problem.chunk);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string(e.what()) + " (in " + where + ")");
  }
  const uint64_t fp = layout_fingerprint(r.problem, r.layout);
  check_workspace(r.ws, r.exec.package, r.kind, fp);
  check_saved_set(r.saved.tag, r.exec.package, r.problem.op, fp);
  if (r.saved.tag.kind != r.kind)
    throw std::invalid_argument(std::string("kcp kernels: ") + where + ": saved set is " + to_string(r.saved.tag.kind) +
                                " but run.kind is " + to_string(r.kind));
  if (r.problem.has_h0 && !r.in.h0)
    throw std::invalid_argument(std::string("kcp kernels: ") + where + ": in.h0 is null but problem.has_h0");
}

// What a full saved set keeps for the backward and a light run holds in its workspace (and
// recomputes): the segment transfer planes and entry states, the WY factors W, U (KDA's kg).
struct Kept {
  float* seg_Mt;
  float* seg_entry;
  DtypeTensor W, U, kg;
};
Kept kept_of(const RankRun& r) {
  if (r.kind == SavedKind::Full) return {r.saved.seg_Mt, r.saved.seg_entry, r.saved.W, r.saved.U, r.saved.kg};
  return {r.ws.seg_Mt, r.ws.seg_entry, r.ws.W, r.ws.U, r.ws.kg};
}

void run_prep_wy(const Backend& be, const RankRun& r, bool with_prep) {
  if (with_prep) {
    PrepArgs a;
    a.ctx = ctx_of(r);
    a.q = r.in.q;
    a.k = r.in.k;
    a.g = r.in.g;
    a.beta = r.in.beta;
    a.A_log = r.in.A_log;
    a.dt_bias = r.in.dt_bias;
    a.q_out = r.saved.q;
    a.k_out = r.saved.k;
    a.rstd_q = r.saved.rstd_q;
    a.rstd_k = r.saved.rstd_k;
    a.gcum = r.saved.gcum;
    a.Phi = r.saved.Phi;
    a.Aqk = r.saved.Aqk;
    be.prep(a);
  }
  WyArgs w;
  w.ctx = ctx_of(r);
  w.k = r.saved.k;
  w.v = r.in.v;
  w.beta = r.in.beta;
  w.gcum = r.saved.gcum;
  w.Phi = r.saved.Phi;
  const Kept f = kept_of(r);
  w.W = f.W;
  w.U = f.U;
  w.kg = f.kg;
  be.wy(w);
}

// The inputs the forward walks (summaries and states) share.
template <class A>
A fwd_walk_args(const RankRun& r) {
  A a;
  a.ctx = ctx_of(r);
  a.k = r.saved.k;
  a.gcum = r.saved.gcum;
  const Kept f = kept_of(r);
  a.W = f.W;
  a.U = f.U;
  a.kg = f.kg;
  return a;
}
// The inputs the backward walks (summaries and states) share.
template <class A>
A bwd_walk_args(const RankRun& r) {
  A a;
  a.ctx = ctx_of(r);
  a.q = r.saved.q;
  a.k = r.saved.k;
  a.gcum = r.saved.gcum;
  const Kept f = kept_of(r);
  a.W = f.W;
  a.kg = f.kg;
  a.dO = r.in.dO;
  a.dv_local = r.ws.dv_local;
  return a;
}

void run_fwd_summaries(const Backend& be, const RankRun& r) {
  FwdSummaryArgs a = fwd_walk_args<FwdSummaryArgs>(r);
  a.seg_h_ext = r.ws.seg_h_ext;
  a.seg_Mt = kept_of(r).seg_Mt;
  be.fwd_summaries(a);
}

// Fold over the segments of piece p, all fp32 (fold.h). Forward: first to last, applying M
// (seg_Mt transposed) to states, b = seg_h_ext, states_before = segment entry states. Backward:
// last to first, applying M^T to gradients, b = seg_dh_ext, states_before = segment exit gradients.
void fold_piece(const Backend& be, const RankRun& r, int32_t p, bool backward, const float* x0, float* states,
                float* x_final, float* composed) {
  const PieceDesc& pc = r.layout.pieces[p];
  const Problem& P = r.problem;
  FoldArgs f;
  f.exec = r.exec;
  f.HV = P.HV;
  f.K = P.K;
  f.V = P.V;
  f.n = pc.seg_end - pc.seg_begin;
  f.transpose_A = !backward;  // seg_Mt holds M^T: the forward applies M, the backward M^T
  if (f.n > 0) {
    const int64_t first = backward ? pc.seg_end - 1 : pc.seg_begin;
    const int64_t dir = backward ? -1 : 1;
    f.A = kept_of(r).seg_Mt + first * hvkk(P);
    f.A_stride = dir * hvkk(P);
    f.b = (backward ? r.ws.seg_dh_ext : r.ws.seg_h_ext) + first * hvkv(P);
    f.b_stride = dir * hvkv(P);
    if (states) {
      f.states_before = states + first * hvkv(P);
      f.states_stride = dir * hvkv(P);
    }
  }
  f.x0 = x0;
  f.x_final = x_final;
  f.composed = composed;
  be.fold(f);
}

// Entry state of piece p: the saved incoming state (piece 0 continuing from earlier ranks), h0,
// or zeros (null).
const float* piece_x0(const RankRun& r, int32_t p) {
  const PieceDesc& pc = r.layout.pieces[p];
  if (!pc.starts_sequence) return r.saved.incoming;
  if (r.problem.has_h0) return r.in.h0 + p * hvkv(r.problem);
  return nullptr;
}

// Segment entry states of every piece (forward and light backward recompute); ht of empty pieces.
void entry_states(const Backend& be, const RankRun& r, float* ht) {
  for (int32_t p = 0; p < r.layout.n_pieces; ++p) {
    const PieceDesc& pc = r.layout.pieces[p];
    float* xf = (ht && pc.seg_end == pc.seg_begin) ? ht + p * hvkv(r.problem) : nullptr;
    fold_piece(be, r, p, false, piece_x0(r, p), kept_of(r).seg_entry, xf, nullptr);
  }
}

// output: the forward's o in the same call (chunk_fwd.h); null in the backward's recompute.
void run_fwd_states(const Backend& be, const RankRun& r, float* ht, const FwdOutputArgs* output) {
  FwdStateArgs a = fwd_walk_args<FwdStateArgs>(r);
  a.seg_entry = kept_of(r).seg_entry;
  a.h = r.ws.h;
  a.v_new = r.ws.v_new;
  a.ht = ht;
  a.output = output;
  be.fwd_states(a);
}

}  // namespace

void rank_forward_begin(const Backend& be, const RankRun& r, float* summary_M, float* summary_h_ext) {
  check_run(r, "rank_forward_begin");
  // Segment summaries of a piece whose summary is not sent may be zeros (summary_needs.h).
  if ((summary_M || summary_h_ext) && r.layout.pieces[r.layout.n_pieces - 1].ends_sequence)
    throw std::invalid_argument(
        "kcp kernels: rank_forward_begin: a forward rank summary was requested but the last piece ends its "
        "sequence; nothing is sent");
  run_prep_wy(be, r, /*with_prep=*/true);
  run_fwd_summaries(be, r);
  if (summary_M || summary_h_ext)
    fold_piece(be, r, r.layout.n_pieces - 1, false, nullptr, nullptr, summary_h_ext, summary_M);
}

void rank_forward_end(const Backend& be, const RankRun& r, const float* incoming, const OutputTensors& out) {
  check_run(r, "rank_forward_end");
  if (incoming && r.layout.pieces[0].starts_sequence)
    throw std::invalid_argument(
        "kcp kernels: rank_forward_end: incoming is given but piece 0 starts its sequence (h0 applies there)");
  if (!out.o) throw std::invalid_argument("kcp kernels: rank_forward_end: out.o is null");
  // The saved copy is what both the forward and the backward recompute fold from.
  if (incoming)
    be.copy_floats(r.saved.incoming, incoming, hvkv(r.problem), r.exec);
  else
    be.fill_floats(r.saved.incoming, 0.0f, hvkv(r.problem), r.exec);
  entry_states(be, r, out.ht);
  FwdOutputArgs o;
  o.ctx = ctx_of(r);
  o.q = r.saved.q;
  o.k = r.saved.k;
  o.gcum = r.saved.gcum;
  o.Aqk = r.saved.Aqk;
  o.h = r.ws.h;
  o.v_new = r.ws.v_new;
  o.o = out.o;
  run_fwd_states(be, r, out.ht, &o);
}

void run_rank_forward(const Backend& be, const RankRun& r, const float* incoming, const OutputTensors& out,
                      float* summary_M, float* summary_h_ext) {
  rank_forward_begin(be, r, summary_M, summary_h_ext);
  rank_forward_end(be, r, incoming, out);
}

void rank_backward_begin(const Backend& be, const RankRun& r, float* summary_Mt, float* summary_dh_ext) {
  check_run(r, "rank_backward_begin");
  if (!r.in.dO) throw std::invalid_argument("kcp kernels: rank_backward_begin: in.dO is null");
  if ((summary_Mt || summary_dh_ext) && r.layout.pieces[0].starts_sequence)
    throw std::invalid_argument(
        "kcp kernels: rank_backward_begin: a backward rank summary was requested but piece 0 starts its "
        "sequence; nothing is sent");
  // B1: light recomputes W, U (kg), the segment summaries and entry states (full kept them); both
  // recompute h, v_new.
  if (r.kind == SavedKind::Light) {
    run_prep_wy(be, r, /*with_prep=*/false);
    run_fwd_summaries(be, r);
    entry_states(be, r, nullptr);
  }
  run_fwd_states(be, r, nullptr, nullptr);
  // B2
  BwdLocalDvArgs l;
  l.ctx = ctx_of(r);
  l.q = r.saved.q;
  l.k = r.saved.k;
  l.gcum = r.saved.gcum;
  l.Aqk = r.saved.Aqk;
  l.dO = r.in.dO;
  l.dv_local = r.ws.dv_local;
  be.bwd_local_dv(l);
  // reverse summaries
  BwdSummaryArgs s = bwd_walk_args<BwdSummaryArgs>(r);
  s.seg_dh_ext = r.ws.seg_dh_ext;
  be.bwd_summaries(s);
  if (summary_Mt || summary_dh_ext) fold_piece(be, r, 0, true, nullptr, nullptr, summary_dh_ext, summary_Mt);
}

namespace {

// B4/B5's Args (chunk_bwd.h).
BwdGradArgs grad_args(const RankRun& r, const GradTensors& gr) {
  BwdGradArgs g;
  g.ctx = ctx_of(r);
  g.q = r.saved.q;
  g.k = r.saved.k;
  g.v = r.in.v;
  g.beta = r.in.beta;
  g.gcum = r.saved.gcum;
  g.Phi = r.saved.Phi;
  g.Aqk = r.saved.Aqk;
  g.h = r.ws.h;
  g.v_new = r.ws.v_new;
  g.dh = r.ws.dh;
  g.dv2 = r.ws.dv2;
  g.dO = r.in.dO;
  g.dq_hv = r.ws.dq_hv;
  g.dk_hv = r.ws.dk_hv;
  g.dv = gr.dv;
  g.dbeta = gr.dbeta;
  g.dlam = r.ws.dlam;
  return g;
}

// B6/B7's Args (chunk_bwd.h).
BwdFinalizeArgs finalize_args(const RankRun& r, const GradTensors& gr) {
  BwdFinalizeArgs f;
  f.ctx = ctx_of(r);
  f.dq_hv = r.ws.dq_hv;
  f.dk_hv = r.ws.dk_hv;
  f.dlam = r.ws.dlam;
  f.q = r.saved.q;
  f.k = r.saved.k;
  f.rstd_q = r.saved.rstd_q;
  f.rstd_k = r.saved.rstd_k;
  f.g = r.in.g;
  f.A_log = r.in.A_log;
  f.dt_bias = r.in.dt_bias;
  f.dq = gr.dq;
  f.dk = gr.dk;
  f.dg = gr.dg;
  f.dA_log = gr.dA_log;
  f.ddt_bias = gr.ddt_bias;
  return f;
}

}  // namespace

void rank_backward_end(const Backend& be, const RankRun& r, const float* exit_grad, const GradTensors& gr) {
  check_run(r, "rank_backward_end");
  const int32_t N = r.layout.n_pieces;
  if (exit_grad && r.layout.pieces[N - 1].ends_sequence)
    throw std::invalid_argument(
        "kcp kernels: rank_backward_end: exit_grad is given but the last piece ends its sequence (dht applies there)");
  if (r.problem.has_dht && !r.in.dht)
    throw std::invalid_argument("kcp kernels: rank_backward_end: in.dht is null but problem.has_dht");
  for (int32_t p = 0; p < N; ++p) {
    const PieceDesc& pc = r.layout.pieces[p];
    const float* y0 = nullptr;
    if (!pc.ends_sequence)
      y0 = exit_grad;
    else if (r.problem.has_dht)
      y0 = r.in.dht + p * hvkv(r.problem);
    float* xf = (gr.dh0 && pc.seg_end == pc.seg_begin) ? gr.dh0 + p * hvkv(r.problem) : nullptr;
    fold_piece(be, r, p, true, y0, r.ws.seg_exit, xf, nullptr);
  }
  BwdStateArgs s = bwd_walk_args<BwdStateArgs>(r);
  s.seg_exit = r.ws.seg_exit;
  s.dh = r.ws.dh;
  s.dv2 = r.ws.dv2;
  s.dh0 = gr.dh0;
  be.bwd_states(s);
  const BwdFinalizeArgs f = finalize_args(r, gr);
  BwdGradArgs g = grad_args(r, gr);
  g.finalize = &f;  // B6/B7 in the same call (chunk_bwd.h)
  be.bwd_grads(g);
}

const float* segment_entry_states(const RankRun& r) { return kept_of(r).seg_entry; }

void run_rank_backward(const Backend& be, const RankRun& r, const float* exit_grad, const GradTensors& grads,
                       float* summary_Mt, float* summary_dh_ext) {
  rank_backward_begin(be, r, summary_Mt, summary_dh_ext);
  rank_backward_end(be, r, exit_grad, grads);
}

}  // namespace kcp
