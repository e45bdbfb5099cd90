#include "core/kcp/phase_timing_backend.h"

namespace kcp {

namespace {
// The Exec a phase's Args carry (the fold's directly, the others' in their context).
const kernels::Exec& exec_of(const kernels::FoldArgs& a) { return a.exec; }
template <class Args>
const kernels::Exec& exec_of(const Args& a) {
  return a.ctx.exec;
}
}  // namespace

const std::vector<std::string>& engine_phase_names() {
  // The phase table's names, then copy_floats / fill_floats timed together as "copy/fill".
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const char* section : {"forward", "backward"}) {
      for (const char* p : kernels::kPhaseNames) v.push_back(std::string(section) + "." + p);
      v.push_back(std::string(section) + ".copy/fill");
    }
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

#define KCP_TIME_PHASE(name, Args)                                 \
  void PhaseTimingBackend::name(const kernels::Args& args) const { \
    timed(#name, exec_of(args), [&] { inner_.name(args); });       \
  }
KCP_BACKEND_PHASES(KCP_TIME_PHASE)
#undef KCP_TIME_PHASE
void PhaseTimingBackend::copy_floats(float* d, const float* s, int64_t n, const kernels::Exec& e) const {
  timed("copy/fill", e, [&] { inner_.copy_floats(d, s, n, e); });
}
void PhaseTimingBackend::fill_floats(float* d, float v, int64_t n, const kernels::Exec& e) const {
  timed("copy/fill", e, [&] { inner_.fill_floats(d, v, n, e); });
}

}  // namespace kcp
