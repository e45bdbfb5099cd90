// FP64 reference probes (docs/algorithm.md 1.4), checked through the public API only:
//   (a) S_p equals ht of the problem truncated to the sequence's first p tokens (same h0), and
//       the naive forward's (reference_test_util.h);
//   (b) dS_p equals dh0 of the suffix problem (tokens p .. len, h0 = S_p, same dO and dht), and
//       a directional difference of the naive suffix loss w.r.t. its initial state;
//   (c) at p = 0 and p = len they are h0 / ht and dh0 / dht (exactly);
//   (d) probes change no other output, and validate() rejects malformed probes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "reference_test_util.h"

namespace kcp::ref::test {
namespace {

constexpr double kTol = 1e-12;   // algebraic identities in FP64
constexpr double kFdTol = 1e-8;  // directional differences of the naive loss (affine in the state)

// Options of a case, or-ed together.
enum Flag : unsigned {
  kALog = 1,
  kBias = 2,   // dt_bias
  kL2 = 4,     // qk_l2norm
  kH0 = 8,     // initial states
  kDht = 16,   // final-state gradients
  kSmall = 32  // window 3, two-level checkpoints, one block per column group
};

struct Case {
  std::string name;
  Op op = Op::Gdn;
  GateForm gate = GateForm::Direct;
  unsigned flags = 0;
  int H = 2, HV = 4;  // GVA
  // Four sequences, the second one empty; probes at both ends, inside and on 64-token windows,
  // adjacent positions; the last sequence has none.
  std::vector<int64_t> cu{0, 70, 70, 203, 230};
  std::vector<std::vector<int64_t>> probes{{0, 1, 5, 6, 63, 64, 65, 70}, {0}, {17, 128, 133}, {}};  // per sequence
  bool has(unsigned f) const { return (flags & f) != 0; }
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

Problem problem_of(const Case& c) {
  Problem p;
  p.op = c.op;
  p.H = c.H;
  p.HV = c.HV;
  p.K = 6;
  p.V = 19;  // two column blocks, the second one padded
  p.cu_seqlens = c.cu;
  p.gate = c.gate;
  p.has_A_log = c.has(kALog);
  p.has_dt_bias = c.has(kBias);
  p.qk_l2norm = c.has(kL2);
  p.has_h0 = c.has(kH0);
  p.has_dht = c.has(kDht);
  p.probe_cu = {0};
  for (const auto& pos : c.probes) {
    p.probes.insert(p.probes.end(), pos.begin(), pos.end());
    p.probe_cu.push_back(p.probe_count());
  }
  return p;
}

detail::Tuning tuning_of(const Case& c) {
  detail::Tuning tu;
  if (c.has(kSmall)) {
    tu.window = 3;
    tu.max_checkpoints = 2;
    tu.column_groups = 1 << 20;
  }
  return tu;
}

// Row r of a [rows, HV, K, V] tensor.
std::vector<double> row(const Problem& p, const std::vector<double>& x, int64_t r) {
  const int64_t n = static_cast<int64_t>(p.HV) * p.K * p.V;
  return {x.begin() + r * n, x.begin() + (r + 1) * n};
}

// Tokens [t0, t1) of sequence n as a one-sequence problem without probes; h0 and dht of sequence
// n (the caller may replace h0).
struct Sub {
  Problem p;
  Data d;
};
Sub slice(const Problem& p, const Data& d, int n, int64_t t0, int64_t t1) {
  Sub s{p, {}};
  s.p.cu_seqlens = {0, t1 - t0};
  s.p.probe_cu.clear();
  s.p.probes.clear();
  auto tokens = [&](const std::vector<double>& x) {
    const size_t w = x.size() / static_cast<size_t>(p.tokens());
    return std::vector<double>(x.begin() + static_cast<int64_t>(w) * t0, x.begin() + static_cast<int64_t>(w) * t1);
  };
  s.d = {tokens(d.q), tokens(d.k), tokens(d.v), tokens(d.g), tokens(d.beta), d.A_log, d.dt_bias, {}, tokens(d.dO), {}};
  if (p.has_h0) s.d.h0 = row(p, d.h0, n);
  if (p.has_dht) s.d.dht = row(p, d.dht, n);
  return s;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::abs(e));
  return m;
}

// Independent of the library: |fd - <dS, dir>| / sum |dir o dS| for a random direction dir of the
// suffix's initial state, fd a fourth-order central difference of the naive suffix loss.
double directional_error(Sub suf, const std::vector<double>& dS, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1, 1);
  const std::vector<double> h0 = suf.d.h0;
  std::vector<double> dir(h0.size());
  double an = 0, mag = 0;
  for (size_t e = 0; e < dir.size(); ++e) {
    dir[e] = u(rng);
    an += dir[e] * dS[e];
    mag += std::abs(dir[e] * dS[e]);
  }
  auto L = [&](double s) {
    for (size_t e = 0; e < dir.size(); ++e) suf.d.h0[e] = h0[e] + s * dir[e];
    return loss(suf.p, suf.d, naive_forward(suf.p, suf.d));
  };
  const double h = 1e-4;
  const double fd = (8.0 * (L(h) - L(-h)) - (L(2 * h) - L(-2 * h))) / (12.0 * h);
  return mag > 0 ? std::abs(fd - an) / mag : std::abs(fd - an);
}

class Probes : public ::testing::TestWithParam<Case> {};

TEST_P(Probes, TruncatedAndSuffixProblems) {
  const Case& c = GetParam();
  const Problem p = problem_of(c);
  const Data d = make_data(p, 4321 + static_cast<uint64_t>(c.name.size()));
  Outputs out;
  Grads gr;
  detail::run(p, d.inputs(), out, &gr, 2, tuning_of(c));
  const size_t per = static_cast<size_t>(p.HV * p.K * p.V);
  ASSERT_EQ(out.probe_S.size(), p.probes.size() * per);
  ASSERT_EQ(gr.probe_dS.size(), p.probes.size() * per);
  double worst_S = 0, worst_dS = 0;
  for (int n = 0; n < p.sequences(); ++n) {
    const int64_t bos = p.cu_seqlens[static_cast<size_t>(n)], len = p.cu_seqlens[static_cast<size_t>(n) + 1] - bos;
    for (int64_t r = p.probe_cu[static_cast<size_t>(n)]; r < p.probe_cu[static_cast<size_t>(n) + 1]; ++r) {
      const int64_t pos = p.probes[static_cast<size_t>(r)];
      SCOPED_TRACE("sequence " + std::to_string(n) + ", p = " + std::to_string(pos));
      const std::vector<double> S = row(p, out.probe_S, r), dS = row(p, gr.probe_dS, r);
      // (a) the prefix problem's final state
      const Sub pre = slice(p, d, n, bos, bos + pos);
      const Outputs po = forward(pre.p, pre.d.inputs(), 1);
      EXPECT_LE(rel_max_diff(S, po.ht), kTol) << "S_p";
      worst_S = std::max(worst_S, rel_max_diff(S, naive_forward(pre.p, pre.d).ht));
      EXPECT_LE(rel_max_diff(S, naive_forward(pre.p, pre.d).ht), kTol) << "S_p vs the naive forward";
      // (b) the suffix problem's initial-state gradient, starting from S_p
      Sub suf = slice(p, d, n, bos + pos, bos + len);
      suf.p.has_h0 = true;
      suf.d.h0 = float_values(po.ht);  // Inputs are float; dS_p does not depend on the state
      Outputs so;
      Grads sg;
      forward_backward(suf.p, suf.d.inputs(), so, sg, 1);
      EXPECT_LE(rel_max_diff(dS, sg.dh0), kTol) << "dS_p";
      worst_dS = std::max(worst_dS, directional_error(suf, dS, static_cast<uint64_t>(r)));
      EXPECT_LE(directional_error(suf, dS, static_cast<uint64_t>(r)), kFdTol) << "dS_p vs naive differences";
      // Not vacuous: the states and gradients compared are not zero.
      if (pos > 0 || p.has_h0) {
        EXPECT_GT(max_abs(S), 0.0);
      }
      if (pos < len || p.has_dht) {
        EXPECT_GT(max_abs(dS), 0.0);
      }
      // (c) the ends: exactly h0 / dh0 at p = 0, ht / dht at p = len (zeros when absent)
      const std::vector<double> zeros(per, 0.0);
      if (pos == 0) {
        expect_bitwise(S, p.has_h0 ? row(p, d.h0, n) : zeros, "S_0 vs h0");
        if (p.has_h0) expect_bitwise(dS, row(p, gr.dh0, n), "dS_0 vs dh0");
      }
      if (pos == len) {
        expect_bitwise(S, row(p, out.ht, n), "S_len vs ht");
        expect_bitwise(dS, p.has_dht ? row(p, d.dht, n) : zeros, "dS_len vs dht");
      }
    }
  }
  std::printf("  %-36s %zu probes: S_p vs naive rel_max %.2e, dS_p vs naive differences %.2e\n", c.name.c_str(),
              p.probes.size(), worst_S, worst_dS);
}

// Probes change no other output (bitwise); forward() gives the same probe states; the probes do
// not depend on the thread count or the schedule (bitwise).
TEST_P(Probes, ChangeNoOtherOutput) {
  const Case& c = GetParam();
  const Problem p = problem_of(c);
  Problem bare = p;
  bare.probe_cu.clear();
  bare.probes.clear();
  const Data d = make_data(p, 99);
  Outputs o1, o2, o3;
  Grads g1, g2, g3;
  detail::run(p, d.inputs(), o1, &g1, 2, tuning_of(c));
  detail::run(bare, d.inputs(), o2, &g2, 3, tuning_of(c));
  expect_bitwise(o1, g1, o2, g2);
  EXPECT_TRUE(o2.probe_S.empty());
  EXPECT_TRUE(g2.probe_dS.empty());
  expect_bitwise(forward(p, d.inputs(), 1).probe_S, o1.probe_S, "probe_S of forward()");
  Case other = c;
  other.flags ^= kSmall;
  detail::run(p, d.inputs(), o3, &g3, 5, tuning_of(other));
  expect_bitwise(o3.probe_S, o1.probe_S, "probe_S, other schedule");
  expect_bitwise(g3.probe_dS, g1.probe_dS, "probe_dS, other schedule");
}

std::vector<Case> cases() {
  const GateForm direct = GateForm::Direct, softplus = GateForm::Softplus, lb = GateForm::LowerBound;
  std::vector<Case> cs = {{"gdn_direct_l2_h0_dht", Op::Gdn, direct, kL2 | kH0 | kDht},
                          {"gdn_softplus_A_bias_h0", Op::Gdn, softplus, kALog | kBias | kH0},
                          {"gdn_softplus_A_l2_dht_small_windows", Op::Gdn, softplus, kALog | kL2 | kDht | kSmall},
                          {"kda_direct_h0_dht", Op::Kda, direct, kH0 | kDht},
                          {"kda_softplus_A_bias_l2_h0_dht", Op::Kda, softplus, kALog | kBias | kL2 | kH0 | kDht},
                          {"kda_lb_A_bias_l2_dht", Op::Kda, lb, kALog | kBias | kL2 | kDht},
                          {"kda_lb_bias_h0_small_windows", Op::Kda, lb, kBias | kH0 | kSmall}};
  // One sequence, no GVA.
  cs.push_back({"gdn_direct_single", Op::Gdn, direct, 0, 1, 1, {0, 150}, {{0, 40, 64, 149, 150}}});
  return cs;
}

INSTANTIATE_TEST_SUITE_P(Reference, Probes, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& pi) { return pi.param.name; });

