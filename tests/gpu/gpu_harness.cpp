#include "gpu_harness.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "kernels/cpu/rank_driver.h"

namespace kcp::test {

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

struct Rank {
  int64_t g0 = 0, g1 = 0;
  std::vector<int> piece_seq;
  kk::RankLayout layout;
  Buf saved, ws, h0, dht, o, ht, dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0, sum_M, sum_h, sum_Mt, sum_dh;
  kk::RankRun run;
};

}  // namespace

namespace {

uint16_t f32_to_16(float x, kk::DType dt) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (dt == kk::DType::BF16) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // NaN stays NaN
    const uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);                          // round to nearest even
    return uint16_t(r >> 16);
  }
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const int exp = int((u >> 23) & 0xffu);
  const uint32_t man = u & 0x7fffffu;
  if (exp == 0xff) return uint16_t(sign | 0x7c00u | (man ? 0x200u : 0u));
  if (exp == 0) return sign;  // fp32 zero / subnormal: far below fp16's range
  const int e = exp - 127;
  if (e > 15) return uint16_t(sign | 0x7c00u);
  uint32_t full = man | 0x800000u;  // 1.m as a 24-bit integer
  int shift;                        // bits to drop from full
  uint32_t base;
  if (e >= -14) {
    shift = 13;
    base = uint32_t(e + 14) << 10;  // (e + 15 - 1) << 10: the implicit 1 adds one exponent step
  } else {
    shift = -1 - e;  // unit 2^-24: value = full 2^(e - 23)
    base = 0;
    if (shift > 24) return sign;
  }
  const uint32_t keep = full >> shift, rem = full & ((1u << shift) - 1u), halfw = 1u << (shift - 1);
  uint32_t q = keep + ((rem > halfw || (rem == halfw && (keep & 1u))) ? 1u : 0u);
  return uint16_t(sign | (base + q));  // a carry out of the mantissa moves into the exponent
}

float f16_to_32(uint16_t h, kk::DType dt) {
  uint32_t u;
  if (dt == kk::DType::BF16) {
    u = uint32_t(h) << 16;
  } else {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) {
      u = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
      const float v = std::ldexp(float(man), -24);
      std::memcpy(&u, &v, 4);
      u |= sign;
    } else {
      u = sign | ((exp + 112u) << 23) | (man << 13);
    }
  }
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace

std::vector<Region16> cuda_16bit_tensors(const kk::WorkspaceTensors& w, const kk::Problem& p, const kk::LayoutView& L) {
  const int64_t T = L.T, NT = L.n_chunks, HV = p.HV, K = p.K, V = p.V;
  return {{"W", w.W, T * HV * K},       {"U", w.U, T * HV * V},        {"h", w.h, NT * HV * K * V},
          {"v_new", w.v_new, T * HV * V}, {"dh", w.dh, NT * HV * K * V}, {"dv2", w.dv2, T * HV * V},
          {"dv_local", w.dv_local, T * HV * V}};
}
std::vector<Region16> cuda_16bit_tensors(const kk::SavedTensors& s, const kk::Problem& p, const kk::LayoutView& L) {
  const int64_t T = L.T;
  return {{"q", s.q, T * p.H * p.K}, {"k", s.k, T * p.H * p.K}, {"Phi", s.Phi, T * p.HV * p.chunk}};
}

