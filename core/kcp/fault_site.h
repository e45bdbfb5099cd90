// Faults injected on purpose (--inject), to prove that the harness catches them, and where one
// lands in a plan: which rank, which segment or token. One function decides it, so the engine
// applies the fault (through core/kcp/fault_backend.h) and the runner records a skip from the
// same rule. The rank is --inject-rank, else the last rank that can take the fault.
#pragma once

#include <cstdint>
#include <string>

#include <vector>

#include "core/plan/segment_plan.h"

namespace kcp {

enum class FaultKind {
  None,
  DropSegmentEntry,         // one segment's entry state replaced by zeros (the first segment after a cut)
  DropRankIncoming,         // one rank's incoming state from earlier ranks replaced by zeros
  SkipOutputTile,           // one 64-token x 1-head tile of o left unwritten (still NaN-poisoned)
  SavedToOtherPackage,      // the forward's saved set handed to the other package's backward
  WorkspaceOfOtherPackage,  // the backward given a workspace tagged with the other package
  Hang,                     // one rank never reaches the forward exchange (tests the deadline)
  NondeterministicRerun     // one rank's o differs by one ulp on every second run (the det checks)
};
struct Fault {
  FaultKind kind = FaultKind::None;
  int rank = -1;  // -1: the engine picks (the last rank that can take the fault)
  std::string name() const;
};
FaultKind parse_fault(const std::string& name);  // throws ConfigError naming the known faults
// The package-mismatch faults: every rank hands its backward a saved set or workspace of the other
// package, and the backend's contract is to refuse it (the entry's status is "refused"; a backend
// that runs it instead has broken the contract: "contract_broken").
inline bool is_package_mismatch(FaultKind k) {
  return k == FaultKind::SavedToOtherPackage || k == FaultKind::WorkspaceOfOtherPackage;
}
std::vector<std::string> fault_names();

struct FaultSite {
  int rank = -1;             // the rank that takes the fault (-1: none can; see why)
  int segment = -1;          // DropSegmentEntry: the rank-local segment whose entry state is zeroed
  int64_t local_token = -1;  // the local token where the fault starts (segment begin, tile begin, 0)
  std::string why;           // when rank < 0: why the plan cannot take this fault
};

FaultSite place_fault(const Fault& fault, const SegmentPlan& plan);
// Empty when the fault can be injected into this plan, else why not (the entry is then skipped:
// e.g. drop-segment-entry needs a rank that cuts a piece, drop-rank-incoming a rank that
// continues a sequence).
std::string fault_skip_reason(const Fault& fault, const SegmentPlan& plan);

}  // namespace kcp
