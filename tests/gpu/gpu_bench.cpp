// kcp_gpu_bench: times the single-rank driver (forward + backward, full saved set) on the CUDA
// backend for one shape, with a per-phase breakdown, and prints a short table (docs/perf-notes.md
// records the numbers). Not a test; the project's timing command is `kcpbench run --bench`.
//
//   kcp_gpu_bench [T=8192] [H=16] [HV=32] [K=128] [P=planned] [repeats=10] [fp16=0] [l2norm=1] [kda=0]
//                 [walk=0]
//
// kda = 1 times KDA (per-channel gates g [T, HV, K]) instead of GDN; issue 16's shape is
// `kcp_gpu_bench T 32 32 128 0 20 0 1 1`.
// walk: the kernel of the state walks, forward and backward (kernels/cuda/walk_select.h): 0 Auto
// (the product's choice), 1 the mma.sync walk, 2 the wgmma + TMA walk wherever it runs;
// e.g. `kcp_gpu_bench 32768 32 32 128 0 20 0 1 1 2`.
// Inputs: uniform random values (never zeros), rounded to the dtype; q, k normalized
// in the kernel when l2norm = 1; direct gates log-sigmoid-like in (-0.7, -0.05); beta in (0, 1).
// P defaults to the planner's rule for the h200 class: floor(132 / (HV * V / 64)), at most
// chunks / 16, clamped to [1, 64].
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/kcp/device_array.h"
#include "core/kcp/phase_timing_backend.h"
#include "core/kcp/rank_driver.h"
#include "kernels/api/numeric.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/walk_select.h"

namespace kk = kcp::kernels;

namespace {

struct Rng {
  uint64_t s;
  float uniform() {  // (0, 1)
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return (float(s >> 40) + 0.5f) * (1.0f / 16777216.0f);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  auto arg = [&](int i, long dflt) { return argc > i ? std::atol(argv[i]) : dflt; };
  const int64_t T = arg(1, 8192);
  const int H = int(arg(2, 16)), HV = int(arg(3, 32)), K = int(arg(4, 128));
  const int repeats = int(arg(6, 10));
  const bool fp16 = arg(7, 0) != 0, l2norm = arg(8, 1) != 0, kda = arg(9, 0) != 0;
  const long walk = arg(10, 0);
  if (walk < 0 || walk > 2) {
    std::printf("walk must be 0 (auto), 1 (mma) or 2 (wgmma), not %ld\n", walk);
    return 2;
  }
  const int64_t chunks = (T + 63) / 64;
  int P = int(arg(5, 0));
  if (P <= 0)
    P = int(std::clamp<int64_t>(std::min<int64_t>(132 / (int64_t(HV) * ((K + 63) / 64)), chunks / 16), 1, 64));
  if (kk::cuda_device_count() == 0) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const kk::cuda::WalkChoice choice = walk == 1   ? kk::cuda::WalkChoice::Mma
                                      : walk == 2 ? kk::cuda::WalkChoice::Wgmma
                                                  : kk::cuda::WalkChoice::Auto;
  kk::cuda::set_fwd_walk_choice(choice);
  kk::cuda::set_bwd_walk_choice(choice);
  auto real = kk::make_cuda_backend(0);
  kcp::PhaseTimingBackend be(*real);

  kk::Problem p;
  p.op = kda ? kk::Op::Kda : kk::Op::Gdn;
  p.H = H;
  p.HV = HV;
  p.K = p.V = K;
  p.qk_l2norm = l2norm;
  p.dtype = fp16 ? kk::DType::FP16 : kk::DType::BF16;
  const kk::RankLayout layout = kk::RankLayout::even({T}, P);
  const kk::LayoutView L = layout.view();
  const auto rt = fp16 ? kcp::RoundTo::FP16 : kcp::RoundTo::BF16;

  Rng rng{0x9E3779B97F4A7C15ull};
  auto gen = [&](int64_t n, float lo, float hi) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = kcp::round_to(lo + (hi - lo) * rng.uniform(), rt);
    return v;
  };
  const kk::Exec ex{kk::Package::Nondet, 1, nullptr};
  auto up = [&](const std::vector<float>& h) {
    float* d = be.alloc_floats(int64_t(h.size()));
    be.upload(d, h.data(), int64_t(h.size()), ex);
    return d;
  };
  // The caller dtype tensors cross the API as 16-bit patterns (kernels/api/tensors.h).
  auto up16 = [&](const std::vector<float>& h) { return kcp::DtypeArray(be, h, p.dtype, ex); };
  const kcp::DtypeArray q = up16(gen(T * H * K, -1.f, 1.f));
  const kcp::DtypeArray k = up16(gen(T * H * K, -1.f, 1.f));
  const kcp::DtypeArray v = up16(gen(T * HV * K, -1.f, 1.f));
  const int64_t gw = p.gate_width();
  float* g = up(gen(T * HV * gw, -0.7f, -0.05f));
  float* beta = up(gen(T * HV, 0.05f, 0.95f));
  const kcp::DtypeArray dO = up16(gen(T * HV * K, -1.f, 1.f));
  const int64_t saved_n = be.saved_floats(p, L, kk::SavedKind::Full),
                ws_n = be.workspace_floats(p, L, kk::SavedKind::Full);
  float* saved = be.alloc_floats(saved_n);
  float* ws = be.alloc_floats(ws_n);
  const kcp::DtypeArray o(be, T * HV * K, p.dtype);
  float* ht = be.alloc_floats(int64_t(HV) * K * K);
  const kcp::DtypeArray dq(be, T * H * K, p.dtype), dk(be, T * H * K, p.dtype), dv(be, T * HV * K, p.dtype);
  float* dg = be.alloc_floats(T * HV * gw);
  float* dbeta = be.alloc_floats(T * HV);
  float* dh0 = be.alloc_floats(int64_t(HV) * K * K);

