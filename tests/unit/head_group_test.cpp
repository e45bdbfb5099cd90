// Forms run by groups of heads, the pieces below the engine: a spilled slice's part of any head
// range reads back as those heads whatever parts it was put in (core/compare/reference_spill.h
// load_part; gather_heads for a slice in memory), the groups' local metrics fold into those of
// every head (core/compare/group_metrics.h), and the memory estimate counts one group's form
// (core/plan/memory_estimate.h, core/plan/head_groups.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/compare/group_metrics.h"
#include "core/compare/reference_spill.h"
#include "core/kcp/head_group_run.h"
#include "core/plan/head_groups.h"
#include "core/util/error.h"

using namespace kcp;

namespace {
std::vector<double> heads_of(const std::vector<double>& v, int64_t rows, int64_t heads, int64_t width, int64_t first,
                             int64_t count) {
  std::vector<double> out;
  for (int64_t r = 0; r < rows; ++r)
    out.insert(out.end(), v.begin() + (r * heads + first) * width, v.begin() + (r * heads + first + count) * width);
  return out;
}
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}
}  // namespace

// Any head range of a tensor put whole, or by parts of another grouping, reads back as those heads
// of the whole (gather_heads gives the same of a tensor in memory); a range outside is an error.
TEST(HeadGroups, ASpilledSlicesPartOfAnyHeadRangeReadsBackAsThoseHeads) {
  const int64_t rows = 7, heads = 6, width = 5;
  std::vector<double> whole(rows * heads * width);
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = 0.25 + double(i) * 1.5;
  ReferenceSpill spill;
  std::vector<double> copy = whole;
  spill.put(ResultTensor::o, copy);  // whole, as an ungrouped reference puts it
  for (int64_t first : {4, 0, 2}) {  // three parts of two heads, out of order
    std::vector<double> part = heads_of(whole, rows, heads, width, first, 2);
    spill.put_part(ResultTensor::dv, part, rows, heads, width, first, 2);
  }
  for (const HeadPart at :
       {HeadPart{rows, heads, width, 0, 3}, HeadPart{rows, heads, width, 3, 3}, HeadPart{rows, heads, width, 1, 1},
        HeadPart{rows, heads, width, 2, 2}, HeadPart{rows, heads, width, 0, 6}}) {
    const std::vector<double> want = heads_of(whole, rows, heads, width, at.first, at.count);
    EXPECT_TRUE(same_bits(spill.load_part(ResultTensor::o, at), want)) << at.first << " " << at.count;
    EXPECT_TRUE(same_bits(spill.load_part(ResultTensor::dv, at), want)) << at.first << " " << at.count;
    EXPECT_TRUE(same_bits(gather_heads(whole, at), want));
  }
  EXPECT_TRUE(spill.load_part(ResultTensor::dq, HeadPart{rows, heads, width, 0, 1}).empty()) << "never put";
  EXPECT_THROW(spill.load_part(ResultTensor::o, HeadPart{rows, heads, width, 5, 2}), InvariantError);
}

namespace {
TensorMetrics metrics(const char* name, double max_abs, WorstElement w, int64_t nonfinite = 0) {
  TensorMetrics m;
  m.name = name;
  m.count = 10;
  m.max_abs = max_abs;
  m.ref_max_abs = 2 * max_abs;
  m.sum_err2 = max_abs * max_abs;
  m.sum_ref2 = 4;
  m.nonfinite = nonfinite;
  m.worst = w;
  return m;
}
WorstElement at(int64_t token, int head, int channel) {
  WorstElement w;
  w.rank = 0;
  w.token = token;
  w.seq = 0;
  w.head = head;
  w.channel = channel;
  return w;
}
}  // namespace

