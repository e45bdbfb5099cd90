// The segment planner (docs/design.md 4; the split rules follow docs/algorithm.md 4.1 and 5).
//
// Why this P: the state recurrence runs one thread block per (value head, V tile, segment), and
// each block walks its segment's chunks one after another. With one segment, a rank keeps only
// HV * ceil(V / v_tile) blocks busy, far fewer than the SMs of an H200 when HV is small, and the
// walk is as long as the whole local sequence. Cutting the longest piece into P segments gives
// P times more blocks and a P times shorter walk, at the price of the segment summaries
// (h_ext, M: one extra K x (K + V) product per chunk) and a fold chain of length P in fp32.
// So P fills one wave of the device and no more:
//     P = floor(sm_count / (HV * ceil(V / v_tile)))        (at least 1, at most 64)
// and each segment keeps at least min_segment_chunks chunks (16 on GPUs: the summary cost is
// then amortised; the CPU test class uses 2 so small int1 shapes still split), so
//     P <= floor(chunks of the longest piece / min_segment_chunks).
// Every piece of the rank with enough chunks is cut into min(P, its chunks / min_segment_chunks)
// segments, as evenly as possible in whole chunks (the first pieces of the division get one more).
// A forced P cuts every piece into min(P, its chunks) segments and needs the rank's longest
// piece to have at least P chunks.
//
// The planner's v_tile and the kernels' real tiling (kernels/api/tiles.h). The CUDA walks run
// HV * V / kStateWalkTileV blocks per segment (32-column tiles) at kStateWalkBlocksPerSm = 2
// blocks per SM, so one wave of the device is P = 2 sm_count / (HV * V / 32). The planner's
// v_tile (64 for V > 64, else 32) gives that same P for V = 128, and half of it for V = 64 (it
// counts a V = 64 head's two 32-column blocks against one slot per SM). It is not tied to the
// kernels' one-wave P on purpose: that would change the planned P of int1 rows A2 (4 -> 6)
// and C2 (1 -> 2) on the cpu class, whose budgets are calibrated at the planned schedule (every
// other row of configs/rows/*.json and tests/gpu/bench_rows.json, on every class, would keep
// its P). The static_assert below makes a change of the kernels' tiling fail here, so the
// model is re-derived (and the budgets recalibrated) rather than silently drifting apart.
#include "core/plan/segment_plan.h"

#include <fmt/ranges.h>
#include <algorithm>
#include <initializer_list>
#include <nlohmann/json.hpp>

#include "core/util/error.h"
#include "core/util/sha256.h"
#include "kernels/api/tiles.h"

