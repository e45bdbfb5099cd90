// Per-token preparation (Q/K L2 norm, q.k, decay factors) and the backward tail (gate chain rule,
// L2-norm backward). Everything here is O(T * HV * K); the O(T * HV * K * V) work lives in
// recurrence.cpp.
#include <cmath>

#include "reference/detail.h"

namespace kcp::ref::detail {

namespace {
constexpr double kL2Eps = 1e-6;  // docs/algorithm.md 1.3: added to the sum of squares inside the sqrt
constexpr int64_t kTokensPerTask = 256;
}  // namespace

int resolve_threads(int threads) {
  if (threads > 0) return threads;
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : static_cast<int>(hc);
}

Prepared prepare(const Problem& p, const Inputs& in, int threads) {
  Prepared pr;
  pr.T = p.tokens();
  pr.H = p.H;
  pr.HV = p.HV;
  pr.K = p.K;
  pr.V = p.V;
  pr.G = p.HV / p.H;
  pr.Kg = p.gate_width();
  pr.rho = p.scale != 0.0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(p.K));
  pr.zeros.assign(static_cast<size_t>(p.K), 0.0f);
  pr.q = in.q;
  pr.k = in.k;

  const int64_t T = pr.T;
  const int H = p.H, HV = p.HV, K = p.K, Kg = pr.Kg;
  const auto sz = [](int64_t n) { return static_cast<size_t>(n); };
  const auto uninit = [&](int64_t n) { return std::unique_ptr<double[]>(new double[sz(std::max<int64_t>(n, 1))]); };
  if (p.qk_l2norm) {
    pr.rstd_q = uninit(T * H);
    pr.rstd_k = uninit(T * H);
  }
  pr.qk = uninit(T * H);
  pr.dec = uninit(T * HV * Kg);

  const int64_t tasks = (T + kTokensPerTask - 1) / kTokensPerTask;
  parallel_for(tasks, threads, [&](int64_t task) {
    const int64_t ta = task * kTokensPerTask, tb = std::min(T, ta + kTokensPerTask);
    for (int64_t t = ta; t < tb; ++t) {
      for (int i = 0; i < H; ++i) {
        const int64_t row = t * H + i;
        if (p.qk_l2norm) {
          const float* srcs[2] = {in.q + row * K, in.k + row * K};
          double* rstds[2] = {&pr.rstd_q[sz(row)], &pr.rstd_k[sz(row)]};
          for (int w = 0; w < 2; ++w) {
            double ss = 0;
            for (int d = 0; d < K; ++d) ss += static_cast<double>(srcs[w][d]) * srcs[w][d];
            *rstds[w] = 1.0 / std::sqrt(ss + kL2Eps);
          }
        }
        const QKRow qn = pr.qn(row), kn = pr.kn(row);
        double qk = 0;
        for (int d = 0; d < K; ++d) qk += qn[d] * kn[d];
        pr.qk[sz(row)] = qk;
      }
      for (int j = 0; j < HV; ++j) {
        const double eA = p.has_A_log ? std::exp(static_cast<double>(in.A_log[j])) : 1.0;
        for (int d = 0; d < Kg; ++d) {
          const int64_t idx = (t * HV + j) * Kg + d;
          const double bias = p.has_dt_bias ? static_cast<double>(in.dt_bias[j * Kg + d]) : 0.0;
          pr.dec[sz(idx)] = std::exp(gate_value<false>(p, eA, static_cast<double>(in.g[idx]) + bias).a);
        }
      }
    }
  });
  return pr;
}

void finish_backward(const Problem& p, const Inputs& in, const Prepared& pr, Grads& g, int threads) {
  const int64_t T = pr.T;
  const int H = pr.H, HV = pr.HV, K = pr.K, Kg = pr.Kg;

  // Gate chain rule. g.dg holds d L / d a on entry. Token chunks of a fixed size (a function of T
  // only) run in parallel; each keeps its own partial sums of dA_log and ddt_bias (tokens in
  // order), which are then added in chunk order: the same bits for any thread count.
  if (p.gate != GateForm::Direct) {
    const int64_t chunk = std::max<int64_t>(kTokensPerTask, (T + 511) / 512);
    const int64_t tasks = (T + chunk - 1) / chunk;
    const int64_t width = static_cast<int64_t>(HV) * Kg;
    std::vector<double> eA(static_cast<size_t>(HV), 1.0);
    if (p.has_A_log)
      for (int j = 0; j < HV; ++j) eA[static_cast<size_t>(j)] = std::exp(static_cast<double>(in.A_log[j]));
    std::vector<double> part_A(static_cast<size_t>(tasks * HV), 0.0);
    std::vector<double> part_b(static_cast<size_t>(tasks * width), 0.0);
    parallel_for(tasks, threads, [&](int64_t task) {
      const int64_t ta = task * chunk, tb = std::min(T, ta + chunk);
      double* pA = part_A.data() + task * HV;
      double* pb = part_b.data() + task * width;
      for (int64_t t = ta; t < tb; ++t) {
        for (int j = 0; j < HV; ++j) {
          for (int d = 0; d < Kg; ++d) {
            const int64_t idx = (t * HV + j) * Kg + d;
            const double bias = p.has_dt_bias ? static_cast<double>(in.dt_bias[j * Kg + d]) : 0.0;
            const GateValue gv = gate_value<true>(p, eA[static_cast<size_t>(j)], static_cast<double>(in.g[idx]) + bias);
            const double da = g.dg[static_cast<size_t>(idx)];
            const double dx = da * gv.dadx;
            g.dg[static_cast<size_t>(idx)] = dx;
            pA[j] += da * gv.dadA;
            pb[j * Kg + d] += dx;
          }
        }
      }
    });
    for (int64_t task = 0; task < tasks; ++task) {
      if (p.has_A_log)
        for (int j = 0; j < HV; ++j) g.dA_log[static_cast<size_t>(j)] += part_A[static_cast<size_t>(task * HV + j)];
      if (p.has_dt_bias)
        for (int64_t x = 0; x < width; ++x)
          g.ddt_bias[static_cast<size_t>(x)] += part_b[static_cast<size_t>(task * width + x)];
    }
  }

  // L2-norm backward: dx = rstd * (dy - (dy . y) y), y the normalized vector.
  if (p.qk_l2norm) {
    const int64_t tasks = (T + kTokensPerTask - 1) / kTokensPerTask;
    parallel_for(tasks, threads, [&](int64_t task) {
      const int64_t ta = task * kTokensPerTask, tb = std::min(T, ta + kTokensPerTask);
      for (int64_t row = ta * H; row < tb * H; ++row) {
        struct Side {
          double* dy;
          QKRow y;
          double rstd;
        };
        const Side sides[2] = {{g.dq.data() + row * K, pr.qn(row), pr.rstd_q[static_cast<size_t>(row)]},
                               {g.dk.data() + row * K, pr.kn(row), pr.rstd_k[static_cast<size_t>(row)]}};
        for (const Side& s : sides) {
          double dot = 0;
          for (int d = 0; d < K; ++d) dot += s.dy[d] * s.y[d];
          for (int d = 0; d < K; ++d) s.dy[d] = s.rstd * (s.dy[d] - dot * s.y[d]);
        }
      }
    });
  }
}

}  // namespace kcp::ref::detail