// Sums and maxima fold; the worst element is the larger error's, an equal error's the one met first
// (token, then head), a non-finite value's before any; heads are numbered in the row (dq: q/k
// heads; dv: value heads, G = 2 a q/k head).
TEST(HeadGroups, TheGroupsLocalMetricsFoldIntoThoseOfEveryHead) {
  RowConfig row;
  row.H = 2;
  row.HV = 4;
  std::vector<TensorMetrics> ms;
  fold_head_group(ms, {metrics("dq", 1.0, at(5, 0, 3)), metrics("dv", 2.0, at(9, 1, 0))}, row, HeadRange{0, 1});
  fold_head_group(ms, {metrics("dq", 1.0, at(4, 0, 7)), metrics("dv", 3.0, at(1, 0, 2))}, row, HeadRange{1, 1});
  ASSERT_EQ(ms.size(), 2u);
  EXPECT_EQ(ms[0].worst, at(4, 1, 7)) << "a tie: the earlier token, in the second group (q/k head 1)";
  EXPECT_EQ(ms[1].worst, at(1, 2, 2)) << "the larger error, value head 0 of the second group = 2";
  EXPECT_EQ(ms[1].max_abs, 3.0);
  EXPECT_EQ(ms[1].ref_max_abs, 6.0);
  EXPECT_EQ(ms[1].count, 20);
  EXPECT_DOUBLE_EQ(ms[1].sum_err2, 13.0);
  EXPECT_DOUBLE_EQ(ms[1].sum_ref2, 8.0);
  // The same token and a tie: the lower head; then a non-finite value wins over any error.
  std::vector<TensorMetrics> tie;
  fold_head_group(tie, {metrics("dv", 2.0, at(3, 1, 0))}, row, HeadRange{0, 1});
  fold_head_group(tie, {metrics("dv", 2.0, at(3, 0, 0))}, row, HeadRange{1, 1});
  EXPECT_EQ(tie[0].worst, at(3, 1, 0));
  fold_head_group(tie, {metrics("dv", 0.5, at(8, 1, 1), 2)}, row, HeadRange{1, 1});
  EXPECT_EQ(tie[0].worst, at(8, 3, 1));
  EXPECT_EQ(tie[0].nonfinite, 2);
  EXPECT_THROW(fold_head_group(tie, {metrics("o", 1.0, at(0, 0, 0))}, row, HeadRange{1, 1}), InvariantError);
  EXPECT_EQ(head_group(row, 1, 2).first, 1);
  EXPECT_TRUE(head_group(row, 0, 1).whole(row.H));
  EXPECT_THROW(head_group(row, 0, 3), InvariantError) << "groups must divide H";
}

namespace {
RowConfig kda_row() {
  RowConfig r;
  r.name = "M2";
  r.op = Op::Kda;
  r.H = 4;
  r.HV = 8;
  r.K = r.V = 128;
  r.seqlens = {32768};
  r.world = 2;
  r.plan_device = "cpu";
  return r;
}

// The CPU twin's memory request for `groups` groups of heads (0: the row's default, one group).
MemoryRequest cpu_request(int groups = 0) {
  MemoryRequest req;
  req.plan.device = "cpu";
  if (groups > 0) req.head_groups = groups;
  return req;
}
}  // namespace

// With n groups of heads a rank's form arrays, shard, twin scratch and results are one group's
// (a quarter with four groups, to the exchange's and fold states' share), what it keeps for the
// row and the FP64 reference's preparation stay every head's, and the plan is the row's.
TEST(HeadGroups, TheEstimateCountsOneGroupsForm) {
  const RowConfig row = kda_row();
  const MemoryRequest req = cpu_request();
  const MemoryEstimate whole = estimate_memory(row, req);
  const MemoryEstimate four = estimate_memory(row, cpu_request(4));
  EXPECT_EQ(four.head_groups, 4);
  const RankMemory &w = whole.ranks[0], &f = four.ranks[0];
  EXPECT_NEAR(double(f.form_arrays), double(w.form_arrays) / 4, 0.01 * double(w.form_arrays));
  EXPECT_NEAR(double(f.twin_scratch), double(w.twin_scratch) / 4, 0.01 * double(w.twin_scratch));
  EXPECT_LT(f.inputs, w.inputs / 3);
  EXPECT_LT(f.judge, w.judge / 2);
  EXPECT_EQ(f.kept, w.kept);
  EXPECT_EQ(f.reference, w.reference);
  EXPECT_EQ(four.phase_prepare, whole.phase_prepare);
  EXPECT_THROW(estimate_memory(row, cpu_request(3)), ConfigError) << "3 does not divide H = 4";
}

