// (a) The CPU twin against the FP64 reference at the public thresholds (rel-RMS <= 5e-3 for o
// and ht, <= 8e-3 for dq, dk, dv, dh0, <= 2e-2 for dg, dbeta, dA_log, ddt_bias): GDN and KDA,
// varlen with unaligned lengths and a zero-length sequence, GVA, h0 + dht, in-kernel L2 norm,
// raw softplus gates, the KDA lower-bound form, K = V = 128, K != V (64 / 128 and 128 / 64), fp16
// inputs.
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

// K != V (the shapes the CUDA backend runs since issue 16 item 2): a case (GVA, h0, dht, in-kernel
// L2 norm, raw gates) at other head dims.
Case with_dims(Case c, const char* name, int K, int V, uint64_t seed) {
  c.name = name;
  c.K = K;
  c.V = V;
  c.seed = seed;
  return c;
}

// Nearly parallel keys after the in-kernel L2 norm (q = randn + 1, k = 10 randn - 50: the KDA CP
// test distribution of FLA), with the lower-bound gate for KDA and weak direct gates for GDN.
// The bf16 chunked algorithm cannot meet the public thresholds here: U - W S and the inter/intra
// parts of o cancel, and every rounding point contributes (measured by switching them off one
// file at a time: no single site dominates; with all forward roundings off o is at 5e-7).
// FLA's own CP test notes "KDA CP error ~0.7-1.2%, dbeta ~1.5-2.4%" for this distribution and
// makes dbeta warning-only; the twin measures o 9.6e-3, dv 1.1e-2, dbeta 1.7e-2 (KDA) and
// o 6.4e-3, dg 1.0e-2 (GDN). These cases therefore check FLA's CP level (1.5e-2, and 3e-2 for
// dg / dbeta), not the public thresholds; budgets of skewed-key rows must come from calibrate.
Case kda_skewed() {
  Case c = kda_lower_bound();
  c.name = "kda_skewed_keys";
  c.skewed = true;
  c.seed = 27;
  return c;
}
Case gdn_skewed() {
  Case c = gdn_gva_state();
  c.name = "gdn_skewed_keys";
  c.l2norm = true;
  c.skewed = true;
  c.seed = 16;
  return c;
}

TEST(SkewedKeys, WithinFlaCpLevel) {
  for (const Case& c : {kda_skewed(), gdn_skewed()}) {
    const Data& d = data_for(c);
    const RefResults& ref = reference_for(c, d);
    TwinOptions opt;
    opt.threads = 2;
    opt.rank_bounds = {0, 250, c.T()};
    opt.P = {2, 2};
    const TwinResults tw = run_twin(c, d, opt);
    std::string line = c.name + ":";
    for (const auto& [name, r] : ref.t) {
      const auto& x = tw.t.at(name);
      EXPECT_EQ(non_finite(x), 0) << c.name << " " << name;
      const double e = rel_rms(r, x);
      line += " " + name + "=" + std::to_string(e).substr(0, 8);
      const double bound = (name == "dg" || name == "dbeta") ? 3e-2 : 1.5e-2;
      EXPECT_LE(e, bound) << c.name << ": rel-RMS of " << name;
    }
    std::printf("[ rel-RMS  ] %s (FLA CP level)\n", line.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, TwinVsReference,
                         ::testing::Values(gdn_varlen(), gdn_gva_state(), gdn_raw_l2(), gdn_k128(), gdn_fp16(),
                                           kda_varlen(), kda_gva_state(), kda_raw_l2(), kda_lower_bound(), kda_k128(),
                                           kda_fp16(), with_dims(gdn_raw_l2(), "gdn_K64_V128", 64, 128, 17),
                                           with_dims(kda_raw_l2(), "kda_K128_V64", 128, 64, 28)),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
}  // namespace kcp::test
