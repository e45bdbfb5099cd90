// FP64 reference for Gated DeltaNet (GDN) and Kimi Delta Attention (KDA): the per-token
// recurrence of docs/algorithm.md section 1 and its exact reverse-mode backward.
//
// Independent of the chunked algorithm on purpose: every verdict kcpbench gives is a comparison
// with this code. Depends on Eigen and the standard library only (no CUDA, no core headers).
//
// Layouts are token-major ("BTHD") with B = 1 and varlen via cu_seqlens; inputs are float (read
// as FP64: a float converts to double exactly), results FP64:
//   q, k      [T, H, K]         v, dO   [T, HV, V]      beta  [T, HV]
//   g (GDN)   [T, HV]           g (KDA) [T, HV, K]      (the gate input as given: direct log-decay,
//                                                        or the raw gate for raw / lower-bound forms)
//   A_log     [HV]              dt_bias GDN [HV], KDA [HV, K]
//   h0, dht, ht, dh0            [N, HV, K, V]  (state is key-major K x V)
//   probe_S, probe_dS           [P, HV, K, V]  (P = probes.size(); docs/algorithm.md 1.4)
// Value head j reads q/k head j / (HV / H). Gradients of q and k are summed over the HV / H value
// heads of a group; dg has the shape of g; dA_log and ddt_bias the shapes of A_log and dt_bias.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vocab/vocabulary.h"

namespace kcp::ref {

// The operator and the gate form (vocab/vocabulary.h): GDN or KDA; how the per-token log-decay
// a_t (natural log, <= 0) is formed from the gate input g:
//   Direct:     a = g
//   Softplus:   a = -exp(A_log[j]) * softplus(g + dt_bias)        (GDN: dt_bias[j]; KDA: dt_bias[j, d])
//   LowerBound: a = lb * sigmoid(exp(A_log[j]) * (g + dt_bias))   (KDA only; without A_log: lb * sigmoid(g + dt_bias))
// A_log is required for Softplus; dt_bias is optional (zero when absent) for both raw forms.
using kcp::GateForm;
using kcp::Op;

struct Problem {
  Op op = Op::Gdn;
  int H = 1, HV = 1, K = 64, V = 64;
  std::vector<int64_t> cu_seqlens;  // [N + 1], starts at 0, non-decreasing (zero-length sequences allowed)
  double scale = 0.0;               // output scale rho; 0 means K^-1/2
  bool qk_l2norm = false;           // q <- q / sqrt(sum q^2 + 1e-6), same for k, before everything else
  GateForm gate = GateForm::Direct;
  double lower_bound = -5.0;  // lb of the LowerBound form
  bool has_A_log = false;
  bool has_dt_bias = false;
  bool has_h0 = false;   // initial state per sequence (else zeros)
  bool has_dht = false;  // gradient of the final state in the loss (else zero)
  // Probes (docs/algorithm.md 1.4): positions p within a sequence (0 <= p <= len) at which the
  // state S_p after the sequence's first p tokens (Outputs::probe_S) and the gradient dS_p of the
  // loss w.r.t. it (Grads::probe_dS) are reported. Sequence n's positions are
  // probes[probe_cu[n] .. probe_cu[n + 1]), strictly ascending; row r of probe_S / probe_dS belongs
  // to probes[r]. probe_cu is [N + 1] (starts at 0, non-decreasing, ends at probes.size()), or
  // empty when probes is empty (no probes: the default). S_0 = h0 (or 0), S_len = ht; dS_0 = dh0
  // (also without has_h0), dS_len = dht (or 0). Probes change no other output (bitwise); each costs
  // a copy of K x V per value head (forward and backward).
  std::vector<int64_t> probe_cu;  // [N + 1] or empty
  std::vector<int64_t> probes;    // [P] positions, sequence by sequence

  int64_t tokens() const { return cu_seqlens.empty() ? 0 : cu_seqlens.back(); }
  int sequences() const { return cu_seqlens.empty() ? 0 : static_cast<int>(cu_seqlens.size()) - 1; }
  int64_t probe_count() const { return static_cast<int64_t>(probes.size()); }
  int gate_width() const { return op == Op::Kda ? K : 1; }  // channels of g per (token, value head)
};

// Inputs, as float (already rounded to the kernels' input dtype by the caller); every value is
// converted to double exactly where it is read, so the results are those of the same values held
// as double, without a double copy of the inputs. Pointers to optional tensors may be null when
// the Problem says they are absent.
struct Inputs {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* g = nullptr;
  const float* beta = nullptr;
  const float* A_log = nullptr;
  const float* dt_bias = nullptr;
  const float* h0 = nullptr;
  const float* dO = nullptr;   // needed by backward only
  const float* dht = nullptr;  // needed by backward only, when has_dht
};

struct Outputs {
  std::vector<double> o;        // [T, HV, V]
  std::vector<double> ht;       // [N, HV, K, V]
  std::vector<double> probe_S;  // [P, HV, K, V] S_p at each probe (empty without probes)
};

struct Grads {
  std::vector<double> dq, dk;    // [T, H, K]
  std::vector<double> dv;        // [T, HV, V]
  std::vector<double> dg;        // shape of g (gradient w.r.t. the gate input as given)
  std::vector<double> dbeta;     // [T, HV]
  std::vector<double> dA_log;    // [HV] when has_A_log, else empty
  std::vector<double> ddt_bias;  // [HV] or [HV * K] when has_dt_bias, else empty
  std::vector<double> dh0;       // [N, HV, K, V] when has_h0, else empty
  std::vector<double> probe_dS;  // [P, HV, K, V] dL / dS_p at each probe (empty without probes)
};

// Throws std::invalid_argument with a message naming the field when the problem is malformed.
void validate(const Problem& p);

// Forward only. threads <= 0 means std::thread::hardware_concurrency().
Outputs forward(const Problem& p, const Inputs& in, int threads = 0);

// Forward and exact backward of L = sum(o * dO) + sum(ht * dht).
void forward_backward(const Problem& p, const Inputs& in, Outputs& out, Grads& grads, int threads = 0);

// FP64 floating-point operation count of forward (and forward+backward) as implemented, for the
// GFLOP/s report of the benchmark.
double forward_flops(const Problem& p);
double forward_backward_flops(const Problem& p);

// The SIMD the recurrence was compiled for, e.g. "SSE2, 2 doubles a packet" (CMake option
// KCP_REFERENCE_ARCH widens it). Results are recorded with it: the order of the per-packet
// horizontal sums, and so the last bits of dq, dk, dg, dbeta, follow the packet width.
std::string simd_description();

}  // namespace kcp::ref
