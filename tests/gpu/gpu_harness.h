// GPU test harness (tests/gpu): runs the single-rank driver over W emulated ranks on ANY backend
// (memory through Backend::alloc_floats / upload / download), so the CPU twin and the CUDA
// backend run the same code path; plus comparison helpers. Case, Data, the FP64 reference
// adapter and the public thresholds come from tests/kcp/twin_harness.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/api/backend.h"
#include "twin_harness.h"

namespace kcp::test {

// A float buffer in a backend's memory space.
class Buf {
 public:
  Buf() = default;
  Buf(const kk::Backend& be, int64_t n) : be_(&be), n_(n), p_(be.alloc_floats(n)) {}
  Buf(const kk::Backend& be, const std::vector<float>& host) : Buf(be, int64_t(host.size())) { put(host); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  Buf(Buf&& o) noexcept { swap(o); }
  Buf& operator=(Buf&& o) noexcept {
    swap(o);
    return *this;
  }
  ~Buf() {
    if (be_ && p_) be_->free_floats(p_);
  }
  float* get() const { return p_; }
  int64_t size() const { return n_; }
  void put(const std::vector<float>& h) const {
    if (n_ > 0) be_->upload(p_, h.data(), std::min<int64_t>(n_, int64_t(h.size())), kk::Exec{});
  }
  std::vector<float> host() const {
    std::vector<float> h(static_cast<size_t>(n_));
    if (n_ > 0) be_->download(h.data(), p_, n_, kk::Exec{});
    return h;
  }
  void fill(float v) const {
    if (n_ > 0) be_->fill_floats(p_, v, n_, kk::Exec{});
  }

 private:
  void swap(Buf& o) noexcept {
    std::swap(be_, o.be_);
    std::swap(n_, o.n_);
    std::swap(p_, o.p_);
  }
  const kk::Backend* be_ = nullptr;
  int64_t n_ = 0;
  float* p_ = nullptr;
};

// run_twin of tests/kcp on any backend: same planning (pieces, even segments), same rank folds,
// NaN-poisoned arenas and outputs, workspace re-poisoned between forward and backward.
TwinResults run_backend(const kk::Backend& be, const Case& c, const Data& d, const TwinOptions& opt);

// Closeness of two float tensors: rel-RMS and max|a - b| / max|b|; NaN anywhere counts as inf.
struct Diff {
  double rel_rms = 0.0, rel_max = 0.0;
  int64_t bad = 0;  // non-finite in a but finite in b
};
Diff diff(const std::vector<float>& a, const std::vector<float>& b);
// Bitwise equality (NaN patterns included); returns the first differing index or -1.
int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b);

// The "dtype" tensors of a workspace / saved set (DtypeTensor, kernels/api/dtype_tensor.h): the
// CUDA backend stores them as Storage::Packed16 (raw dtype bits, element e at byte 2 e of the
// tensor's region), the twin as Storage::F32. A test that supplies twin values to a CUDA phase
// packs them; one that reads CUDA values back takes packed16() and unpacks them.
struct Region16 {
  const char* name;
  kk::DtypeTensor t;  // the tensor in the workspace / saved set, in the binding backend's storage
  int64_t n;          // elements (Packed16 uses the first ceil(n / 2) floats of the region)
};
std::vector<Region16> cuda_16bit_tensors(const kk::WorkspaceTensors& w, const kk::Problem& p, const kk::LayoutView& L);
std::vector<Region16> cuda_16bit_tensors(const kk::SavedTensors& s, const kk::Problem& p, const kk::LayoutView& L);
// n floats holding exact dtype values -> n raw 16-bit dtype values; throws std::logic_error if a
// value is not exactly representable (NaN is kept as a NaN).
std::vector<uint16_t> pack16(const float* x, int64_t n, kk::DType dt);
// n raw 16-bit dtype values -> n floats (exact).
std::vector<float> unpack16(const uint16_t* packed, int64_t n, kk::DType dt);
// All bits set: NaN as a float and as each of its 16-bit halves (bf16 and fp16), so poison for
// 16-bit storage.
float poison16();

// Unit roundoff of the case's dtype (2^-8 bf16, 2^-11 fp16): one ulp at 1.0 is 2u.
double unit_roundoff(const Case& c);

}  // namespace kcp::test