// auto: one group when the row fits, else the fewest that fit (H when none does, fits false);
// never: one; a byte count: the fewest groups whose form arrays take at most that a rank.
TEST(HeadGroups, TheFewestGroupsThatFitAreChosen) {
  const RowConfig row = kda_row();
  const MemoryRequest req = cpu_request();
  const MemoryEstimate whole = estimate_memory(row, req);
  const MemoryEstimate two = estimate_memory(row, cpu_request(2));
  EXPECT_EQ(choose_head_groups(row, req, kHeadGroupAuto, whole.host_bytes, 0).groups, 1);
  const HeadGroupChoice c = choose_head_groups(row, req, kHeadGroupAuto, two.host_bytes, 0);
  EXPECT_EQ(c.groups, 2);
  EXPECT_TRUE(c.fits);
  EXPECT_EQ(c.estimate.host_bytes, two.host_bytes);
  const HeadGroupChoice none = choose_head_groups(row, req, kHeadGroupAuto, 1 << 20, 0);
  EXPECT_EQ(none.groups, 4);
  EXPECT_FALSE(none.fits);
  EXPECT_EQ(choose_head_groups(row, req, kHeadGroupNever, 1 << 20, 0).groups, 1);
  EXPECT_EQ(choose_head_groups(row, req, 0, 0, 0).groups, 4);
  EXPECT_EQ(choose_head_groups(row, req, two.ranks[0].form_arrays, 0, 0).groups, 2);
  MemoryRequest gpu_two = cpu_request(2);
  gpu_two.device_is_host = false;
  const MemoryEstimate gpu = estimate_memory(row, gpu_two);
  EXPECT_EQ(choose_head_groups(row, gpu_two, kHeadGroupAuto, 0, gpu.device_bytes - 1).groups, 4)
      << "the device limit counts too (two groups' estimate here is " << gpu.device_bytes << ")";
}

// --reference-spill auto: the slices stay in memory when the row fits that way in no more groups
// of heads than with spilled slices; else (or with no known host memory) they spill at
// kReferenceSpillBytes (the row's slices, about 0.6 GiB a rank, pass it).
TEST(HeadGroups, AutoSpillKeepsTheSlicesInMemoryWhenTheRowFits) {
  const RowConfig row = kda_row();
  MemoryRequest kept_req = cpu_request(), spilled_req = cpu_request();
  kept_req.reference_spill_bytes = -1;
  spilled_req.reference_spill_bytes = kReferenceSpillBytes;
  const MemoryEstimate kept = estimate_memory(row, kept_req), spilled = estimate_memory(row, spilled_req);
  MemoryRequest req = cpu_request();
  req.reference_spill_bytes = kReferenceSpillAuto;
  const int64_t room_for_kept = kept.host_bytes / 9 * 10 + 100;  // kept choices take at most 90% of it
  const HeadGroupChoice roomy = choose_head_groups(row, req, kHeadGroupAuto, room_for_kept, 0);
  EXPECT_EQ(roomy.reference_spill_bytes, -1);
  EXPECT_EQ(roomy.groups, 1);
  EXPECT_EQ(roomy.estimate.host_bytes, kept.host_bytes);
  const HeadGroupChoice unknown = choose_head_groups(row, req, kHeadGroupAuto, 0, 0);
  EXPECT_EQ(unknown.reference_spill_bytes, kReferenceSpillBytes) << "no known host memory: spill as before";
  EXPECT_EQ(unknown.estimate.host_bytes, spilled.host_bytes);
  // A host that holds the row in one group only with spilled slices: kept slices would need more
  // groups of heads, so the slices spill.
  ASSERT_LT(spilled.host_bytes, kept.host_bytes);
  ASSERT_TRUE(spilled.ranks[0].reference_spilled);
  const HeadGroupChoice tight = choose_head_groups(row, req, kHeadGroupAuto, spilled.host_bytes, 0);
  EXPECT_EQ(tight.reference_spill_bytes, kReferenceSpillBytes);
  EXPECT_EQ(tight.groups, 1);
  EXPECT_EQ(choose_head_groups(row, req, kHeadGroupAuto, kept.host_bytes, 0).reference_spill_bytes,
            kReferenceSpillBytes)
      << "kept slices that would take more than 90% of the memory at hand";
  // A disk too small for the spilled slices: kept ones, in more groups of heads where needed.
  const HeadGroupChoice no_disk = choose_head_groups(row, req, kHeadGroupAuto, spilled.host_bytes, 0, false, 1);
  EXPECT_EQ(no_disk.reference_spill_bytes, -1);
  EXPECT_TRUE(no_disk.fits);
  EXPECT_GT(no_disk.groups, 1);
  EXPECT_LE(no_disk.estimate.host_bytes, spilled.host_bytes);
  // estimate_memory alone reads auto as kReferenceSpillBytes.
  EXPECT_EQ(estimate_memory(row, req).host_bytes, spilled.host_bytes);
}

