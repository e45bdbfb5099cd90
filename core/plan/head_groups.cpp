#include "core/plan/head_groups.h"

#include <algorithm>

namespace kcp {

namespace {

int64_t largest_form(const MemoryEstimate& e) {
  int64_t most = 0;
  for (const RankMemory& r : e.ranks) most = std::max(most, r.form_arrays);
  return most;
}

bool within(const MemoryEstimate& e, int64_t host_avail, int64_t device_avail) {
  return (host_avail <= 0 || e.host_bytes <= host_avail) && (device_avail <= 0 || e.device_bytes <= device_avail);
}

}  // namespace

namespace {

HeadGroupChoice choose_for_spill(const RowConfig& row, MemoryRequest req, int64_t group_bytes, int64_t host_avail,
                                 int64_t device_avail) {
  HeadGroupChoice c;
  c.reference_spill_bytes = req.reference_spill_bytes;
  for (int n = 1; n <= row.H; ++n) {
    if (row.H % n != 0) continue;
    req.head_groups = n;
    c.groups = n;
    c.estimate = estimate_memory(row, req);
    c.fits = within(c.estimate, host_avail, device_avail);
    if (group_bytes == kHeadGroupNever) return c;
    if (group_bytes == kHeadGroupAuto ? c.fits : largest_form(c.estimate) <= group_bytes) return c;
  }
  return c;  // H groups: the least memory
}

// The host memory a kept choice (slices or shard in memory) may use: 90% of what is at hand, so
// that it never takes the last of it where spilling, or drawing again, was the safe way.
int64_t keep_room(int64_t host_avail) { return host_avail / 10 * 9; }

HeadGroupChoice choose_groups_and_spill(const RowConfig& row, MemoryRequest req, int64_t group_bytes,
                                        int64_t host_avail, int64_t device_avail, int64_t spill_room) {
  if (req.reference_spill_bytes != kReferenceSpillAuto)
    return choose_for_spill(row, req, group_bytes, host_avail, device_avail);
  req.reference_spill_bytes = kReferenceSpillBytes;
  HeadGroupChoice spilled = choose_for_spill(row, req, group_bytes, host_avail, device_avail);
  if (host_avail <= 0) return spilled;
  req.reference_spill_bytes = -1;
  HeadGroupChoice kept = choose_for_spill(row, req, group_bytes, keep_room(host_avail), device_avail);
  if (kept.fits && kept.groups <= spilled.groups) return kept;
  // Spilled slices that the disk cannot hold: kept ones in more groups of heads, where they fit.
  if (spill_room > 0 && spilled_reference_bytes(spilled.estimate) > spill_room) {
    kept = choose_for_spill(row, req, group_bytes, host_avail, device_avail);
    if (kept.fits) return kept;
  }
  return spilled;
}

}  // namespace

namespace {

HeadGroupChoice choose_with_inputs(const RowConfig& row, MemoryRequest req, int64_t group_bytes, int64_t host_avail,
                                   int64_t device_avail, bool may_keep_inputs, int64_t spill_room) {
  req.keep_inputs = false;
  HeadGroupChoice c = choose_groups_and_spill(row, req, group_bytes, host_avail, device_avail, spill_room);
  if (!may_keep_inputs || c.groups != 1 || host_avail <= 0 || !c.fits) return c;
  req.head_groups = 1;
  req.reference_spill_bytes = c.reference_spill_bytes;
  req.keep_inputs = true;
  MemoryEstimate e = estimate_memory(row, req);
  if (!within(e, keep_room(host_avail), device_avail)) return c;
  c.estimate = std::move(e);
  c.keep_inputs = true;
  return c;
}

}  // namespace

HeadGroupChoice choose_head_groups(const RowConfig& row, MemoryRequest req, int64_t group_bytes, int64_t host_avail,
                                   int64_t device_avail, bool may_keep_inputs, int64_t spill_room) {
  const auto choose = [&](const MemoryRequest& r) {
    return choose_with_inputs(row, r, group_bytes, host_avail, device_avail, may_keep_inputs, spill_room);
  };
  const HeadGroupChoice narrow = choose(req);
  if (req.reference_group_bytes != kReferenceGroupAuto || host_avail <= 0) return narrow;
  // auto on a host of known memory: the FP64 reference in the widest groups, from as wide as its
  // threads need down to kReferenceGroupBytes, that keep every other choice and fit 90% of the host.
  for (int n = reference_groups_for_threads(row, req.reference_threads); n < narrow.estimate.reference_groups; ++n) {
    if (row.H % n != 0) continue;
    req.reference_group_bytes = reference_group_bytes_for(row, n);
    HeadGroupChoice w = choose(req);
    if (w.fits && within(w.estimate, keep_room(host_avail), device_avail) && w.groups == narrow.groups &&
        w.reference_spill_bytes == narrow.reference_spill_bytes && w.keep_inputs == narrow.keep_inputs) {
      w.reference_group_bytes = req.reference_group_bytes;
      return w;
    }
  }
  return narrow;
}

}  // namespace kcp
