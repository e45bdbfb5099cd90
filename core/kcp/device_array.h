// A float array in a backend's memory space (host for the CPU twin, device for CUDA), owned
// RAII-style, with host transfers; and DtypeArray, a caller tensor (q, k, v, dO, o, dq, dk, dv;
// kernels/api/tensors.h) in the backend's caller_storage(). The engine and the test harnesses
// keep every tensor the kernels touch in these, so one engine drives every backend.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/api/backend.h"

namespace kcp {

class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const kernels::Backend& be, int64_t n) : be_(&be), n_(n), p_(n > 0 ? be.alloc_floats(n) : nullptr) {}
  DeviceArray(const kernels::Backend& be, const std::vector<float>& host, const kernels::Exec& ex = {})
      : DeviceArray(be, static_cast<int64_t>(host.size())) {
    if (n_ > 0) be.upload(p_, host.data(), n_, ex);
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept { swap(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    swap(o);
    return *this;
  }
  ~DeviceArray() {
    if (be_ && p_) be_->free_floats(p_);
  }
  float* get() const { return p_; }
  int64_t size() const { return n_; }
  const kernels::Backend& backend() const { return *be_; }
  void fill(float v, const kernels::Exec& ex = {}) const {
    if (n_ > 0) be_->fill_floats(p_, v, n_, ex);
  }
  std::vector<float> to_host(const kernels::Exec& ex = {}) const {
    std::vector<float> h(static_cast<size_t>(n_));
    if (n_ > 0) be_->download(h.data(), p_, n_, ex);
    return h;
  }
  // The first min(size(), h.size()) elements from the host.
  void from_host(const std::vector<float>& h, const kernels::Exec& ex = {}) const {
    const int64_t n = std::min<int64_t>(n_, static_cast<int64_t>(h.size()));
    if (n > 0) be_->upload(p_, h.data(), n, ex);
  }

 private:
  void swap(DeviceArray& o) noexcept {
    std::swap(be_, o.be_);
    std::swap(n_, o.n_);
    std::swap(p_, o.p_);
  }
  const kernels::Backend* be_ = nullptr;
  int64_t n_ = 0;
  float* p_ = nullptr;
};

// NaN into the first n elements of a dtype tensor in the backend's memory (docs/design.md 5):
// the float NaN (F32) or the dtype's quiet-NaN pattern (Packed16).
inline void poison_dtype(const kernels::Backend& be, kernels::DtypeTensor t, int64_t n, RoundTo rt,
                         const kernels::Exec& ex = {}) {
  if (n <= 0) return;
  if (t.storage() == kernels::Storage::F32)
    be.fill_floats(t.f32(), std::numeric_limits<float>::quiet_NaN(), n, ex);
  else
    be.fill_16(t.packed16(), nan16(rt), n, ex);
}

// A caller tensor of n dtype elements in the backend's memory, stored as be.caller_storage():
// Packed16, one 16-bit pattern per element (ceil(n / 2) floats of memory, reinterpreted as
// uint16_t: alloc_floats memory is aligned for both), or F32 (the exact-storage twin). The host
// side is always floats: the constructor from host values encodes them (they must be dtype
// values: std::invalid_argument names the first that is not), to_host() decodes.
class DtypeArray {
 public:
  DtypeArray() = default;
  DtypeArray(const kernels::Backend& be, int64_t n, kernels::DType dtype)
      : storage_(be.caller_storage()),
        rt_(kernels::rounding_of(dtype)),
        n_(n),
        mem_(be, storage_ == kernels::Storage::F32 ? n : (n + 1) / 2) {}
  DtypeArray(const kernels::Backend& be, const std::vector<float>& host, kernels::DType dtype,
             const kernels::Exec& ex = {})
      : DtypeArray(be, static_cast<int64_t>(host.size()), dtype) {
    if (n_ == 0) return;
    if (storage_ == kernels::Storage::F32) {
      be.upload(mem_.get(), host.data(), n_, ex);
      return;
    }
    std::vector<uint16_t> bits(static_cast<size_t>(n_));
    for (size_t e = 0; e < bits.size(); ++e) {
      bits[e] = dtype16_bits(host[e], rt_);
      const float back = dtype16_value(bits[e], rt_);
      if (std::memcmp(&back, &host[e], sizeof(float)) != 0 && !(back != back && host[e] != host[e]))
        throw std::invalid_argument("DtypeArray: element " + std::to_string(e) + " (" + std::to_string(host[e]) +
                                    ") is not a value of the dtype");
    }
    be.upload_16(bits16(), bits.data(), n_, ex);
  }

  kernels::DtypeTensor tensor() const {
    if (!mem_.get()) return {};
    return storage_ == kernels::Storage::F32 ? kernels::DtypeTensor::of_f32(mem_.get())
                                             : kernels::DtypeTensor::of_packed16(bits16());
  }
  int64_t size() const { return n_; }
  int64_t bytes() const { return mem_.size() * int64_t(sizeof(float)); }
  // Every element NaN (16-bit: the dtype's quiet-NaN pattern), docs/design.md 5.
  void poison(const kernels::Exec& ex = {}) const {
    if (n_ > 0) poison_dtype(be(), tensor(), n_, rt_, ex);
  }
  std::vector<float> to_host(const kernels::Exec& ex = {}) const {
    if (storage_ == kernels::Storage::F32) return mem_.to_host(ex);
    std::vector<uint16_t> bits(static_cast<size_t>(n_));
    if (n_ > 0) be().download_16(bits.data(), bits16(), n_, ex);
    std::vector<float> h(bits.size());
    for (size_t e = 0; e < h.size(); ++e) h[e] = dtype16_value(bits[e], rt_);
    return h;
  }

 private:
  uint16_t* bits16() const { return reinterpret_cast<uint16_t*>(mem_.get()); }
  const kernels::Backend& be() const { return mem_.backend(); }
  kernels::Storage storage_ = kernels::Storage::Packed16;
  RoundTo rt_ = RoundTo::BF16;
  int64_t n_ = 0;
  DeviceArray mem_;
};

}  // namespace kcp
