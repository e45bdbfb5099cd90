// CpuBackend: argument checks and dispatch to the phase implementations of the CPU twin.
#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <chrono>

#include <cstring>

#include "kernels/cpu/cpu_common.h"

namespace kcp::kernels {

Status CpuBackend::can_implement(const Problem& problem) const {
  try {
    validate_problem(problem);
  } catch (const std::invalid_argument& e) {
    return Status::fail(e.what());
  }
  return Status::success();  // the twin runs every well-formed problem
}

void CpuBackend::prep(const PrepArgs& args) const { cpu::prep(with_storage(args)); }

void CpuBackend::wy(const WyArgs& a) const {
  const char* ph = a.ctx.problem.op == Op::Gdn ? "gdn wy" : "kda wy";
  check_problem_layout(a.ctx, ph);
  const WyArgs b = with_storage(a);
  check_wy_args(b, ph, cpu::twin_storage(b.ctx));
  cpu::wy(b);
}

void CpuBackend::fwd_summaries(const FwdSummaryArgs& args) const { cpu::fwd_summaries(with_storage(args)); }
void CpuBackend::fold(const FoldArgs& args) const { cpu::fold(args); }
// With args.output the two phases in turn (the twin does not fuse them).
void CpuBackend::fwd_states(const FwdStateArgs& args) const {
  cpu::fwd_states(with_storage(args));
  if (args.output) fwd_output(*args.output);
}

void CpuBackend::fwd_output(const FwdOutputArgs& a) const {
  const bool kda = a.ctx.problem.op == Op::Kda;
  const char* ph = kda ? "kda fwd_output" : "gdn fwd_output";
  check_problem_layout(a.ctx, ph);
  const FwdOutputArgs b = with_storage(a);
  check_fwd_output_args(b, ph, cpu::twin_storage(b.ctx));
  if (kda)
    cpu::kda_output(b);
  else
    cpu::gdn_output(b);
}

void CpuBackend::bwd_local_dv(const BwdLocalDvArgs& args) const { cpu::bwd_local_dv(with_storage(args)); }
void CpuBackend::bwd_summaries(const BwdSummaryArgs& args) const { cpu::bwd_summaries(with_storage(args)); }
void CpuBackend::bwd_states(const BwdStateArgs& args) const { cpu::bwd_states(with_storage(args)); }

void CpuBackend::bwd_grads(const BwdGradArgs& a) const {
  const bool kda = a.ctx.problem.op == Op::Kda;
  const char* ph = kda ? "kda bwd_grads" : "gdn bwd_grads";
  check_problem_layout(a.ctx, ph);
  const BwdGradArgs b = with_storage(a);
  check_bwd_grads_args(b, ph, cpu::twin_storage(b.ctx));
  if (kda)
    cpu::kda_bwd_grads(b);
  else
    cpu::gdn_bwd_grads(b);
  if (a.finalize) bwd_finalize(*a.finalize);  // the two phases in turn (the twin does not fuse them)
}

void CpuBackend::bwd_finalize(const BwdFinalizeArgs& args) const { cpu::bwd_finalize(with_storage(args)); }

void CpuBackend::copy_floats(float* dst, const float* src, int64_t n, const Exec&) const {
  if (n < 0) arg_fail("copy_floats", "n (" + std::to_string(n) + ") must be >= 0");
  if (n == 0) return;
  need(dst, "copy_floats", "dst");
  need(src, "copy_floats", "src");
  std::memmove(dst, src, size_t(n) * sizeof(float));
}

void CpuBackend::fill_floats(float* dst, float value, int64_t n, const Exec&) const {
  if (n < 0) arg_fail("fill_floats", "n (" + std::to_string(n) + ") must be >= 0");
  if (n == 0) return;
  need(dst, "fill_floats", "dst");
  for (int64_t i = 0; i < n; ++i) dst[i] = value;
}

void CpuBackend::fill_16(uint16_t* dst, uint16_t bits, int64_t n, const Exec&) const {
  if (n < 0) arg_fail("fill_16", "n (" + std::to_string(n) + ") must be >= 0");
  if (n == 0) return;
  need(dst, "fill_16", "dst");
  for (int64_t i = 0; i < n; ++i) dst[i] = bits;
}

std::unique_ptr<Backend> make_cpu_backend(CpuStorage storage) { return std::make_unique<CpuBackend>(storage); }

}  // namespace kcp::kernels

namespace kcp::kernels {
namespace {
class HostTimer final : public PhaseTimer {
 public:
  void start(const Exec&) override { t0_ = std::chrono::steady_clock::now(); }
  void stop(const Exec&) override { t1_ = std::chrono::steady_clock::now(); }
  double elapsed_ms() override { return std::chrono::duration<double, std::milli>(t1_ - t0_).count(); }

 private:
  std::chrono::steady_clock::time_point t0_, t1_;
};
}  // namespace

float* CpuBackend::alloc_floats(int64_t n) const {
  if (n < 0) arg_fail("alloc_floats", "n (" + std::to_string(n) + ") must be >= 0");
  return new float[static_cast<size_t>(std::max<int64_t>(n, 1))];
}
void CpuBackend::free_floats(float* p) const { delete[] p; }
void CpuBackend::upload(float* dst, const float* src, int64_t n, const Exec& exec) const {
  copy_floats(dst, src, n, exec);
}
void CpuBackend::download(float* dst, const float* src, int64_t n, const Exec& exec) const {
  copy_floats(dst, src, n, exec);
}
// Host to host, as upload / download: a plain copy of the 16-bit elements.
void CpuBackend::upload_16(uint16_t* dst, const uint16_t* src, int64_t n, const Exec&) const { copy_16(dst, src, n); }
void CpuBackend::download_16(uint16_t* dst, const uint16_t* src, int64_t n, const Exec&) const { copy_16(dst, src, n); }
void CpuBackend::copy_16(uint16_t* dst, const uint16_t* src, int64_t n) {
  if (n < 0) arg_fail("copy_16", "n (" + std::to_string(n) + ") must be >= 0");
  if (n == 0) return;
  need(dst, "copy_16", "dst");
  need(src, "copy_16", "src");
  std::memmove(dst, src, size_t(n) * sizeof(uint16_t));
}
std::unique_ptr<PhaseTimer> CpuBackend::make_timer() const { return std::make_unique<HostTimer>(); }
std::string CpuBackend::device_name() const { return "cpu (fp32 twin)"; }
}  // namespace kcp::kernels
