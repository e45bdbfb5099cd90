// Where an injected fault lands (core/kcp/fault_site.h), and why it cannot land.
#include "core/kcp/fault_site.h"

#include <gtest/gtest.h>

using namespace kcp;

namespace {
SegmentPlan two_rank_plan() {
  RowConfig r;
  r.name = "A1";
  r.H = 1;
  r.HV = 1;
  r.seqlens = {4096};
  r.world = 2;
  return make_plan(r, {0, "cpu", 0, 0});
}
}  // namespace

// --inject-rank naming a rank the plan does not have is the reason the entry gives, whatever the
// fault (drop-segment-entry used to say "needs a rank that cuts a piece", hiding the bad rank).
TEST(FaultSite, ARankThePlanDoesNotHaveIsTheReason) {
  const SegmentPlan plan = two_rank_plan();
  for (FaultKind k : {FaultKind::DropSegmentEntry, FaultKind::DropRankIncoming, FaultKind::SkipOutputTile,
                      FaultKind::Hang, FaultKind::SavedToOtherPackage, FaultKind::WorkspaceOfOtherPackage}) {
    const Fault f{k, 7};
    const FaultSite site = place_fault(f, plan);
    EXPECT_EQ(site.rank, -1) << f.name();
    EXPECT_EQ(site.why, "--inject-rank 7 is not a rank of row A1 (W = 2: ranks 0..1)") << f.name();
  }
  // A rank that exists takes the fault.
  EXPECT_EQ(place_fault({FaultKind::DropSegmentEntry, 1}, plan).rank, 1);
  EXPECT_EQ(place_fault({FaultKind::Hang, 0}, plan).rank, 0);
  EXPECT_EQ(place_fault({FaultKind::DropRankIncoming, 1}, plan).rank, 1);
  EXPECT_EQ(place_fault({FaultKind::DropRankIncoming, 0}, plan).why,
            "fault drop-rank-incoming needs a rank that continues a sequence from an earlier rank");
  // No fault: nothing to place, nothing skipped.
  EXPECT_EQ(place_fault({FaultKind::None, 7}, plan).why, "");
}