  kcp::RankRun run;
  run.problem = p;
  run.layout = L;
  run.exec = ex;
  run.kind = kk::SavedKind::Full;
  run.in.q = q.tensor();
  run.in.k = k.tensor();
  run.in.v = v.tensor();
  run.in.g = g;
  run.in.beta = beta;
  run.in.dO = dO.tensor();
  run.saved = be.bind_saved_for(saved, saved_n, p, L, kk::SavedKind::Full, ex.package);
  run.ws = be.bind_workspace_for(ws, ws_n, p, L, kk::SavedKind::Full, ex.package);
  const kk::OutputTensors out{o.tensor(), ht};
  const kk::GradTensors gr{dq.tensor(), dk.tensor(), dv.tensor(), dg, dbeta, nullptr, nullptr, dh0};

  std::vector<double> fwd_ms, bwd_ms;
  std::map<std::string, double> phase_ms;
  auto t_fwd = be.make_timer(), t_bwd = be.make_timer();
  const int warmup = 2;
  for (int rep = 0; rep < warmup + repeats; ++rep) {
    be.set_timing(rep >= warmup);
    t_fwd->start(ex);
    kcp::run_rank_forward(be, run, nullptr, out);
    t_fwd->stop(ex);
    t_bwd->start(ex);
    kcp::run_rank_backward(be, run, nullptr, gr);
    t_bwd->stop(ex);
    be.synchronize(ex);
    if (rep >= warmup) {
      fwd_ms.push_back(t_fwd->elapsed_ms());
      bwd_ms.push_back(t_bwd->elapsed_ms());
      for (const auto& [name, ms] : be.collect()) phase_ms[name] += ms;
    }
  }
  // Check the last results are finite (a cheap guard; accuracy is the tests' job).
  const std::vector<float> host = dq.to_host(ex);
  int64_t bad = 0;
  for (float x : host) bad += std::isfinite(x) ? 0 : 1;

  static const char* const kWalk[] = {"auto", "mma", "wgmma"};
  std::printf(
      "kcp_gpu_bench %s %s: T=%lld H=%d HV=%d K=V=%d P=%d %s l2norm=%d walk=%s (fwd %s, bwd %s), median of %d "
      "(per-phase timing on)\n",
      kda ? "kda" : "gdn", be.device_name().c_str(), (long long)T, H, HV, K, P, fp16 ? "fp16" : "bf16", int(l2norm),
      kWalk[walk], kk::cuda::fwd_walk_uses_wgmma(p) ? "wgmma" : "mma",
      kk::cuda::bwd_walk_uses_wgmma(p) ? "wgmma" : "mma", repeats);
  std::printf("  %-16s %9s\n", "phase", "ms/iter");
  for (const auto& [name, ms] : phase_ms) std::printf("  %-16s %9.3f\n", name.c_str(), ms / repeats);
  std::printf("  forward %.3f ms  backward %.3f ms  fwd+bwd %.3f ms  (non-finite dq: %lld)\n", median(fwd_ms),
              median(bwd_ms), median(fwd_ms) + median(bwd_ms), (long long)bad);
  // Again without per-phase events (they add gaps between launches).
  fwd_ms.clear();
  bwd_ms.clear();
  be.set_timing(false);
  for (int rep = 0; rep < repeats; ++rep) {
    t_fwd->start(ex);
    kcp::run_rank_forward(be, run, nullptr, out);
    t_fwd->stop(ex);
    t_bwd->start(ex);
    kcp::run_rank_backward(be, run, nullptr, gr);
    t_bwd->stop(ex);
    be.synchronize(ex);
    fwd_ms.push_back(t_fwd->elapsed_ms());
    bwd_ms.push_back(t_bwd->elapsed_ms());
  }
  std::printf("RESULT %s T=%lld P=%d fwd_ms=%.3f bwd_ms=%.3f total_ms=%.3f\n", kda ? "kda" : "gdn", (long long)T, P,
              median(fwd_ms), median(bwd_ms), median(fwd_ms) + median(bwd_ms));
  // FNV-1a of the bits of every output and gradient as floats (o, dq, dk, dv decoded from their
  // 16-bit patterns): two builds that must give the same bits (a storage change,
  // docs/perf-notes.md v5; the 16-bit caller tensors) print the same line.
  {
    std::printf("OUTHASH T=%lld", (long long)T);
    auto down = [&](float* src, int64_t n) {
      std::vector<float> hb(static_cast<size_t>(n));
      be.download(hb.data(), src, n, ex);
      return hb;
    };
    const std::pair<const char*, std::vector<float>> outs[] = {
        {"o", o.to_host(ex)},           {"ht", down(ht, int64_t(HV) * K * K)},
        {"dq", dq.to_host(ex)},         {"dk", dk.to_host(ex)},
        {"dv", dv.to_host(ex)},         {"dg", down(dg, T * HV * gw)},
        {"dbeta", down(dbeta, T * HV)}, {"dh0", down(dh0, int64_t(HV) * K * K)}};
    for (const auto& [name, hb] : outs) {
      uint64_t hsh = 1469598103934665603ull;
      const unsigned char* bytes = reinterpret_cast<const unsigned char*>(hb.data());
      for (size_t i = 0; i < hb.size() * sizeof(float); ++i) {
        hsh ^= bytes[i];
        hsh *= 1099511628211ull;
      }
      std::printf(" %s=%016llx", name, (unsigned long long)hsh);
    }
    std::printf("\n");
  }
  for (float* ptr : {g, beta, saved, ws, ht, dg, dbeta, dh0}) be.free_floats(ptr);
  return bad == 0 ? 0 : 1;
}
