// How many groups of q/k heads the forms of a row run in (core/kcp/head_group_run.h), from its
// memory estimate (core/plan/memory_estimate.h): `run` and `calibrate` choose it for every row
// before any row runs, `plan` prints it. The plan (segments, P per rank) is the whole row's
// whatever the groups: only the memory changes.
#pragma once

#include <cstdint>

#include "core/plan/memory_estimate.h"

namespace kcp {

struct HeadGroupChoice {
  int groups = 1;           // a divisor of H
  MemoryEstimate estimate;  // of the row with that many groups
  bool fits = true;         // the estimate is within host_avail and device_avail
  // The reference spill the estimate assumes (req.reference_spill_bytes, with kReferenceSpillAuto
  // resolved: -1 kept in memory, or kReferenceSpillBytes).
  int64_t reference_spill_bytes = kReferenceSpillBytes;
  bool keep_inputs = false;  // the estimate keeps the rank's input shard across forms (MemoryRequest)
  // The FP64 reference's groups of heads the estimate assumes (MemoryRequest::reference_group_bytes;
  // a byte count where auto was widened for the reference's threads).
  int64_t reference_group_bytes = kReferenceGroupAuto;
};

// group_bytes (RunOptions::head_group_bytes):
//   kHeadGroupNever: 1 group;
//   kHeadGroupAuto: 1 group when the row fits, else the fewest groups (a divisor of H) with
//     which it fits; H groups (the least memory) with fits false when no count fits;
//   B >= 0: the fewest groups whose largest rank's form arrays take at most B (0: H groups).
// host_avail / device_avail: bytes at hand (<= 0: no limit). req.head_groups is ignored.
// req.reference_spill_bytes kReferenceSpillAuto: the slices are kept in memory when host_avail is
// known (> 0) and the row fits 90% of it that way in no more groups than with spilled slices, or
// when the spilled slices would pass spill_room (> 0: the disk's room) and the kept ones fit
// host_avail in more groups; else they spill (kReferenceSpillBytes). req.reference_group_bytes
// kReferenceGroupAuto with a known host_avail: the reference runs in the fewest groups of heads,
// from reference_groups_for_threads up to auto's (kReferenceGroupBytes of results each), with
// which the row still fits 90% of host_avail with the same groups, spill and inputs choice;
// reference_group_bytes says which (a byte count, or kReferenceGroupAuto for auto's own). may_keep_inputs: with
// one group of heads and a known host_avail, the rank's input shard is kept across the row's forms (drawn once, not
// once a form) when the row still fits 90% of host_avail that way. Throws ConfigError as estimate_memory does.
HeadGroupChoice choose_head_groups(const RowConfig& row, MemoryRequest req, int64_t group_bytes, int64_t host_avail,
                                   int64_t device_avail, bool may_keep_inputs = false, int64_t spill_room = 0);

}  // namespace kcp
