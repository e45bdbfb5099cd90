// The segment plan: the immutable result of planning one row for a world size W and a device
// class (docs/design.md sections 1 and 4; docs/algorithm.md sections 4.1 and 5).
//
// Invariants (tested in tests/unit/segment_plan_test.cpp):
//  * ranks own contiguous, disjoint token ranges that cover [0, T) exactly once;
//  * a rank's pieces are the parts of the global sequences it holds, in token order; chunking
//    restarts at every piece start (a piece is a local sequence), so chunk c of a piece covers
//    local tokens [begin + c*C, min(begin + (c+1)*C, end));
//  * only a rank's first piece can continue from earlier ranks and only its last piece can
//    continue into later ranks;
//  * segments cover every piece exactly once, in order, and every segment boundary inside a
//    piece lies on a chunk boundary of that piece; zero-length pieces have no segments.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "core/config/row_config.h"

namespace kcp {

// A device class for planning: what the planner needs to know about a GPU.
struct DeviceClass {
  std::string name;  // "h200"
  int sm_count = 132;
  int min_segment_chunks = 16;  // a segment is never shorter than this many chunks (merge cost)
};
// Known classes: h100, h200 (132 SMs), b200 (148), gb300 (152), cpu (the CPU twin's test class).
const std::vector<DeviceClass>& device_classes();
// Throws ConfigError naming the known classes when `name` is unknown.
DeviceClass device_class(const std::string& name);

struct Piece {
  int seq = 0;              // global sequence index
  int64_t local_begin = 0;  // local token range [local_begin, local_end)
  int64_t local_end = 0;
  int64_t global_begin = 0;     // the same range in global tokens
  int64_t seq_offset = 0;       // tokens of this sequence before the piece (on earlier ranks)
  bool from_prev_rank = false;  // the sequence started on an earlier rank
  bool to_next_rank = false;    // the sequence continues on a later rank
  int64_t length() const { return local_end - local_begin; }
};

struct Segment {
  int piece = 0;            // index into RankPlan::pieces
  int64_t local_begin = 0;  // local token range, chunk aligned within its piece
  int64_t local_end = 0;
  int index_in_piece = 0;
};

// Scratch sizes (bytes) per rank and package, so workspaces are allocated once per row.
struct WorkspaceSizes {
  int64_t segment_summaries = 0;  // (h_ext, M) per segment and value head, fp32
  int64_t transfer_planes = 0;    // M_seg^T per segment and value head, fp32 (full saved set)
  int64_t entry_states = 0;       // segment entry states, fp32
  int64_t chunk_states = 0;       // per-chunk states h, bf16
  int64_t det_partials = 0;       // fixed-order partial buffers of the det package
  int64_t total() const { return segment_summaries + transfer_planes + entry_states + chunk_states + det_partials; }
};

struct RankPlan {
  int rank = 0;
  int64_t global_begin = 0, global_end = 0;  // owned global token range
  std::vector<Piece> pieces;
  std::vector<Segment> segments;
  int P = 1;           // segments of the rank's longest piece (1 when nothing is split)
  int planned_P = 1;   // what the planner chose (== P unless a P was forced)
  int pre_ranks = 0;   // earlier ranks holding the first piece's sequence
  int post_ranks = 0;  // later ranks holding the last piece's sequence
  int64_t chunks = 0;  // chunks over all pieces
  WorkspaceSizes workspace;
  int64_t tokens() const { return global_end - global_begin; }
  // Segment s's first token and its end as positions p in its sequence (docs/algorithm.md 1.4:
  // its entry state is S_begin, its exit gradient dS_end).
  int64_t seq_begin(size_t s) const {
    const Segment& sg = segments[s];
    const Piece& pc = pieces[static_cast<size_t>(sg.piece)];
    return pc.seq_offset + (sg.local_begin - pc.local_begin);
  }
  int64_t seq_end(size_t s) const { return seq_begin(s) + (segments[s].local_end - segments[s].local_begin); }
};

struct SegmentPlan {
  std::string row;
  int world = 1;
  int chunk = 64;
  DeviceClass device;
  int v_tile = 64;   // V tile width of the state kernels (blocks per head = ceil(V / v_tile))
  int forced_P = 0;  // 0 = planned schedule
  std::vector<RankPlan> ranks;
  std::string fingerprint;  // SHA-256 of the plan's canonical description (workspaces check it)
};

struct PlanRequest {
  int world = 0;  // 0 = the row's world
  std::string device = "h200";
  int sm_count = 0;  // > 0 overrides the class's SM count
  int forced_P = 0;  // 0 = planned
};

// Plans a row. Throws ConfigError when the row cannot be planned as asked (W larger than the
// tokens allow, uneven rank lengths that do not add up, a forced P that a rank cannot take).
SegmentPlan make_plan(const RowConfig& row, const PlanRequest& req);

// Can this forced P run on this row (docs/design.md 6 and the row's forced_rule)? Empty = yes,
// otherwise the reason it is skipped.
std::string forced_p_skip_reason(const RowConfig& row, const SegmentPlan& planned, int forced_P);

// Can every rank take this forced P (its longest piece holds at least P chunks)? Empty = yes,
// otherwise the reason naming the first rank that cannot (no host or source location: it is
// stored in results as a skip reason).
std::string forced_p_unfit_reason(const SegmentPlan& planned, int forced_P);

// The planned P of one rank (exposed for tests and the README's explanation).
int planned_segments(int64_t longest_piece_chunks, int HV, int V, int v_tile, const DeviceClass& dev);

std::string describe(const SegmentPlan& plan);  // human-readable, one line per rank

// Adds the probe positions of a plan's segments (docs/algorithm.md 1.4) per sequence (probes has
// one set per sequence of seqlens): each segment's begin p > 0 and end p < len, over every rank;
// where h_entry and dh_exit are judged.
void add_probe_positions(const SegmentPlan& plan, const std::vector<int64_t>& seqlens,
                         std::vector<std::set<int64_t>>& probes);
}  // namespace kcp
