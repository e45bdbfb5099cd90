// (b) one piece split into P = 1, 2, 3, 5 segments, and (c) a hand-made split over 2 and 3
// "ranks" (rank summaries exchanged and folded with Backend::fold, as the KCP engine does):
// every split passes the reference thresholds and stays within bf16 state-rounding noise of the
// unsplit run. (Splits are not bitwise equal to P = 1 by design: the fold applies the fp32
// transfer M X + h_ext where the unsplit recurrence rounds S to bf16 for W S; docs/algorithm.md 4.5.)
#include "twin_test_util.h"

namespace kcp::test {
namespace {

// A split run may differ from the unsplit run by bf16 state-rounding noise: per tensor, at most
// the public threshold (the same bound both runs meet against FP64). Unaligned rank cuts change
// the chunking of everything after the cut, so their difference is the size of the twin's own
// error; chunk-aligned segment splits only change the rounding of the states after each cut.
// A wrong entry state or exit gradient gives differences of order 1. Measured values are printed.
// dA_log and ddt_bias are HV-element sums over all tokens (rel-RMS of a few numbers with
// cancellation): both runs are within the threshold of FP64, so their difference is bounded by
// twice it (triangle inequality); measured up to 1.9e-2 on the 2-rank GDN softplus case.
bool within_split_noise(const std::string& label, const TwinResults& base, const TwinResults& split) {
  max_rel_diff(label, base, split);
  bool ok = true;
  for (const auto& [name, b] : base.t) {
    const double e = rel_rms(b, split.t.at(name));
    const double bound = (name == "dA_log" || name == "ddt_bias") ? 2.0 * threshold(name) : threshold(name);
    if (e > bound) {
      ADD_FAILURE() << label << ": " << name << " differs from the unsplit run by rel-RMS " << e;
      ok = false;
    }
  }
  return ok;
}

class SegmentSplit : public ::testing::TestWithParam<kernels::Op> {};

TEST_P(SegmentSplit, PiecesOfOneSequence) {
  const Case c = single_sequence(GetParam());
  const Data& d = data_for(c);
  const RefResults& ref = reference_for(c, d);
  TwinOptions base_opt;
  base_opt.threads = 2;
  const TwinResults base = run_twin(c, d, base_opt);
  expect_within_thresholds(c.name + " P=1", ref, base);
  for (int P : {2, 3, 5}) {
    TwinOptions opt = base_opt;
    opt.P = {P};
    const TwinResults split = run_twin(c, d, opt);
    const std::string label = c.name + " P=" + std::to_string(P);
    expect_within_thresholds(label, ref, split);
    EXPECT_TRUE(within_split_noise(label, base, split));
  }
}

TEST_P(SegmentSplit, EveryPieceOfAVarlenRank) {
  Case c = GetParam() == kernels::Op::Gdn ? gdn_raw_l2() : kda_raw_l2();
  const Data& d = data_for(c);
  const RefResults& ref = reference_for(c, d);
  TwinOptions opt;
  opt.threads = 2;
  const TwinResults base = run_twin(c, d, opt);
  opt.P = {3};
  const TwinResults split = run_twin(c, d, opt);
  expect_within_thresholds(c.name + " P=3/piece", ref, split);
  EXPECT_TRUE(within_split_noise(c.name + " P=3/piece", base, split));
}

TEST_P(SegmentSplit, TwoRanksByHand) {
  // Two sequences [300, 200]; rank 0 holds [0, 250) (seq 0 head, cut not chunk aligned), rank 1
  // holds seq 0's 50-token tail (less than one chunk) and seq 1. Raw gates, L2 norm, h0 + dht, GVA.
  Case c = GetParam() == kernels::Op::Gdn ? gdn_raw_l2() : kda_raw_l2();
  c.name += "_2rank";
  c.lens = {300, 200};
  const Data& d = data_for(c);
  const RefResults& ref = reference_for(c, d);
  TwinOptions one;
  one.threads = 2;
  const TwinResults base = run_twin(c, d, one);
  expect_within_thresholds(c.name + " W=1", ref, base);
  TwinOptions two = one;
  two.rank_bounds = {0, 250, 500};
  two.P = {2, 1};
  const TwinResults split = run_twin(c, d, two);
  expect_within_thresholds(c.name + " W=2", ref, split);
  EXPECT_TRUE(within_split_noise(c.name + " W=2", base, split));
}

TEST_P(SegmentSplit, ThreeRanksWithAMiddleRank) {
  // [450, 150] over ranks [0,170) [170,390) [390,600): rank 1 holds one piece that neither starts
  // nor ends its sequence, so both exchanges fold a chain of two rank summaries.
  Case c = GetParam() == kernels::Op::Gdn ? gdn_raw_l2() : kda_raw_l2();
  c.name += "_3rank";
  c.lens = {450, 150};
  const Data& d = data_for(c);
  const RefResults& ref = reference_for(c, d);
  TwinOptions one;
  one.threads = 2;
  const TwinResults base = run_twin(c, d, one);
  TwinOptions three = one;
  three.rank_bounds = {0, 170, 390, 600};
  three.P = {1, 3, 2};
  const TwinResults split = run_twin(c, d, three);
  expect_within_thresholds(c.name + " W=3", ref, split);
  EXPECT_TRUE(within_split_noise(c.name + " W=3", base, split));
}

TEST_P(SegmentSplit, EdgeLengths) {
  // 1-token sequences, exact multiples of C, 1-token last chunks (65, 129), a zero-length
  // sequence, and ranks [0,131) [131,195) [195,324): rank 0 ends with a 1-token piece of seq 4
  // (after the zero-length seq 3 at token 130), rank 1 holds 64 tokens of seq 4 that neither
  // start nor end it, rank 2 starts with seq 4's 64-token tail.
  Case c = GetParam() == kernels::Op::Gdn ? gdn_gva_state() : kda_gva_state();
  c.name += "_edges";
  c.lens = {1, 64, 65, 0, 129, 1, 64};
  const Data& d = data_for(c);
  const RefResults& ref = reference_for(c, d);
  TwinOptions opt;
  opt.threads = 2;
  const TwinResults base = run_twin(c, d, opt);
  expect_within_thresholds(c.name + " W=1", ref, base);
  opt.rank_bounds = {0, 131, 195, c.T()};
  opt.P = {2, 1, 3};
  const TwinResults split = run_twin(c, d, opt);
  expect_within_thresholds(c.name + " W=3", ref, split);
  EXPECT_TRUE(within_split_noise(c.name + " W=3", base, split));
}

INSTANTIATE_TEST_SUITE_P(Ops, SegmentSplit, ::testing::Values(kernels::Op::Gdn, kernels::Op::Kda),
                         [](const ::testing::TestParamInfo<kernels::Op>& i) {
                           return std::string(kernels::to_string(i.param));
                         });

}  // namespace
}  // namespace kcp::test
