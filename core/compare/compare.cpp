#include "core/compare/compare.h"

#include <algorithm>
#include <cmath>

#include "core/util/error.h"

namespace kcp {

namespace {
// x / scale, with 0 / 0 = 0 and x / 0 = Inf.
double relative_to(double x, double scale) { return scale > 0 ? x / scale : (x > 0 ? INFINITY : 0.0); }

struct Acc {
  TensorMetrics m;
  WorstElement first_nonfinite;
  void add(double ref, float got, const WorstElement& where) {
    ++m.count;
    if (!std::isfinite(ref)) return;  // the reference itself is non-finite: not counted against the kernel
    m.ref_max_abs = std::max(m.ref_max_abs, std::fabs(ref));
    m.sum_ref2 += ref * ref;
    if (!std::isfinite(got)) {
      if (m.nonfinite++ == 0) first_nonfinite = where;
      return;
    }
    const double e = std::fabs(double(got) - ref);
    m.sum_err2 += e * e;
    if (e > m.max_abs) {
      m.max_abs = e;
      m.worst = where;
    }
  }
  // The worst element is the first non-finite one when there is any, else the max-abs one.
  TensorMetrics done() {
    if (m.nonfinite > 0) m.worst = first_nonfinite;
    return m;
  }
};

// Metrics of a per-head total against its reference and its per-element scale: max-abs (its
// element is the worst), max_rel = max |err| / max scale and rel_rms = RMS(err) / RMS(scale), both
// over the whole tensor, as a token tensor's are over max|ref| (an element whose scale is nearly
// zero, a saturated gate channel, would make a per-element ratio meaningless).
TensorMetrics scaled_metrics(const char* name, const std::vector<double>& ref, const std::vector<float>& got,
                             const std::vector<double>& scale, size_t per_head) {
  Acc a;
  a.m.name = name;
  double sum_scale2 = 0, max_scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    WorstElement w;
    w.head = static_cast<int>(i / per_head);
    w.channel = static_cast<int>(i % per_head);
    a.add(ref[i], got[i], w);
    const double s = i < scale.size() ? scale[i] : 0.0;
    sum_scale2 += s * s;
    max_scale = std::max(max_scale, s);
  }
  a.m.max_rel = relative_to(a.m.max_abs, max_scale);
  a.m.rel_rms = relative_to(std::sqrt(a.m.sum_err2), std::sqrt(sum_scale2));
  return a.done();
}

// Distance (tokens) from local token t to the nearest segment or rank boundary.
int64_t boundary_distance(const RankPlan& rp, int64_t t, int* segment) {
  int64_t best = std::min(t, rp.tokens() - t);
  for (size_t s = 0; s < rp.segments.size(); ++s) {
    const auto& sg = rp.segments[s];
    if (t >= sg.local_begin && t < sg.local_end) *segment = static_cast<int>(s);
    if (sg.local_begin > 0) best = std::min<int64_t>(best, std::llabs(t - sg.local_begin));
  }
  return best;
}
}  // namespace

std::vector<std::shared_ptr<const SequenceReference>> rank_references(const RankPlan& rp, ReferenceCache& cache,
                                                                      HeadRange heads) {
  std::vector<std::shared_ptr<const SequenceReference>> refs;
  for (const auto& pc : rp.pieces) refs.push_back(cache.get(pc.seq, heads));
  return refs;
}

HeadPart head_part(const RowConfig& row, const RankPlan& rp, ResultTensor t, HeadRange heads) {
  const RowConfig part = head_range_row(row, heads);
  const int64_t first = heads.whole(row.H) ? 0 : heads.first, G = row.HV / row.H;
  if (place_of(t) == TensorPlace::State)
    return {static_cast<int64_t>(rp.pieces.size()), row.HV, int64_t(row.K) * row.V, first * G, part.HV};
  const auto [all, width] = token_dims(row, t);
  const int64_t count = token_dims(part, t)[0];
  return {rp.tokens(), all, std::max<int64_t>(width, 1), all == row.H ? first : first * G, count};
}

void scatter_heads(const std::vector<double>& part, const HeadPart& at, std::vector<double>& whole) {
  const int64_t run = at.count * at.width;
  for (int64_t r = 0; r < at.rows; ++r)
    std::copy_n(part.begin() + r * run, run, whole.begin() + (r * at.heads + at.first) * at.width);
}

