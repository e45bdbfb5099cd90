// The fp32 CPU twin of every GPU kernel phase (kernels/api/backend.h), GDN and KDA, forward and
// backward, with segments. It mirrors the GPU kernels' rounding points (bf16/fp16 operands and
// stored tensors, fp32 accumulation, fp32 chains; see each phase file) so that budgets derived
// from it model the algorithm's precision. Deterministic in both packages: every reduction runs
// in a fixed order, and work is split over (segment or chunk, value head) with disjoint writes,
// so the thread count never changes a bit.
#pragma once

#include <memory>

#include "kernels/api/backend.h"

namespace kcp::kernels {

// How the twin stores its "dtype" points: rounded like the GPU (Rounded, the twin every verdict
// uses) or kept in fp32 (Exact: the calibration's check that the twin's algorithm is right,
// docs/design.md 6).
enum class CpuStorage { Rounded, Exact };

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(CpuStorage storage = CpuStorage::Rounded) : exact_(storage == CpuStorage::Exact) {}
  const char* name() const override { return "cpu"; }
  Status can_implement(const Problem& problem) const override;
  // The twin stores the "dtype" tensors as one float per element (dtype_tensor.h).
  Storage dtype_storage() const override { return Storage::F32; }
  // The caller tensors as 16-bit patterns like the GPU; the exact-storage twin keeps them fp32.
  Storage caller_storage() const override { return exact_ ? Storage::F32 : Storage::Packed16; }

  // Every phase of kernels/api/phases.h (defined in cpu_backend.cpp).
  KCP_BACKEND_PHASES(KCP_PHASE_OVERRIDE)

  void copy_floats(float* dst, const float* src, int64_t n, const Exec& exec) const override;
  void fill_floats(float* dst, float value, int64_t n, const Exec& exec) const override;
  void fill_16(uint16_t* dst, uint16_t bits, int64_t n, const Exec& exec) const override;

  float* alloc_floats(int64_t n) const override;
  void free_floats(float* p) const override;
  void upload(float* dst, const float* host_src, int64_t n, const Exec& exec) const override;
  void download(float* host_dst, const float* src, int64_t n, const Exec& exec) const override;
  void upload_16(uint16_t* dst, const uint16_t* host_src, int64_t n, const Exec& exec) const override;
  void download_16(uint16_t* host_dst, const uint16_t* src, int64_t n, const Exec& exec) const override;
  std::unique_ptr<PhaseTimer> make_timer() const override;
  std::string device_name() const override;

 private:
  // The phase's arguments with this twin's storage mode in their PhaseCtx.
  template <class A>
  A with_storage(const A& a) const {
    A b = a;
    b.ctx.exact_storage = exact_;
    return b;
  }
  static void copy_16(uint16_t* dst, const uint16_t* src, int64_t n);
  bool exact_ = false;
};

// Factory: the CPU twin.
std::unique_ptr<Backend> make_cpu_backend(CpuStorage storage = CpuStorage::Rounded);

}  // namespace kcp::kernels
