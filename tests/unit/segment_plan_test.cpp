#include "core/plan/segment_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/config/row_loader.h"
#include "core/util/error.h"
#include "kernels/api/tiles.h"

using namespace kcp;

namespace {
RowConfig row_of(std::vector<int64_t> seqlens, int world, int HV = 4, int V = 64) {
  RowConfig r;
  r.name = "P1";
  r.H = 1;
  r.HV = HV;
  r.K = 64;
  r.V = V;
  r.seqlens = std::move(seqlens);
  r.world = world;
  return r;
}

// Checks every structural invariant of segment_plan.h on one plan.
void check_invariants(const RowConfig& row, const SegmentPlan& plan) {
  const int64_t C = plan.chunk;
  int64_t at = 0;
  std::vector<int64_t> seq_begin(row.seqlens.size() + 1, 0);
  for (size_t s = 0; s < row.seqlens.size(); ++s) seq_begin[s + 1] = seq_begin[s] + row.seqlens[s];
  std::vector<int64_t> covered(static_cast<size_t>(row.total_tokens()), 0);
  for (const auto& rp : plan.ranks) {
    ASSERT_EQ(rp.global_begin, at);
    at = rp.global_end;
    int64_t local = 0;
    for (size_t i = 0; i < rp.pieces.size(); ++i) {
      const Piece& pc = rp.pieces[i];
      ASSERT_EQ(pc.local_begin, local) << "pieces must tile the rank in order";
      local = pc.local_end;
      ASSERT_EQ(pc.global_begin, rp.global_begin + pc.local_begin);
      ASSERT_EQ(pc.seq_offset, pc.global_begin - seq_begin[pc.seq]);
      if (pc.from_prev_rank) {
        ASSERT_EQ(i, 0u) << "only the first piece continues from earlier ranks";
      }
      if (pc.to_next_rank) {
        ASSERT_EQ(i, rp.pieces.size() - 1) << "only the last piece continues into later ranks";
      }
      for (int64_t t = pc.local_begin; t < pc.local_end; ++t) covered[rp.global_begin + t]++;
    }
    ASSERT_EQ(local, rp.tokens());
    // Segments: in order, inside their piece, chunk aligned relative to the piece start.
    std::vector<int64_t> piece_at(rp.pieces.size());
    for (size_t i = 0; i < rp.pieces.size(); ++i) piece_at[i] = rp.pieces[i].local_begin;
    int maxseg = 0;
    std::vector<int> per_piece(rp.pieces.size(), 0);
    for (const auto& s : rp.segments) {
      const Piece& pc = rp.pieces[s.piece];
      ASSERT_EQ(s.local_begin, piece_at[s.piece]);
      ASSERT_GT(s.local_end, s.local_begin);
      ASSERT_LE(s.local_end, pc.local_end);
      if (s.local_end != pc.local_end) {
        ASSERT_EQ((s.local_end - pc.local_begin) % C, 0) << "chunk aligned";
      }
      piece_at[s.piece] = s.local_end;
      maxseg = std::max(maxseg, ++per_piece[s.piece]);
    }
    for (size_t i = 0; i < rp.pieces.size(); ++i) ASSERT_EQ(piece_at[i], rp.pieces[i].local_end) << "segments cover";
    ASSERT_EQ(rp.P, std::max(1, maxseg));
  }
  ASSERT_EQ(at, row.total_tokens());
  for (auto c : covered) ASSERT_EQ(c, 1) << "every token covered exactly once";
}
}  // namespace

TEST(SegmentPlan, InvariantsOverManyShapes) {
  std::mt19937 rng(7);
  int planned = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int nseq = 1 + int(rng() % 6);
    std::vector<int64_t> lens;
    for (int s = 0; s < nseq; ++s) lens.push_back(rng() % 5 == 0 ? 0 : int64_t(rng() % 3000));
    int64_t T = 0;
    for (auto l : lens) T += l;
    const int W = 1 + int(rng() % 8);
    lens.back() += (W - T % W) % W + (T == 0 ? W : 0);
    RowConfig row = row_of(lens, W, 1 + int(rng() % 8), rng() % 2 ? 64 : 128);
    for (const char* dev : {"h200", "cpu"}) {
      SegmentPlan plan = make_plan(row, {0, dev, 0, 0});
      check_invariants(row, plan);
      // Deterministic: the same request gives the same plan.
      EXPECT_EQ(plan.fingerprint, make_plan(row, {0, dev, 0, 0}).fingerprint);
      ++planned;
    }
  }
  EXPECT_EQ(planned, 800);
}

