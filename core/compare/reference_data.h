// The FP64 reference of a row, per sequence (docs/design.md 3 step 5). Each sequence is its own
// reference problem, so a rank computes only the sequences its tokens touch, and the threads
// of one process (the local launch mode) share one computation per sequence through
// ReferenceCache. Results are cached on disk by row digest and seed (a cache directory of
// binary files; sequences over 256 MiB of results are not stored). Each file carries the key it
// was made for and a checksum of its contents: a file of another key, cut short or damaged is
// recomputed and rewritten with one warning line naming it and why. A cache folder that cannot be
// created or written gets one warning line per process and the run goes on without a cache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config/row_config.h"
#include "core/kcp/rank_result.h"

namespace kcp {

struct SequenceReference {
  int seq = 0;
  int64_t t_begin = 0, t_end = 0;                // global tokens of the sequence
  std::vector<double> o, dq, dk, dv, dg, dbeta;  // [len, ...] token-major
  std::vector<double> ht, dh0;                   // [HV, K, V]
  std::vector<double> dA_log, ddt_bias;          // this sequence's contribution
  // The field of a result tensor (core/kcp/rank_result.h), by the table's names.
  const std::vector<double>& operator[](ResultTensor t) const {
    switch (t) {
#define KCP_X(name, place, heads, width) \
  case ResultTensor::name:               \
    return name;
      KCP_RESULT_TENSORS(KCP_X)
#undef KCP_X
    }
    return o;
  }
};

class ReferenceCache {
 public:
  // cache_dir empty: no disk cache. threads: FP64 reference threads per computation.
  ReferenceCache(const RowConfig& row, std::string digest, std::string cache_dir, int threads);
  ~ReferenceCache();
  // Thread-safe; computes (or loads) a sequence once and shares it.
  std::shared_ptr<const SequenceReference> get(int seq);
  double compute_seconds() const;  // total time spent computing (not loading)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kcp
