// Helpers for the FP64 reference tests: random problem data, an independent naive forward (plain
// per-token matrix code, written from docs/algorithm.md 1.1-1.3 without looking at the library's
// blocking), the loss, finite differences, and gtest checks (bitwise equality, validate() errors).
#pragma once

#include <gtest/gtest.h>

#include <Eigen/Dense>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/detail.h"
#include "reference/reference.h"

namespace kcp::ref::test {

// The values are held as double (the naive forward and the finite differences work on them) and
// must all be floats: the reference takes its inputs as float (Inputs), and inputs() hands it
// exact float copies.
inline std::vector<float> exact_floats(const std::vector<double>& x) {
  std::vector<float> f(x.size());
  for (size_t e = 0; e < x.size(); ++e) {
    f[e] = static_cast<float>(x[e]);
    if (static_cast<double>(f[e]) != x[e] && !std::isnan(x[e]))
      throw std::invalid_argument("test Data holds a value that is not a float: " + std::to_string(x[e]));
  }
  return f;
}

// x with every value rounded to float (still as double).
inline std::vector<double> float_values(const std::vector<double>& x) {
  std::vector<double> r(x.size());
  for (size_t e = 0; e < x.size(); ++e) r[e] = static_cast<double>(static_cast<float>(x[e]));
  return r;
}

// Float copies of a Data's tensors and the Inputs pointing at them; converts to Inputs, so a
// temporary can be passed where Inputs are taken (it lives to the end of the full expression).
struct FloatInputs {
  std::vector<float> q, k, v, g, beta, A_log, dt_bias, h0, dO, dht;
  Inputs in;
  FloatInputs() = default;
  FloatInputs(FloatInputs&&) = default;  // moving the vectors keeps their buffers, so `in` stays valid
  FloatInputs(const FloatInputs&) = delete;
  FloatInputs& operator=(const FloatInputs&) = delete;
  operator const Inputs&() const { return in; }
};

struct Data {
  std::vector<double> q, k, v, g, beta, A_log, dt_bias, h0, dO, dht;

  FloatInputs inputs() const {
    FloatInputs f;
    auto put = [](const std::vector<double>& x, std::vector<float>& to) -> const float* {
      to = exact_floats(x);
      return to.empty() ? nullptr : to.data();
    };
    f.in.q = put(q, f.q);
    f.in.k = put(k, f.k);
    f.in.v = put(v, f.v);
    f.in.g = put(g, f.g);
    f.in.beta = put(beta, f.beta);
    f.in.A_log = put(A_log, f.A_log);
    f.in.dt_bias = put(dt_bias, f.dt_bias);
    f.in.h0 = put(h0, f.h0);
    f.in.dO = put(dO, f.dO);
    f.in.dht = put(dht, f.dht);
    return f;
  }
};

// Well-conditioned random data for the problem (uniform distributions rounded to float, decays in
// (0.35, 0.95) for the direct form, raw gates of order one).
inline Data make_data(const Problem& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto uni = [&](size_t n, double lo, double hi) {
    std::uniform_real_distribution<double> u(lo, hi);
    std::vector<double> x(n);
    for (auto& e : x) e = static_cast<double>(static_cast<float>(u(rng)));  // Inputs are float
    return x;
  };
  const auto T = static_cast<size_t>(p.tokens()), H = static_cast<size_t>(p.H), HV = static_cast<size_t>(p.HV),
             K = static_cast<size_t>(p.K), V = static_cast<size_t>(p.V), N = static_cast<size_t>(p.sequences()),
             Kg = static_cast<size_t>(p.gate_width());
  Data d;
  d.q = uni(T * H * K, -1, 1);
  d.k = uni(T * H * K, -1, 1);
  d.v = uni(T * HV * V, -1, 1);
  d.g = p.gate == GateForm::Direct ? uni(T * HV * Kg, -1.0, -0.05) : uni(T * HV * Kg, -2, 2);
  d.beta = uni(T * HV, 0.2, 0.9);
  if (p.has_A_log) d.A_log = uni(HV, -0.5, 0.5);
  if (p.has_dt_bias) d.dt_bias = uni(HV * Kg, -0.5, 0.5);
  if (p.has_h0) d.h0 = uni(N * HV * K * V, -1, 1);
  d.dO = uni(T * HV * V, -1, 1);
  if (p.has_dht) d.dht = uni(N * HV * K * V, -1, 1);
  return d;
}

// ---- naive forward ----------------------------------------------------------------------------

inline double naive_softplus(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }
inline double naive_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

inline double naive_log_decay(const Problem& p, const Data& d, int64_t t, int j, int c) {
  const int Kg = p.gate_width();
  const double g = d.g[static_cast<size_t>((t * p.HV + j) * Kg + (Kg == 1 ? 0 : c))];
  const double bias = p.has_dt_bias ? d.dt_bias[static_cast<size_t>(j * Kg + (Kg == 1 ? 0 : c))] : 0.0;
  switch (p.gate) {
    case GateForm::Direct:
      return g;
    case GateForm::Softplus:
      return -std::exp(d.A_log[static_cast<size_t>(j)]) * naive_softplus(g + bias);
    case GateForm::LowerBound: {
      const double z = p.has_A_log ? std::exp(d.A_log[static_cast<size_t>(j)]) * (g + bias) : g + bias;
      return p.lower_bound * naive_sigmoid(z);
    }
  }
  return 0;
}

// Plain per-token recurrence: S = D S; e = v - S^T k; S += beta k e^T; o = rho S^T q.
inline Outputs naive_forward(const Problem& p, const Data& d) {
  const int H = p.H, HV = p.HV, K = p.K, V = p.V, G = HV / H, N = p.sequences();
  const double rho = p.scale != 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(K));
  Outputs out;
  out.o.assign(static_cast<size_t>(p.tokens() * HV * V), 0.0);
  out.ht.assign(static_cast<size_t>(N * HV * K * V), 0.0);
  using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < HV; ++j) {
      const int i = j / G;
      Mat S = Mat::Zero(K, V);
      const size_t soff = static_cast<size_t>((static_cast<int64_t>(n) * HV + j) * K * V);
      if (p.has_h0) S = Eigen::Map<const Mat>(d.h0.data() + soff, K, V);
      for (int64_t t = p.cu_seqlens[static_cast<size_t>(n)]; t < p.cu_seqlens[static_cast<size_t>(n) + 1]; ++t) {
        Eigen::VectorXd q = Eigen::Map<const Eigen::VectorXd>(d.q.data() + (t * H + i) * K, K);
        Eigen::VectorXd k = Eigen::Map<const Eigen::VectorXd>(d.k.data() + (t * H + i) * K, K);
        if (p.qk_l2norm) {
          q /= std::sqrt(q.squaredNorm() + 1e-6);
          k /= std::sqrt(k.squaredNorm() + 1e-6);
        }
        Eigen::VectorXd dec(K);
        for (int c = 0; c < K; ++c) dec[c] = std::exp(naive_log_decay(p, d, t, j, c));
        const Eigen::VectorXd v = Eigen::Map<const Eigen::VectorXd>(d.v.data() + (t * HV + j) * V, V);
        const double beta = d.beta[static_cast<size_t>(t * HV + j)];
        S = dec.asDiagonal() * S;
        const Eigen::VectorXd e = v - S.transpose() * k;
        S += beta * k * e.transpose();
        Eigen::Map<Eigen::VectorXd>(out.o.data() + (t * HV + j) * V, V) = rho * (S.transpose() * q);
      }
      Eigen::Map<Mat>(out.ht.data() + soff, K, V) = S;
    }
  }
  return out;
}