std::vector<double> gather_heads(const std::vector<double>& whole, const HeadPart& at) {
  const int64_t run = at.count * at.width;
  std::vector<double> part(static_cast<size_t>(at.rows * run));
  for (int64_t r = 0; r < at.rows; ++r)
    std::copy_n(whole.begin() + (r * at.heads + at.first) * at.width, run, part.begin() + r * run);
  return part;
}

std::vector<double> reference_tensor_for_rank(const RowConfig& row_, const RankPlan& rp,
                                              const std::vector<std::shared_ptr<const SequenceReference>>& refs,
                                              ResultTensor t, HeadRange heads) {
  const RowConfig row = head_range_row(row_, heads);  // the part's shape (the row's when whole)
  const int64_t T = rp.tokens(), N = static_cast<int64_t>(rp.pieces.size()), state = int64_t(row.HV) * row.K * row.V;
  std::vector<double> out;
  if (!row_has(row, t)) return out;
  if (place_of(t) == TensorPlace::Token) {
    // Each local token reads its own sequence's reference at its place in the sequence.
    const int64_t per_token = result_elements(row, t, 1, 0, 0);
    out.assign(static_cast<size_t>(T * per_token), 0.0);
    for (int64_t p = 0; p < N; ++p) {
      const Piece& pc = rp.pieces[p];
      const std::vector<double>& ref = (*refs[p])[t];
      std::copy_n(ref.begin() + pc.seq_offset * per_token, pc.length() * per_token,
                  out.begin() + pc.local_begin * per_token);
    }
  }
  // States per piece: NaN where the piece has no final state (it continues) or no dh0.
  auto states = [&](bool Piece::*continues) {
    out.assign(static_cast<size_t>(N * state), std::nan(""));
    for (int64_t p = 0; p < N; ++p)
      if (!(rp.pieces[p].*continues)) std::copy_n((*refs[p])[t].begin(), state, out.begin() + p * state);
  };
  if (t == ResultTensor::ht) states(&Piece::to_next_rank);
  if (t == ResultTensor::dh0) states(&Piece::from_prev_rank);
  return out;
}

RankReference reference_for_rank(const RowConfig& row, const RankPlan& rp,
                                 const std::vector<std::shared_ptr<const SequenceReference>>& refs) {
  RankReference rr;
  for (int i = 0; i < kResultTensorCount; ++i)
    rr.tensors[i] = reference_tensor_for_rank(row, rp, refs, result_tensor(i));
  return rr;
}

std::shared_ptr<const SequenceReference> piece_slice(const SequenceReference& full, const Piece& pc) {
  auto s = std::make_shared<SequenceReference>();
  s->seq = full.seq;
  s->t_begin = full.t_begin;
  s->t_end = full.t_end;
  s->heads = full.heads;
  s->dA_log = full.dA_log;
  s->ddt_bias = full.ddt_bias;
  const size_t n = full.probes.size(), state = n ? full.probe_S.size() / n : 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t p = full.probes[i];
    if (p < pc.seq_offset || p > pc.seq_offset + pc.length()) continue;
    s->probes.push_back(p);
    s->probe_S.insert(s->probe_S.end(), full.probe_S.begin() + i * state, full.probe_S.begin() + (i + 1) * state);
    s->probe_dS.insert(s->probe_dS.end(), full.probe_dS.begin() + i * state, full.probe_dS.begin() + (i + 1) * state);
  }
  return s;
}

void add_piece_part(const RowConfig& row, const SequenceReference& part, SequenceReference& into) {
  if (part.heads.whole(row.H)) {
    into = part;
    return;
  }
  into.seq = part.seq;
  into.t_begin = part.t_begin;
  into.t_end = part.t_end;
  into.probes = part.probes;
  const int64_t G = row.HV / row.H, gw = row.op == Op::Kda ? row.K : 1, KV = int64_t(row.K) * row.V;
  const int64_t n = static_cast<int64_t>(part.probes.size());
  const HeadPart at{0, row.HV, 0, int64_t(part.heads.first) * G, int64_t(part.heads.count) * G};
  auto put = [&](const std::vector<double>& src, std::vector<double>& dst, int64_t rows, int64_t width) {
    if (src.empty()) return;
    dst.resize(static_cast<size_t>(rows * row.HV * width));
    scatter_heads(src, HeadPart{rows, at.heads, width, at.first, at.count}, dst);
  };
  put(part.probe_S, into.probe_S, n, KV);
  put(part.probe_dS, into.probe_dS, n, KV);
  put(part.dA_log, into.dA_log, 1, 1);
  put(part.ddt_bias, into.ddt_bias, 1, gw);
}

