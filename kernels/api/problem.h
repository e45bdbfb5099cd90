// Problem description shared by every kernel phase of every backend (CPU twin, CUDA): the
// operator, head shapes, options, and the execution tag (package, threads, stream).
//
// Invariants checked by validate_problem() (std::invalid_argument naming the field):
//   H >= 1, HV >= 1, HV % H == 0, K in [1, 256], V >= 1, chunk == 64 (the only supported chunk),
//   Softplus needs has_A_log, LowerBound is KDA only and needs lower_bound < 0,
//   Direct forbids has_A_log / has_dt_bias (they would be silently unused).
// All scalars are fp32 because the GPU kernels use them as fp32.
#pragma once

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/api/numeric.h"
#include "vocab/vocabulary.h"

namespace kcp::kernels {

// The shared words (vocab/vocabulary.h), also reachable as kernels::Op etc.
using kcp::DType;
using kcp::GateForm;
using kcp::Op;
using kcp::Package;
using kcp::SavedKind;
using kcp::to_string;

// The rounding (numeric.h) of a dtype.
inline RoundTo rounding_of(DType d) { return d == DType::BF16 ? RoundTo::BF16 : RoundTo::FP16; }

inline constexpr int32_t kChunk = 64;            // chunk size C of this project
inline constexpr int32_t kMaxK = 256;            // state kernels hold K rows per value head
inline constexpr float kRcpLn2 = 1.4426950216f;  // fp32 1/ln 2 used to store cumsums in log2 units
inline constexpr float kL2NormEps = 1e-6f;       // added to sum(x^2) inside the sqrt

struct Problem {
  Op op = Op::Gdn;
  int32_t H = 1;   // q/k heads
  int32_t HV = 1;  // value heads, HV % H == 0; value head j reads q/k head j / (HV / H)
  int32_t K = 64;  // key dim (state rows)
  int32_t V = 64;  // value dim (state cols)
  int32_t chunk = kChunk;
  float scale = 0.0f;      // output scale rho; 0 means K^-1/2 (see resolved_scale)
  bool qk_l2norm = false;  // q <- q / sqrt(sum q^2 + 1e-6) (same for k), fp32, stored in dtype
  GateForm gate = GateForm::Direct;
  float lower_bound = -5.0f;  // lb of the LowerBound form
  bool has_A_log = false;     // A_log [HV] given (required by Softplus)
  bool has_dt_bias = false;   // dt_bias given: GDN [HV], KDA [HV, K]
  bool has_h0 = false;        // initial state h0 [N_pieces, HV, K, V] read for pieces that start
                              // their sequence (dh0 is then produced)
  bool has_dht = false;       // dht [N_pieces, HV, K, V] read for pieces that end their sequence
  DType dtype = DType::BF16;

  int32_t group() const { return HV / H; }                      // G: value heads per q/k head
  int32_t gate_width() const { return op == Op::Kda ? K : 1; }  // channels of g per (t, head)
  float resolved_scale() const { return scale != 0.0f ? scale : 1.0f / std::sqrt(float(K)); }
};

// Returned by Backend::can_implement: ok, or the reason this backend cannot run the problem
// (recorded as a skip reason).
struct Status {
  bool ok = true;
  std::string reason;
  static Status success() { return {}; }
  static Status fail(std::string why) { return {false, std::move(why)}; }
};

// Execution tag carried by every phase call.
struct Exec {
  Package package = Package::Det;
  int32_t threads = 1;     // CPU twin: worker threads per phase (<= 0 means 1)
  void* stream = nullptr;  // CUDA backend: cudaStream_t; ignored by the CPU twin
};

// Throws std::invalid_argument naming the first malformed field ("problem.HV (6) must be a
// multiple of problem.H (4)").
inline void validate_problem(const Problem& p) {
  auto fail = [](const std::string& m) { throw std::invalid_argument("kcp kernels: " + m); };
  if (p.op != Op::Gdn && p.op != Op::Kda) fail("problem.op is not a known operator");
  if (p.H < 1) fail("problem.H (" + std::to_string(p.H) + ") must be >= 1");
  if (p.HV < 1) fail("problem.HV (" + std::to_string(p.HV) + ") must be >= 1");
  if (p.HV % p.H != 0)
    fail("problem.HV (" + std::to_string(p.HV) + ") must be a multiple of problem.H (" + std::to_string(p.H) + ")");
  if (p.K < 1 || p.K > kMaxK)
    fail("problem.K (" + std::to_string(p.K) + ") must be in [1, " + std::to_string(kMaxK) + "]");
  if (p.V < 1) fail("problem.V (" + std::to_string(p.V) + ") must be >= 1");
  if (p.chunk != kChunk) fail("problem.chunk (" + std::to_string(p.chunk) + ") must be " + std::to_string(kChunk));
  if (!std::isfinite(p.scale) || p.scale < 0.0f)
    fail("problem.scale (" + std::to_string(p.scale) + ") must be finite and >= 0 (0 = K^-1/2)");
  if (p.gate == GateForm::Softplus && !p.has_A_log) fail("problem.has_A_log must be true for problem.gate = softplus");
  if (p.gate == GateForm::LowerBound && p.op != Op::Kda)
    fail("problem.gate = lower_bound is KDA only (problem.op = gdn)");
  if (p.gate == GateForm::LowerBound && !(p.lower_bound < 0.0f && std::isfinite(p.lower_bound)))
    fail("problem.lower_bound (" + std::to_string(p.lower_bound) + ") must be finite and < 0");
  if (p.gate == GateForm::Direct && (p.has_A_log || p.has_dt_bias))
    fail(std::string("problem.") + (p.has_A_log ? "has_A_log" : "has_dt_bias") +
         " must be false for problem.gate = direct (A_log / dt_bias only act on raw gates)");
  if (p.dtype != DType::BF16 && p.dtype != DType::FP16) fail("problem.dtype is not bf16 or fp16");
}

}  // namespace kcp::kernels
