// Every gradient of the FP64 reference against central finite differences of an independent naive
// forward, for every option: GDN and KDA, each gate form, L2 norm on and off, GVA, varlen with a
// zero-length sequence, initial states and dht, and small windows (two-level checkpoints, many
// column groups) so the blocked schedule is exercised on tiny shapes.
#include <gtest/gtest.h>

#include <cstdio>

#include "reference_test_util.h"

namespace kcp::ref::test {
namespace {

// Finite differences agree to ~1e-11 on these shapes; the issue asks for 1e-6.
constexpr double kFdTol = 1e-8;
constexpr double kFdStep = 1e-3;  // fourth-order stencil: truncation ~h^4, rounding ~1e-16/h

struct Case {
  std::string name;
  Op op = Op::Gdn;
  GateForm gate = GateForm::Direct;
  bool A_log = false, dt_bias = false, l2 = false, h0 = false, dht = false;
  int H = 1, HV = 1;
  std::vector<int64_t> cu{0, 12};
  double scale = 0.0;
  bool small_windows = false;  // window 2, two-level checkpoints, one block per column group
  int K = 5, V = 11;           // V not a multiple of the 16-column block: exercises padding
};

Problem problem_of(const Case& c) {
  Problem p;
  p.op = c.op;
  p.H = c.H;
  p.HV = c.HV;
  p.K = c.K;
  p.V = c.V;
  p.cu_seqlens = c.cu;
  p.scale = c.scale;
  p.qk_l2norm = c.l2;
  p.gate = c.gate;
  p.has_A_log = c.A_log;
  p.has_dt_bias = c.dt_bias;
  p.has_h0 = c.h0;
  p.has_dht = c.dht;
  return p;
}

class FiniteDifference : public ::testing::TestWithParam<Case> {};

TEST_P(FiniteDifference, EveryGradient) {
  const Case& c = GetParam();
  const Problem p = problem_of(c);
  Data d = make_data(p, 1234 + static_cast<uint64_t>(c.name.size()));
  detail::Tuning tu;
  if (c.small_windows) {
    tu.window = 2;
    tu.max_checkpoints = 2;
    tu.column_groups = 1 << 20;  // one block per group: many chained items
  }
  Outputs out;
  Grads gr;
  detail::run(p, d.inputs(), out, &gr, 2, tu);

  const Outputs naive = naive_forward(p, d);
  EXPECT_LE(rel_max_diff(out.o, naive.o), 1e-13) << "o";
  EXPECT_LE(rel_max_diff(out.ht, naive.ht), 1e-13) << "ht";

  struct Tensor {
    const char* name;
    std::vector<double>* x;
    const std::vector<double>* grad;
  };
  std::vector<Tensor> tensors = {
      {"q", &d.q, &gr.dq}, {"k", &d.k, &gr.dk}, {"v", &d.v, &gr.dv}, {"g", &d.g, &gr.dg}, {"beta", &d.beta, &gr.dbeta}};
  if (p.has_A_log)
    tensors.push_back({"A_log", &d.A_log, &gr.dA_log});
  else
    EXPECT_TRUE(gr.dA_log.empty());
  if (p.has_dt_bias)
    tensors.push_back({"dt_bias", &d.dt_bias, &gr.ddt_bias});
  else
    EXPECT_TRUE(gr.ddt_bias.empty());
  if (p.has_h0)
    tensors.push_back({"h0", &d.h0, &gr.dh0});
  else
    EXPECT_TRUE(gr.dh0.empty());

  for (const Tensor& t : tensors) {
    ASSERT_EQ(t.grad->size(), t.x->size()) << t.name;
    std::vector<double> fd(t.x->size());
    for (size_t e = 0; e < fd.size(); ++e) fd[e] = fd_element(p, d, *t.x, e, kFdStep);
    const Agreement a = compare(fd, *t.grad);
    std::printf("  %-22s d%-8s rel_norm %.2e  rel_max %.2e  (max |grad| %.2e)\n", c.name.c_str(), t.name, a.rel_norm,
                a.rel_max, a.scale);
    EXPECT_GT(a.scale, 0.0) << t.name << ": gradient is identically zero, the check would be vacuous";
    EXPECT_LE(a.rel_norm, kFdTol) << t.name;
    EXPECT_LE(a.rel_max, kFdTol) << t.name;
  }
}

std::vector<Case> cases() {
  const std::vector<int64_t> varlen{0, 5, 5, 12};  // three sequences, the middle one empty
  std::vector<Case> cs;
  auto add = [&](Case c) { cs.push_back(std::move(c)); };
  // GDN
  add({.name = "gdn_direct", .op = Op::Gdn});
  add({.name = "gdn_direct_l2_gva_varlen",
       .op = Op::Gdn,
       .l2 = true,
       .h0 = true,
       .dht = true,
       .H = 2,
       .HV = 4,
       .cu = varlen,
       .scale = 0.7});
  add({.name = "gdn_softplus",
       .op = Op::Gdn,
       .gate = GateForm::Softplus,
       .A_log = true,
       .h0 = true,
       .H = 1,
       .HV = 2,
       .cu = varlen});
  add({.name = "gdn_softplus_bias_l2_gva",
       .op = Op::Gdn,
       .gate = GateForm::Softplus,
       .A_log = true,
       .dt_bias = true,
       .l2 = true,
       .h0 = true,
       .dht = true,
       .H = 1,
       .HV = 3,
       .cu = varlen});
  add({.name = "gdn_softplus_small_windows",
       .op = Op::Gdn,
       .gate = GateForm::Softplus,
       .A_log = true,
       .dt_bias = true,
       .l2 = true,
       .h0 = true,
       .dht = true,
       .H = 1,
       .HV = 2,
       .cu = varlen,
       .small_windows = true});
  add({.name = "gdn_direct_dht_only", .op = Op::Gdn, .dht = true, .cu = {0, 7, 12}});
  // KDA
  add({.name = "kda_direct", .op = Op::Kda});
  add({.name = "kda_direct_l2_gva_varlen",
       .op = Op::Kda,
       .l2 = true,
       .h0 = true,
       .dht = true,
       .H = 1,
       .HV = 2,
       .cu = varlen});
  add({.name = "kda_softplus", .op = Op::Kda, .gate = GateForm::Softplus, .A_log = true, .dht = true});
  add({.name = "kda_softplus_bias_l2_gva",
       .op = Op::Kda,
       .gate = GateForm::Softplus,
       .A_log = true,
       .dt_bias = true,
       .l2 = true,
       .h0 = true,
       .dht = true,
       .H = 2,
       .HV = 4,
       .cu = varlen});
  add({.name = "kda_lb_A_bias_l2_gva",
       .op = Op::Kda,
       .gate = GateForm::LowerBound,
       .A_log = true,
       .dt_bias = true,
       .l2 = true,
       .h0 = true,
       .dht = true,
       .H = 2,
       .HV = 4,
       .cu = varlen,
       .scale = 0.3});
  add({.name = "kda_lb_bias",
       .op = Op::Kda,
       .gate = GateForm::LowerBound,
       .dt_bias = true,
       .h0 = true,
       .dht = true,
       .H = 1,
       .HV = 2,
       .cu = varlen});
  add({.name = "kda_lb_plain_l2", .op = Op::Kda, .gate = GateForm::LowerBound, .l2 = true});
  add({.name = "kda_lb_A_small_windows",
       .op = Op::Kda,
       .gate = GateForm::LowerBound,
       .A_log = true,
       .dt_bias = true,
       .l2 = true,
       .h0 = true,
       .dht = true,
       .H = 1,
       .HV = 2,
       .cu = varlen,
       .small_windows = true});
  add({.name = "kda_direct_small_windows",
       .op = Op::Kda,
       .h0 = true,
       .dht = true,
       .H = 1,
       .HV = 2,
       .cu = {0, 9, 9, 12},
       .small_windows = true});
  // Degenerate and multi-block widths.
  add({.name = "kda_k1_v1",
       .op = Op::Kda,
       .gate = GateForm::Softplus,
       .A_log = true,
       .h0 = true,
       .dht = true,
       .cu = varlen,
       .K = 1,
       .V = 1});
  add({.name = "gdn_v37_three_blocks",
       .op = Op::Gdn,
       .l2 = true,
       .h0 = true,
       .dht = true,
       .H = 1,
       .HV = 2,
       .cu = {0, 4, 9},
       .small_windows = true,
       .K = 3,
       .V = 37});
  return cs;
}

INSTANTIATE_TEST_SUITE_P(Reference, FiniteDifference, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& pi) { return pi.param.name; });

}  // namespace
}  // namespace kcp::ref::test
