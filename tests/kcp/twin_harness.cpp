#include "twin_harness.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>

#include "core/kcp/rank_exchange.h"
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

float rnd(const Case& c, double x) { return kcp::round_to(static_cast<float>(x), kk::rounding_of(c.dtype)); }

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
      if (u < c.mask_p)
        a = -1000.0;
      else if (u < c.mask_p + c.zero_p)
        a = 0.0;
      x = rnd(c, a);
    } else {
      double graw = z;  // raw gate
      const double u = rng.uniform();
      if (u < c.mask_p)
        graw = 1000.0;  // softplus -> 1000, sigmoid -> 1: decay at its extreme
      else if (u < c.mask_p + c.zero_p)
        graw = -1000.0;  // softplus -> 0 (no decay), sigmoid -> 0
      x = rnd(c, graw);
    }
  }
  d.beta.resize(size_t(T) * c.HV);
  for (auto& x : d.beta) x = rnd(c, 1.0 / (1.0 + std::exp(-rng.normal())));
  if (c.A_log) {
    d.A_log.resize(c.HV);
    for (int j = 0; j < c.HV; ++j)  // log(linspace(1, 8, HV)): per-head variation (docs/algorithm.md 6.2)
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
  p.op = c.op;
  p.H = c.H;
  p.HV = c.HV;
  p.K = c.K;
  p.V = c.V;
  p.cu_seqlens.push_back(0);
  for (int64_t l : c.lens) p.cu_seqlens.push_back(p.cu_seqlens.back() + l);
  p.qk_l2norm = c.l2norm;
  p.gate = c.gate;
  p.lower_bound = c.lower_bound;
  p.has_A_log = c.A_log;
  p.has_dt_bias = c.dt_bias;
  p.has_h0 = c.h0;
  p.has_dht = c.dht;
  ref::Inputs in;
  in.q = d.q.data();
  in.k = d.k.data();
  in.v = d.v.data();
  in.g = d.g.data();
  in.beta = d.beta.data();
  in.A_log = c.A_log ? d.A_log.data() : nullptr;
  in.dt_bias = c.dt_bias ? d.dt_bias.data() : nullptr;
  in.h0 = c.h0 ? d.h0.data() : nullptr;
  in.dO = d.dO.data();
  in.dht = c.dht ? d.dht.data() : nullptr;
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

struct Rank {
  int64_t g0 = 0, g1 = 0;      // global token range
  std::vector<int> piece_seq;  // global sequence of each local piece
  kk::RankLayout layout;
  Buf saved, ws, h0, dht, ht, dg, dbeta, dA_log, ddt_bias, dh0;
  kcp::DtypeArray o, dq, dk, dv;  // caller dtype tensors (16-bit patterns on every backend but the exact twin)
  kcp::RankRun run;
};

}  // namespace