TEST(SegmentPlan, ShortRanksPlanOneSegment) {
  // 8 ranks of 512 tokens (8 chunks) cannot reach 16 chunks per segment on an H200.
  auto plan = make_plan(row_of({4096}, 8, 1), {0, "h200", 0, 0});
  for (const auto& rp : plan.ranks) EXPECT_EQ(rp.P, 1);
  // One rank of 64K tokens with HV = 1 fills 132 SMs with V tiles of 64: P = min(132/1, 1024/16) = 64.
  auto big = make_plan(row_of({65536}, 1, 1), {0, "h200", 0, 0});
  EXPECT_EQ(big.ranks[0].P, 64);
  // HV = 12, V = 128: 24 blocks per segment -> P = 5 on 132 SMs, 6 on 148 SMs.
  EXPECT_EQ(make_plan(row_of({65536}, 8, 12, 128), {0, "h200", 0, 0}).ranks[0].P, 5);
  EXPECT_EQ(make_plan(row_of({65536}, 8, 12, 128), {0, "b200", 0, 0}).ranks[0].P, 6);
  EXPECT_EQ(make_plan(row_of({65536}, 8, 12, 128), {0, "h200", 148, 0}).ranks[0].P, 6) << "--sm-count overrides";
}

TEST(SegmentPlan, PiecesAndLinks) {
  // cu = [0, 5, 12], W = 3 ranks of 4 tokens (docs/algorithm.md 6.2 test_cp_context): rank 1 holds
  // [4, 8) = the tail of seq 0 (1 token) and the head of seq 1 (3 tokens).
  auto plan = make_plan(row_of({5, 7}, 3), {0, "h200", 0, 0});
  const auto& r1 = plan.ranks[1];
  ASSERT_EQ(r1.pieces.size(), 2u);
  EXPECT_EQ(r1.pieces[0].length(), 1);
  EXPECT_TRUE(r1.pieces[0].from_prev_rank);
  EXPECT_TRUE(r1.pieces[1].to_next_rank);
  EXPECT_EQ(r1.pre_ranks, 1);
  EXPECT_EQ(r1.post_ranks, 1);
  EXPECT_EQ(plan.ranks[0].pre_ranks, 0);
  EXPECT_EQ(plan.ranks[2].post_ranks, 0);
  // A zero-length sequence is an empty piece with no segments on the rank where it starts.
  auto z = make_plan(row_of({64, 0, 64}, 2), {0, "h200", 0, 0});
  ASSERT_EQ(z.ranks[1].pieces.size(), 2u);
  EXPECT_EQ(z.ranks[1].pieces[0].length(), 0);
  EXPECT_EQ(z.ranks[1].segments.size(), 1u);
  // A piece shorter than one chunk, and W larger than the number of chunks.
  auto tiny = make_plan(row_of({24}, 8), {0, "cpu", 0, 0});
  for (const auto& rp : tiny.ranks) {
    EXPECT_EQ(rp.tokens(), 3);
    EXPECT_EQ(rp.segments.size(), 1u);
  }
  check_invariants(row_of({24}, 8), tiny);
}

TEST(SegmentPlan, ForcedP) {
  auto row = row_of({2048}, 2);
  auto forced = make_plan(row, {0, "h200", 0, 3});
  for (const auto& rp : forced.ranks) {
    EXPECT_EQ(rp.P, 3);
    EXPECT_EQ(rp.planned_P, 1);
  }
  check_invariants(row, forced);
  // 1024 tokens per rank = 16 chunks: P = 17 cannot be taken.
  EXPECT_THROW(make_plan(row, {0, "h200", 0, 17}), ConfigError);
  // Eligibility: the seed's rule skips rows where a rank plans P > 1.
  row.forms.forced_rule = ForcedRule::AllRanksPlanP1;
  EXPECT_EQ(forced_p_skip_reason(row, make_plan(row, {0, "h200", 0, 0}), 2), "");
  auto uneven = row_of({4096}, 2);
  uneven.rank_tokens = {3584, 512};
  auto up = make_plan(uneven, {0, "cpu", 0, 0});
  EXPECT_GT(up.ranks[0].P, 1);
  EXPECT_EQ(up.ranks[1].tokens(), 512);
  EXPECT_NE(forced_p_skip_reason(uneven, up, 2).find("rank 0 plans P"), std::string::npos);
  uneven.forms.forced_rule = ForcedRule::Always;
  EXPECT_EQ(forced_p_skip_reason(uneven, up, 2), "");
}

