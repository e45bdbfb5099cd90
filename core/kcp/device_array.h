// A float array in a backend's memory space (host for the CPU twin, device for CUDA), owned
// RAII-style, with host transfers. The engine and the test harnesses keep every tensor the
// kernels touch in these, so one engine drives every backend.
#pragma once

#include <algorithm>
#include <cstdint>
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

}  // namespace kcp