// A row's input shard stays across its forms only when asked (may_keep_inputs), with one group of
// heads, a known host memory, and room for it: it then counts in what the rank keeps.
TEST(HeadGroups, TheInputShardIsKeptAcrossFormsOnlyWhereItFits) {
  const RowConfig row = kda_row();
  MemoryRequest req = cpu_request();
  const MemoryEstimate plain = estimate_memory(row, req);
  MemoryRequest keep_req = cpu_request();
  keep_req.keep_inputs = true;
  const MemoryEstimate kept = estimate_memory(row, keep_req);
  EXPECT_EQ(kept.ranks[0].kept, plain.ranks[0].kept + plain.ranks[0].inputs);
  EXPECT_EQ(kept.ranks[0].upload, plain.ranks[0].upload - plain.ranks[0].inputs);
  EXPECT_GT(kept.host_bytes, plain.host_bytes);
  const int64_t room = kept.host_bytes / 9 * 10 + 100;  // a kept shard takes at most 90% of it
  const HeadGroupChoice roomy = choose_head_groups(row, req, kHeadGroupAuto, room, 0, true);
  EXPECT_TRUE(roomy.keep_inputs);
  EXPECT_EQ(roomy.estimate.host_bytes, kept.host_bytes);
  EXPECT_FALSE(choose_head_groups(row, req, kHeadGroupAuto, room, 0, false).keep_inputs);
  EXPECT_FALSE(choose_head_groups(row, req, kHeadGroupAuto, kept.host_bytes, 0, true).keep_inputs) << "over 90%";
  EXPECT_FALSE(choose_head_groups(row, req, kHeadGroupAuto, 0, 0, true).keep_inputs) << "unknown host memory";
  const HeadGroupChoice tight = choose_head_groups(row, req, kHeadGroupAuto, kept.host_bytes - 1, 0, true);
  EXPECT_FALSE(tight.keep_inputs);
  EXPECT_EQ(tight.groups, 1);
  EXPECT_FALSE(choose_head_groups(row, req, 0, room * 4, 0, true).keep_inputs) << "groups of heads";
  keep_req.head_groups = 2;
  EXPECT_THROW(estimate_memory(row, keep_req), InvariantError);
}