std::vector<uint16_t> pack16(const float* x, int64_t n, kk::DType dt) {
  std::vector<uint16_t> out(static_cast<size_t>(n), 0);
  uint16_t* o = out.data();
  for (int64_t e = 0; e < n; ++e) {
    const uint16_t h = f32_to_16(x[e], dt);
    const float back = f16_to_32(h, dt);
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
  for (int64_t e = 0; e < n; ++e) out[size_t(e)] = f16_to_32(s[e], dt);
  return out;
}

float poison16() {
  const uint32_t u = 0xffffffffu;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

TwinResults run_backend(const kk::Backend& be, const Case& c, const Data& d, const TwinOptions& opt) {
  const kk::Problem p = c.problem();
  const int64_t T = c.T();
  const int gw = p.gate_width();
  const int64_t S = int64_t(c.HV) * c.K * c.V, SK = int64_t(c.HV) * c.K * c.K;
  const std::vector<int64_t> bounds = opt.rank_bounds.empty() ? std::vector<int64_t>{0, T} : opt.rank_bounds;
  const int W = static_cast<int>(bounds.size()) - 1;
  std::vector<int64_t> cu{0};
  for (int64_t l : c.lens) cu.push_back(cu.back() + l);
  const int NS = static_cast<int>(c.lens.size());
  const kk::Exec ex{opt.package, opt.threads, nullptr};

  // Global inputs in the backend's memory.
  const Buf q(be, d.q), k(be, d.k), v(be, d.v), g(be, d.g), beta(be, d.beta), dO(be, d.dO);
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
      if (b == e) here = (b >= rs.g0 && b < rs.g1) || (r == W - 1 && b == rs.g1);
      else here = b < rs.g1 && e > rs.g0;
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
    rs.ws = Buf(be, be.workspace_floats(p, L));
    std::vector<float> h0(size_t(N * S), kNaN), dht(size_t(N * S), kNaN);
    for (int32_t pi = 0; pi < N; ++pi) {
      const int s = rs.piece_seq[pi];
      if (c.h0 && L.pieces[pi].starts_sequence) std::memcpy(&h0[pi * S], &d.h0[s * S], S * sizeof(float));
      if (c.dht && L.pieces[pi].ends_sequence) std::memcpy(&dht[pi * S], &d.dht[s * S], S * sizeof(float));
    }
    rs.h0 = Buf(be, h0);
    rs.dht = Buf(be, dht);
    rs.o = Buf(be, Tl * c.HV * c.V);
    rs.ht = Buf(be, N * S);
    rs.dq = Buf(be, Tl * c.H * c.K);
    rs.dk = Buf(be, Tl * c.H * c.K);
    rs.dv = Buf(be, Tl * c.HV * c.V);
    rs.dg = Buf(be, Tl * c.HV * gw);
    rs.dbeta = Buf(be, Tl * c.HV);
    rs.dA_log = Buf(be, c.HV);
    rs.ddt_bias = Buf(be, int64_t(c.HV) * gw);
    rs.dh0 = Buf(be, N * S);
    rs.sum_M = Buf(be, SK);
    rs.sum_h = Buf(be, S);
    rs.sum_Mt = Buf(be, SK);
    rs.sum_dh = Buf(be, S);
    for (const Buf* b : {&rs.saved, &rs.ws, &rs.o, &rs.ht, &rs.dq, &rs.dk, &rs.dv, &rs.dg, &rs.dbeta, &rs.dA_log,
                         &rs.ddt_bias, &rs.dh0, &rs.sum_M, &rs.sum_h, &rs.sum_Mt, &rs.sum_dh})
      b->fill(kNaN);

    kk::RankRun& run = rs.run;
    run.problem = p;
    run.layout = L;
    run.exec = ex;
    run.kind = opt.kind;
    run.in.q = q.get() + rs.g0 * c.H * c.K;
    run.in.k = k.get() + rs.g0 * c.H * c.K;
    run.in.v = v.get() + rs.g0 * c.HV * c.V;
    run.in.g = g.get() + rs.g0 * c.HV * gw;
    run.in.beta = beta.get() + rs.g0 * c.HV;
    run.in.A_log = c.A_log ? A_log.get() : nullptr;
    run.in.dt_bias = c.dt_bias ? dt_bias.get() : nullptr;
    run.in.h0 = c.h0 ? rs.h0.get() : nullptr;
    run.in.dO = dO.get() + rs.g0 * c.HV * c.V;
    run.in.dht = c.dht ? rs.dht.get() : nullptr;
    run.saved = be.bind_saved_for(rs.saved.get(), rs.saved.size(), p, L, opt.kind, opt.package);
    run.ws = be.bind_workspace_for(rs.ws.get(), rs.ws.size(), p, L, opt.package);
  }

  // Fold of rank summaries (in `order`) from x0 into out, as the engine does.
  auto fold_ranks = [&](const std::vector<int>& order, bool fwd, const float* x0, float* out) {
    const Buf A(be, std::max<int64_t>(1, int64_t(order.size()) * SK)), b(be, std::max<int64_t>(1, int64_t(order.size()) * S));
    for (size_t u = 0; u < order.size(); ++u) {
      const Rank& q = *R[order[u]];
      be.copy_floats(A.get() + u * SK, (fwd ? q.sum_M : q.sum_Mt).get(), SK, ex);
      be.copy_floats(b.get() + u * S, (fwd ? q.sum_h : q.sum_dh).get(), S, ex);
    }
    kk::FoldArgs f;
    f.exec = ex;
    f.HV = c.HV;
    f.K = c.K;
    f.V = c.V;
    f.n = static_cast<int32_t>(order.size());
    f.A = A.get();
    f.A_stride = SK;
    f.b = b.get();
    f.b_stride = S;
    f.x0 = x0;
    f.x_final = out;
    be.fold(f);
    be.synchronize(ex);
  };

  // A rank computes the summaries it sends (forward: its last piece continues on a later rank;
  // backward: its first piece continues from an earlier one), as the engine does.
  for (int r = 0; r < W; ++r) {
    const bool sends = !R[r]->layout.pieces().back().ends_sequence;
    kk::rank_forward_begin(be, R[r]->run, sends ? R[r]->sum_M.get() : nullptr, sends ? R[r]->sum_h.get() : nullptr);
  }
  for (int r = 0; r < W; ++r) {
    Rank& rs = *R[r];
    Buf incoming;
    if (!rs.layout.pieces()[0].starts_sequence) {
      const int s = rs.piece_seq[0];
      int r0 = r;
      while (r0 > 0 && R[r0 - 1]->piece_seq.back() == s && cu[s] < R[r0]->g0) --r0;
      std::vector<int> order;
      for (int q2 = r0; q2 < r; ++q2) order.push_back(q2);
      incoming = Buf(be, S);
      fold_ranks(order, true, c.h0 ? h0_all.get() + s * S : nullptr, incoming.get());
    }
    kk::OutputTensors out{rs.o.get(), rs.ht.get()};
    kk::rank_forward_end(be, rs.run, incoming.get(), out);
    be.synchronize(ex);
    if (opt.repoison_between) rs.ws.fill(kNaN);
  }
  for (int r = 0; r < W; ++r) {
    const bool sends = !R[r]->layout.pieces().front().starts_sequence;
    kk::rank_backward_begin(be, R[r]->run, sends ? R[r]->sum_Mt.get() : nullptr, sends ? R[r]->sum_dh.get() : nullptr);
  }
  for (int r = 0; r < W; ++r) {
    Rank& rs = *R[r];
    Buf exit_grad;
    if (!rs.layout.pieces().back().ends_sequence) {
      const int s = rs.piece_seq.back();
      int r1 = r;
      while (r1 + 1 < W && R[r1 + 1]->piece_seq.front() == s && cu[s + 1] > R[r1]->g1) ++r1;
      std::vector<int> order;
      for (int q2 = r1; q2 > r; --q2) order.push_back(q2);
      exit_grad = Buf(be, S);
      fold_ranks(order, false, c.dht ? dht_all.get() + s * S : nullptr, exit_grad.get());
    }
    kk::GradTensors gr;
    gr.dq = rs.dq.get();
    gr.dk = rs.dk.get();
    gr.dv = rs.dv.get();
    gr.dg = rs.dg.get();
    gr.dbeta = rs.dbeta.get();
    gr.dA_log = c.A_log ? rs.dA_log.get() : nullptr;
    gr.ddt_bias = c.dt_bias ? rs.ddt_bias.get() : nullptr;
    gr.dh0 = rs.dh0.get();
    kk::rank_backward_end(be, rs.run, exit_grad.get(), gr);
    be.synchronize(ex);
  }

  TwinResults res;
  auto& t = res.t;
  auto gather_tok = [&](const char* name, int per_token, Buf Rank::*field) {
    auto& dst = t[name];
    dst.assign(size_t(T) * per_token, kNaN);
    for (auto& rs : R) {
      const std::vector<float> h = ((*rs).*field).host();
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

Diff diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) throw std::runtime_error("diff: size mismatch");
  Diff d;
  double se = 0.0, sb = 0.0, me = 0.0, mb = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) && std::isfinite(b[i])) {
      ++d.bad;
      continue;
    }
    if (!std::isfinite(b[i])) continue;
    const double e = double(a[i]) - double(b[i]);
    se += e * e;
    sb += double(b[i]) * b[i];
    me = std::max(me, std::fabs(e));
    mb = std::max(mb, std::fabs(double(b[i])));
  }
  if (d.bad > 0) {
    d.rel_rms = d.rel_max = std::numeric_limits<double>::infinity();
    return d;
  }
  d.rel_rms = sb > 0 ? std::sqrt(se / sb) : std::sqrt(se);
  d.rel_max = mb > 0 ? me / mb : me;
  return d;
}

int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return int64_t(i);
  return -1;
}

double unit_roundoff(const Case& c) { return c.dtype == kk::DType::BF16 ? 1.0 / 256.0 : 1.0 / 2048.0; }

}  // namespace kcp::test