RankReference boundary_reference(const RowConfig& row, const RankPlan& rp,
                                 const std::vector<std::shared_ptr<const SequenceReference>>& piece_refs,
                                 HeadRange heads) {
  // The whole state of a probe is [HV, K, V]; the range's value heads are one run of it.
  const int64_t KV = int64_t(row.K) * row.V, state = row.HV * KV, S = static_cast<int64_t>(rp.segments.size());
  const int64_t G = row.HV / row.H, first = heads.whole(row.H) ? 0 : heads.first * G * KV;
  const int64_t part = heads.whole(row.H) ? state : heads.count * G * KV;
  RankReference rr;
  rr[ResultTensor::h_entry].assign(static_cast<size_t>(S * part), std::nan(""));
  rr[ResultTensor::dh_exit].assign(static_cast<size_t>(S * part), std::nan(""));
  // The state at position p of the segment's sequence, into segment s's slot of tensor t.
  auto put = [&](ResultTensor t, size_t s, const std::vector<double> SequenceReference::*field, int64_t p) {
    const SequenceReference& ref = *piece_refs.at(static_cast<size_t>(rp.segments[s].piece));
    const double* src = ref.probe_state(ref.*field, p, state);
    KCP_CHECK(src, "no FP64 probe at position {} of sequence {} (rank {} segment {})", p, ref.seq, rp.rank, s);
    std::copy_n(src + first, part, rr[t].begin() + int64_t(s) * part);
  };
  for (size_t s = 0; s < rp.segments.size(); ++s) {
    const SequenceReference& ref = *piece_refs.at(static_cast<size_t>(rp.segments[s].piece));
    if (rp.seq_begin(s) > 0) put(ResultTensor::h_entry, s, &SequenceReference::probe_S, rp.seq_begin(s));
    if (rp.seq_end(s) < ref.t_end - ref.t_begin)
      put(ResultTensor::dh_exit, s, &SequenceReference::probe_dS, rp.seq_end(s));
  }
  return rr;
}

std::vector<TensorMetrics> compare_rank(const RowConfig& row, const RankPlan& rp, const RankResult& res,
                                        const RankReference& rr, const RankReference& br, int rank) {
  return compare_rank(
      row, rp, res, [&](ResultTensor t) -> const std::vector<double>& { return rr[t]; }, br, rank);
}