TEST(SegmentPlan, Errors) {
  EXPECT_THROW(make_plan(row_of({7}, 8), {0, "h200", 0, 0}), ConfigError);    // W > tokens
  EXPECT_THROW(make_plan(row_of({100}, 3), {0, "h200", 0, 0}), ConfigError);  // not divisible
  EXPECT_THROW(make_plan(row_of({128}, 2), {0, "a100", 0, 0}), ConfigError);  // unknown class
}

// The planned P of every row the repository ships, on the row's own planning class (budgets
// are calibrated at the planned schedule): pinned, so a change of the planner's model (e.g.
// tying it to the kernels' tiling, kernels/api/tiles.h; see segment_plan.cpp) shows here.
TEST(SegmentPlan, ShippedRowsKeepTheirPlannedP) {
  struct Want {
    const char* file;
    const char* row;
    std::vector<int> P;  // planned_P per rank
  };
  const std::vector<Want> want = {
      {"configs/rows/int1.json", "A1", {4, 4}},
      {"configs/rows/int1.json", "A2", {4}},
      {"configs/rows/int1.json", "A3", {2, 2, 2, 2}},
      {"configs/rows/int1.json", "B1", {1, 1, 1, 2}},
      {"configs/rows/int1.json", "C1", {4, 1, 2}},
      {"configs/rows/int1.json", "C2", {1, 1}},
      {"configs/rows/int1.json", "D1", {2, 2}},
      {"configs/rows/int1.json", "E1", {2, 2}},
      {"configs/rows/int1.json", "F1", {1, 1, 1, 1}},
      {"configs/rows/int1.json", "KA1", {4, 4}},
      {"configs/rows/int1.json", "KB1", {2, 2, 1, 2}},
      {"configs/rows/int1.json", "KC1", {4, 1, 2}},
      {"configs/rows/int1.json", "KD1", {2, 2}},
      {"configs/rows/int1.json", "KE1", {2, 2}},
      {"configs/rows/int1.json", "KF1", {1, 1, 1, 1}},
      {"configs/rows/int1.json", "G1", {2, 2}},
      {"configs/rows/int1.json", "KG1", {2, 2}},
      {"configs/rows/int1.json", "W1", {4, 4, 4, 4}},
      {"configs/rows/int1.json", "KW1", {4, 3, 4}},
      {"configs/rows/int1.json", "H1", {1, 1}},
      {"configs/rows/int1.json", "L1", {4, 2, 3}},
      {"configs/rows/int1.json", "S1", {8, 8}},
      {"configs/rows/int1.json", "V1", {2, 2}},
      {"configs/rows/int1.json", "KV1", {2, 2}},
      {"configs/rows/int3.json", "A4", {2, 2, 2, 2, 2, 2, 2, 2}},
      {"configs/rows/int3.json", "A5", {2, 2, 2, 2, 2, 2, 2, 2}},
      {"configs/rows/int3.json", "B4", {1, 2, 2, 2, 1, 2, 2, 2}},
      {"configs/rows/int3.json", "C8", {2, 2, 2, 2, 2, 2, 1, 1}},
      {"configs/rows/int3.json", "D4", {2, 2, 2, 2, 2, 2, 2, 2}},
      {"configs/rows/int3.json", "D5", {5, 5, 5, 5, 5, 5, 5, 5}},
      {"configs/rows/int3.json", "E4", {2, 2, 2, 2, 2, 2, 2, 2}},
      {"configs/rows/int3.json", "F4", {2, 2, 2, 2, 2, 2, 2, 2}},
      {"configs/rows/int3.json", "KA4", {2, 2, 2, 2, 2, 2, 2, 2}},
      {"configs/rows/int3.json", "KB4", {2, 2, 2, 2, 2, 2, 1, 1}},
      {"configs/rows/int3.json", "KC8", {2, 2, 2, 2, 2, 2, 1, 1}},
      {"configs/rows/int3.json", "KD4", {2, 2, 2, 2, 2, 2, 2, 2}},
      {"configs/rows/int3.json", "KE4", {2, 2, 2, 2, 2, 2, 2, 2}},
      {"configs/rows/int4.json", "A8", {2, 2, 2, 2, 2, 2, 2, 2}},
      {"configs/rows/int4.json", "A9", {2, 2, 2, 2, 2, 2, 2, 2}},
      {"configs/rows/int4.json", "B8", {2, 2, 2, 2, 2, 2, 2, 2}},
      {"configs/rows/int4.json", "KA8", {2, 2, 2, 2, 2, 2, 2, 2}},
      {"configs/rows/int4.json", "KA9", {2, 2, 2, 2, 2, 2, 2, 2}},
      {"tests/gpu/bench_rows.json", "T1", {2}},
      {"tests/gpu/bench_rows.json", "T2", {2}},
  };
  std::map<std::string, RowSet> sets;
  for (const Want& w : want) {
    if (!sets.count(w.file)) sets[w.file] = load_row_set(std::string(KCP_TEST_SOURCE_DIR) + "/" + w.file);
    const RowSet& set = sets[w.file];
    const auto it = std::find_if(set.rows.begin(), set.rows.end(), [&](const RowConfig& r) { return r.name == w.row; });
    ASSERT_NE(it, set.rows.end()) << w.file << " " << w.row;
    PlanRequest req;
    if (!it->plan_device.empty()) req.device = it->plan_device;
    const SegmentPlan plan = make_plan(*it, req);
    std::vector<int> got;
    for (const RankPlan& rp : plan.ranks) got.push_back(rp.planned_P);
    EXPECT_EQ(got, w.P) << w.file << " row " << w.row;
  }
  size_t rows = 0;
  for (const auto& [file, set] : sets) rows += set.rows.size();
  EXPECT_EQ(rows, want.size()) << "a shipped row is not pinned here";
}

