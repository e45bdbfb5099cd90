// A Backend decorator that times every phase call while enabled, so `kcpbench run --bench` (and
// kcp_gpu_bench) can report per-phase kernel times with the kernels and the engine's data flow
// untouched. Each call gets a pair of the inner backend's timers (CUDA events on a GPU) around
// it; the timers are kept and reused across repeats. A timer pair between launches adds a small
// gap, so the engine measures forward / backward totals on repeats with timing off.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/kcp/backend_decorator.h"

namespace kcp {

class PhaseTimingBackend final : public BackendDecorator {
 public:
  explicit PhaseTimingBackend(const kernels::Backend& inner) : BackendDecorator(inner) {}

  // Timing on or off; while on, each phase call is recorded as "<section>.<phase>" ("forward.wy")
  // or as "<phase>" when the section is empty.
  void set_timing(bool on, const std::string& section = "") {
    on_ = on;
    section_ = section;
  }
  // Milliseconds per recorded name since the last collect(), summed over the name's calls (waits
  // for the work); then forgets them.
  std::map<std::string, double> collect();

  // Every phase of kernels/api/phases.h is timed.
  KCP_BACKEND_PHASES(KCP_PHASE_OVERRIDE)
  void copy_floats(float* d, const float* s, int64_t n, const kernels::Exec& e) const override;
  void fill_floats(float* d, float v, int64_t n, const kernels::Exec& e) const override;

 private:
  struct Call {
    std::string name;
    std::unique_ptr<kernels::PhaseTimer> timer;
  };
  template <class F>
  void timed(const char* phase, const kernels::Exec& e, F&& run) const;

  bool on_ = false;
  std::string section_;
  // Phases are const (backend.h); the record is the decorator's own bookkeeping.
  mutable std::vector<Call> calls_;
  mutable size_t used_ = 0;
};

// The names a PhaseTimingBackend records in the engine's sections, in the order of the phase
// table (kernels/api/phases.h) then "copy/fill": "forward.prep" ... "forward.copy/fill",
// "backward.prep" ... "backward.copy/fill". The engine reports them in this order (JSON).
const std::vector<std::string>& engine_phase_names();

}  // namespace kcp