// ---- validate()
// ----------------------------------------------------------------------------------

TEST(Reference, ValidateRejectsBadProbes) {
  Problem ok;
  ok.K = ok.V = 4;
  ok.cu_seqlens = {0, 8, 8, 11};
  ok.probe_cu = {0, 3, 4, 4};
  ok.probes = {0, 4, 8, 0};
  EXPECT_NO_THROW(validate(ok));
  Problem p = ok;
  p.probe_cu.clear();
  p.probes.clear();
  EXPECT_NO_THROW(validate(p));  // no probes at all
  p = ok;
  p.probe_cu.clear();
  expect_invalid(p, "Problem.probe_cu is empty");
  p = ok;
  p.probe_cu = {0, 3, 4};
  expect_invalid(p, "Problem.probe_cu must hold N + 1 = 4");
  p.probe_cu = {1, 3, 4, 4};
  expect_invalid(p, "Problem.probe_cu[0] must be 0, got 1");
  p.probe_cu = {0, 3, 2, 4};
  expect_invalid(p, "probe_cu[2] = 2 < probe_cu[1] = 3");
  p.probe_cu = {0, 3, 4, 5};
  expect_invalid(p, "Problem.probe_cu[N] must equal probes.size() = 4, got 5");
  p = ok;
  p.probes[1] = 9;
  expect_invalid(p, "Problem.probes[1] = 9 (sequence 0) must lie in [0, len = 8]");
  p.probes[1] = -1;
  expect_invalid(p, "Problem.probes[1] = -1 (sequence 0)");
  p = ok;
  p.probes[3] = 1;  // sequence 1 is empty: only p = 0
  expect_invalid(p, "Problem.probes[3] = 1 (sequence 1) must lie in [0, len = 0]");
  p = ok;
  p.probes[1] = 0;  // a duplicate
  expect_invalid(p, "Problem.probes[1] = 0 (sequence 0) must be greater than the sequence's previous probe 0");
  p = ok;
  p.probes = {0, 8, 4, 0};  // descending
  expect_invalid(p, "Problem.probes[2] = 4 (sequence 0)");
}

}  // namespace
}  // namespace kcp::ref::test
