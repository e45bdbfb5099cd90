// The memory estimate of a row (core/plan/memory_estimate.h): its form arrays are exactly what
// FormBuffers allocates on every rank of every int1 row, its host terms follow the shapes, and a
// size beyond 64 bits is an error naming the row, not a wrapped number.
#include "core/plan/memory_estimate.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "core/config/row_loader.h"
#include "core/inputs/inputs.h"
#include "core/kcp/form_buffers.h"
#include "core/kcp/kcp_engine.h"
#include "core/util/error.h"
#include "kernels/cpu/cpu_backend.h"

using namespace kcp;

namespace {
RowConfig gdn_row(std::vector<int64_t> seqlens, int world) {
  RowConfig r;
  r.name = "M1";
  r.H = 2;
  r.HV = 4;
  r.K = 64;
  r.V = 32;
  r.seqlens = std::move(seqlens);
  r.world = world;
  r.plan_device = "cpu";
  return r;
}
MemoryRequest request(const RowConfig& row) {
  MemoryRequest q;
  q.plan.device = row.plan_device.empty() ? "h200" : row.plan_device;
  return q;
}
std::string error_of(const RowConfig& row) {
  try {
    estimate_memory(row, request(row));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// Every rank of every int1 row: the estimate's form arrays (full saved set, planned schedule)
// are the bytes FormBuffers allocates for that form on the CPU twin.
TEST(MemoryEstimate, FormArraysAreWhatFormBuffersAllocatesForEveryInt1Row) {
  const RowSet set = load_row_set(std::string(KCP_TEST_SOURCE_DIR) + "/configs/rows/int1.json");
  const auto backend = kernels::make_cpu_backend();
  for (const RowConfig& row : set.rows) {
    MemoryRequest req = request(row);
    req.backend = backend.get();
    const MemoryEstimate e = estimate_memory(row, req);
    const SegmentPlan plan = make_plan(row, req.plan);
    ASSERT_EQ(e.ranks.size(), size_t(row.world)) << row.name;
    for (const RankPlan& rp : plan.ranks) {
      const RowInputs shard = make_inputs(row, set.row_digests[row.index], rp.global_begin, rp.global_end);
      const kernels::RankLayout layout = kernel_layout(rp);
      const FormBuffers buf(*backend, row, rp, plan.world, shard, kernel_problem(row), layout.view(), SavedKind::Full,
                            {});
      EXPECT_EQ(e.ranks[rp.rank].form_arrays, buf.bytes()) << row.name << " rank " << rp.rank;
      EXPECT_EQ(e.ranks[rp.rank].saved_set, int64_t(sizeof(float)) * buf.saved_arena().size()) << row.name;
      EXPECT_EQ(e.ranks[rp.rank].workspace, int64_t(sizeof(float)) * buf.workspace_arena().size()) << row.name;
      // The shard as generated (the estimate adds a few floats of gate parameters at most).
      const int64_t shard_bytes =
          int64_t(sizeof(float)) * int64_t(shard.q.size() + shard.k.size() + shard.v.size() + shard.g.size() +
                                           shard.beta.size() + shard.dO.size() + shard.h0.size() + shard.dht.size());
      EXPECT_GE(e.ranks[rp.rank].inputs, shard_bytes) << row.name;
      EXPECT_LE(e.ranks[rp.rank].inputs, shard_bytes + 2 * 4 * row.HV * row.K) << row.name;
    }
  }
}

// With the workspace-of-other-package fault each form also has a spare workspace of its own size:
// a light form's workspace holds W, U, seg_Mt and seg_entry (a full form keeps them in its saved
// set), so the largest form is a light one with its spare, which the estimate must count.
TEST(MemoryEstimate, TheSpareWorkspaceOfALightFormCounts) {
  const RowSet set = load_row_set(std::string(KCP_TEST_SOURCE_DIR) + "/configs/rows/int1.json");
  const auto backend = kernels::make_cpu_backend();
  const RowConfig& row = set.rows.front();
  MemoryRequest req = request(row);
  req.backend = backend.get();
  req.spare_workspace = true;
  const MemoryEstimate e = estimate_memory(row, req);
  const SegmentPlan plan = make_plan(row, req.plan);
  for (const RankPlan& rp : plan.ranks) {
    const RowInputs shard = make_inputs(row, set.row_digests[row.index], rp.global_begin, rp.global_end);
    const kernels::RankLayout layout = kernel_layout(rp);
    int64_t bytes[2] = {0, 0};
    for (SavedKind kind : {SavedKind::Full, SavedKind::Light}) {
      FormBuffers buf(*backend, row, rp, plan.world, shard, kernel_problem(row), layout.view(), kind, {});
      buf.spare_workspace_arena();
      bytes[kind == SavedKind::Light] = buf.bytes();
    }
    EXPECT_GT(bytes[1], bytes[0]) << row.name << " rank " << rp.rank;
    EXPECT_EQ(e.ranks[rp.rank].form_arrays, bytes[1]) << row.name << " rank " << rp.rank;
  }
}

// The caller tensors q, k, v, dO, o, dq, dk, dv cross the kernel API as 16-bit patterns: on the
// twin that `run` uses they take half the bytes they take on the exact-storage twin (floats), and
// every other array is the same.
TEST(MemoryEstimate, CallerTensorsTakeHalfTheBytes) {
  const RowSet set = load_row_set(std::string(KCP_TEST_SOURCE_DIR) + "/configs/rows/int1.json");
  const auto twin = kernels::make_cpu_backend();
  const auto exact = kernels::make_cpu_backend(kernels::CpuStorage::Exact);
  for (const RowConfig& row : set.rows) {
    const SegmentPlan plan = make_plan(row, request(row).plan);
    const RankPlan& rp = plan.ranks[0];
    const RowInputs shard = make_inputs(row, set.row_digests[row.index], rp.global_begin, rp.global_end);
    const kernels::RankLayout layout = kernel_layout(rp);
    auto bytes = [&](const kernels::Backend& be) {
      return FormBuffers(be, row, rp, plan.world, shard, kernel_problem(row), layout.view(), SavedKind::Full, {})
          .bytes();
    };
    const int64_t T = rp.tokens(), qk = T * row.H * row.K, vo = T * row.HV * row.V;
    int64_t halved = 0;  // bytes saved per array of n elements: 4 n floats -> ceil(n / 2) floats
    for (int64_t n : {qk, qk, vo, vo, vo, qk, qk, vo}) halved += 4 * n - 4 * ((n + 1) / 2);
    EXPECT_GT(halved, 0) << row.name;
    EXPECT_EQ(bytes(*exact) - bytes(*twin), halved) << row.name;
  }
}

// The host terms by hand for one small row: 1000 tokens of GDN, H 2, HV 4, K 64, V 32, W 1.
TEST(MemoryEstimate, HostTermsFollowTheShapes) {
  const RowConfig row = gdn_row({600, 400}, 1);
  const MemoryEstimate e = estimate_memory(row, request(row));
  ASSERT_EQ(e.ranks.size(), 1u);
  const int64_t T = 1000, per_token_in = 2 * 2 * 64 + 2 * 4 * 32 + 4 + 4;  // q k | v dO | g | beta
  EXPECT_EQ(e.ranks[0].inputs, 4 * (T * per_token_in + 2 * 4 * 64));
  const int64_t per_token_out = 4 * 32 + 2 * 2 * 64 + 4 * 32 + 4 + 4;  // o | dq dk | dv | dg | dbeta
  // The probes kept for h_entry / dh_exit: S_p at each segment begin p > 0, dS_p at each end p < len.
  const RankPlan rp = make_plan(row, request(row).plan).ranks[0];
  int64_t judged = 0;
  for (size_t q = 0; q < rp.segments.size(); ++q) {
    const int64_t len = row.seqlens[size_t(rp.pieces[size_t(rp.segments[q].piece)].seq)];
    judged += (rp.seq_begin(q) > 0 ? 1 : 0) + (rp.seq_end(q) < len ? 1 : 0);
  }
  EXPECT_GT(judged, 0) << "the row plans P > 1 on the cpu device class";
  EXPECT_EQ(e.ranks[0].reference, 8 * T * per_token_out);
  EXPECT_FALSE(e.ranks[0].reference_spilled) << "4 MB stay in memory";
  // Both sequences' FP64 results (plus ht of each, and S_p, dS_p at each probe: on one rank every
  // cut inside a sequence is one probe, judged twice, as an entry and as an exit) are held while
  // the rank takes its slice; the rank keeps S_p and dS_p of each probe inside its pieces.
  EXPECT_EQ(e.sequences, 8 * (T * per_token_out + 2 * (4 * 64 * 32 + 4 * 2) + 2 * (judged / 2) * 4 * 64 * 32));
  EXPECT_EQ(e.ranks[0].probes, 8 * 2 * (judged / 2) * 4 * 64 * 32);
  EXPECT_EQ(e.host_bytes, e.fixed + std::max(e.phase_prepare, e.phase_forms));
  // One form's arrays at a time, and on a host backend never both the arrays and the downloaded
  // results whole: the rank's peak is what it keeps plus the largest of upload, run and judge.
  const RankMemory& m = e.ranks[0];
  EXPECT_EQ(e.phase_forms, m.host_peak);
  EXPECT_EQ(m.kept, m.probes + m.reference);
  EXPECT_EQ(m.host_peak, m.kept + std::max({m.upload, m.run, m.judge}));
  EXPECT_EQ(m.upload, m.inputs + m.form_inputs);
  EXPECT_GE(m.run, m.form_arrays);
  EXPECT_LT(m.run - m.twin_scratch, m.form_arrays + m.form_arrays / 8)
      << "the form's arrays, counted once (besides the twin's decoded caller tensors)";
  EXPECT_LT(m.judge, m.form_arrays) << "judging holds the results, not the arrays";
  EXPECT_LT(e.phase_forms, m.inputs + m.reference + m.form_arrays + 4 * T * per_token_out)
      << "the shard, the arrays and the downloaded results are never all whole at once";
  EXPECT_EQ(e.device_bytes, 0) << "the CPU twin's arrays are host memory";

  // On a GPU the form arrays move to the device; one rank of an mpirun holds only its own.
  MemoryRequest gpu = request(row);
  gpu.device_is_host = false;
  const MemoryEstimate g = estimate_memory(row, gpu);
  EXPECT_EQ(g.device_bytes, e.ranks[0].form_arrays);
  EXPECT_EQ(g.ranks[0].upload, m.inputs);
  EXPECT_LT(g.phase_forms, e.phase_forms);
  const RowConfig two = gdn_row({600, 400}, 2);
  MemoryRequest one_rank = request(two);
  one_rank.ranks = {1};
  const MemoryEstimate all = estimate_memory(two, request(two)), mine = estimate_memory(two, one_rank);
  ASSERT_EQ(mine.ranks.size(), 1u);
  EXPECT_EQ(mine.ranks[0].rank, 1);
  EXPECT_LT(mine.host_bytes, all.host_bytes);
}

// A slice at or above the spill threshold waits in a file while forms run: the rank keeps only
// its probes, and judging reads the slice back one tensor at a time (its largest tensor counts);
// the runner decides on the same bytes.
TEST(MemoryEstimate, ASpilledSliceIsCountedWhileJudgingOnly) {
  const RowConfig row = gdn_row({600, 400}, 1);
  MemoryRequest req = request(row);
  const MemoryEstimate kept = estimate_memory(row, req);
  req.reference_spill_bytes = 0;
  const MemoryEstimate spilled = estimate_memory(row, req);
  const RankMemory &a = kept.ranks[0], &b = spilled.ranks[0];
  EXPECT_TRUE(b.reference_spilled);
  EXPECT_EQ(b.kept, b.probes);
  const RankPlan rp = make_plan(row, req.plan).ranks[0];
  int64_t largest = 0;
  for (int i = 0; i < kResultTensorCount; ++i) {
    const ResultTensor t = result_tensor(i);
    if (row_has(row, t) && (place_of(t) == TensorPlace::Token || place_of(t) == TensorPlace::State))
      largest = std::max(largest, result_elements(row, t, rp.tokens(), int64_t(rp.pieces.size()), 0));
  }
  EXPECT_EQ(b.judge, a.judge + 8 * largest);
  EXPECT_LT(8 * largest, a.reference / 3) << "one tensor of the slice, not all of it";
  EXPECT_LE(spilled.phase_forms, kept.phase_forms);
  EXPECT_EQ(reference_slice_bytes(row, make_plan(row, req.plan).ranks[0]), a.reference);
  req.reference_spill_bytes = a.reference + 1;
  EXPECT_FALSE(estimate_memory(row, req).ranks[0].reference_spilled);
}

// A forced schedule with more segments than the planned one: the estimate's form is the larger
// of the two (one form's arrays at a time), not their sum.
TEST(MemoryEstimate, TheLargestFormCountsOnce) {
  const RowConfig row = gdn_row({4096}, 1);
  MemoryRequest planned = request(row), forced = request(row);
  planned.plan.forced_P = 1;
  forced.plan.forced_P = 1;
  forced.forced_P = {1, 16};
  const MemoryEstimate p1 = estimate_memory(row, planned), both = estimate_memory(row, forced);
  MemoryRequest only16 = request(row);
  only16.plan.forced_P = 16;
  const MemoryEstimate p16 = estimate_memory(row, only16);
  EXPECT_GT(p16.ranks[0].form_arrays, p1.ranks[0].form_arrays);
  EXPECT_EQ(both.ranks[0].form_arrays, p16.ranks[0].form_arrays);
  EXPECT_LT(both.phase_forms, p1.phase_forms + p16.ranks[0].form_arrays);
}

// Doubling every sequence about doubles the need (the token terms dominate).
TEST(MemoryEstimate, GrowsWithTheTokens) {
  const RowConfig a = gdn_row({1 << 20}, 2), b = gdn_row({1 << 21}, 2);
  const MemoryEstimate ea = estimate_memory(a, request(a)), eb = estimate_memory(b, request(b));
  EXPECT_NEAR(double(eb.host_bytes - eb.fixed) / double(ea.host_bytes - ea.fixed), 2.0, 0.05);
}

// Sizes past 64 bits are refused naming the row (checked multiplication), never wrapped.
TEST(MemoryEstimate, OverflowIsAnErrorNamingTheRow) {
  RowConfig huge = gdn_row({int64_t(1) << 40}, 1);
  EXPECT_EQ(error_of(huge), "") << "2^40 tokens fit in 64 bits";
  EXPECT_GT(estimate_memory(huge, request(huge)).host_bytes, int64_t(1) << 50);
  huge.seqlens = {int64_t(1) << 58};
  huge.HV = 64;
  huge.H = 64;
  huge.K = huge.V = 256;
  // The planner's checked sizes (segment_plan.cpp) or the estimate's own, whichever meets the
  // overflow first: either way the row is named and nothing wraps.
  const std::string why = error_of(huge);
  EXPECT_NE(why.find("row M1: "), std::string::npos) << why;
  EXPECT_TRUE(why.find("does not fit in 64 bits") != std::string::npos ||
              why.find("overflows 64-bit sizes") != std::string::npos)
      << why;
  EXPECT_THROW(checked_mul(std::numeric_limits<int64_t>::max() / 2 + 1, 2, "X", "y"), ConfigError);
  EXPECT_THROW(checked_add(std::numeric_limits<int64_t>::max(), 1, "X", "y"), ConfigError);
  EXPECT_EQ(checked_mul(int64_t(1) << 31, int64_t(1) << 31, "X", "y"), int64_t(1) << 62);
  EXPECT_EQ(human_bytes(3 * (int64_t(1) << 50)), "3.0 PiB");
  EXPECT_EQ(human_bytes(512), "512 B");
}

// The FP64 reference of a row whose results pass the group threshold runs one group of heads at
// a time (a divisor of H): the sequences' results and the working set counted are one group's,
// the ranks' slices stay whole; never groups: every head at once.
TEST(MemoryEstimate, TheReferenceRunsOneGroupOfHeadsAtATime) {
  RowConfig row = gdn_row({16384}, 2);
  row.H = 4;
  row.HV = 8;
  row.K = row.V = 128;
  MemoryRequest req = request(row);
  req.reference_group_bytes = kReferenceGroupNever;
  const MemoryEstimate whole = estimate_memory(row, req);
  EXPECT_EQ(whole.reference_groups, 1);
  // 16384 tokens x (o, dv: 8 x 128; dq, dk: 4 x 128; dg, dbeta: 8) doubles = 405 MB in all.
  EXPECT_EQ(reference_head_groups(row, 500 << 20), 1);
  EXPECT_EQ(reference_head_groups(row, 250 << 20), 2);
  EXPECT_EQ(reference_head_groups(row, 120 << 20), 4);
  EXPECT_EQ(reference_head_groups(row, 1), 4) << "one q/k head at the least";
  EXPECT_EQ(reference_head_groups(row, kReferenceGroupNever), 1);
  EXPECT_EQ(reference_head_groups(row, kReferenceGroupAuto), 1) << "405 MB: within kReferenceGroupBytes";
  req.reference_group_bytes = 120 << 20;
  const MemoryEstimate grouped = estimate_memory(row, req);
  EXPECT_EQ(grouped.reference_groups, 4);
  EXPECT_NEAR(double(grouped.sequences), double(whole.sequences) / 4, 0.01 * double(whole.sequences));
  EXPECT_LT(grouped.reference_work, whole.reference_work / 2);
  EXPECT_LT(grouped.phase_prepare, whole.phase_prepare / 2);
  EXPECT_EQ(grouped.ranks[0].reference, whole.ranks[0].reference);
  EXPECT_EQ(grouped.phase_forms, whole.phase_forms) << "the forms do not depend on how the reference ran";
}

// The groups a reference computation of `threads` threads needs (one value head of V = 128 keeps
// 8 busy) and the byte count that asks for exactly that many; auto alone is kReferenceGroupBytes
// whatever the threads (choose_head_groups widens it where the host has room).
TEST(MemoryEstimate, ReferenceGroupsForThreadsAndTheirByteCount) {
  RowConfig row = gdn_row({65536}, 2);
  row.H = 4;
  row.HV = 8;
  row.K = row.V = 128;  // 1.62 GB of results in all, 405 MB a q/k head; a q/k head has 2 x 8 items
  EXPECT_EQ(reference_groups_for_threads(row, 2), 4);
  EXPECT_EQ(reference_groups_for_threads(row, 16), 4) << "16 items for 16 threads";
  EXPECT_EQ(reference_groups_for_threads(row, 17), 2) << "H = 4: no group of 3 heads";
  EXPECT_EQ(reference_groups_for_threads(row, 64), 1);
  EXPECT_EQ(reference_groups_for_threads(row, 1000), 1) << "every head at once is the most there is";
  for (int n : {1, 2, 4}) EXPECT_EQ(reference_head_groups(row, reference_group_bytes_for(row, n)), n);
  EXPECT_EQ(reference_head_groups(row, kReferenceGroupAuto), 4);
  MemoryRequest req = request(row);
  req.reference_threads = 64;
  EXPECT_EQ(estimate_memory(row, req).reference_groups, 4) << "the estimate counts what it is asked";
  req.reference_group_bytes = reference_group_bytes_for(row, 2);
  EXPECT_EQ(estimate_memory(row, req).reference_groups, 2);
}

// The CPU twin's floats of the 16-bit caller tensors while a phase runs (three [T, HV, V] in the
// chunk backward) count in its run moment; on a GPU they are not host memory.
TEST(MemoryEstimate, TheTwinsDecodedCallerTensorsCountOnTheHost) {
  const RowConfig row = gdn_row({4096}, 1);
  MemoryRequest req = request(row);
  const RankMemory twin = estimate_memory(row, req).ranks[0];
  const int64_t T = 4096, vo = T * row.HV * row.V, qk = T * row.H * row.K;
  EXPECT_EQ(twin.twin_scratch, std::max(4 * std::max(3 * vo, 2 * qk), 2 * (4 * qk + 4 * vo)));
  EXPECT_GE(twin.run, twin.form_arrays + twin.twin_scratch);
  req.device_is_host = false;
  EXPECT_EQ(estimate_memory(row, req).ranks[0].twin_scratch, 0);
}
