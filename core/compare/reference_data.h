// The FP64 reference of a row, per sequence (docs/design.md 3 step 5). Each sequence is its own
// reference problem, so a rank computes only the sequences its tokens touch, and the threads
// of one process (the local launch mode) share one computation per sequence through
// ReferenceCache. Results are cached on disk by row digest and seed (a cache directory of
// binary files; sequences over 256 MiB of results are not stored). Each file carries the key it
// was made for (probe positions included) and a checksum of its contents: a file of another key, cut short or damaged
// is recomputed and rewritten with one warning line naming it and why. A cache folder that cannot be created or written
// gets one warning line per process and the run goes on without a cache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config/row_config.h"
#include "core/inputs/inputs.h"
#include "core/kcp/rank_result.h"

namespace kcp {

struct SequenceReference {
  int seq = 0;
  int64_t t_begin = 0, t_end = 0;                // global tokens of the sequence
  std::vector<double> o, dq, dk, dv, dg, dbeta;  // [len, ...] token-major
  std::vector<double> ht, dh0;                   // [HV, K, V]
  std::vector<double> dA_log, ddt_bias;          // this sequence's contribution
  // Probes (docs/algorithm.md 1.4): positions p in the sequence, ascending, and S_p, dS_p at each
  // ([n_probes, HV, K, V]); the reference of the Boundary tensors (h_entry, dh_exit).
  std::vector<int64_t> probes;
  std::vector<double> probe_S, probe_dS;
  // The heads computed (core/inputs/inputs.h): every per-head field holds only these, packed
  // (head_range_row's shape); count 0 = every head.
  HeadRange heads;
  // The field of a result tensor (core/kcp/rank_result.h), by the table's names; a Boundary
  // tensor's is its probe field.
  const std::vector<double>& operator[](ResultTensor t) const {
    switch (t) {
#define KCP_REF_FIELD_Token(name) name
#define KCP_REF_FIELD_State(name) name
#define KCP_REF_FIELD_Param(name) name
#define KCP_REF_FIELD_Boundary(name) (ResultTensor::name == ResultTensor::h_entry ? probe_S : probe_dS)
#define KCP_X(name, place, heads, width) \
  case ResultTensor::name:               \
    return KCP_REF_FIELD_##place(name);
      KCP_RESULT_TENSORS(KCP_X)
#undef KCP_X
#undef KCP_REF_FIELD_Token
#undef KCP_REF_FIELD_State
#undef KCP_REF_FIELD_Param
#undef KCP_REF_FIELD_Boundary
    }
    return o;
  }
  // Row i of probe_S / probe_dS for position p (one of `probes`); null when p is not probed.
  const double* probe_state(const std::vector<double>& field, int64_t p, int64_t state) const;
};

// Probe positions per sequence of a row (index: sequence; empty: none).
using ProbePositions = std::vector<std::vector<int64_t>>;

class ReferenceCache {
 public:
  // cache_dir empty: no disk cache. threads: FP64 reference threads per computation. probes: the
  // positions each sequence's S_p / dS_p are wanted at (part of every cache file's key).
  ReferenceCache(const RowConfig& row, std::string digest, std::string cache_dir, int threads,
                 ProbePositions probes = {});
  ~ReferenceCache();
  // Thread-safe; computes (or loads) a sequence once and shares it. With a head range, only those
  // heads (the same bits as in the whole sequence's reference; never stored on disk).
  std::shared_ptr<const SequenceReference> get(int seq, HeadRange heads = {});
  // Forgets the sequences computed for a head range (they live on while a caller holds them).
  void release(HeadRange heads);
  double compute_seconds() const;  // total time spent computing (not loading), summed over sequences
  double inputs_seconds() const;   // the part of it spent drawing the inputs (make_inputs)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kcp
