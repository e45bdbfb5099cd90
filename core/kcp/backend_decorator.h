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
  void prep(const kernels::PrepArgs& a) const override { inner_.prep(a); }
  void wy(const kernels::WyArgs& a) const override { inner_.wy(a); }
  void fwd_summaries(const kernels::FwdSummaryArgs& a) const override { inner_.fwd_summaries(a); }
  void fold(const kernels::FoldArgs& a) const override { inner_.fold(a); }
  void fwd_states(const kernels::FwdStateArgs& a) const override { inner_.fwd_states(a); }
  void fwd_output(const kernels::FwdOutputArgs& a) const override { inner_.fwd_output(a); }
  void bwd_local_dv(const kernels::BwdLocalDvArgs& a) const override { inner_.bwd_local_dv(a); }
  void bwd_summaries(const kernels::BwdSummaryArgs& a) const override { inner_.bwd_summaries(a); }
  void bwd_states(const kernels::BwdStateArgs& a) const override { inner_.bwd_states(a); }
  void bwd_grads(const kernels::BwdGradArgs& a) const override { inner_.bwd_grads(a); }
  void bwd_finalize(const kernels::BwdFinalizeArgs& a) const override { inner_.bwd_finalize(a); }
  void copy_floats(float* d, const float* s, int64_t n, const kernels::Exec& e) const override {
    inner_.copy_floats(d, s, n, e);
  }
  void fill_floats(float* d, float v, int64_t n, const kernels::Exec& e) const override { inner_.fill_floats(d, v, n, e); }
  void synchronize(const kernels::Exec& e) const override { inner_.synchronize(e); }
  float* alloc_floats(int64_t n) const override { return inner_.alloc_floats(n); }
  void free_floats(float* p) const override { inner_.free_floats(p); }
  void upload(float* d, const float* s, int64_t n, const kernels::Exec& e) const override { inner_.upload(d, s, n, e); }
  void download(float* d, const float* s, int64_t n, const kernels::Exec& e) const override { inner_.download(d, s, n, e); }
  std::unique_ptr<kernels::PhaseTimer> make_timer() const override { return inner_.make_timer(); }
  std::string device_name() const override { return inner_.device_name(); }
  int64_t device_memory_bytes() const override { return inner_.device_memory_bytes(); }

 protected:
  const kernels::Backend& inner_;
};

}  // namespace kcp
