// Throughput of the FP64 reference (GDN and KDA, forward and forward+backward) next to Eigen's
// own FP64 matrix-product rate, measured in the same run with the same number of threads.
//
// Eigen's GEMM only runs multi-threaded with OpenMP, which this project does not use; so the
// GEMM rate is one independent n x n x n product per thread, all threads at once, rates summed.
// It is measured before and after the reference runs and the higher value is used (the ratio
// errs low). Times are the best of --reps wall-clock runs; forward() allocates its outputs on
// every call, forward_backward() reuses the caller's Outputs and Grads across repetitions.
//
// Usage: kcp_reference_bench [--quick] [--threads N] [--reps R]
//   default shape: one sequence, T = 8192, H = 4, HV = 8, K = V = 128 (issue 3's acceptance shape)
//   --quick: T = 512, H = 2, HV = 4, K = V = 64, short GEMM timing (a smoke run for CI)
#include <Eigen/Core>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "reference/reference.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Sum over threads of each thread's FP64 GEMM rate (GFLOP/s), all running concurrently.
double eigen_gemm_rate(int threads, int n, double min_seconds) {
  std::vector<double> rate(static_cast<size_t>(threads), 0.0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      Eigen::MatrixXd A = Eigen::MatrixXd::Random(n, n), B = Eigen::MatrixXd::Random(n, n), C(n, n);
      C.noalias() = A * B;  // warm-up
      int reps = 0;
      const auto t0 = Clock::now();
      double el = 0;
      do {
        C.noalias() = A * B;
        ++reps;
        el = seconds_since(t0);
      } while (el < min_seconds);
      rate[static_cast<size_t>(t)] = 2.0 * n * n * static_cast<double>(n) * reps / el / 1e9 + 0.0 * C(0, 0);
    });
  }
  for (auto& th : pool) th.join();
  double sum = 0;
  for (double r : rate) sum += r;
  return sum;
}

struct Data {
  std::vector<float> q, k, v, g, beta, A_log, dt_bias, h0, dO, dht;  // the reference's inputs are float
  kcp::ref::Inputs inputs() const {
    kcp::ref::Inputs in;
    in.q = q.data();
    in.k = k.data();
    in.v = v.data();
    in.g = g.data();
    in.beta = beta.data();
    in.A_log = A_log.empty() ? nullptr : A_log.data();
    in.dt_bias = dt_bias.empty() ? nullptr : dt_bias.data();
    in.h0 = h0.data();
    in.dO = dO.data();
    in.dht = dht.data();
    return in;
  }
};

Data make_data(const kcp::ref::Problem& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  auto randn = [&](size_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = static_cast<float>(nd(rng));
    return x;
  };
  const auto T = static_cast<size_t>(p.tokens());
  const auto H = static_cast<size_t>(p.H), HV = static_cast<size_t>(p.HV), K = static_cast<size_t>(p.K),
             V = static_cast<size_t>(p.V), N = static_cast<size_t>(p.sequences());
  Data d;
  d.q = randn(T * H * K);
  d.k = randn(T * H * K);
  d.v = randn(T * HV * V);
  d.g = randn(T * HV * static_cast<size_t>(p.gate_width()));
  if (p.gate == kcp::ref::GateForm::Direct)  // log-decay = logsigmoid(x)
    for (auto& x : d.g) x = -(std::max(-x, 0.0f) + std::log1p(std::exp(-std::abs(x))));
  d.beta = randn(T * HV);
  for (auto& x : d.beta) x = 1.0f / (1.0f + std::exp(-x));
  if (p.has_A_log) {
    d.A_log.resize(HV);
    const double span = static_cast<double>(std::max<size_t>(HV - 1, 1));
    for (size_t j = 0; j < HV; ++j)
      d.A_log[j] = static_cast<float>(std::log(1.0 + 7.0 * static_cast<double>(j) / span));  // log(linspace(1, 8))
  }
  if (p.has_dt_bias) {
    d.dt_bias = randn(HV * static_cast<size_t>(p.gate_width()));
    for (auto& x : d.dt_bias) x *= 0.1f;
  }
  d.h0 = randn(N * HV * K * V);
  d.dO = randn(T * HV * V);
  d.dht = randn(N * HV * K * V);
  return d;
}

