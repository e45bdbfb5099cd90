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

// The folder spill files go to: $TMPDIR, else /tmp.
std::string reference_spill_folder();

class ReferenceSpill {
 public:
  ReferenceSpill();  // throws ApiError naming the folder when no file can be made there
  ~ReferenceSpill();
  ReferenceSpill(const ReferenceSpill&) = delete;
  ReferenceSpill& operator=(const ReferenceSpill&) = delete;

  // Writes `v` as tensor t's reference and frees it (ApiError when the write fails: disk full).
  void put(ResultTensor t, std::vector<double>& v);
  // Writes `v` as heads [first, first + count) of tensor t, a tensor of `rows` rows of `heads`
  // heads of `width` elements (v: [rows, count, width]), and frees it: the FP64 reference made
  // one group of heads at a time. A tensor is whole once every head is put.
  void put_part(ResultTensor t, std::vector<double>& v, int64_t rows, int64_t heads, int64_t width, int64_t first,
                int64_t count);
  // Tensor t read back ([rows, heads, width] from its parts; empty when never put; thread-safe).
  std::vector<double> load_tensor(ResultTensor t) const;
  // Heads [at.first, at.first + at.count) of tensor t, a tensor of at.rows x at.heads x at.width,
  // read back as [rows, count, width] (a form judged one group of heads at a time: core/kcp/
  // head_group_run.h), whether it was put whole or by parts; the parts' rows are read in blocks of
  // at most kReadBlockBytes. Empty when never put; thread-safe.
  std::vector<double> load_part(ResultTensor t, const HeadPart& at) const;
  static constexpr int64_t kReadBlockBytes = int64_t(8) << 20;
  // Every tensor put, read back (thread-safe: positioned reads).
  RankReference load() const;
  int64_t bytes() const { return end_; }
  const std::string& folder() const { return dir_; }

 private:
  struct Part {
    int64_t first = 0, count = 0, offset = 0;  // heads and where they lie in the file
  };
  struct Layout {
    int64_t rows = 0, heads = 0, width = 0;
    std::vector<Part> parts;
  };
  void write_at(const std::vector<double>& v, int64_t at) const;
  void read_at(double* p, int64_t n, int64_t at) const;
  int fd_ = -1;
  std::string dir_;
  std::array<Layout, kResultTensorCount> layout_{};
  int64_t end_ = 0;
};

}  // namespace kcp