inline double loss(const Problem& p, const Data& d, const Outputs& out) {
  long double L = 0;
  for (size_t x = 0; x < out.o.size(); ++x) L += static_cast<long double>(out.o[x]) * d.dO[x];
  if (p.has_dht)
    for (size_t x = 0; x < out.ht.size(); ++x) L += static_cast<long double>(out.ht[x]) * d.dht[x];
  return static_cast<double>(L);
}

// ---- finite differences -------------------------------------------------------------------------

// Fourth-order central difference of the naive loss w.r.t. x[idx] (x is one of d's tensors):
// (8 (L(+h) - L(-h)) - (L(+2h) - L(-2h))) / 12h, truncation O(h^4).
inline double fd_element(const Problem& p, Data& d, std::vector<double>& x, size_t idx, double h) {
  const double x0 = x[idx];
  auto L = [&](double dx) {
    x[idx] = x0 + dx;
    return loss(p, d, naive_forward(p, d));
  };
  const double r = (8.0 * (L(h) - L(-h)) - (L(2 * h) - L(-2 * h))) / (12.0 * h);
  x[idx] = x0;
  return r;
}

struct Agreement {
  double rel_norm = 0;  // ||fd - an||_2 / ||an||_2
  double rel_max = 0;   // max |fd - an| / max |an|
  double scale = 0;     // max |an|
};

inline Agreement compare(const std::vector<double>& fd, const std::vector<double>& an) {
  double num = 0, den = 0, mx = 0, mxd = 0;
  for (size_t x = 0; x < an.size(); ++x) {
    const double e = fd[x] - an[x];
    num += e * e;
    den += an[x] * an[x];
    mx = std::max(mx, std::abs(an[x]));
    mxd = std::max(mxd, std::abs(e));
  }
  Agreement a;
  a.scale = mx;
  a.rel_norm = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  a.rel_max = mx > 0 ? mxd / mx : mxd;
  return a;
}

// Largest |a - b| relative to max |b| (0 when both are empty or zero).
inline double rel_max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double mx = 0, md = 0;
  for (size_t x = 0; x < b.size(); ++x) {
    mx = std::max(mx, std::abs(b[x]));
    md = std::max(md, std::abs(a[x] - b[x]));
  }
  return mx > 0 ? md / mx : md;
}

// ---- gtest helpers --------------------------------------------------------------------------------

inline void expect_bitwise(const std::vector<double>& a, const std::vector<double>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t x = 0; x < a.size(); ++x) {
    if (std::memcmp(&a[x], &b[x], sizeof(double)) != 0) {
      ADD_FAILURE() << what << "[" << x << "] differs: " << a[x] << " vs " << b[x];
      return;
    }
  }
}

// Every output and gradient but the probes.
inline void expect_bitwise(const Outputs& oa, const Grads& ga, const Outputs& ob, const Grads& gb) {
  expect_bitwise(oa.o, ob.o, "o");
  expect_bitwise(oa.ht, ob.ht, "ht");
  expect_bitwise(ga.dq, gb.dq, "dq");
  expect_bitwise(ga.dk, gb.dk, "dk");
  expect_bitwise(ga.dv, gb.dv, "dv");
  expect_bitwise(ga.dg, gb.dg, "dg");
  expect_bitwise(ga.dbeta, gb.dbeta, "dbeta");
  expect_bitwise(ga.dA_log, gb.dA_log, "dA_log");
  expect_bitwise(ga.ddt_bias, gb.ddt_bias, "ddt_bias");
  expect_bitwise(ga.dh0, gb.dh0, "dh0");
}

// validate(p) throws std::invalid_argument naming `field`.
inline void expect_invalid(const Problem& p, const std::string& field) {
  try {
    validate(p);
    ADD_FAILURE() << "validate() accepted a problem with a bad " << field;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

}  // namespace kcp::ref::test