TwinResults run_backend(const kk::Backend& be, const Case& c, const Data& d, const TwinOptions& opt) {
  const kk::Problem p = c.problem();
  const int64_t T = c.T();
  const int gw = p.gate_width();
  const int64_t S = int64_t(c.HV) * c.K * c.V;
  const SummaryBlock blk = summary_block(p);
  const std::vector<int64_t> bounds = opt.rank_bounds.empty() ? std::vector<int64_t>{0, T} : opt.rank_bounds;
  const int W = static_cast<int>(bounds.size()) - 1;
  std::vector<int64_t> cu{0};
  for (int64_t l : c.lens) cu.push_back(cu.back() + l);
  const int NS = static_cast<int>(c.lens.size());
  const kk::Exec ex{opt.package, opt.threads, nullptr};

  // Global inputs in the backend's memory.
  const kcp::DtypeArray q(be, d.q, p.dtype), k(be, d.k, p.dtype), v(be, d.v, p.dtype), dO(be, d.dO, p.dtype);
  const Buf g(be, d.g), beta(be, d.beta);
  const Buf A_log = c.A_log ? Buf(be, d.A_log) : Buf(), dt_bias = c.dt_bias ? Buf(be, d.dt_bias) : Buf();
  const Buf h0_all = c.h0 ? Buf(be, d.h0) : Buf(), dht_all = c.dht ? Buf(be, d.dht) : Buf();

  std::vector<std::unique_ptr<Rank>> R;
  for (int r = 0; r < W; ++r) {
    R.push_back(std::make_unique<Rank>());
    Rank& rs = *R.back();
    rs.g0 = bounds[r];
    rs.g1 = bounds[r + 1];
    std::vector<kk::PieceSpec> ps;
    std::vector<kk::SegmentSpec> ss;
    for (int s = 0; s < NS; ++s) {
      const int64_t b = cu[s], e = cu[s + 1];
      bool here;
      if (b == e)
        here = (b >= rs.g0 && b < rs.g1) || (r == W - 1 && b == rs.g1);
      else
        here = b < rs.g1 && e > rs.g0;
      if (!here) continue;
      const int64_t lb = std::max(b, rs.g0) - rs.g0, le = std::min(e, rs.g1) - rs.g0;
      const int32_t pi = static_cast<int32_t>(ps.size());
      ps.push_back({lb, le, b >= rs.g0, e <= rs.g1});
      kk::RankLayout::append_even_segments(pi, lb, le, opt.P.empty() ? 1 : opt.P[r], p.chunk, ss);
      rs.piece_seq.push_back(s);
    }
    rs.layout = kk::RankLayout(ps, ss);
    const kk::LayoutView L = rs.layout.view();
    const int64_t Tl = rs.g1 - rs.g0, N = L.n_pieces;
    rs.saved = Buf(be, be.saved_floats(p, L, opt.kind));
    rs.ws = Buf(be, be.workspace_floats(p, L, opt.kind));
    std::vector<float> h0(size_t(N * S), kNaN), dht(size_t(N * S), kNaN);
    for (int32_t pi = 0; pi < N; ++pi) {
      const int s = rs.piece_seq[pi];
      if (c.h0 && L.pieces[pi].starts_sequence) std::memcpy(&h0[pi * S], &d.h0[s * S], S * sizeof(float));
      if (c.dht && L.pieces[pi].ends_sequence) std::memcpy(&dht[pi * S], &d.dht[s * S], S * sizeof(float));
    }
    rs.h0 = Buf(be, h0);
    rs.dht = Buf(be, dht);
    rs.o = kcp::DtypeArray(be, Tl * c.HV * c.V, p.dtype);
    rs.ht = Buf(be, N * S);
    rs.dq = kcp::DtypeArray(be, Tl * c.H * c.K, p.dtype);
    rs.dk = kcp::DtypeArray(be, Tl * c.H * c.K, p.dtype);
    rs.dv = kcp::DtypeArray(be, Tl * c.HV * c.V, p.dtype);
    rs.dg = Buf(be, Tl * c.HV * gw);
    rs.dbeta = Buf(be, Tl * c.HV);
    rs.dA_log = Buf(be, c.HV);
    rs.ddt_bias = Buf(be, int64_t(c.HV) * gw);
    rs.dh0 = Buf(be, N * S);
    for (const Buf* b : {&rs.saved, &rs.ws, &rs.ht, &rs.dg, &rs.dbeta, &rs.dA_log, &rs.ddt_bias, &rs.dh0})
      b->fill(kNaN);
    for (const kcp::DtypeArray* b : {&rs.o, &rs.dq, &rs.dk, &rs.dv}) b->poison();

    kcp::RankRun& run = rs.run;
    run.problem = p;
    run.layout = L;
    run.exec = ex;
    run.kind = opt.kind;
    run.in.q = q.tensor().at(rs.g0 * c.H * c.K);
    run.in.k = k.tensor().at(rs.g0 * c.H * c.K);
    run.in.v = v.tensor().at(rs.g0 * c.HV * c.V);
    run.in.g = g.get() + rs.g0 * c.HV * gw;
    run.in.beta = beta.get() + rs.g0 * c.HV;
    run.in.A_log = c.A_log ? A_log.get() : nullptr;
    run.in.dt_bias = c.dt_bias ? dt_bias.get() : nullptr;
    run.in.h0 = c.h0 ? rs.h0.get() : nullptr;
    run.in.dO = dO.tensor().at(rs.g0 * c.HV * c.V);
    run.in.dht = c.dht ? rs.dht.get() : nullptr;
    run.saved = be.bind_saved_for(rs.saved.get(), rs.saved.size(), p, L, opt.kind, opt.package);
    run.ws = be.bind_workspace_for(rs.ws.get(), rs.ws.size(), p, L, opt.kind, opt.package);
  }

  // The all-gathers of the engine, emulated: every rank writes its block of one gathered buffer
  // per direction (zeros where it sends nothing), then folds the blocks of its sequence's other
  // ranks with the engine's own folds (core/kcp/rank_exchange.h).
  const Buf gathered_fwd(be, W * blk.floats()), gathered_bwd(be, W * blk.floats());
  gathered_fwd.fill(0.0f);
  gathered_bwd.fill(0.0f);
  auto block_A = [&](const Buf& gathered, int r) { return gathered.get() + r * blk.floats(); };
  auto block_b = [&](const Buf& gathered, int r) { return gathered.get() + r * blk.floats() + blk.A; };

  // A rank computes the summaries it sends (forward: its last piece continues on a later rank;
  // backward: its first piece continues from an earlier one), as the engine does.
  for (int r = 0; r < W; ++r) {
    const bool sends = !R[r]->layout.pieces().back().ends_sequence;
    kcp::rank_forward_begin(be, R[r]->run, sends ? block_A(gathered_fwd, r) : nullptr,
                            sends ? block_b(gathered_fwd, r) : nullptr);
  }
  be.synchronize(ex);
  for (int r = 0; r < W; ++r) {
    Rank& rs = *R[r];
    Buf incoming;
    if (!rs.layout.pieces()[0].starts_sequence) {
      const int s = rs.piece_seq[0];
      int r0 = r;
      while (r0 > 0 && R[r0 - 1]->piece_seq.back() == s && cu[s] < R[r0]->g0) --r0;
      incoming = Buf(be, S);
      fold_earlier_ranks(be, ex, p, gathered_fwd.get(), r, r - r0, c.h0 ? h0_all.get() + s * S : nullptr,
                         incoming.get());
    }
    kk::OutputTensors out{rs.o.tensor(), rs.ht.get()};
    kcp::rank_forward_end(be, rs.run, incoming.get(), out);
    be.synchronize(ex);
    if (opt.repoison_between) rs.ws.fill(kNaN);
  }
  for (int r = 0; r < W; ++r) {
    const bool sends = !R[r]->layout.pieces().front().starts_sequence;
    kcp::rank_backward_begin(be, R[r]->run, sends ? block_A(gathered_bwd, r) : nullptr,
                             sends ? block_b(gathered_bwd, r) : nullptr);
  }
  be.synchronize(ex);
  for (int r = 0; r < W; ++r) {
    Rank& rs = *R[r];
    Buf exit_grad;
    if (!rs.layout.pieces().back().ends_sequence) {
      const int s = rs.piece_seq.back();
      int r1 = r;
      while (r1 + 1 < W && R[r1 + 1]->piece_seq.front() == s && cu[s + 1] > R[r1]->g1) ++r1;
      exit_grad = Buf(be, S);
      fold_later_ranks(be, ex, p, gathered_bwd.get(), r, r1 - r, c.dht ? dht_all.get() + s * S : nullptr,
                       exit_grad.get());
    }
    kk::GradTensors gr;
    gr.dq = rs.dq.tensor();
    gr.dk = rs.dk.tensor();
    gr.dv = rs.dv.tensor();
    gr.dg = rs.dg.get();
    gr.dbeta = rs.dbeta.get();
    gr.dA_log = c.A_log ? rs.dA_log.get() : nullptr;
    gr.ddt_bias = c.dt_bias ? rs.ddt_bias.get() : nullptr;
    gr.dh0 = rs.dh0.get();
    kcp::rank_backward_end(be, rs.run, exit_grad.get(), gr);
    be.synchronize(ex);
  }

  TwinResults res;
  auto& t = res.t;
  auto gather_tok = [&](const char* name, int per_token, auto Rank::*field) {
    auto& dst = t[name];
    dst.assign(size_t(T) * per_token, kNaN);
    for (auto& rs : R) {
      const std::vector<float> h = ((*rs).*field).to_host();
      std::copy(h.begin(), h.end(), dst.begin() + rs->g0 * per_token);
    }
  };
  gather_tok("o", c.HV * c.V, &Rank::o);
  gather_tok("dq", c.H * c.K, &Rank::dq);
  gather_tok("dk", c.H * c.K, &Rank::dk);
  gather_tok("dv", c.HV * c.V, &Rank::dv);
  gather_tok("dg", c.HV * gw, &Rank::dg);
  gather_tok("dbeta", c.HV, &Rank::dbeta);
  t["ht"].assign(size_t(NS * S), kNaN);
  if (c.h0) t["dh0"].assign(size_t(NS * S), kNaN);
  for (auto& rs : R) {
    const auto& ps = rs->layout.pieces();
    const std::vector<float> ht = rs->ht.host(), dh0 = rs->dh0.host();
    for (size_t pi = 0; pi < ps.size(); ++pi) {
      const int s = rs->piece_seq[pi];
      if (ps[pi].ends_sequence) std::copy(&ht[pi * S], &ht[pi * S] + S, &t["ht"][s * S]);
      if (c.h0 && ps[pi].starts_sequence) std::copy(&dh0[pi * S], &dh0[pi * S] + S, &t["dh0"][s * S]);
    }
  }
  if (c.A_log) {
    auto& dst = t["dA_log"];
    dst.assign(size_t(c.HV), 0.0f);
    for (auto& rs : R) {
      const std::vector<float> h = rs->dA_log.host();
      for (int j = 0; j < c.HV; ++j) dst[j] += h[j];
    }
  }
  if (c.dt_bias) {
    auto& dst = t["ddt_bias"];
    dst.assign(size_t(c.HV) * gw, 0.0f);
    for (auto& rs : R) {
      const std::vector<float> h = rs->ddt_bias.host();
      for (size_t e = 0; e < dst.size(); ++e) dst[e] += h[e];
    }
  }
  return res;
}

