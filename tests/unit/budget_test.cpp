// Relative budgets, their judgement, and the cancellation-aware scale of dA_log / ddt_bias
// (docs/design.md 6; core/compare/budget.h, core/compare/compare.h).
#include <gtest/gtest.h>

#include <cmath>

#include "core/comm/local_communicator.h"
#include "core/compare/budget.h"
#include "core/compare/compare.h"

using namespace kcp;

TEST(Budget, RelativeBudgetIsKTimesTheWorstSeedPlusU) {
  const Budget b = derive_budget(0.004, 0.003, 2.0, DType::BF16);
  EXPECT_TRUE(b.relative);
  EXPECT_DOUBLE_EQ(b.max_rel, 0.01191);   // 2 x 0.004 + 2^-8 = 0.01190625, rounded up to 4 digits
  EXPECT_DOUBLE_EQ(b.rel_rms, 0.009907);  // 2 x 0.003 + 2^-8 = 0.00990625
  EXPECT_GE(derive_budget(0.004, 0.003, 2.0, DType::FP16).max_rel, 2 * 0.004 + std::ldexp(1.0, -11));
}

// A relative budget judges max|err| / scale, so the same kernel error pattern at a seed whose
// reference is 10x larger gets the same ratio; an absolute budget does not.
TEST(Budget, ARelativeBudgetMeansTheSameAtEveryScale) {
  RowConfig row;
  row.budgets["o"] = Budget::of_scale(0.01, 0.01);
  for (double scale : {0.5, 5.0}) {
    TensorMetrics m;
    m.name = "o";
    m.count = 1;
    m.max_abs = 0.005 * scale;
    m.ref_max_abs = scale;
    m.max_rel = m.max_abs / m.ref_max_abs;
    m.rel_rms = 0.002;
    std::vector<TensorMetrics> ms = {m};
    judge(ms, row);
    EXPECT_DOUBLE_EQ(ms[0].ratio_max, 0.5) << scale;
    EXPECT_TRUE(ms[0].pass);
  }
  row.budgets["o"] = Budget::absolute(0.01, 0.01);  // absolute: 0.025 at scale 5 is 2.5x over
  TensorMetrics m;
  m.name = "o";
  m.count = 1;
  m.max_abs = 0.025;
  m.max_rel = 0.005;
  std::vector<TensorMetrics> ms = {m};
  judge(ms, row);
  EXPECT_DOUBLE_EQ(ms[0].ratio_max, 2.5);
  EXPECT_FALSE(ms[0].pass);
}

// judge(ms, row, P) takes the forced schedule's budgets where the row has them.
TEST(Budget, AForcedFormIsJudgedByItsScheduleBudgets) {
  RowConfig row;
  row.budgets["o"] = Budget::of_scale(0.01, 0.01);
  row.forced_budgets[2]["o"] = Budget::of_scale(0.02, 0.01);
  TensorMetrics m;
  m.name = "o";
  m.count = 1;
  m.max_rel = 0.015;
  m.rel_rms = 0.005;
  for (int P : {0, 2, 4}) {
    std::vector<TensorMetrics> ms = {m};
    judge(ms, row, P);
    EXPECT_DOUBLE_EQ(ms[0].ratio_max, P == 2 ? 0.75 : 1.5) << "P = " << P;
    EXPECT_EQ(ms[0].pass, P == 2) << "P = " << P;
  }
}

namespace {
// A GDN softplus row of one value head, T tokens, with A_log and dt_bias.
RowConfig softplus_row() {
  RowConfig row;
  row.op = Op::Gdn;
  row.H = row.HV = 1;
  row.gate = GateForm::Softplus;
  row.A_log = row.dt_bias = true;
  return row;
}
}  // namespace

// The scale sums the absolute per-token contributions: |dg| for ddt_bias, |dg softplus(x) /
// sigmoid(x)| for dA_log (x = g + dt_bias), so terms that cancel in the total do not cancel in it.
TEST(ParamScale, SumsAbsolutePerTokenContributions) {
  const RowConfig row = softplus_row();
  RowInputs in;
  in.t_begin = 0;
  in.t_end = 2;
  in.g = {0.5f, -1.0f};
  in.dt_bias = {0.25f};
  in.A_log = {0.0f};
  const std::vector<double> dg = {2.0, -3.0};
  run_local_world(1, [&](Communicator& comm) {
    const ParamScales s = param_grad_scales(row, in, dg, comm);
    auto r = [](double x) { return std::log1p(std::exp(x)) * (1 + std::exp(-x)); };
    ASSERT_EQ(s.ddt_bias.size(), 1u);
    EXPECT_DOUBLE_EQ(s.ddt_bias[0], 5.0);
    ASSERT_EQ(s.dA_log.size(), 1u);
    EXPECT_NEAR(s.dA_log[0], 2.0 * r(0.75) + 3.0 * r(-0.75), 1e-12);
  });
}

// Ranks' token sums add up: two ranks of one token each give the scale of both tokens.
TEST(ParamScale, RanksAddTheirTokens) {
  const RowConfig row = softplus_row();
  run_local_world(2, [&](Communicator& comm) {
    RowInputs in;
    in.t_begin = comm.rank();
    in.t_end = comm.rank() + 1;
    in.g = {comm.rank() == 0 ? 0.5f : -1.0f};
    in.dt_bias = {0.25f};
    const std::vector<double> dg = {comm.rank() == 0 ? 2.0 : -3.0};
    EXPECT_DOUBLE_EQ(param_grad_scales(row, in, dg, comm).ddt_bias[0], 5.0);
  });
}

// A chain factor left out (the kernel's dA_log missing exp(A_log) = 4) still fails against the
// scale on a total that cancels (here the scale is more than twice the total): the error is 3/4
// of the total, a fraction of the scale far above the budget. (A factor error fails when
// |factor error| x |total| / scale > max_rel: heavier cancellation needs a larger error.)
TEST(ParamScale, AMissingChainFactorStillFails) {
  RowConfig row = softplus_row();
  row.budgets["dA_log"] = Budget::of_scale(0.01, 0.01);
  RowInputs in;
  in.t_begin = 0;
  in.t_end = 64;
  in.dt_bias = {0.0f};
  std::vector<double> dg(64);
  double total = 0;
  for (int t = 0; t < 64; ++t) {
    in.g.push_back(float(t % 7) * 0.3f - 1.0f);
    dg[t] = (t % 3 ? 1.0 : -1.0) * (1.0 + 0.01 * t);
    total += dg[t] * std::log1p(std::exp(double(in.g[t]))) * (1 + std::exp(-double(in.g[t])));
  }
  run_local_world(1, [&](Communicator& comm) {
    const ParamScales s = param_grad_scales(row, in, dg, comm);
    EXPECT_GT(s.dA_log[0], 2 * std::fabs(total)) << "the total cancels";
    TensorMetrics m;
    m.name = "dA_log";
    m.count = 1;
    m.max_rel = std::fabs(total / 4 - total) / s.dA_log[0];
    m.rel_rms = m.max_rel;
    std::vector<TensorMetrics> ms = {m};
    judge(ms, row);
    EXPECT_FALSE(ms[0].pass) << "ratio " << ms[0].ratio_max;
    EXPECT_GT(ms[0].ratio_max, 2.0);
  });
}
