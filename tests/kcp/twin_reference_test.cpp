// (a) The CPU twin against the FP64 reference at the public thresholds (rel-RMS <= 5e-3 for o
// and ht, <= 8e-3 for dq, dk, dv, dh0, <= 2e-2 for dg, dbeta, dA_log, ddt_bias): GDN and KDA,
// varlen with unaligned lengths and a zero-length sequence, GVA, h0 + dht, in-kernel L2 norm,
// raw softplus gates, the KDA lower-bound form, K = V = 128, fp16 inputs.
#include "twin_test_util.h"

namespace kcp::test {
namespace {

class TwinVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(TwinVsReference, WithinPublicThresholds) {
  const Case& c = GetParam();
  const Data& d = data_for(c);
  const RefResults& ref = reference_for(c, d);
  TwinOptions opt;
  opt.threads = 2;
  expect_within_thresholds(c.name, ref, run_twin(c, d, opt));
}

Case gdn_fp16() {
  Case c = gdn_gva_state();
  c.name = "gdn_fp16";
  c.dtype = kernels::DType::FP16;
  c.seed = 15;
  return c;
}
Case kda_fp16() {
  Case c = kda_raw_l2();
  c.name = "kda_fp16";
  c.dtype = kernels::DType::FP16;
  c.seed = 26;
  return c;
}

INSTANTIATE_TEST_SUITE_P(Cases, TwinVsReference,
                         ::testing::Values(gdn_varlen(), gdn_gva_state(), gdn_raw_l2(), gdn_k128(), gdn_fp16(),
                                           kda_varlen(), kda_gva_state(), kda_raw_l2(), kda_lower_bound(), kda_k128(),
                                           kda_fp16()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace kcp::test