std::vector<TensorMetrics> compare_rank(const RowConfig& row, const RankPlan& rp, const RankResult& res,
                                        const ReferenceSource& ref_of, const RankReference& br, int rank) {
  const int64_t HV = row.HV, K = row.K, V = row.V;
  std::vector<TensorMetrics> out;
  std::vector<int> piece_of(static_cast<size_t>(rp.tokens()), 0);
  for (size_t p = 0; p < rp.pieces.size(); ++p)
    std::fill(piece_of.begin() + rp.pieces[p].local_begin, piece_of.begin() + rp.pieces[p].local_end, int(p));
  auto token_tensor = [&](const char* name, const std::vector<float>& got, const std::vector<double>& ref,
                          int64_t heads, int64_t width) {
    Acc a;
    a.m.name = name;
    for (int64_t t = 0; t < rp.tokens(); ++t) {
      WorstElement w;
      w.rank = rank;
      w.token = rp.global_begin + t;
      w.seq = rp.pieces[piece_of[t]].seq;
      w.boundary_distance = boundary_distance(rp, t, &w.segment);
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t c = 0; c < width; ++c) {
          w.head = static_cast<int>(h);
          w.channel = static_cast<int>(c);
          const int64_t i = (t * heads + h) * width + c;
          a.add(ref[i], got[i], w);
        }
    }
    out.push_back(a.done());
  };
  // States of n units (pieces or segments; where(u): the unit's location): only the elements
  // whose reference is not NaN (ht: pieces that end their sequence, dh0: that start it; h_entry,
  // dh_exit: segments whose boundary carries state).
  auto state_tensor = [&](const char* name, const std::vector<float>& got, const std::vector<double>& ref, size_t n,
                          auto&& where) {
    Acc a;
    a.m.name = name;
    for (size_t p = 0; p < n; ++p) {
      WorstElement w = where(p);
      for (int64_t h = 0; h < HV; ++h)
        for (int64_t i = 0; i < K * V; ++i) {
          const int64_t at = (int64_t(p) * HV + h) * K * V + i;
          if (std::isnan(ref[at])) continue;
          w.head = static_cast<int>(h);
          w.channel = static_cast<int>(i);
          a.add(ref[at], got[at], w);
        }
    }
    out.push_back(a.done());
  };
  auto piece_at = [&](size_t p) {
    WorstElement w;
    w.rank = rank;
    w.seq = rp.pieces[p].seq;
    return w;
  };
  for (int i = 0; i < kResultTensorCount; ++i) {
    const ResultTensor t = result_tensor(i);
    if (!row_has(row, t)) continue;
    const auto [heads, width] = token_dims(row, t);
    if (place_of(t) == TensorPlace::Token)
      token_tensor(to_string(t), res[t], ref_of(t), heads, std::max<int64_t>(1, width));
    if (place_of(t) == TensorPlace::State) state_tensor(to_string(t), res[t], ref_of(t), rp.pieces.size(), piece_at);
    if (place_of(t) == TensorPlace::Boundary)
      state_tensor(to_string(t), res[t], br[t], rp.segments.size(), [&](size_t s) {
        WorstElement w = piece_at(static_cast<size_t>(rp.segments[s].piece));
        w.segment = static_cast<int>(s);
        w.token =
            rp.global_begin + (t == ResultTensor::h_entry ? rp.segments[s].local_begin : rp.segments[s].local_end);
        w.boundary_distance = 0;
        return w;
      });
  }
  return out;
}

namespace {
// softplus(x) / sigmoid(x) = softplus(x) (1 + e^-x): 1 for x -> -inf, x for x -> +inf.
double softplus_over_sigmoid(double x) {
  if (x < -30) return 1.0;
  const double sp = x > 30 ? x : std::log1p(std::exp(x));
  return sp * (1.0 + std::exp(-x));
}
}  // namespace

ParamScales param_grad_scales(const RowConfig& row, const RowInputs& in, const std::vector<double>& ref_dg,
                              Communicator& comm) {
  ParamScales s;
  const int64_t HV = row.HV, gw = row.op == Op::Kda ? row.K : 1, T = in.t_end - in.t_begin;
  if (row.A_log) s.dA_log.assign(static_cast<size_t>(HV), 0.0);
  if (row.dt_bias) s.ddt_bias.assign(static_cast<size_t>(HV * gw), 0.0);
  KCP_CHECK(static_cast<int64_t>(ref_dg.size()) == T * HV * gw, "reference dg has {} values, expected {}",
            ref_dg.size(), T * HV * gw);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < HV; ++j)
      for (int64_t c = 0; c < gw; ++c) {
        const int64_t i = (t * HV + j) * gw + c;
        const double dg = ref_dg[i];
        const double x = double(in.g[i]) + (row.dt_bias ? double(in.dt_bias[j * gw + c]) : 0.0);
        if (row.dt_bias) s.ddt_bias[j * gw + c] += std::fabs(dg);
        if (row.A_log) s.dA_log[j] += std::fabs(dg * (row.gate == GateForm::Softplus ? softplus_over_sigmoid(x) : x));
      }
  for (auto* v : {&s.dA_log, &s.ddt_bias})
    if (!v->empty()) comm.allreduce(v->data(), v->size(), ReduceOp::Sum);
  return s;
}