// --reference-group auto where the reference has more threads than a group gives work items
// (a q/k head of this row: 2 value heads x 8 column blocks): the groups are made as wide as the
// threads need (reference_groups_for_threads) when the row still fits 90% of the host memory that
// way with the same other choices; without known host memory, or without room, auto's own groups.
TEST(HeadGroups, AutoReferenceGroupsWidenForThreadsWhereTheHostHasRoom) {
  RowConfig row = kda_row();
  row.seqlens = {262144};  // 8.6 GB of FP64 results, 2.2 GB a q/k head
  EXPECT_EQ(reference_groups_for_threads(row, 16), 4);
  EXPECT_EQ(reference_groups_for_threads(row, 32), 2);
  EXPECT_EQ(reference_groups_for_threads(row, 1000), 1);
  for (int n : {1, 2, 4}) EXPECT_EQ(reference_head_groups(row, reference_group_bytes_for(row, n)), n);
  MemoryRequest req = cpu_request();
  req.reference_threads = 32;
  req.reference_spill_bytes = kReferenceSpillBytes;
  req.device_is_host = false;  // on a GPU the reference's preparation sets the host peak
  const MemoryEstimate four = estimate_memory(row, req);
  ASSERT_EQ(four.reference_groups, 4) << "auto alone: kReferenceGroupBytes";
  MemoryRequest two_req = req;
  two_req.reference_group_bytes = reference_group_bytes_for(row, 2);
  const MemoryEstimate two = estimate_memory(row, two_req);
  ASSERT_EQ(two.reference_groups, 2);
  ASSERT_GT(two.host_bytes, four.host_bytes);
  const int64_t roomy = two.host_bytes / 9 * 10 + 100;
  const HeadGroupChoice wide = choose_head_groups(row, req, kHeadGroupNever, roomy, 0);
  EXPECT_EQ(wide.estimate.reference_groups, 2);
  EXPECT_EQ(wide.reference_group_bytes, two_req.reference_group_bytes);
  EXPECT_EQ(wide.estimate.host_bytes, two.host_bytes);
  const HeadGroupChoice tight = choose_head_groups(row, req, kHeadGroupNever, two.host_bytes, 0);
  EXPECT_EQ(tight.estimate.reference_groups, 4) << "fits, but not within 90% of the host";
  EXPECT_EQ(tight.reference_group_bytes, kReferenceGroupAuto) << "auto's own groups";
  EXPECT_EQ(choose_head_groups(row, req, kHeadGroupNever, 0, 0).estimate.reference_groups, 4) << "host unknown";
  req.reference_threads = 16;
  EXPECT_EQ(choose_head_groups(row, req, kHeadGroupNever, roomy, 0).estimate.reference_groups, 4)
      << "16 threads: four groups give every thread an item";
  req.reference_threads = 32;
  req.reference_group_bytes = reference_group_bytes_for(row, 4);
  EXPECT_EQ(choose_head_groups(row, req, kHeadGroupNever, roomy, 0).estimate.reference_groups, 4)
      << "a byte count is kept";
}

// Between the groups the threads need and auto's: the widest with which the row still fits 90%
// of the host (here two groups where one would not fit).
TEST(HeadGroups, AutoReferenceGroupsTakeTheWidestThatFits) {
  RowConfig row = kda_row();
  row.seqlens = {65536};  // 2.15 GB of results: four groups at kReferenceGroupBytes
  MemoryRequest req = cpu_request();
  req.reference_threads = 64;  // every head at once: 64 items
  req.reference_spill_bytes = kReferenceSpillBytes;
  req.device_is_host = false;
  ASSERT_EQ(reference_groups_for_threads(row, 64), 1);
  std::vector<MemoryEstimate> at;  // at[n]: the estimate with n reference groups
  for (int n = 0; n <= 4; ++n) {
    MemoryRequest r = req;
    r.reference_group_bytes = n > 0 ? reference_group_bytes_for(row, n) : kReferenceGroupAuto;
    at.push_back(estimate_memory(row, r));
  }
  ASSERT_EQ(at[0].reference_groups, 4);
  ASSERT_GT(at[1].host_bytes, at[2].host_bytes);
  ASSERT_GT(at[2].host_bytes, at[4].host_bytes);
  const HeadGroupChoice two = choose_head_groups(row, req, kHeadGroupAuto, at[2].host_bytes / 9 * 10 + 100, 0);
  EXPECT_TRUE(two.fits);
  EXPECT_EQ(two.groups, 1);
  EXPECT_EQ(two.estimate.reference_groups, 2);
  EXPECT_EQ(two.reference_group_bytes, reference_group_bytes_for(row, 2));
  const HeadGroupChoice four = choose_head_groups(row, req, kHeadGroupAuto, at[2].host_bytes - 1, 0);
  EXPECT_TRUE(four.fits);
  EXPECT_EQ(four.estimate.reference_groups, 4) << "no wider group fits: auto's own, not a refusal";
  EXPECT_EQ(four.reference_group_bytes, kReferenceGroupAuto);
  const HeadGroupChoice one = choose_head_groups(row, req, kHeadGroupAuto, at[1].host_bytes / 9 * 10 + 100, 0);
  EXPECT_EQ(one.estimate.reference_groups, 1);
}