TwinResults run_twin(const Case& c, const Data& d, const TwinOptions& opt) {
  const std::unique_ptr<kk::Backend> own = opt.backend ? nullptr : kk::make_cpu_backend();
  return run_backend(opt.backend ? *opt.backend : *own, c, d, opt);
}

std::vector<uint16_t> pack16(const float* x, int64_t n, kk::DType dt) {
  std::vector<uint16_t> out(static_cast<size_t>(n), 0);
  uint16_t* o = out.data();
  for (int64_t e = 0; e < n; ++e) {
    const uint16_t h = kcp::dtype16_bits(x[e], kk::rounding_of(dt));
    const float back = kcp::dtype16_value(h, kk::rounding_of(dt));
    if (!(std::isnan(x[e]) && std::isnan(back)) && std::memcmp(&back, &x[e], 4) != 0)
      throw std::logic_error("pack16: element " + std::to_string(e) + " (" + std::to_string(x[e]) +
                             ") is not exactly representable in the dtype");
    o[e] = h;
  }
  return out;
}

std::vector<float> unpack16(const uint16_t* packed, int64_t n, kk::DType dt) {
  const uint16_t* s = packed;
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) out[size_t(e)] = kcp::dtype16_value(s[e], kk::rounding_of(dt));
  return out;
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
