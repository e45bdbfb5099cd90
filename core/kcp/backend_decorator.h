// The base of the engine's Backend decorators (fault injection, phase timing): every method
// forwards to the wrapped backend, so a decorator overrides only the calls it changes.
#pragma once

#include <memory>
#include <string>

#include "kernels/api/backend.h"

namespace kcp {

class BackendDecorator : public kernels::Backend {
 public:
  explicit BackendDecorator(const kernels::Backend& inner) : inner_(inner) {}

  const char* name() const override { return inner_.name(); }
  kernels::Status can_implement(const kernels::Problem& p) const override { return inner_.can_implement(p); }
  int64_t extra_workspace_floats(const kernels::Problem& p, const kernels::LayoutView& l) const override {
    return inner_.extra_workspace_floats(p, l);
  }
  kernels::Storage dtype_storage() const override { return inner_.dtype_storage(); }
  kernels::Storage caller_storage() const override { return inner_.caller_storage(); }
  // Every phase of kernels/api/phases.h forwards.
#define KCP_FORWARD_PHASE(name, Args) \
  void name(const kernels::Args& a) const override { inner_.name(a); }
  KCP_BACKEND_PHASES(KCP_FORWARD_PHASE)
#undef KCP_FORWARD_PHASE
  void copy_floats(float* d, const float* s, int64_t n, const kernels::Exec& e) const override {
    inner_.copy_floats(d, s, n, e);
  }
  void fill_floats(float* d, float v, int64_t n, const kernels::Exec& e) const override {
    inner_.fill_floats(d, v, n, e);
  }
  void fill_16(uint16_t* d, uint16_t bits, int64_t n, const kernels::Exec& e) const override {
    inner_.fill_16(d, bits, n, e);
  }
  void synchronize(const kernels::Exec& e) const override { inner_.synchronize(e); }
  float* alloc_floats(int64_t n) const override { return inner_.alloc_floats(n); }
  void free_floats(float* p) const override { inner_.free_floats(p); }
  void upload(float* d, const float* s, int64_t n, const kernels::Exec& e) const override { inner_.upload(d, s, n, e); }
  void download(float* d, const float* s, int64_t n, const kernels::Exec& e) const override {
    inner_.download(d, s, n, e);
  }
  void upload_16(uint16_t* d, const uint16_t* s, int64_t n, const kernels::Exec& e) const override {
    inner_.upload_16(d, s, n, e);
  }
  void download_16(uint16_t* d, const uint16_t* s, int64_t n, const kernels::Exec& e) const override {
    inner_.download_16(d, s, n, e);
  }
  std::unique_ptr<kernels::PhaseTimer> make_timer() const override { return inner_.make_timer(); }
  std::string device_name() const override { return inner_.device_name(); }
  int64_t device_memory_bytes() const override { return inner_.device_memory_bytes(); }

 protected:
  const kernels::Backend& inner_;
};

}  // namespace kcp
