#include "twin_harness.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "kernels/api/numeric.h"
#include "reference/reference.h"

namespace kcp::test {

namespace {

struct Rng {  // splitmix64 + Box-Muller: deterministic across platforms
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 12345) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (double(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }
  double normal() {
    const double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

float rnd(const Case& c, double x) {
  return kcp::round_to(static_cast<float>(x), c.dtype == kk::DType::BF16 ? kcp::RoundTo::BF16 : kcp::RoundTo::FP16);
}

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

}  // namespace

kk::Problem Case::problem() const {
  kk::Problem p;
  p.op = op;
  p.H = H;
  p.HV = HV;
  p.K = K;
  p.V = V;
  p.qk_l2norm = l2norm;
  p.gate = gate;
  p.lower_bound = lower_bound;
  p.has_A_log = A_log;
  p.has_dt_bias = dt_bias;
  p.has_h0 = h0;
  p.has_dht = dht;
  p.dtype = dtype;
  return p;
}

Data make_data(const Case& c) {
  Data d;
  const int64_t T = c.T();
  const int gw = c.op == kk::Op::Kda ? c.K : 1;
  const int64_t N = static_cast<int64_t>(c.lens.size());
  Rng rng(c.seed);
  auto fill_qk = [&](std::vector<float>& x, double mul, double add) {
    x.resize(size_t(T) * c.H * c.K);
    std::vector<double> row(c.K);
    for (int64_t r = 0; r < T * c.H; ++r) {
      double ss = 0.0;
      for (int e = 0; e < c.K; ++e) {
        row[e] = mul * rng.normal() + add;
        ss += row[e] * row[e];
      }
      const double inv = c.l2norm ? 1.0 : 1.0 / std::sqrt(ss);  // pre-normalized unless the kernel normalizes
      for (int e = 0; e < c.K; ++e) x[size_t(r) * c.K + e] = rnd(c, row[e] * inv);
    }
  };
  fill_qk(d.q, 1.0, c.skewed ? 1.0 : 0.0);
  fill_qk(d.k, c.skewed ? 10.0 : 1.0, c.skewed ? -50.0 : 0.0);
  d.v.resize(size_t(T) * c.HV * c.V);
  for (auto& x : d.v) x = rnd(c, rng.normal());
  d.g.resize(size_t(T) * c.HV * gw);
  for (auto& x : d.g) {
    const double z = rng.normal();
    if (c.gate == kk::GateForm::Direct) {
      double a = -std::log1p(std::exp(-z)) / c.gate_div;  // logsigmoid / normalizer
      const double u = rng.uniform();
      if (u < c.mask_p) a = -1000.0;
      else if (u < c.mask_p + c.zero_p) a = 0.0;
      x = rnd(c, a);
    } else {
      double graw = z;  // raw gate
      const double u = rng.uniform();
      if (u < c.mask_p) graw = 1000.0;                 // softplus -> 1000, sigmoid -> 1: decay at its extreme
      else if (u < c.mask_p + c.zero_p) graw = -1000.0;  // softplus -> 0 (no decay), sigmoid -> 0
      x = rnd(c, graw);
    }
  }
  d.beta.resize(size_t(T) * c.HV);
  for (auto& x : d.beta) x = rnd(c, 1.0 / (1.0 + std::exp(-rng.normal())));
  if (c.A_log) {
    d.A_log.resize(c.HV);
    for (int j = 0; j < c.HV; ++j)  // log(linspace(1, 8, HV)): per-head variation (ALGORITHM 6.2)
      d.A_log[j] = rnd(c, std::log(1.0 + 7.0 * (c.HV > 1 ? double(j) / (c.HV - 1) : 0.0)));
  }
  if (c.dt_bias) {
    d.dt_bias.resize(size_t(c.HV) * gw);
    for (auto& x : d.dt_bias) {  // inverse softplus of dt, dt log-uniform in [1e-3, 1e-1]
      const double dt = std::exp(std::log(1e-3) + rng.uniform() * (std::log(1e-1) - std::log(1e-3)));
      x = rnd(c, dt + std::log(-std::expm1(-dt)));
    }
  }
  const size_t state = size_t(N) * c.HV * c.K * c.V;
  if (c.h0) {
    d.h0.resize(state);
    for (auto& x : d.h0) x = static_cast<float>(rng.normal());
  }
  d.dO.resize(size_t(T) * c.HV * c.V);
  for (auto& x : d.dO) x = rnd(c, rng.normal());
  if (c.dht) {
    d.dht.resize(state);
    for (auto& x : d.dht) x = static_cast<float>(rng.normal());
  }
  return d;
}

RefResults run_reference(const Case& c, const Data& d) {
  ref::Problem p;
  p.op = c.op == kk::Op::Gdn ? ref::Op::Gdn : ref::Op::Kda;
  p.H = c.H;
  p.HV = c.HV;
  p.K = c.K;
  p.V = c.V;
  p.cu_seqlens.push_back(0);
  for (int64_t l : c.lens) p.cu_seqlens.push_back(p.cu_seqlens.back() + l);
  p.qk_l2norm = c.l2norm;
  p.gate = c.gate == kk::GateForm::Direct     ? ref::GateForm::Direct
           : c.gate == kk::GateForm::Softplus ? ref::GateForm::Softplus
                                              : ref::GateForm::LowerBound;
  p.lower_bound = c.lower_bound;
  p.has_A_log = c.A_log;
  p.has_dt_bias = c.dt_bias;
  p.has_h0 = c.h0;
  p.has_dht = c.dht;
  const auto q = to_double(d.q), k = to_double(d.k), v = to_double(d.v), g = to_double(d.g), beta = to_double(d.beta),
             A_log = to_double(d.A_log), dt_bias = to_double(d.dt_bias), h0 = to_double(d.h0), dO = to_double(d.dO),
             dht = to_double(d.dht);
  ref::Inputs in;
  in.q = q.data();
  in.k = k.data();
  in.v = v.data();
  in.g = g.data();
  in.beta = beta.data();
  in.A_log = c.A_log ? A_log.data() : nullptr;
  in.dt_bias = c.dt_bias ? dt_bias.data() : nullptr;
  in.h0 = c.h0 ? h0.data() : nullptr;
  in.dO = dO.data();
  in.dht = c.dht ? dht.data() : nullptr;
  ref::Outputs out;
  ref::Grads gr;
  ref::forward_backward(p, in, out, gr, 2);
  RefResults r;
  r.t["o"] = out.o;
  r.t["ht"] = out.ht;
  r.t["dq"] = gr.dq;
  r.t["dk"] = gr.dk;
  r.t["dv"] = gr.dv;
  r.t["dg"] = gr.dg;
  r.t["dbeta"] = gr.dbeta;
  if (c.A_log) r.t["dA_log"] = gr.dA_log;
  if (c.dt_bias) r.t["ddt_bias"] = gr.ddt_bias;
  if (c.h0) r.t["dh0"] = gr.dh0;
  return r;
}

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

struct RankState {
  int64_t g0 = 0, g1 = 0;           // global token range
  std::vector<int> piece_seq;        // global sequence of each local piece
  kk::RankLayout layout;
  std::vector<float> saved_arena, ws_arena;
  kk::RankRun run;
  std::vector<float> h0, dht;        // local [N_pieces, HV, K, V]
  std::vector<float> o, ht, dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0;
  std::vector<float> sum_M, sum_h, sum_Mt, sum_dh;  // rank summaries
};

}  // namespace

TwinResults run_twin(const Case& c, const Data& d, const TwinOptions& opt) {
  const kk::Problem p = c.problem();
  const int64_t T = c.T();
  const int gw = p.gate_width();
  const int64_t S = int64_t(c.HV) * c.K * c.V, SK = int64_t(c.HV) * c.K * c.K;
  std::vector<int64_t> bounds = opt.rank_bounds.empty() ? std::vector<int64_t>{0, T} : opt.rank_bounds;
  const int W = static_cast<int>(bounds.size()) - 1;
  std::vector<int64_t> cu{0};
  for (int64_t l : c.lens) cu.push_back(cu.back() + l);
  const int NS = static_cast<int>(c.lens.size());
  const std::unique_ptr<kk::Backend> own = opt.backend ? nullptr : kk::make_cpu_backend();
  const kk::Backend* be = opt.backend ? opt.backend : own.get();

  // ---- plan the ranks: pieces (clipped sequences) and even segments ----
  std::vector<RankState> R(W);
  for (int r = 0; r < W; ++r) {
    RankState& rs = R[r];
    rs.g0 = bounds[r];
    rs.g1 = bounds[r + 1];
    std::vector<kk::PieceSpec> ps;
    std::vector<kk::SegmentSpec> ss;
    for (int s = 0; s < NS; ++s) {
      const int64_t b = cu[s], e = cu[s + 1];
      bool here;
      if (b == e) here = (b >= rs.g0 && b < rs.g1) || (r == W - 1 && b == rs.g1);  // zero-length sequence
      else here = b < rs.g1 && e > rs.g0;
      if (!here) continue;
      const int64_t lb = std::max(b, rs.g0) - rs.g0, le = std::min(e, rs.g1) - rs.g0;
      const int32_t pi = static_cast<int32_t>(ps.size());
      ps.push_back({lb, le, b >= rs.g0, e <= rs.g1});
      const int P = opt.P.empty() ? 1 : opt.P[r];
      kk::RankLayout::append_even_segments(pi, lb, le, P, p.chunk, ss);
      rs.piece_seq.push_back(s);
    }
    rs.layout = kk::RankLayout(ps, ss);
    const kk::LayoutView L = rs.layout.view();
    const int64_t Tl = rs.g1 - rs.g0, N = L.n_pieces;
    rs.saved_arena.assign(size_t(be->saved_floats(p, L, opt.kind)), kNaN);
    rs.ws_arena.assign(size_t(be->workspace_floats(p, L)), kNaN);
    rs.h0.assign(size_t(N * S), kNaN);
    rs.dht.assign(size_t(N * S), kNaN);
    for (int32_t pi = 0; pi < N; ++pi) {
      const int s = rs.piece_seq[pi];
      if (c.h0 && L.pieces[pi].starts_sequence) std::memcpy(&rs.h0[pi * S], &d.h0[s * S], S * sizeof(float));
      if (c.dht && L.pieces[pi].ends_sequence) std::memcpy(&rs.dht[pi * S], &d.dht[s * S], S * sizeof(float));
    }
    rs.o.assign(size_t(Tl) * c.HV * c.V, kNaN);
    rs.ht.assign(size_t(N * S), kNaN);
    rs.dq.assign(size_t(Tl) * c.H * c.K, kNaN);
    rs.dk.assign(size_t(Tl) * c.H * c.K, kNaN);
    rs.dv.assign(size_t(Tl) * c.HV * c.V, kNaN);
    rs.dg.assign(size_t(Tl) * c.HV * gw, kNaN);
    rs.dbeta.assign(size_t(Tl) * c.HV, kNaN);
    rs.dA_log.assign(size_t(c.HV), kNaN);
    rs.ddt_bias.assign(size_t(c.HV) * gw, kNaN);
    rs.dh0.assign(size_t(N * S), kNaN);
    rs.sum_M.assign(size_t(SK), kNaN);
    rs.sum_h.assign(size_t(S), kNaN);
    rs.sum_Mt.assign(size_t(SK), kNaN);
    rs.sum_dh.assign(size_t(S), kNaN);

    kk::RankRun& run = rs.run;
    run.problem = p;
    run.layout = L;
    run.exec.package = opt.package;
    run.exec.threads = opt.threads;
    run.kind = opt.kind;
    run.in.q = d.q.data() + rs.g0 * c.H * c.K;
    run.in.k = d.k.data() + rs.g0 * c.H * c.K;
    run.in.v = d.v.data() + rs.g0 * c.HV * c.V;
    run.in.g = d.g.data() + rs.g0 * c.HV * gw;
    run.in.beta = d.beta.data() + rs.g0 * c.HV;
    run.in.A_log = c.A_log ? d.A_log.data() : nullptr;
    run.in.dt_bias = c.dt_bias ? d.dt_bias.data() : nullptr;
    run.in.h0 = c.h0 ? rs.h0.data() : nullptr;
    run.in.dO = d.dO.data() + rs.g0 * c.HV * c.V;
    run.in.dht = c.dht ? rs.dht.data() : nullptr;
    run.saved = be->bind_saved_for(rs.saved_arena.data(), int64_t(rs.saved_arena.size()), p, L, opt.kind, opt.package);
    run.ws = be->bind_workspace_for(rs.ws_arena.data(), int64_t(rs.ws_arena.size()), p, L, opt.package);
  }

  // Fold of rank summaries [first, last] (ascending or descending) from x0 into out.
  auto fold_ranks = [&](const std::vector<int>& order, bool fwd, const float* x0, float* out) {
    std::vector<float> A, b;
    for (int q : order) {
      const auto& M = fwd ? R[q].sum_M : R[q].sum_Mt;
      const auto& h = fwd ? R[q].sum_h : R[q].sum_dh;
      A.insert(A.end(), M.begin(), M.end());
      b.insert(b.end(), h.begin(), h.end());
    }
    kk::FoldArgs f;
    f.HV = c.HV;
    f.K = c.K;
    f.V = c.V;
    f.n = static_cast<int32_t>(order.size());
    f.A = A.empty() ? nullptr : A.data();
    f.A_stride = SK;
    f.b = b.empty() ? nullptr : b.data();
    f.b_stride = S;
    f.x0 = x0;
    f.x_final = out;
    be->fold(f);
  };

  // ---- forward ----
  // A rank computes the summaries it sends: forward when its last piece continues on a later
  // rank, backward when its first piece continues from an earlier one.
  for (int r = 0; r < W; ++r) {
    const bool sends = !R[r].layout.pieces().back().ends_sequence;
    kk::rank_forward_begin(*be, R[r].run, sends ? R[r].sum_M.data() : nullptr, sends ? R[r].sum_h.data() : nullptr);
  }
  for (int r = 0; r < W; ++r) {
    RankState& rs = R[r];
    std::vector<float> incoming;
    if (!rs.layout.pieces()[0].starts_sequence) {
      const int s = rs.piece_seq[0];
      int r0 = r;
      while (r0 > 0 && R[r0 - 1].piece_seq.back() == s && cu[s] < R[r0].g0) --r0;
      std::vector<int> order;
      for (int q = r0; q < r; ++q) order.push_back(q);
      incoming.assign(size_t(S), 0.0f);
      fold_ranks(order, true, c.h0 ? &d.h0[s * S] : nullptr, incoming.data());
    }
    kk::OutputTensors out{rs.o.data(), rs.ht.data()};
    kk::rank_forward_end(*be, rs.run, incoming.empty() ? nullptr : incoming.data(), out);
    if (opt.repoison_between) std::fill(rs.ws_arena.begin(), rs.ws_arena.end(), kNaN);
  }

  // ---- backward ----
  for (int r = 0; r < W; ++r) {
    const bool sends = !R[r].layout.pieces().front().starts_sequence;
    kk::rank_backward_begin(*be, R[r].run, sends ? R[r].sum_Mt.data() : nullptr, sends ? R[r].sum_dh.data() : nullptr);
  }
  for (int r = 0; r < W; ++r) {
    RankState& rs = R[r];
    std::vector<float> exit_grad;
    if (!rs.layout.pieces().back().ends_sequence) {
      const int s = rs.piece_seq.back();
      int r1 = r;
      while (r1 + 1 < W && R[r1 + 1].piece_seq.front() == s && cu[s + 1] > R[r1].g1) ++r1;
      std::vector<int> order;
      for (int q = r1; q > r; --q) order.push_back(q);
      exit_grad.assign(size_t(S), 0.0f);
      fold_ranks(order, false, c.dht ? &d.dht[s * S] : nullptr, exit_grad.data());
    }
    kk::GradTensors g;
    g.dq = rs.dq.data();
    g.dk = rs.dk.data();
    g.dv = rs.dv.data();
    g.dg = rs.dg.data();
    g.dbeta = rs.dbeta.data();
    g.dA_log = c.A_log ? rs.dA_log.data() : nullptr;
    g.ddt_bias = c.dt_bias ? rs.ddt_bias.data() : nullptr;
    g.dh0 = rs.dh0.data();
    kk::rank_backward_end(*be, rs.run, exit_grad.empty() ? nullptr : exit_grad.data(), g);
  }

  // ---- gather ----
  TwinResults res;
  auto& t = res.t;
  auto gather_tok = [&](const char* name, int per_token, std::vector<float> RankState::*field) {
    auto& dst = t[name];
    dst.assign(size_t(T) * per_token, kNaN);
    for (auto& rs : R)
      std::copy((rs.*field).begin(), (rs.*field).end(), dst.begin() + rs.g0 * per_token);
  };
  gather_tok("o", c.HV * c.V, &RankState::o);
  gather_tok("dq", c.H * c.K, &RankState::dq);
  gather_tok("dk", c.H * c.K, &RankState::dk);
  gather_tok("dv", c.HV * c.V, &RankState::dv);
  gather_tok("dg", c.HV * gw, &RankState::dg);
  gather_tok("dbeta", c.HV, &RankState::dbeta);
  t["ht"].assign(size_t(NS * S), kNaN);
  if (c.h0) t["dh0"].assign(size_t(NS * S), kNaN);
  for (auto& rs : R) {
    const auto& ps = rs.layout.pieces();
    for (size_t pi = 0; pi < ps.size(); ++pi) {
      const int s = rs.piece_seq[pi];
      if (ps[pi].ends_sequence) std::copy(&rs.ht[pi * S], &rs.ht[pi * S] + S, &t["ht"][s * S]);
      if (c.h0 && ps[pi].starts_sequence) std::copy(&rs.dh0[pi * S], &rs.dh0[pi * S] + S, &t["dh0"][s * S]);
    }
  }
  if (c.A_log) {
    auto& dst = t["dA_log"];
    dst.assign(size_t(c.HV), 0.0f);
    for (auto& rs : R)
      for (int j = 0; j < c.HV; ++j) dst[j] += rs.dA_log[j];  // the engine's all-reduce, rank order
  }
  if (c.dt_bias) {
    auto& dst = t["ddt_bias"];
    dst.assign(size_t(c.HV) * gw, 0.0f);
    for (auto& rs : R)
      for (size_t e = 0; e < dst.size(); ++e) dst[e] += rs.ddt_bias[e];
  }
  return res;
}

double rel_rms(const std::vector<double>& ref, const std::vector<float>& a) {
  if (ref.size() != a.size()) throw std::runtime_error("rel_rms: size mismatch");
  double se = 0.0, sr = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = double(a[i]) - ref[i];
    se += e * e;
    sr += ref[i] * ref[i];
  }
  if (!std::isfinite(se)) return std::numeric_limits<double>::infinity();
  return sr > 0.0 ? std::sqrt(se / sr) : std::sqrt(se / double(std::max<size_t>(1, ref.size())));
}
double rel_rms(const std::vector<float>& ref, const std::vector<float>& a) {
  return rel_rms(std::vector<double>(ref.begin(), ref.end()), a);
}
int64_t non_finite(const std::vector<float>& a) {
  int64_t n = 0;
  for (float x : a) n += std::isfinite(x) ? 0 : 1;
  return n;
}

double threshold(const std::string& t) {
  if (t == "o" || t == "ht") return 5e-3;
  if (t == "dq" || t == "dk" || t == "dv" || t == "dh0") return 8e-3;
  return 2e-2;  // dg, dbeta, dA_log, ddt_bias
}

}  // namespace kcp::test