struct Row {
  std::string op, pass;
  double gflop, seconds, rate;
};

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int threads = 0, reps = 2;
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--quick") {
      quick = true;
    } else if ((arg == "--threads" || arg == "--reps") && a + 1 < argc) {
      char* end = nullptr;
      const long val = std::strtol(argv[++a], &end, 10);
      if (end == nullptr || *end != '\0' || val < 1 || val > 4096) {
        std::fprintf(stderr, "kcp_reference_bench: %s needs a positive integer, got '%s'\n", arg.c_str(), argv[a]);
        return 2;
      }
      (arg == "--threads" ? threads : reps) = static_cast<int>(val);
    } else {
      std::fprintf(stderr, "usage: kcp_reference_bench [--quick] [--threads N] [--reps R]\n");
      return 2;
    }
  }
  if (threads <= 0) threads = std::max(1u, std::thread::hardware_concurrency());

  const int64_t T = quick ? 512 : 8192;
  const int H = quick ? 2 : 4, HV = quick ? 4 : 8, K = quick ? 64 : 128, V = K;
  const int gemm_n = quick ? 256 : 512;
  const double gemm_s = quick ? 0.2 : 1.0;

  std::printf(
      "kcp_reference_bench: threads=%d, one sequence, T=%lld, H=%d, HV=%d, K=%d, V=%d, "
      "best of %d\n",
      threads, static_cast<long long>(T), H, HV, K, V, reps);
  std::printf(
      "  GDN: direct gate logsigmoid(randn); KDA: lower-bound gate (lb=-5, A_log, "
      "dt_bias); both with\n"
      "  Q/K L2 norm, h0 and dht. Rates count the FLOPs of forward_flops / "
      "forward_backward_flops.\n"
      "  reference SIMD: %s (the GEMM below: this binary's own flags)\n",
      kcp::ref::simd_description().c_str());
  const double gemm_before = eigen_gemm_rate(threads, gemm_n, gemm_s);

  std::vector<Row> rows;
  for (const kcp::ref::Op op : {kcp::ref::Op::Gdn, kcp::ref::Op::Kda}) {
    kcp::ref::Problem p;
    p.op = op;
    p.H = H;
    p.HV = HV;
    p.K = K;
    p.V = V;
    p.cu_seqlens = {0, T};
    p.qk_l2norm = true;
    p.has_h0 = true;
    p.has_dht = true;
    if (op == kcp::ref::Op::Kda) {
      p.gate = kcp::ref::GateForm::LowerBound;
      p.lower_bound = -5.0;
      p.has_A_log = true;
      p.has_dt_bias = true;
    }
    const Data data = make_data(p, op == kcp::ref::Op::Gdn ? 1 : 2);
    const kcp::ref::Inputs in = data.inputs();
    const char* name = op == kcp::ref::Op::Gdn ? "GDN" : "KDA";

    double best = 1e300;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      const kcp::ref::Outputs out = kcp::ref::forward(p, in, threads);
      best = std::min(best, seconds_since(t0));
    }
    const double ff = kcp::ref::forward_flops(p) / 1e9;
    rows.push_back({name, "fwd", ff, best, ff / best});

    best = 1e300;
    kcp::ref::Outputs out;  // reused across repetitions, as a caller computing many rows would
    kcp::ref::Grads grads;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = Clock::now();
      kcp::ref::forward_backward(p, in, out, grads, threads);
      best = std::min(best, seconds_since(t0));
    }
    const double fb = kcp::ref::forward_backward_flops(p) / 1e9;
    rows.push_back({name, "fwd+bwd", fb, best, fb / best});
  }

  const double gemm_after = eigen_gemm_rate(threads, gemm_n, gemm_s);
  const double gemm = std::max(gemm_before, gemm_after);
  std::printf(
      "  Eigen FP64 GEMM %dx%dx%d, one per thread, %d threads: %.2f GFLOP/s (before %.2f, "
      "after %.2f)\n\n",
      gemm_n, gemm_n, gemm_n, threads, gemm, gemm_before, gemm_after);
  std::printf("  %-4s %-8s %9s %9s %9s %12s\n", "op", "pass", "GFLOP", "time_s", "GFLOP/s", "vs_GEMM");
  bool met = true;
  for (const Row& r : rows) {
    const double ratio = r.rate / gemm;
    std::printf("  %-4s %-8s %9.2f %9.3f %9.2f %12.3f\n", r.op.c_str(), r.pass.c_str(), r.gflop, r.seconds, r.rate,
                ratio);
    if (r.pass == "fwd+bwd" && ratio < 0.3) met = false;
  }
  std::printf("\n  acceptance (fwd+bwd >= 0.30 x GEMM, GDN and KDA): %s\n", met ? "met" : "NOT met");
  return 0;
}
