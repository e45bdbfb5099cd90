// Where an injected fault (--inject) lands in a plan: which rank, which segment or token. One
// function decides it, so the engine applies the fault and the runner records a skip from the
// same rule. The rank is --inject-rank, else the last rank that can take the fault.
#pragma once

#include <cstdint>
#include <string>

#include "core/kcp/kcp_engine.h"

namespace kcp {

struct FaultSite {
  int rank = -1;             // the rank that takes the fault (-1: none can; see why)
  int segment = -1;          // DropSegmentEntry: the rank-local segment whose entry state is zeroed
  int64_t local_token = -1;  // the local token where the fault starts (segment begin, tile begin, 0)
  std::string why;           // when rank < 0: why the plan cannot take this fault
};

FaultSite place_fault(const Fault& fault, const SegmentPlan& plan);

}  // namespace kcp
