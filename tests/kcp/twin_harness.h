// Test harness for the kernels (tests/kcp, tests/gpu): deterministic inputs, the FP64 reference
// adapter, an emulation of the KCP engine over W ranks on any backend (each rank runs the
// engine's rank driver; the all-gather is emulated, the rank folds are the engine's), and the
// rel-RMS metric.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "core/kcp/device_array.h"
#include "core/kcp/rank_driver.h"
#include "kernels/api/backend.h"
#include "kernels/cpu/cpu_backend.h"

namespace kcp::kernels {
// gtest prints parameters with PrintTo: "gdn" reads better than a byte dump in ctest's list.
inline void PrintTo(Op op, std::ostream* os) { *os << to_string(op); }
}  // namespace kcp::kernels

namespace kcp::test {

namespace kk = kcp::kernels;

struct Case {
  std::string name;
  kk::Op op = kk::Op::Gdn;
  int H = 2, HV = 2, K = 64, V = 64;
  std::vector<int64_t> lens;  // global sequence lengths (zero allowed)
  bool l2norm = false;        // in-kernel L2 norm (q, k raw randn); else q, k pre-normalized
  bool skewed = false;        // q = randn + 1, k = 10 randn - 50 (nearly parallel keys; needs l2norm)
  kk::GateForm gate = kk::GateForm::Direct;
  float lower_bound = -5.0f;
  bool A_log = false, dt_bias = false, h0 = false, dht = false;
  kk::DType dtype = kk::DType::BF16;
  uint64_t seed = 1;
  double gate_div = 1.0;  // direct gates: logsigmoid(randn) / gate_div (weaker decay)
  double mask_p = 0.0;    // probability of an extreme-decay gate: direct -1000, raw +1000
  double zero_p = 0.0;    // probability of a no-decay gate: direct 0, raw -1000
  int64_t T() const {
    int64_t t = 0;
    for (int64_t l : lens) t += l;
    return t;
  }
  kk::Problem problem() const;
};
// gtest prints a parameter with PrintTo; the name keeps ctest's test list readable.
inline void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Global inputs (floats holding dtype values), indexed by global token / sequence.
struct Data {
  std::vector<float> q, k, v, g, beta, A_log, dt_bias, h0, dO, dht;
};
Data make_data(const Case& c);

// Results of one run, global layout (ht / dh0 indexed by sequence). Double for the reference.
template <class F>
struct Results {
  std::map<std::string, std::vector<F>> t;  // "o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0"
};
using RefResults = Results<double>;
using TwinResults = Results<float>;

RefResults run_reference(const Case& c, const Data& d);

// A float array in a backend's memory space (core/kcp/device_array.h) with the tests' short verbs.
class Buf : public kcp::DeviceArray {
 public:
  Buf() = default;
  Buf(const kk::Backend& be, int64_t n) : DeviceArray(be, n) {}
  Buf(const kk::Backend& be, const std::vector<float>& host) : DeviceArray(be, host) {}
  void put(const std::vector<float>& h) const { from_host(h); }
  std::vector<float> host() const { return to_host(); }
};

struct TwinOptions {
  std::vector<int64_t> rank_bounds;  // global token boundaries of W ranks: {0, ..., T}; empty = one rank
  std::vector<int> P;                // segments per piece, per rank (empty = 1 everywhere)
  kk::SavedKind kind = kk::SavedKind::Full;
  kk::Package package = kk::Package::Det;
  int threads = 1;
  bool repoison_between = true;          // NaN the workspace between forward and backward
  const kk::Backend* backend = nullptr;  // host-memory backend to run; null: a fresh CPU twin
};
// W emulated ranks on any backend (memory through Backend::alloc_floats / upload / download), so
// the CPU twin and the CUDA backend run the same code path: even segments per piece, the
// engine's rank driver and rank folds, NaN-poisoned arenas and outputs, the workspace re-poisoned
// between forward and backward.
TwinResults run_backend(const kk::Backend& be, const Case& c, const Data& d, const TwinOptions& opt);
// run_backend on opt.backend, or on a fresh CPU twin.
TwinResults run_twin(const Case& c, const Data& d, const TwinOptions& opt);

// n floats holding exact dtype values -> n raw 16-bit dtype values (the Packed16 storage of the
// caller tensors and of CUDA's saved set / workspace); throws std::logic_error if a value is not
// exactly representable (NaN is kept as a NaN).
std::vector<uint16_t> pack16(const float* x, int64_t n, kk::DType dt);
// n raw 16-bit dtype values -> n floats (exact).
std::vector<float> unpack16(const uint16_t* packed, int64_t n, kk::DType dt);

// rel-RMS = RMS(a - ref) / RMS(ref) (RMS(a - ref) when RMS(ref) == 0).
double rel_rms(const std::vector<double>& ref, const std::vector<float>& a);
double rel_rms(const std::vector<float>& ref, const std::vector<float>& a);
int64_t non_finite(const std::vector<float>& a);

// The public thresholds the twin is held to (docs/design.md 6).
double threshold(const std::string& tensor);

}  // namespace kcp::test
