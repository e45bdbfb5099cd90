#include "core/kcp/fault_site.h"

#include <fmt/format.h>

#include <utility>

#include "core/util/error.h"

namespace kcp {

namespace {
const std::vector<std::pair<const char*, FaultKind>> kFaults = {
    {"none", FaultKind::None},
    {"drop-segment-entry", FaultKind::DropSegmentEntry},
    {"drop-rank-incoming", FaultKind::DropRankIncoming},
    {"skip-output-tile", FaultKind::SkipOutputTile},
    {"saved-to-other-package", FaultKind::SavedToOtherPackage},
    {"workspace-of-other-package", FaultKind::WorkspaceOfOtherPackage},
    {"hang", FaultKind::Hang},
    {"nondeterministic-rerun", FaultKind::NondeterministicRerun}};
}  // namespace

std::string Fault::name() const {
  for (auto& [n, k] : kFaults)
    if (k == kind) return n;
  return "?";
}

FaultKind parse_fault(const std::string& name) {
  std::string known;
  for (auto& [n, k] : kFaults) {
    if (name == n) return k;
    known += (known.empty() ? "" : ", ") + std::string(n);
  }
  KCP_THROW(ConfigError, "--inject: unknown fault \"{}\" (known: {})", name, known);
}

std::vector<std::string> fault_names() {
  std::vector<std::string> v;
  for (auto& [n, k] : kFaults) v.push_back(n);
  return v;
}

std::string fault_skip_reason(const Fault& fault, const SegmentPlan& plan) { return place_fault(fault, plan).why; }

FaultSite place_fault(const Fault& fault, const SegmentPlan& plan) {
  FaultSite site;
  if (fault.kind == FaultKind::None) return site;
  // A rank the plan does not have is the reason, before any fault-specific one (rows of several
  // world sizes can share one --inject-rank, so this is a skip of the entry, not an error).
  const int W = static_cast<int>(plan.ranks.size());
  if (fault.rank >= W) {
    site.why =
        fmt::format("--inject-rank {} is not a rank of row {} (W = {}: ranks 0..{})", fault.rank, plan.row, W, W - 1);
    return site;
  }
  // The first rank (from the last) that can take the fault, and where in it.
  for (int q = static_cast<int>(plan.ranks.size()) - 1; q >= 0 && site.rank < 0; --q) {
    if (fault.rank >= 0 && q != fault.rank) continue;
    const RankPlan& rp = plan.ranks[q];
    switch (fault.kind) {
      case FaultKind::DropSegmentEntry:  // the first segment that starts after a cut inside a piece
        for (size_t s = 0; s < rp.segments.size(); ++s)
          if (rp.segments[s].index_in_piece > 0) {
            site = {q, static_cast<int>(s), rp.segments[s].local_begin, {}};
            break;
          }
        break;
      case FaultKind::DropRankIncoming:  // a rank whose first piece continues a sequence
        if (!rp.pieces.empty() && rp.pieces.front().from_prev_rank) site = {q, -1, 0, {}};
        break;
      case FaultKind::SkipOutputTile:  // the 64-token tile in the middle of the rank
        site = {q, -1, (rp.tokens() / 2) / 64 * 64, {}};
        break;
      case FaultKind::Hang:
      case FaultKind::NondeterministicRerun:
        site = {q, -1, 0, {}};
        break;
      default:  // none, and the cross-package faults (they apply to every rank's backward)
        return site;
    }
  }
  if (site.rank < 0 && fault.kind == FaultKind::DropSegmentEntry)
    site.why = "fault drop-segment-entry needs a rank that cuts a piece into segments; this plan has P = 1 there";
  if (site.rank < 0 && fault.kind == FaultKind::DropRankIncoming)
    site.why = "fault drop-rank-incoming needs a rank that continues a sequence from an earlier rank";
  if (site.rank < 0 && site.why.empty() &&
      fault.rank >= 0)  // unreachable for the placed kinds: every rank can take them
    site.why = fmt::format("fault {} cannot be placed on rank {}", fault.name(), fault.rank);
  return site;
}

}  // namespace kcp
