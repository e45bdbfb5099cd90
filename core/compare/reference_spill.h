// A rank's slice of the FP64 reference (core/compare/compare.h RankReference) kept in an unlinked
// temporary file while the forms run, and read back for each judging: on an int3 row the slices
// of all ranks take as much as the whole FP64 reference (6.2 GiB on A4), which the ranks' form
// arrays need while a form runs (core/plan/memory_estimate.h). The file lies in $TMPDIR (else
// /tmp), has no name (O_TMPFILE, or removed right after it is made) and goes with the object.
// The values read back are the bits written.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/compare/compare.h"

namespace kcp {

class ReferenceSpill {
 public:
  ReferenceSpill();  // throws ApiError naming the folder when no file can be made there
  ~ReferenceSpill();
  ReferenceSpill(const ReferenceSpill&) = delete;
  ReferenceSpill& operator=(const ReferenceSpill&) = delete;

  // Writes `v` as tensor t's reference and frees it (ApiError when the write fails: disk full).
  void put(ResultTensor t, std::vector<double>& v);
  // Every tensor put, read back (thread-safe: positioned reads).
  RankReference load() const;
  int64_t bytes() const { return end_; }
  const std::string& folder() const { return dir_; }

 private:
  int fd_ = -1;
  std::string dir_;
  std::array<int64_t, kResultTensorCount> offset_{}, count_{};
  std::array<bool, kResultTensorCount> has_{};
  int64_t end_ = 0;
};

}  // namespace kcp
