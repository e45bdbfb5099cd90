// FP64 reference: agreement with the naive forward on multi-window shapes, closed forms, GDN as
// KDA with a uniform gate, determinism across thread counts and schedules, FLOP counts and
// validate() errors. Gradients against finite differences are in reference_fd_test.cpp.
#include <gtest/gtest.h>

#include <limits>

#include "reference_test_util.h"

namespace kcp::ref::test {
namespace {

Problem base_problem(Op op, int K, int V) {
  Problem p;
  p.op = op;
  p.K = K;
  p.V = V;
  p.cu_seqlens = {0, 8};
  return p;
}

// A shape with several windows, column blocks, groups and sequences (including an empty one).
Problem multi_window_problem(Op op, GateForm gate) {
  Problem p = base_problem(op, 9, 21);
  p.H = 2;
  p.HV = 4;
  p.cu_seqlens = {0, 70, 70, 203, 230};
  p.qk_l2norm = true;
  p.gate = gate;
  p.has_A_log = gate != GateForm::Direct;
  p.has_dt_bias = gate != GateForm::Direct;
  p.has_h0 = true;
  p.has_dht = true;
  return p;
}

// ---- agreement with the naive forward on multi-window shapes ------------------------------------

TEST(Reference, ForwardMatchesNaiveOverWindows) {
  for (const Op op : {Op::Gdn, Op::Kda}) {
    for (const GateForm gate : {GateForm::Direct, GateForm::Softplus, GateForm::LowerBound}) {
      if (op == Op::Gdn && gate == GateForm::LowerBound) continue;
      const Problem p = multi_window_problem(op, gate);
      const Data d = make_data(p, 7);
      const Outputs naive = naive_forward(p, d);
      const Outputs out = forward(p, d.inputs(), 2);
      EXPECT_LE(rel_max_diff(out.o, naive.o), 1e-12);
      EXPECT_LE(rel_max_diff(out.ht, naive.ht), 1e-12);
      // forward() and forward_backward() share the forward arithmetic exactly.
      Outputs out2;
      Grads gr;
      forward_backward(p, d.inputs(), out2, gr, 2);
      expect_bitwise(out.o, out2.o, "o");
      expect_bitwise(out.ht, out2.ht, "ht");
    }
  }
}

// Directional finite differences on the multi-window shape (per-element ones run on tiny shapes).
TEST(Reference, DirectionalDerivativesOverWindows) {
  for (const Op op : {Op::Gdn, Op::Kda}) {
    const Problem p = multi_window_problem(op, op == Op::Gdn ? GateForm::Softplus : GateForm::LowerBound);
    Data d = make_data(p, 11);
    Outputs out;
    Grads gr;
    forward_backward(p, d.inputs(), out, gr, 2);
    std::mt19937_64 rng(5);
    std::uniform_real_distribution<double> u(-1, 1);
    struct Tensor {
      const char* name;
      std::vector<double>* x;
      const std::vector<double>* grad;
    };
    const Tensor tensors[] = {{"q", &d.q, &gr.dq},
                              {"k", &d.k, &gr.dk},
                              {"v", &d.v, &gr.dv},
                              {"g", &d.g, &gr.dg},
                              {"beta", &d.beta, &gr.dbeta},
                              {"A_log", &d.A_log, &gr.dA_log},
                              {"dt_bias", &d.dt_bias, &gr.ddt_bias},
                              {"h0", &d.h0, &gr.dh0}};
    for (const Tensor& t : tensors) {
      std::vector<double> dir(t.x->size());
      double an = 0, mag = 0;
      for (size_t e = 0; e < dir.size(); ++e) {
        dir[e] = u(rng);
        an += dir[e] * (*t.grad)[e];
        mag += std::abs(dir[e] * (*t.grad)[e]);
      }
      const std::vector<double> x0 = *t.x;
      auto L = [&](double s) {
        for (size_t e = 0; e < dir.size(); ++e) (*t.x)[e] = x0[e] + s * dir[e];
        return loss(p, d, naive_forward(p, d));
      };
      const double h = 1e-4;
      const double fd = (8.0 * (L(h) - L(-h)) - (L(2 * h) - L(-2 * h))) / (12.0 * h);
      *t.x = x0;
      EXPECT_LE(std::abs(fd - an), 1e-8 * mag)
          << (op == Op::Gdn ? "GDN d" : "KDA d") << t.name << ": fd " << fd << " analytic " << an;
    }
  }
}

// ---- closed forms
// --------------------------------------------------------------------------------

// beta = 0: the state only decays, S_t = (prod D) h0; o_t = rho S_t^T q_t; dk = dv = 0 exactly.
TEST(Reference, BetaZeroIsPureDecay) {
  for (const Op op : {Op::Gdn, Op::Kda}) {
    Problem p = base_problem(op, 6, 10);
    p.H = 1;
    p.HV = 2;
    p.cu_seqlens = {0, 4, 9};
    p.has_h0 = true;
    p.has_dht = true;
    Data d = make_data(p, 3);
    std::fill(d.beta.begin(), d.beta.end(), 0.0);
    Outputs out;
    Grads gr;
    forward_backward(p, d.inputs(), out, gr, 2);
    const double rho = 1.0 / std::sqrt(6.0);
    const int K = p.K, V = p.V, Kg = p.gate_width();
    double err = 0, mx = 0;
    for (int n = 0; n < 2; ++n) {
      for (int j = 0; j < 2; ++j) {
        std::vector<double> logdec(static_cast<size_t>(K), 0.0);
        for (int64_t t = p.cu_seqlens[static_cast<size_t>(n)]; t < p.cu_seqlens[static_cast<size_t>(n) + 1]; ++t) {
          for (int r = 0; r < K; ++r)
            logdec[static_cast<size_t>(r)] += d.g[static_cast<size_t>((t * 2 + j) * Kg + (Kg == 1 ? 0 : r))];
          for (int c = 0; c < V; ++c) {
            double o = 0;
            for (int r = 0; r < K; ++r)
              o += d.q[static_cast<size_t>(t * K + r)] * std::exp(logdec[static_cast<size_t>(r)]) *
                   d.h0[static_cast<size_t>(((n * 2 + j) * K + r) * V + c)];
            const double got = out.o[static_cast<size_t>((t * 2 + j) * V + c)];
            err = std::max(err, std::abs(got - rho * o));
            mx = std::max(mx, std::abs(rho * o));
          }
        }
        for (int r = 0; r < K; ++r)
          for (int c = 0; c < V; ++c) {
            const size_t s = static_cast<size_t>(((n * 2 + j) * K + r) * V + c);
            const double want = std::exp(logdec[static_cast<size_t>(r)]) * d.h0[s];
            err = std::max(err, std::abs(out.ht[s] - want));
            mx = std::max(mx, std::abs(want));
          }
      }
    }
    EXPECT_LE(err, 1e-14 * mx);
    for (double x : gr.dk) EXPECT_EQ(x, 0.0);
    for (double x : gr.dv) EXPECT_EQ(x, 0.0);
  }
}

// One token from a zero state: e = v, S_1 = beta k v^T, o = rho beta (q.k) v; the gradients in
// closed form; the gate gradient is zero (nothing to decay).
TEST(Reference, OneTokenFromZeroState) {
  for (const Op op : {Op::Gdn, Op::Kda}) {
    Problem p = base_problem(op, 4, 3);
    p.cu_seqlens = {0, 1};
    p.has_h0 = true;  // zeros: dh0 has a closed form too
    p.has_dht = true;
    p.scale = 0.5;
    Data d = make_data(p, 9);
    std::fill(d.h0.begin(), d.h0.end(), 0.0);
    Outputs out;
    Grads gr;
    forward_backward(p, d.inputs(), out, gr, 1);
    using Vec = Eigen::VectorXd;
    using Mat = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    const Vec q = Eigen::Map<const Vec>(d.q.data(), 4), k = Eigen::Map<const Vec>(d.k.data(), 4);
    const Vec v = Eigen::Map<const Vec>(d.v.data(), 3), dO = Eigen::Map<const Vec>(d.dO.data(), 3);
    const Mat dht = Eigen::Map<const Mat>(d.dht.data(), 4, 3);
    const double b = d.beta[0], rho = 0.5;
    Vec dec(4);
    for (int r = 0; r < 4; ++r) dec[r] = std::exp(d.g[static_cast<size_t>(op == Op::Kda ? r : 0)]);

    auto near = [](const std::vector<double>& got, const Eigen::MatrixXd& want, const char* what) {
      const Eigen::MatrixXd w = want;
      ASSERT_EQ(got.size(), static_cast<size_t>(w.size())) << what;
      for (Eigen::Index r = 0; r < w.rows(); ++r)
        for (Eigen::Index c = 0; c < w.cols(); ++c)
          EXPECT_NEAR(got[static_cast<size_t>(r * w.cols() + c)], w(r, c), 1e-15) << what;
    };
    near(out.o, (rho * b * q.dot(k) * v).transpose(), "o");
    near(out.ht, b * k * v.transpose(), "ht");
    near(gr.dq, (rho * b * v.dot(dO) * k).transpose(), "dq");
    near(gr.dk, (rho * b * v.dot(dO) * q + b * dht * v).transpose(), "dk");
    near(gr.dv, (rho * b * q.dot(k) * dO + b * dht.transpose() * k).transpose(), "dv");
    near(gr.dbeta, Eigen::MatrixXd::Constant(1, 1, rho * q.dot(k) * v.dot(dO) + k.dot(dht * v)), "dbeta");
    for (double x : gr.dg) EXPECT_EQ(x, 0.0);
    const Mat Gm = dht + rho * q * dO.transpose();
    near(gr.dh0, dec.asDiagonal() * (Gm - b * k * (k.transpose() * Gm)), "dh0");
  }
}

// ---- GDN is KDA with the same gate on every channel
// ----------------------------------------------

TEST(Reference, GdnEqualsKdaWithUniformGate) {
  for (const GateForm gate : {GateForm::Direct, GateForm::Softplus}) {
    Problem pg = multi_window_problem(Op::Gdn, gate);
    pg.cu_seqlens = {0, 40, 40, 97};
    Problem pk = pg;
    pk.op = Op::Kda;
    const Data dg = make_data(pg, 21);
    Data dk = dg;
    const int K = pg.K;
    const size_t rows = dg.g.size();
    dk.g.resize(rows * static_cast<size_t>(K));
    for (size_t r = 0; r < rows; ++r)
      for (int c = 0; c < K; ++c) dk.g[r * static_cast<size_t>(K) + static_cast<size_t>(c)] = dg.g[r];
    if (pg.has_dt_bias) {
      dk.dt_bias.resize(dg.dt_bias.size() * static_cast<size_t>(K));
      for (size_t j = 0; j < dg.dt_bias.size(); ++j)
        for (int c = 0; c < K; ++c) dk.dt_bias[j * static_cast<size_t>(K) + static_cast<size_t>(c)] = dg.dt_bias[j];
    }
    Outputs og, ok;
    Grads gg, gk;
    forward_backward(pg, dg.inputs(), og, gg, 2);
    forward_backward(pk, dk.inputs(), ok, gk, 2);
    constexpr double tol = 1e-12;
    EXPECT_LE(rel_max_diff(ok.o, og.o), tol);
    EXPECT_LE(rel_max_diff(ok.ht, og.ht), tol);
    EXPECT_LE(rel_max_diff(gk.dq, gg.dq), tol);
    EXPECT_LE(rel_max_diff(gk.dk, gg.dk), tol);
    EXPECT_LE(rel_max_diff(gk.dv, gg.dv), tol);
    EXPECT_LE(rel_max_diff(gk.dbeta, gg.dbeta), tol);
    EXPECT_LE(rel_max_diff(gk.dh0, gg.dh0), tol);
    EXPECT_LE(rel_max_diff(gk.dA_log, gg.dA_log), tol);
    auto channel_sum = [K](const std::vector<double>& x) {
      std::vector<double> s(x.size() / static_cast<size_t>(K), 0.0);
      for (size_t r = 0; r < s.size(); ++r)
        for (int c = 0; c < K; ++c) s[r] += x[r * static_cast<size_t>(K) + static_cast<size_t>(c)];
      return s;
    };
    EXPECT_LE(rel_max_diff(channel_sum(gk.dg), gg.dg), tol);
    if (pg.has_dt_bias) {
      EXPECT_LE(rel_max_diff(channel_sum(gk.ddt_bias), gg.ddt_bias), tol);
    }
  }
}

// ---- determinism
// ---------------------------------------------------------------------------------

TEST(Reference, SameBitsForAnyThreadCount) {
  for (const Op op : {Op::Gdn, Op::Kda}) {
    Problem p = multi_window_problem(op, op == Op::Gdn ? GateForm::Softplus : GateForm::LowerBound);
    p.cu_seqlens = {0, 300, 300, 700, 1100};  // several token chunks in the O(T) passes too
    const Data d = make_data(p, 13);
    Outputs o1;
    Grads g1;
    forward_backward(p, d.inputs(), o1, g1, 1);
    // The same Outputs / Grads objects are reused, starting from stale contents of other sizes:
    // every field is reset (accumulated gradients start from zero).
    Outputs o;
    Grads g;
    o.o.assign(5, std::nan(""));
    g.dq.assign(1 << 16, 1.0);
    g.dA_log.assign(3, 2.0);
    for (const int threads : {2, 3, 7, 16}) {
      forward_backward(p, d.inputs(), o, g, threads);
      expect_bitwise(o1, g1, o, g);
    }
  }
}

// Window length, one- vs two-level checkpointing and the column grouping change memory and
// scheduling only, never a bit.
TEST(Reference, SameBitsForAnyScheduleAndCheckpointing) {
  for (const Op op : {Op::Gdn, Op::Kda}) {
    const Problem p = multi_window_problem(op, GateForm::Direct);
    const Data d = make_data(p, 17);
    Outputs o1;
    Grads g1;
    detail::run(p, d.inputs(), o1, &g1, 2, detail::Tuning{});
    auto tuning = [](int window, int max_checkpoints, int groups) {
      detail::Tuning tu;
      tu.window = window;
      tu.max_checkpoints = max_checkpoints;
      tu.column_groups = groups;
      return tu;
    };
    for (const detail::Tuning& tu : {tuning(5, 256, 0), tuning(3, 4, 0), tuning(1, 1, 2), tuning(64, 1, 1),
                                     tuning(64, 256, 1), tuning(7, 3, 1 << 20)}) {
      Outputs o;
      Grads g;
      detail::run(p, d.inputs(), o, &g, 3, tu);
      expect_bitwise(o1, g1, o, g);
    }
  }
}

// ---- edge cases
// ----------------------------------------------------------------------------------

TEST(Reference, ZeroLengthSequencesPassStatesThrough) {
  Problem p = base_problem(Op::Kda, 3, 5);
  p.HV = 2;
  p.cu_seqlens = {0, 0, 4, 4};
  p.has_h0 = true;
  p.has_dht = true;
  const Data d = make_data(p, 23);
  Outputs out;
  Grads gr;
  forward_backward(p, d.inputs(), out, gr, 2);
  const size_t per = static_cast<size_t>(p.HV * p.K * p.V);
  for (const size_t n : {size_t{0}, size_t{2}}) {
    for (size_t x = n * per; x < (n + 1) * per; ++x) {
      EXPECT_EQ(out.ht[x], d.h0[x]);
      EXPECT_EQ(gr.dh0[x], d.dht[x]);
    }
  }
  const Problem empty = [] {
    Problem q = base_problem(Op::Gdn, 4, 4);
    q.cu_seqlens = {0, 0};
    return q;
  }();
  const Outputs none = forward(empty, Inputs{}, 1);
  EXPECT_TRUE(none.o.empty());
  EXPECT_EQ(none.ht.size(), 16u);
}

// Extreme decays: exp(-1000) = 0 wipes the state, large raw gates saturate without NaN.
TEST(Reference, ExtremeGatesStayFinite) {
  Problem p = multi_window_problem(Op::Kda, GateForm::Direct);
  Data d = make_data(p, 29);
  for (size_t x = 0; x < d.g.size(); x += 7) d.g[x] = -1000.0;
  Outputs out;
  Grads gr;
  forward_backward(p, d.inputs(), out, gr, 2);
  for (const auto* v : {&out.o, &out.ht, &gr.dq, &gr.dk, &gr.dv, &gr.dg, &gr.dbeta, &gr.dh0})
    for (double x : *v) ASSERT_TRUE(std::isfinite(x));
  EXPECT_LE(rel_max_diff(out.o, naive_forward(p, d).o), 1e-12);

  p = multi_window_problem(Op::Gdn, GateForm::Softplus);
  d = make_data(p, 31);
  for (size_t x = 0; x < d.g.size(); x += 5) d.g[x] = (x % 2 == 0) ? 800.0 : -800.0;
  forward_backward(p, d.inputs(), out, gr, 2);
  for (const auto* v : {&out.o, &gr.dg, &gr.dA_log, &gr.ddt_bias})
    for (double x : *v) ASSERT_TRUE(std::isfinite(x));
}

// ---- FLOP count
// ----------------------------------------------------------------------------------

TEST(Reference, FlopCount) {
  Problem p = base_problem(Op::Kda, 128, 64);
  p.HV = 2;
  p.cu_seqlens = {0, 1000, 1000, 3000};
  const double kv = 128.0 * 64.0 * 2.0;
  EXPECT_DOUBLE_EQ(forward_flops(p), 7.0 * kv * 3000);
  EXPECT_DOUBLE_EQ(forward_backward_flops(p), 28.0 * kv * 3000);
  p.cu_seqlens = {0, 64 * 256, 64 * 256 + 64 * 256 + 1};  // the second one uses two-level checkpoints
  EXPECT_DOUBLE_EQ(forward_backward_flops(p), 28.0 * kv * (64 * 256) + 33.0 * kv * (64 * 256 + 1));
}

// ---- validate()
// ----------------------------------------------------------------------------------

TEST(Reference, ValidateNamesTheField) {
  const Problem ok = base_problem(Op::Gdn, 4, 4);
  EXPECT_NO_THROW(validate(ok));
  Problem p = ok;
  p.H = 0;
  expect_invalid(p, "Problem.H");
  p = ok;
  p.H = 3;
  p.HV = 4;
  expect_invalid(p, "Problem.HV");
  p = ok;
  p.K = 0;
  expect_invalid(p, "Problem.K");
  p = ok;
  p.V = -1;
  expect_invalid(p, "Problem.V");
  p = ok;
  p.cu_seqlens = {};
  expect_invalid(p, "Problem.cu_seqlens");
  p.cu_seqlens = {1, 4};
  expect_invalid(p, "Problem.cu_seqlens[0]");
  p.cu_seqlens = {0, 4, 3};
  expect_invalid(p, "Problem.cu_seqlens");
  p = ok;
  p.scale = std::numeric_limits<double>::infinity();
  expect_invalid(p, "Problem.scale");
  p = ok;
  p.gate = GateForm::Softplus;
  expect_invalid(p, "Problem.has_A_log");
  p = ok;
  p.has_dt_bias = true;
  expect_invalid(p, "Problem.has_dt_bias");
  p = ok;
  p.gate = GateForm::LowerBound;
  expect_invalid(p, "Problem.gate");
  p.op = Op::Kda;
  EXPECT_NO_THROW(validate(p));  // LowerBound without A_log is allowed
  p.lower_bound = 0.0;
  expect_invalid(p, "Problem.lower_bound");
}

TEST(Reference, MissingInputsAreNamed) {
  Problem p = base_problem(Op::Kda, 4, 4);
  p.has_h0 = true;
  p.has_dht = true;
  const Data d = make_data(p, 37);
  const FloatInputs f = d.inputs();
  Inputs in = f;
  in.h0 = nullptr;
  try {
    (void)forward(p, in, 1);
    ADD_FAILURE() << "missing h0 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("Inputs.h0"), std::string::npos) << e.what();
  }
  in = f;
  in.dht = nullptr;
  EXPECT_NO_THROW((void)forward(p, in, 1));  // forward does not need dht
  Outputs out;
  Grads gr;
  try {
    forward_backward(p, in, out, gr, 1);
    ADD_FAILURE() << "missing dht accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("Inputs.dht"), std::string::npos) << e.what();
  }
}

// The SIMD description names the instruction set and packet width the recurrence was compiled with
// (KCP_REFERENCE_ARCH may differ from this test's own flags): a results file records it
// (context.build.reference_simd), because the last bits of the column sums follow the width.
TEST(Reference, SimdDescriptionNamesTheInstructionSetAndItsWidth) {
  const std::string s = kcp::ref::simd_description();
  const std::pair<const char*, const char*> known[] = {
      {"AVX-512, ", "8 doubles a packet"},   {"AVX2, ", "4 doubles a packet"},   {"AVX, ", "4 doubles a packet"},
      {"SSE2, ", "2 doubles a packet"},      {"no SIMD, ", "1 double a packet"}, {"other SIMD, ", "2 doubles a packet"},
      {"other SIMD, ", "4 doubles a packet"}};
  int matches = 0;
  for (const auto& [isa, width] : known) matches += s == std::string(isa) + width;
  EXPECT_EQ(matches, 1) << s;
}

}  // namespace
}  // namespace kcp::ref::test
