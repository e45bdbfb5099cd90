// Public entry points of the FP64 reference: validation, forward, forward+backward, FLOP count.
// The work itself is in prepare.cpp (per-token O(K) parts) and recurrence.cpp (the O(K V) part).
#include "reference/reference.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "reference/detail.h"

namespace kcp::ref {

namespace {

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument("kcp::ref: " + what); }

void require_input(const void* ptr, bool needed, const char* name) {
  if (needed && ptr == nullptr) fail(std::string("Inputs.") + name + " is null but the problem needs it");
}

void check_inputs(const Problem& p, const Inputs& in, bool backward) {
  const bool tokens = p.tokens() > 0;
  require_input(in.q, tokens, "q");
  require_input(in.k, tokens, "k");
  require_input(in.v, tokens, "v");
  require_input(in.g, tokens, "g");
  require_input(in.beta, tokens, "beta");
  require_input(in.A_log, p.has_A_log, "A_log");
  require_input(in.dt_bias, p.has_dt_bias, "dt_bias");
  require_input(in.h0, p.has_h0, "h0");
  if (backward) {
    require_input(in.dO, tokens, "dO");
    require_input(in.dht, p.has_dht, "dht");
  }
}

size_t zs(int64_t n) { return static_cast<size_t>(n); }

template <class T>
std::string num(T x) {
  return std::to_string(x);
}

// The offsets Problem.<name> (non-empty) start at 0 and never decrease.
void check_offsets(const std::vector<int64_t>& cu, const std::string& name) {
  if (cu.front() != 0) fail("Problem." + name + "[0] must be 0, got " + num(cu.front()));
  for (size_t n = 1; n < cu.size(); ++n)
    if (cu[n] < cu[n - 1])
      fail("Problem." + name + " must be non-decreasing, but " + name + "[" + num(n) + "] = " + num(cu[n]) + " < " +
           name + "[" + num(n - 1) + "] = " + num(cu[n - 1]));
}

// Probes (docs/algorithm.md 1.4): probe_cu like cu_seqlens, ending at probes.size(); each
// sequence's positions strictly ascending within [0, len].
void validate_probes(const Problem& p) {
  if (p.probe_cu.empty()) {
    if (!p.probes.empty())
      fail("Problem.probe_cu is empty but Problem.probes holds " + num(p.probes.size()) + " positions");
    return;
  }
  if (p.probe_cu.size() != p.cu_seqlens.size())
    fail("Problem.probe_cu must hold N + 1 = " + num(p.cu_seqlens.size()) + " offsets (or none), got " +
         num(p.probe_cu.size()));
  check_offsets(p.probe_cu, "probe_cu");
  if (p.probe_cu.back() != p.probe_count())
    fail("Problem.probe_cu[N] must equal probes.size() = " + num(p.probes.size()) + ", got " + num(p.probe_cu.back()));
  for (int n = 0; n < p.sequences(); ++n) {
    const int64_t len = p.cu_seqlens[zs(n) + 1] - p.cu_seqlens[zs(n)];
    for (int64_t r = p.probe_cu[zs(n)]; r < p.probe_cu[zs(n) + 1]; ++r) {
      const int64_t x = p.probes[zs(r)];
      const std::string at = "Problem.probes[" + num(r) + "] = " + num(x) + " (sequence " + num(n) + ")";
      if (x < 0 || x > len) fail(at + " must lie in [0, len = " + num(len) + "]");
      if (r > p.probe_cu[zs(n)] && x <= p.probes[zs(r) - 1])
        fail(at + " must be greater than the sequence's previous probe " + num(p.probes[zs(r) - 1]));
    }
  }
}

}  // namespace

void validate(const Problem& p) {
  if (p.op != Op::Gdn && p.op != Op::Kda) fail("Problem.op is not Gdn or Kda");
  if (p.H < 1) fail("Problem.H must be >= 1, got " + num(p.H));
  if (p.HV < 1) fail("Problem.HV must be >= 1, got " + num(p.HV));
  if (p.HV % p.H != 0) fail("Problem.HV (" + num(p.HV) + ") must be a multiple of Problem.H (" + num(p.H) + ")");
  if (p.K < 1) fail("Problem.K must be >= 1, got " + num(p.K));
  if (p.V < 1) fail("Problem.V must be >= 1, got " + num(p.V));
  if (p.cu_seqlens.size() < 2) fail("Problem.cu_seqlens must hold N + 1 >= 2 offsets, got " + num(p.cu_seqlens.size()));
  check_offsets(p.cu_seqlens, "cu_seqlens");
  if (!std::isfinite(p.scale)) fail("Problem.scale must be finite (0 means K^-1/2)");
  switch (p.gate) {
    case GateForm::Direct:
      if (p.has_A_log) fail("Problem.has_A_log needs a raw gate form (Softplus or LowerBound), gate is Direct");
      if (p.has_dt_bias) fail("Problem.has_dt_bias needs a raw gate form (Softplus or LowerBound), gate is Direct");
      break;
    case GateForm::Softplus:
      if (!p.has_A_log) fail("Problem.has_A_log must be true for the Softplus gate form (A_log is required)");
      break;
    case GateForm::LowerBound:
      if (p.op != Op::Kda) fail("Problem.gate LowerBound is KDA only, op is Gdn");
      if (!std::isfinite(p.lower_bound) || !(p.lower_bound < 0.0))
        fail("Problem.lower_bound must be finite and < 0, got " + num(p.lower_bound));
      break;
    default:
      fail("Problem.gate is not a known GateForm");
  }
  validate_probes(p);
}