// The planner's v_tile comes from the kernels' tile width (kernels/api/tiles.h): 32 for V = 64,
// 64 for V = 128. For V = 128 its P is the kernels' one-wave P, 2 sm / (HV V / 32); for V = 64
// it is half of that (segment_plan.cpp says why it stays so).
TEST(SegmentPlan, VTileAndTheKernelsOneWaveModel) {
  EXPECT_EQ(make_plan(row_of({64 * 64}, 1, 4, 64), PlanRequest{}).v_tile, kernels::kStateWalkTileV);
  EXPECT_EQ(make_plan(row_of({64 * 64}, 1, 4, 128), PlanRequest{}).v_tile, 2 * kernels::kStateWalkTileV);
  for (const DeviceClass& dev : device_classes())
    for (int HV : {1, 2, 4, 8, 12, 32}) {
      const int64_t chunks = 1 << 20;  // long enough that only the occupancy model binds (below 64)
      auto one_wave = [&](int V) {
        const int64_t slots = int64_t(dev.sm_count) * kernels::kStateWalkBlocksPerSm;
        const int64_t blocks = int64_t(HV) * (V / kernels::kStateWalkTileV);
        return int(std::clamp<int64_t>(slots / blocks, 1, 64));
      };
      EXPECT_EQ(planned_segments(chunks, HV, 128, 64, dev), one_wave(128)) << dev.name << " HV " << HV;
      EXPECT_EQ(planned_segments(chunks, HV, 64, 32, dev),
                int(std::clamp<int64_t>(int64_t(dev.sm_count) / (2 * HV), 1, 64)))
          << dev.name << " HV " << HV;
      if (one_wave(64) < 64 && one_wave(64) > 1) {
        EXPECT_LT(planned_segments(chunks, HV, 64, 32, dev), one_wave(64)) << dev.name << " HV " << HV;
      }
    }
}

// Workspace sizes are computed with checked arithmetic: a shape whose sizes pass 2^63 - 1 bytes
// is refused naming the row and the size, never planned with a wrapped (negative or small) size.
TEST(SegmentPlan, WorkspaceSizesNeverWrap) {
  RowConfig row = row_of({int64_t(1) << 52}, 1, 1024, 128);
  row.K = 128;
  try {
    const SegmentPlan plan = make_plan(row, {0, "h200", 0, 0});
    FAIL() << "planned with a wrapped workspace of " << plan.ranks[0].workspace.total() << " bytes";
  } catch (const ConfigError& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "row P1: rank 0's workspace (chunk_states) overflows 64-bit sizes (70368744177664 x 1024 x 128 x 128 x 2)"),
        std::string::npos)
        << e.what();
  }
  // Lengths that add up past 2^63 - 1 are refused, not wrapped to a small total.
  try {
    make_plan(row_of({INT64_MAX, INT64_MAX, 2}, 1), {0, "h200", 0, 0});
    FAIL() << "planned a row whose lengths wrap to 0";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("row P1: the sequence lengths add up past 9223372036854775807"),
              std::string::npos)
        << e.what();
  }
  // The largest sizes that fit are planned exactly.
  const SegmentPlan ok = make_plan(row_of({int64_t(1) << 30}, 1, 1024, 128), {0, "h200", 0, 0});
  EXPECT_EQ(ok.ranks[0].workspace.det_partials, (int64_t(1) << 30) * 1024 * 64 * 8);
  EXPECT_GT(ok.ranks[0].workspace.total(), 0);
}
