// Internals of the FP64 reference (reference.h is the public API). Not installed, not part of any
// contract; the tests include it to force small windows and two-level checkpointing on tiny
// problems.
//
// Structure:
//   prepare.cpp     Q/K L2 norm, q.k per token, gate activation and the decay factors exp(a);
//                   the backward tail (gate chain rule, L2-norm backward); a small thread helper.
//   recurrence.cpp  the per-token recurrence and its reverse sweep, per work item
//                   (sequence, value head, group of state columns), blocked over state columns.
//   reference.cpp   validate(), the public entry points, the FLOP count.
//
// Invariants:
//   * Results do not depend on the thread count (bitwise): every reduction runs in a fixed order
//     that does not depend on how the work is split (column groups, token chunks).
//   * Results do not depend on the window length or on one- vs two-level checkpointing (bitwise):
//     the recomputation repeats exactly the arithmetic of the first forward pass. Windows split at
//     probe positions therefore leave every other output unchanged too.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "reference/reference.h"
#include "vocab/parallel_for.h"

namespace kcp::ref::detail {

// Knobs that change memory and scheduling, never the results.
struct Tuning {
  int window = 64;            // tokens per checkpoint window (states of one window are recomputed)
  int max_checkpoints = 256;  // checkpoints per work item before switching to two levels
  int items_per_thread = 4;   // column groups: enough for this many work items per thread
  int column_groups = 0;      // > 0 forces this many column groups per (sequence, value head)
};

// The windows of one sequence, as positions within it: the multiples of Tuning::window, split
// further at the sequence's probe positions (docs/algorithm.md 1.4); without probes, window w is
// [w W, min(len, (w + 1) W)). A split changes no bit (see the invariants above).
struct Windows {
  std::vector<int64_t> pos;    // [nwin + 1] boundaries: pos[0] = 0, pos[nwin] = len
  std::vector<int64_t> probe;  // [nwin + 1] the probe row of the state at pos[w], or -1
  int64_t count() const { return static_cast<int64_t>(pos.size()) - 1; }
};
Windows windows(const Problem& p, int n, int window);

// Rows [first, second) of probe_S / probe_dS that belong to sequence n (empty without probes).
inline std::pair<int64_t, int64_t> probe_rows(const Problem& p, int n) {
  if (p.probe_cu.empty()) return {0, 0};
  return {p.probe_cu[static_cast<size_t>(n)], p.probe_cu[static_cast<size_t>(n) + 1]};
}

// Forward (grads == nullptr) or forward and backward, with explicit tuning.
void run(const Problem& p, const Inputs& in, Outputs& out, Grads* grads, int threads, const Tuning& tuning);

// FLOP count as implemented (see reference.cpp for the per-element breakdown).
double flops(const Problem& p, bool backward, const Tuning& tuning);

int resolve_threads(int threads);

// parallel_for: vocab/parallel_for.h (items claimed in order; the backward's ordered reductions
// rely on it).
using kcp::parallel_for;

// ---- gates ----------------------------------------------------------------------------------

// Gate activations. One exponential per element for both sigmoid(x) and sigmoid(-x), and for
// softplus and its derivative. The exact stable softplus log(1 + e^x) = max(x, 0) + log1p(e^-|x|)
// is used everywhere (no threshold shortcut).
struct SigmoidPair {
  double pos, neg;  // sigmoid(x), sigmoid(-x) = 1 - sigmoid(x) without cancellation
};
inline SigmoidPair sigmoid_pair(double x) {
  const double e = std::exp(-std::abs(x));
  const double big = 1.0 / (1.0 + e), small = e / (1.0 + e);
  return x >= 0 ? SigmoidPair{big, small} : SigmoidPair{small, big};
}

struct GateValue {
  double a = 0;     // log-decay
  double dadx = 0;  // d a / d (g + dt_bias)   (Direct: d a / d g = 1)
  double dadA = 0;  // d a / d A_log
};

// x = g + dt_bias (the raw gate plus its bias; for Direct, x = g); eA = exp(A_log[j]) (1 without
// A_log). kDerivatives = false computes only a.
template <bool kDerivatives>
inline GateValue gate_value(const Problem& p, double eA, double x) {
  GateValue r;
  switch (p.gate) {
    case GateForm::Direct:
      r.a = x;
      r.dadx = 1.0;
      break;
    case GateForm::Softplus: {
      const double e = std::exp(-std::abs(x));
      r.a = -eA * (std::max(x, 0.0) + std::log1p(e));  // -exp(A_log) softplus(x)
      if constexpr (kDerivatives) {
        r.dadx = -eA * (x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e));  // -exp(A_log) sigmoid(x)
        r.dadA = r.a;
      }
      break;
    }
    case GateForm::LowerBound: {
      const double z = p.has_A_log ? eA * x : x;
      const SigmoidPair s = sigmoid_pair(z);
      r.a = p.lower_bound * s.pos;
      if constexpr (kDerivatives) {
        const double dadz = p.lower_bound * s.pos * s.neg;
        r.dadx = dadz * eA;
        r.dadA = p.has_A_log ? dadz * z : 0.0;
      }
      break;
    }
  }
  return r;
}

// One token's q or k row of one head as the recurrence reads it: the float input times a factor
// (1 / sqrt(sum x^2 + eps) of the L2 norm, or 1 without it), formed in double where it is read.
// The product is rounded the same way at every read, so every reader sees the bits a stored
// normalized copy would hold (and x * 1.0 == x), without [T, H, K] arrays of doubles.
struct QKRow {
  const float* x = nullptr;
  double r = 1.0;
  double operator[](int d) const { return static_cast<double>(x[d]) * r; }
};

// Per-token data shared by all work items, built once (O(T * HV * K) memory, like the inputs).
struct Prepared {
  int64_t T = 0;
  int H = 0, HV = 0, K = 0, V = 0, G = 1, Kg = 1;
  double rho = 0;
  const float* q = nullptr;  // [T, H, K] the inputs (Inputs::q, k)
  const float* k = nullptr;
  // Large buffers are allocated uninitialised, so that the threads that fill them also fault
  // their pages in (in parallel) instead of the calling thread zeroing them first.
  std::unique_ptr<double[]> rstd_q, rstd_k;  // [T, H] when qk_l2norm
  std::unique_ptr<double[]> qk;              // [T, H] qn . kn
  std::unique_ptr<double[]> dec;             // [T, HV, Kg] exp(a)
  std::vector<float> zeros;                  // [K]
  // q and k of row t * H + i after the optional L2 norm.
  QKRow qn(int64_t row) const { return {q + row * K, rstd_q ? rstd_q[static_cast<size_t>(row)] : 1.0}; }
  QKRow kn(int64_t row) const { return {k + row * K, rstd_k ? rstd_k[static_cast<size_t>(row)] : 1.0}; }
};

Prepared prepare(const Problem& p, const Inputs& in, int threads);

// The O(T * HV * K * V) part: o and ht; with grads, also dv, dh0 and the accumulated gradients
// w.r.t. the normalized q/k (in grads->dq, dk), the log-decay (in grads->dg) and beta.
void run_recurrence(const Problem& p, const Inputs& in, const Prepared& pr, Outputs& out, Grads* grads, int threads,
                    const Tuning& tuning);

// Turns the accumulated gradients w.r.t. the normalized q/k and the log-decay (stored in dq, dk
// and dg) into gradients w.r.t. the inputs as given; fills dA_log and ddt_bias.
void finish_backward(const Problem& p, const Inputs& in, const Prepared& pr, Grads& g, int threads);

}  // namespace kcp::ref::detail