namespace detail {

namespace {

// Zero-length sequences (no work item touches them): ht = h0 and dh0 = dht; a probe there (p = 0,
// docs/algorithm.md 1.4) holds h0 and dht too (zeros when absent).
void pass_through_empty(const Problem& p, const Inputs& in, Outputs& out, Grads* grads) {
  const int64_t cnt = static_cast<int64_t>(p.HV) * p.K * p.V;
  auto copy = [cnt](const float* src, int64_t from, std::vector<double>& dst, int64_t to) {
    if (src != nullptr) std::copy(src + from * cnt, src + (from + 1) * cnt, dst.begin() + to * cnt);
  };
  const float* h0 = p.has_h0 ? in.h0 : nullptr;
  const float* dht = grads != nullptr && p.has_dht ? in.dht : nullptr;
  for (int n = 0; n < p.sequences(); ++n) {
    if (p.cu_seqlens[zs(n) + 1] != p.cu_seqlens[zs(n)]) continue;
    copy(h0, n, out.ht, n);
    if (grads != nullptr && p.has_h0) copy(dht, n, grads->dh0, n);
    for (auto [r, r1] = probe_rows(p, n); r < r1; ++r) {
      copy(h0, n, out.probe_S, r);
      if (grads != nullptr) copy(dht, n, grads->probe_dS, r);
    }
  }
}

}  // namespace

void run(const Problem& p, const Inputs& in, Outputs& out, Grads* grads, int threads, const Tuning& tuning) {
  validate(p);
  check_inputs(p, in, grads != nullptr);
  if (tuning.window < 1 || tuning.max_checkpoints < 1 || tuning.items_per_thread < 1 || tuning.column_groups < 0)
    fail(
        "detail::Tuning: window, max_checkpoints and items_per_thread must be >= 1, "
        "column_groups >= 0");
  threads = resolve_threads(threads);

  const int64_t T = p.tokens();
  const int N = p.sequences(), H = p.H, HV = p.HV, K = p.K, V = p.V, Kg = p.gate_width();
  const int64_t state = static_cast<int64_t>(K) * V;
  const Prepared pr = prepare(p, in, threads);

  out.o.assign(zs(T * HV * V), 0.0);
  out.ht.assign(zs(N * HV * state), 0.0);
  if (grads != nullptr) {
    grads->dq.assign(zs(T * H * K), 0.0);
    grads->dk.assign(zs(T * H * K), 0.0);
    grads->dv.assign(zs(T * HV * V), 0.0);
    grads->dg.assign(zs(T * HV * Kg), 0.0);
    grads->dbeta.assign(zs(T * HV), 0.0);
    grads->dA_log.assign(p.has_A_log ? zs(HV) : 0, 0.0);
    grads->ddt_bias.assign(p.has_dt_bias ? zs(HV * Kg) : 0, 0.0);
    grads->dh0.assign(p.has_h0 ? zs(N * HV * state) : 0, 0.0);
  }
  out.probe_S.assign(zs(p.probe_count() * HV * state), 0.0);
  if (grads != nullptr) grads->probe_dS.assign(zs(p.probe_count() * HV * state), 0.0);
  pass_through_empty(p, in, out, grads);

  run_recurrence(p, in, pr, out, grads, threads, tuning);
  if (grads != nullptr) finish_backward(p, in, pr, *grads, threads);
}

// FLOPs per (token, value head, state element), counting each multiply and add of the loops over
// the K x V state as implemented (recurrence.cpp):
//   forward pass:        7  (pending update 2, decay 1, k.Sbar 2, q.Sbar 2)
//   backward recompute:  5  (forward without the output)
//   reverse sweep:      16  (Sbar 1, dSbar 2, dk 4, da 2, dS 1, G 2, k.G 2, dq 2)
//   two-level checkpoints (sequences with more than Tuning::max_checkpoints windows): +5
// Per-token terms of order K + V (norms, gates, e, o, window bookkeeping) are not counted; they
// are below 2 % of the total at K = V = 64, so the reported rate errs low.
double flops(const Problem& p, bool backward, const Tuning& tuning) {
  validate(p);
  const double kv = static_cast<double>(p.K) * p.V * p.HV;
  double total = 0;
  for (int n = 0; n < p.sequences(); ++n) {
    const int64_t len = p.cu_seqlens[zs(n) + 1] - p.cu_seqlens[zs(n)];
    double per = 7.0;
    if (backward) {
      per += 5.0 + 16.0;
      if (windows(p, n, tuning.window).count() > tuning.max_checkpoints) per += 5.0;
    }
    total += per * kv * static_cast<double>(len);
  }
  return total;
}

}  // namespace detail

Outputs forward(const Problem& p, const Inputs& in, int threads) {
  Outputs out;
  detail::run(p, in, out, nullptr, threads, detail::Tuning{});
  return out;
}

void forward_backward(const Problem& p, const Inputs& in, Outputs& out, Grads& grads, int threads) {
  detail::run(p, in, out, &grads, threads, detail::Tuning{});
}

double forward_flops(const Problem& p) { return detail::flops(p, false, detail::Tuning{}); }

double forward_backward_flops(const Problem& p) { return detail::flops(p, true, detail::Tuning{}); }

}  // namespace kcp::ref