std::vector<TensorMetrics> compare_parameter_grads(const RowConfig& row, const RankPlan& rp, const RankResult& res,
                                                   const std::vector<std::shared_ptr<const SequenceReference>>& refs,
                                                   const ParamScales& scales, Communicator& comm) {
  std::vector<TensorMetrics> out;
  auto one = [&](const char* name, const std::vector<float>& got, std::vector<double> SequenceReference::*part,
                 const std::vector<double>& scale) {
    // Reference total: each rank sums the sequences that start on it (in sequence order), then
    // the partial sums are all-reduced in rank order, as the engine reduces the kernel's.
    std::vector<double> total(got.size(), 0.0);
    for (size_t p = 0; p < rp.pieces.size(); ++p) {
      if (rp.pieces[p].from_prev_rank) continue;
      const std::vector<double>& v = (*refs[p]).*part;
      for (size_t i = 0; i < total.size() && i < v.size(); ++i) total[i] += v[i];
    }
    if (!total.empty()) comm.allreduce(total.data(), total.size(), ReduceOp::Sum);
    out.push_back(scaled_metrics(name, total, got, scale, got.size() / std::max<size_t>(1, size_t(row.HV))));
  };
  if (row.A_log) one("dA_log", res[ResultTensor::dA_log], &SequenceReference::dA_log, scales.dA_log);
  if (row.dt_bias) one("ddt_bias", res[ResultTensor::ddt_bias], &SequenceReference::ddt_bias, scales.ddt_bias);
  return out;
}

void reduce_metrics(std::vector<TensorMetrics>& ms, Communicator& comm) {
  const int W = comm.size();
  for (auto& m : ms) {
    double sums[3] = {m.sum_err2, m.sum_ref2, 0};
    int64_t counts[2] = {m.nonfinite, m.count};
    comm.allreduce(sums, 2, ReduceOp::Sum);
    comm.allreduce(counts, 2, ReduceOp::Sum);
    double mx = m.ref_max_abs;
    comm.allreduce(&mx, 1, ReduceOp::Max);
    // The worst element: gather every rank's (max_abs, location) and keep, in rank order, the
    // first rank with a non-finite value, else the largest max_abs (lowest rank on ties), so
    // every rank and every launch mode agree on the same element.
    const double mine[9] = {m.max_abs,
                            double(m.worst.rank),
                            double(m.worst.token),
                            double(m.worst.seq),
                            double(m.worst.head),
                            double(m.worst.channel),
                            double(m.worst.segment),
                            double(m.worst.boundary_distance),
                            double(m.nonfinite)};
    std::vector<double> all(9 * W);
    comm.allgather(mine, all.data(), 9);
    int best = 0;
    for (int r = 1; r < W; ++r) {
      const bool best_nf = all[9 * best + 8] > 0, r_nf = all[9 * r + 8] > 0;
      if ((!best_nf && r_nf) || (!best_nf && !r_nf && all[9 * r] > all[9 * best])) best = r;
    }
    const double* b = &all[9 * best];
    double worst_max = 0;
    for (int r = 0; r < W; ++r) worst_max = std::max(worst_max, all[9 * r]);
    m.max_abs = worst_max;
    m.worst = {int(b[1]), int64_t(b[2]), int(b[3]), int(b[4]), int(b[5]), int(b[6]), int64_t(b[7])};
    m.sum_err2 = sums[0];
    m.sum_ref2 = sums[1];
    m.nonfinite = counts[0];
    m.count = counts[1];
    m.ref_max_abs = mx;
    m.rel_rms = m.sum_ref2 > 0 ? std::sqrt(m.sum_err2 / m.sum_ref2) : (m.sum_err2 > 0 ? INFINITY : 0.0);
    m.max_rel = relative_to(m.max_abs, m.ref_max_abs);
  }
}

void judge(std::vector<TensorMetrics>& ms, const RowConfig& row, int P) {
  const std::map<std::string, Budget>& budgets = row.budgets_at(P);
  for (auto& m : ms) {
    auto it = budgets.find(m.name);
    m.has_budget = it != budgets.end();
    if (!m.has_budget) {
      m.pass = m.count == 0;  // nothing judged (docs/design.md 6): passes without a budget
      continue;
    }
    m.budget = it->second;
    m.ratio_max =
        m.budget.relative ? relative_to(m.max_rel, m.budget.max_rel) : relative_to(m.max_abs, m.budget.max_abs);
    m.rms_ratio = relative_to(m.rel_rms, m.budget.rel_rms);
    m.pass = m.nonfinite == 0 && m.ratio_max <= 1.0 && m.rms_ratio <= 1.0;
  }
}

}  // namespace kcp