namespace kcp {

const std::vector<DeviceClass>& device_classes() {
  static const std::vector<DeviceClass> classes = {
      {"h100", 132, 16}, {"h200", 132, 16}, {"b200", 148, 16}, {"gb300", 152, 16}, {"cpu", 16, 2}};
  return classes;
}

DeviceClass device_class(const std::string& name) {
  std::string names;
  for (const auto& d : device_classes()) {
    if (d.name == name) return d;
    names += (names.empty() ? "" : ", ") + d.name;
  }
  KCP_THROW(ConfigError, "unknown device class \"{}\" (known: {}; or give --sm-count N)", name, names);
}

namespace {
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A workspace size in bytes, the product of `factors`, checked: a size past 2^63 - 1 is refused
// naming the row, the rank and the buffer instead of being planned (and printed) wrapped.
int64_t checked_size(const SegmentPlan& plan, int rank, const char* what, std::initializer_list<int64_t> factors) {
  int64_t n = 1;
  for (int64_t f : factors)
    KCP_REQUIRE(!__builtin_mul_overflow(n, f, &n),
                "row {}: rank {}'s workspace ({}) overflows 64-bit sizes ({}); use "
                "fewer tokens per rank or fewer heads",
                plan.row, rank, what, fmt::join(factors, " x "));
  return n;
}

// Cuts a piece of `chunks` chunks into `n` segments of whole chunks, as evenly as possible.
void cut_piece(const Piece& pc, int piece_index, int64_t chunk, int n, std::vector<Segment>& out) {
  const int64_t chunks = ceil_div(pc.length(), chunk);
  int64_t at = pc.local_begin;
  for (int s = 0; s < n; ++s) {
    const int64_t take = chunks / n + (s < chunks % n ? 1 : 0);
    const int64_t end = (s == n - 1) ? pc.local_end : at + take * chunk;
    out.push_back(Segment{piece_index, at, end, s});
    at = end;
  }
}
}  // namespace

int planned_segments(int64_t longest_chunks, int HV, int V, int v_tile, const DeviceClass& dev) {
  const int64_t blocks_per_segment = int64_t(HV) * ceil_div(V, v_tile);
  int64_t P = std::max<int64_t>(1, dev.sm_count / blocks_per_segment);
  P = std::min<int64_t>(P, longest_chunks / std::max(1, dev.min_segment_chunks));
  return static_cast<int>(std::clamp<int64_t>(P, 1, 64));
}

namespace {

// The plan's header: row, world, chunk, device class (with an SM override) and the walks' V tile.
SegmentPlan plan_header(const RowConfig& row, const PlanRequest& req) {
  SegmentPlan plan;
  plan.row = row.name;
  plan.world = req.world > 0 ? req.world : row.world;
  plan.chunk = row.chunk;
  plan.device = device_class(req.device);
  if (req.sm_count > 0) {
    plan.device.sm_count = req.sm_count;
    plan.device.name += fmt::format("@{}sm", req.sm_count);
  }
  static_assert(kernels::kStateWalkTileV == 32 && kernels::kStateWalkBlocksPerSm == 2,
                "the CUDA state walks' tiling changed: re-derive the planner's v_tile (see the top)");
  plan.v_tile = row.V > 64 ? 2 * kernels::kStateWalkTileV : kernels::kStateWalkTileV;
  plan.forced_P = req.forced_P;
  return plan;
}

// Rank token counts: explicit per-rank lengths (uneven rows) or an even split of T over W.
std::vector<int64_t> rank_lengths(const RowConfig& row, int W) {
  const int64_t T = row.total_tokens();
  KCP_REQUIRE(W >= 1, "row {}: world size must be >= 1, got {}", row.name, W);
  KCP_REQUIRE(T >= W, "row {}: W = {} is larger than the {} tokens allow", row.name, W, T);
  if (!row.rank_tokens.empty() && W == row.world) return row.rank_tokens;
  KCP_REQUIRE(T % W == 0, "row {}: total tokens {} are not divisible by W = {}", row.name, T, W);
  return std::vector<int64_t>(size_t(W), T / W);
}

// The rank's pieces: every sequence with a non-empty intersection; a zero-length sequence becomes
// an empty piece on the rank where it starts (it still has an initial and a final state).
void add_pieces(const RowConfig& row, const std::vector<int64_t>& seq_begin, bool last_rank, RankPlan& rp) {
  for (size_t s = 0; s < row.seqlens.size(); ++s) {
    const int64_t b = std::max(seq_begin[s], rp.global_begin), e = std::min(seq_begin[s + 1], rp.global_end);
    const bool empty_here = row.seqlens[s] == 0 && seq_begin[s] >= rp.global_begin &&
                            (seq_begin[s] < rp.global_end || (last_rank && seq_begin[s] == rp.global_end));
    if (b >= e && !empty_here) continue;
    Piece pc;
    pc.seq = static_cast<int>(s);
    pc.global_begin = empty_here ? seq_begin[s] : b;
    pc.local_begin = pc.global_begin - rp.global_begin;
    pc.local_end = empty_here ? pc.local_begin : e - rp.global_begin;
    pc.seq_offset = pc.global_begin - seq_begin[s];
    pc.from_prev_rank = !empty_here && seq_begin[s] < rp.global_begin;
    pc.to_next_rank = !empty_here && seq_begin[s + 1] > rp.global_end;
    rp.pieces.push_back(pc);
  }
}

// The rank's planned P and its segments: each piece cut into min(P, its chunks /
// min_segment_chunks) segments, or min(forced P, its chunks) under a forced P.
void add_segments(const RowConfig& row, const SegmentPlan& plan, int forced_P, RankPlan& rp) {
  int64_t longest = 0;
  for (const auto& pc : rp.pieces) {
    rp.chunks += ceil_div(pc.length(), plan.chunk);
    longest = std::max(longest, ceil_div(pc.length(), plan.chunk));
  }
  rp.planned_P = planned_segments(longest, row.HV, row.V, plan.v_tile, plan.device);
  if (forced_P > 0) {
    KCP_REQUIRE(longest >= forced_P,
                "row {}: rank {} cannot take forced P = {}: its longest piece has only {} chunk(s)", row.name, rp.rank,
                forced_P, longest);
  }
  rp.P = 1;
  for (size_t i = 0; i < rp.pieces.size(); ++i) {
    const auto& pc = rp.pieces[i];
    const int64_t nc = ceil_div(pc.length(), plan.chunk);
    if (nc == 0) continue;
    int64_t n = forced_P > 0 ? std::min<int64_t>(forced_P, nc)
                             : std::clamp<int64_t>(nc / std::max(1, plan.device.min_segment_chunks), 1, rp.planned_P);
    cut_piece(pc, static_cast<int>(i), plan.chunk, static_cast<int>(n), rp.segments);
    rp.P = std::max<int>(rp.P, static_cast<int>(n));
  }
}

// Links between ranks: how many earlier ranks share the first piece's sequence, how many later
// ranks share the last piece's sequence (docs/algorithm.md 4.1 pre_num_ranks / post_num_ranks).
void link_ranks(SegmentPlan& plan) {
  const int W = static_cast<int>(plan.ranks.size());
  for (int r = 0; r < W; ++r) {
    auto& rp = plan.ranks[r];
    if (rp.pieces.empty()) continue;
    const int first_seq = rp.pieces.front().seq, last_seq = rp.pieces.back().seq;
    for (int q = r - 1; q >= 0 && !plan.ranks[q].pieces.empty() && plan.ranks[q].pieces.back().seq == first_seq &&
                        rp.pieces.front().from_prev_rank;
         --q)
      ++rp.pre_ranks;
    for (int q = r + 1; q < W && !plan.ranks[q].pieces.empty() && plan.ranks[q].pieces.front().seq == last_seq &&
                        rp.pieces.back().to_next_rank;
         ++q)
      ++rp.post_ranks;
  }
}

// Workspace sizes (bytes) per rank; they size the allocations made once per row.
void size_workspaces(const RowConfig& row, SegmentPlan& plan) {
  const int64_t HV = row.HV, K = row.K, V = row.V;
  for (auto& rp : plan.ranks) {
    const int64_t nseg = static_cast<int64_t>(rp.segments.size());
    WorkspaceSizes& ws = rp.workspace;
    ws.segment_summaries = checked_size(plan, rp.rank, "segment_summaries", {nseg, HV, K, K + V, 4});
    ws.transfer_planes = checked_size(plan, rp.rank, "transfer_planes", {nseg, HV, K, K, 4});
    ws.entry_states = checked_size(plan, rp.rank, "entry_states", {nseg, HV, K, V, 4});
    ws.chunk_states = checked_size(plan, rp.rank, "chunk_states", {rp.chunks, HV, K, V, 2});
    // per-value-head dq/dk before the GVA sum
    ws.det_partials = checked_size(plan, rp.rank, "det_partials", {rp.tokens(), HV, K, 4, 2});
    int64_t total = 0;
    for (int64_t part : {ws.segment_summaries, ws.transfer_planes, ws.entry_states, ws.chunk_states, ws.det_partials})
      KCP_REQUIRE(!__builtin_add_overflow(total, part, &total),
                  "row {}: rank {}'s workspace total overflows 64-bit sizes; use fewer tokens per rank or fewer heads",
                  plan.row, rp.rank);
  }
}

// The first 16 hex digits of sha256 over the row, world, chunk, V tile and every rank's range and
// segments.
std::string plan_fingerprint(const SegmentPlan& plan) {
  nlohmann::json fp = nlohmann::json::object();
  fp["row"] = plan.row;
  fp["world"] = plan.world;
  fp["chunk"] = plan.chunk;
  fp["v_tile"] = plan.v_tile;
  auto& ranks = fp["ranks"] = nlohmann::json::array();
  for (const auto& rp : plan.ranks) {
    nlohmann::json segs = nlohmann::json::array();
    for (const auto& s : rp.segments) segs.push_back({s.piece, s.local_begin, s.local_end});
    ranks.push_back({{"range", {rp.global_begin, rp.global_end}}, {"segments", segs}});
  }
  return sha256_hex(fp.dump()).substr(0, 16);
}

}  // namespace

SegmentPlan make_plan(const RowConfig& row, const PlanRequest& req) {
  SegmentPlan plan = plan_header(row, req);
  const int W = plan.world;
  const std::vector<int64_t> lens = rank_lengths(row, W);
  std::vector<int64_t> seq_begin(row.seqlens.size() + 1, 0);
  for (size_t s = 0; s < row.seqlens.size(); ++s) seq_begin[s + 1] = seq_begin[s] + row.seqlens[s];
  int64_t at = 0;
  for (int r = 0; r < W; ++r) {
    RankPlan rp;
    rp.rank = r;
    rp.global_begin = at;
    rp.global_end = at + lens[size_t(r)];
    at = rp.global_end;
    add_pieces(row, seq_begin, r == W - 1, rp);
    add_segments(row, plan, req.forced_P, rp);
    plan.ranks.push_back(std::move(rp));
  }
  link_ranks(plan);
  size_workspaces(row, plan);
  plan.fingerprint = plan_fingerprint(plan);
  return plan;
}

std::string forced_p_skip_reason(const RowConfig& row, const SegmentPlan& planned, int forced_P) {
  if (row.forms.forced_rule == ForcedRule::AllRanksPlanP1) {
    for (const auto& rp : planned.ranks)
      if (rp.P != 1)
        return fmt::format(
            "forced P = {} runs only where every rank plans P = 1 (rule all_ranks_plan_p1); rank {} "
            "plans P = {} on {}",
            forced_P, rp.rank, rp.P, planned.device.name);
  }
  return {};
}

std::string forced_p_unfit_reason(const SegmentPlan& planned, int forced_P) {
  for (const auto& rp : planned.ranks) {
    int64_t longest = 0;
    for (const auto& pc : rp.pieces) longest = std::max(longest, ceil_div(pc.length(), planned.chunk));
    if (longest < forced_P)
      return fmt::format("rank {} cannot take forced P = {}: its longest piece has only {} chunk(s)", rp.rank, forced_P,
                         longest);
  }
  return {};
}

std::string describe(const SegmentPlan& plan) {
  std::string s =
      fmt::format("row {} W={} device={} ({} SMs, min {} chunks/segment) v_tile={}{} fingerprint {}\n", plan.row,
                  plan.world, plan.device.name, plan.device.sm_count, plan.device.min_segment_chunks, plan.v_tile,
                  plan.forced_P ? fmt::format(" forced P={}", plan.forced_P) : "", plan.fingerprint);
  for (const auto& rp : plan.ranks) {
    s += fmt::format(
        "  rank {:>2}: tokens [{}, {}) pieces {} chunks {} P {} (planned {}) pre {} post {} ws {:.1f} MiB\n", rp.rank,
        rp.global_begin, rp.global_end, rp.pieces.size(), rp.chunks, rp.P, rp.planned_P, rp.pre_ranks, rp.post_ranks,
        double(rp.workspace.total()) / (1 << 20));
  }
  return s;
}

void add_probe_positions(const SegmentPlan& plan, const std::vector<int64_t>& seqlens,
                         std::vector<std::set<int64_t>>& probes) {
  for (const RankPlan& rp : plan.ranks)
    for (size_t q = 0; q < rp.segments.size(); ++q) {
      const size_t seq = static_cast<size_t>(rp.pieces[static_cast<size_t>(rp.segments[q].piece)].seq);
      if (rp.seq_begin(q) > 0) probes.at(seq).insert(rp.seq_begin(q));
      if (rp.seq_end(q) < seqlens.at(seq)) probes.at(seq).insert(rp.seq_end(q));
    }
}

}  // namespace kcp
