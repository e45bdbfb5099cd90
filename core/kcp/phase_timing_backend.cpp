#include "core/kcp/phase_timing_backend.h"

namespace kcp {

namespace {
// Phase names in backend.h order; copy_floats / fill_floats are timed together.
const char* const kPhases[] = {"prep",         "wy",           "fwd_summaries", "fold",      "fwd_states",
                               "fwd_output",   "bwd_local_dv", "bwd_summaries", "bwd_states", "bwd_grads",
                               "bwd_finalize", "copy/fill"};
}  // namespace

const std::vector<std::string>& engine_phase_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const char* section : {"forward", "backward"})
      for (const char* p : kPhases) v.push_back(std::string(section) + "." + p);
    return v;
  }();
  return names;
}

template <class F>
void PhaseTimingBackend::timed(const char* phase, const kernels::Exec& e, F&& run) const {
  if (!on_) return run();
  if (used_ == calls_.size()) calls_.push_back({std::string(), inner_.make_timer()});
  Call& c = calls_[used_++];
  c.name = section_.empty() ? std::string(phase) : section_ + "." + phase;
  c.timer->start(e);
  run();
  c.timer->stop(e);
}

std::map<std::string, double> PhaseTimingBackend::collect() {
  std::map<std::string, double> ms;
  for (size_t i = 0; i < used_; ++i) ms[calls_[i].name] += calls_[i].timer->elapsed_ms();
  used_ = 0;
  return ms;
}

void PhaseTimingBackend::prep(const kernels::PrepArgs& a) const { timed("prep", a.ctx.exec, [&] { inner_.prep(a); }); }
void PhaseTimingBackend::wy(const kernels::WyArgs& a) const { timed("wy", a.ctx.exec, [&] { inner_.wy(a); }); }
void PhaseTimingBackend::fwd_summaries(const kernels::FwdSummaryArgs& a) const {
  timed("fwd_summaries", a.ctx.exec, [&] { inner_.fwd_summaries(a); });
}
void PhaseTimingBackend::fold(const kernels::FoldArgs& a) const { timed("fold", a.exec, [&] { inner_.fold(a); }); }
void PhaseTimingBackend::fwd_states(const kernels::FwdStateArgs& a) const {
  timed("fwd_states", a.ctx.exec, [&] { inner_.fwd_states(a); });
}
void PhaseTimingBackend::fwd_output(const kernels::FwdOutputArgs& a) const {
  timed("fwd_output", a.ctx.exec, [&] { inner_.fwd_output(a); });
}
void PhaseTimingBackend::bwd_local_dv(const kernels::BwdLocalDvArgs& a) const {
  timed("bwd_local_dv", a.ctx.exec, [&] { inner_.bwd_local_dv(a); });
}
void PhaseTimingBackend::bwd_summaries(const kernels::BwdSummaryArgs& a) const {
  timed("bwd_summaries", a.ctx.exec, [&] { inner_.bwd_summaries(a); });
}
void PhaseTimingBackend::bwd_states(const kernels::BwdStateArgs& a) const {
  timed("bwd_states", a.ctx.exec, [&] { inner_.bwd_states(a); });
}
void PhaseTimingBackend::bwd_grads(const kernels::BwdGradArgs& a) const {
  timed("bwd_grads", a.ctx.exec, [&] { inner_.bwd_grads(a); });
}
void PhaseTimingBackend::bwd_finalize(const kernels::BwdFinalizeArgs& a) const {
  timed("bwd_finalize", a.ctx.exec, [&] { inner_.bwd_finalize(a); });
}
void PhaseTimingBackend::copy_floats(float* d, const float* s, int64_t n, const kernels::Exec& e) const {
  timed("copy/fill", e, [&] { inner_.copy_floats(d, s, n, e); });
}
void PhaseTimingBackend::fill_floats(float* d, float v, int64_t n, const kernels::Exec& e) const {
  timed("copy/fill", e, [&] { inner_.fill_floats(d, v, n, e); });
}

}  // namespace kcp
