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

namespace kcp::kernels {

enum class Op : int32_t { Gdn = 0, Kda = 1 };

// How the per-token natural-log decay a_t (<= 0) is formed from the gate input g (docs/algorithm.md 1.2):
//   Direct:     a = g
//   Softplus:   a = -exp(A_log[j]) * softplus(g + dt_bias)   (GDN dt_bias[j]; KDA dt_bias[j, d])
//   LowerBound: a = lb * sigmoid(exp(A_log[j]) * (g + dt_bias)), or lb * sigmoid(g + dt_bias)
//               without A_log (KDA only)
// dt_bias is optional (zero when absent) for both raw forms.
enum class GateForm : int32_t { Direct = 0, Softplus = 1, LowerBound = 2 };

// Input dtype: every input tensor arrives as float holding a value of this type; every tensor
// the kernels "store in the input dtype" (normalized q/k, Phi, W, U, h, v_new, dh, dv2, o,
// dq/dk/dv) is rounded to it (kcp::round_to).
enum class DType : int32_t { BF16 = 0, FP16 = 1 };

// det: fixed-order reductions, bitwise reproducible. nondet: reductions may use atomics.
// The CPU twin is deterministic for both; it keeps the tag so saved sets and workspaces can be
// checked against the backward they are passed to (docs/design.md 5).
enum class Package : int32_t { Det = 0, Nondet = 1 };

// full: the forward also keeps each segment's transfer plane M_seg^T and segment entry states.
// light: only prep outputs and the first piece's incoming state; the backward recomputes.
enum class SavedKind : int32_t { Full = 0, Light = 1 };

inline const char* to_string(Op v) { return v == Op::Gdn ? "gdn" : "kda"; }
inline const char* to_string(GateForm v) {
  return v == GateForm::Direct ? "direct" : v == GateForm::Softplus ? "softplus" : "lower_bound";
}
inline const char* to_string(DType v) { return v == DType::BF16 ? "bf16" : "fp16"; }
inline const char* to_string(Package v) { return v == Package::Det ? "det" : "nondet"; }
inline const char* to_string(SavedKind v) { return v == SavedKind::Full ? "full" : "light"; }

inline constexpr int32_t kChunk = 64;          // chunk size C of this project
inline constexpr int32_t kMaxK = 256;          // state kernels hold K rows per value head
inline constexpr float kRcpLn2 = 1.4426950216f;  // fp32 1/ln 2 used to store cumsums in log2 units
inline constexpr float kL2NormEps = 1e-6f;     // added to sum(x^2) inside the sqrt

struct Problem {
  Op op = Op::Gdn;
  int32_t H = 1;        // q/k heads
  int32_t HV = 1;       // value heads, HV % H == 0; value head j reads q/k head j / (HV / H)
  int32_t K = 64;       // key dim (state rows)
  int32_t V = 64;       // value dim (state cols)
  int32_t chunk = kChunk;
  float scale = 0.0f;   // output scale rho; 0 means K^-1/2 (see resolved_scale)
  bool qk_l2norm = false;  // q <- q / sqrt(sum q^2 + 1e-6) (same for k), fp32, stored in dtype
  GateForm gate = GateForm::Direct;
  float lower_bound = -5.0f;  // lb of the LowerBound form
  bool has_A_log = false;     // A_log [HV] given (required by Softplus)
  bool has_dt_bias = false;   // dt_bias given: GDN [HV], KDA [HV, K]
  bool has_h0 = false;        // initial state h0 [N_pieces, HV, K, V] read for pieces that start
                              // their sequence (dh0 is then produced)
  bool has_dht = false;       // dht [N_pieces, HV, K, V] read for pieces that end their sequence
  DType dtype = DType::BF16;

  int32_t group() const { return HV / H; }                   // G: value heads per q/k head
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
    fail("problem.HV (" + std::to_string(p.HV) + ") must be a multiple of problem.H (" +
         std::to_string(p.H) + ")");
  if (p.K < 1 || p.K > kMaxK)
    fail("problem.K (" + std::to_string(p.K) + ") must be in [1, " + std::to_string(kMaxK) + "]");
  if (p.V < 1) fail("problem.V (" + std::to_string(p.V) + ") must be >= 1");
  if (p.chunk != kChunk)
    fail("problem.chunk (" + std::to_string(p.chunk) + ") must be " + std::to_string(kChunk));
  if (!std::isfinite(p.scale) || p.scale < 0.0f)
    fail("problem.scale (" + std::to_string(p.scale) + ") must be finite and >= 0 (0 = K^-1/2)");
  if (p.gate == GateForm::Softplus && !p.has_A_log)
    fail("problem.has_A_log must be true for problem.gate = softplus");
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
