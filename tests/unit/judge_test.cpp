// judge (core/compare/compare.h, docs/design.md 6): a tensor with judged elements needs a budget;
// one with none (count 0: h_entry / dh_exit where no segment carries state) passes without one.
// And boundary_reference: S_p at segment begins p > 0, dS_p at ends p < len, NaN elsewhere.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>

#include "core/compare/compare.h"

using namespace kcp;

TEST(Judge, AnEmptyTensorPassesWithoutABudgetAnyOtherFails) {
  RowConfig row;
  row.budgets["o"] = Budget::absolute(1.0, 1.0);
  auto metrics = [](std::string name, int64_t count, double max_abs) {
    TensorMetrics m;
    m.name = std::move(name);
    m.count = count;
    m.max_abs = max_abs;
    return m;
  };
  std::vector<TensorMetrics> ms{metrics("h_entry", 0, 0.0),  // nothing judged, no budget
                                metrics("dh_exit", 8, 0.0),  // judged, no budget
                                metrics("o", 8, 0.5),        // judged, within its budget
                                metrics("dq", 0, 0.0)};      // no budget either, nothing judged
  judge(ms, row);
  EXPECT_TRUE(ms[0].pass);
  EXPECT_FALSE(ms[0].has_budget);
  EXPECT_EQ(ms[0].ratio_max, 0.0);
  EXPECT_FALSE(ms[1].pass);
  EXPECT_TRUE(ms[2].pass);
  EXPECT_DOUBLE_EQ(ms[2].ratio_max, 0.5);
  EXPECT_TRUE(ms[3].pass);
}

TEST(BoundaryReference, StatesAtCarriedBoundariesOnly) {
  RowConfig row;
  row.HV = 1;
  row.K = 1;
  row.V = 2;
  row.seqlens = {300};
  // One rank holding tokens 100..300 of the sequence, cut into segments [100, 228) and [228, 300).
  RankPlan rp;
  rp.global_begin = 100;
  rp.global_end = 300;
  rp.pieces = {Piece{0, 0, 200, 100, 100, true, false}};
  rp.segments = {Segment{0, 0, 128, 0}, Segment{0, 128, 200, 1}};
  SequenceReference full;
  full.t_begin = 0;
  full.t_end = 300;
  full.probes = {64, 100, 228};  // 64 lies on another rank: piece_slice drops it
  full.probe_S = {1, 2, 3, 4, 5, 6};
  full.probe_dS = {-1, -2, -3, -4, -5, -6};
  const auto slice = piece_slice(full, rp.pieces[0]);
  EXPECT_EQ(slice->probes, (std::vector<int64_t>{100, 228}));
  const RankReference br = boundary_reference(row, rp, {slice});
  const auto& h = br[ResultTensor::h_entry];
  const auto& d = br[ResultTensor::dh_exit];
  ASSERT_EQ(h.size(), 4u);
  EXPECT_EQ(h[0], 3);   // S_100 enters segment 0 (carried from the earlier rank)
  EXPECT_EQ(h[2], 5);   // S_228 enters segment 1
  EXPECT_EQ(d[0], -5);  // dS_228 leaves segment 0
  EXPECT_TRUE(std::isnan(d[2]) && std::isnan(d[3])) << "segment 1 ends the sequence: dS_300 = dht, not judged";
}
