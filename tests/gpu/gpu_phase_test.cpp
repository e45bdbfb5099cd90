// Each CUDA phase against the CPU twin on the same inputs (label gpu; skipped without a device).
//
// The twin runs one rank forward + backward on the host (full saved set, no re-poisoning), so its
// saved set and workspace then hold every intermediate tensor. For each phase the GPU gets a
// fresh copy of those arenas (so its inputs are exactly the twin's), the phase's outputs are
// poisoned with NaN, the GPU phase runs, and its outputs are compared with the twin's. The CUDA
// backend stores the "dtype" saved / workspace tensors (q, k, Phi, W, U, h, v_new, dv_local, dh,
// dv2) as Storage::Packed16 (kernels/api/dtype_tensor.h), the twin as F32: the device image packs
// them, and they are unpacked (exactly) before the comparison; their poison is the dtype's NaN
// pattern. The caller tensors q, k, v, dO, o, dq, dk, dv are 16-bit on both backends
// (Backend::caller_storage(); core/kcp/device_array.h, DtypeArray).
//
// Tolerance: both sides use the same dtype operands and the same rounding points; they differ
// only in the order of fp32 accumulation (tensor-core fragments vs sequential loops) and, in the
// fp32 M chain, by the split-operand products (~2^-16 relative). A rounding to bf16 therefore
// flips by one ulp only where the fp32 values straddle a rounding boundary, and such flips move
// later fp32 sums by about one ulp of the flipped term. So the rel-RMS difference must stay below
// the dtype's unit roundoff u (2^-8 bf16, 2^-11 fp16) and the max difference below 4u of the
// tensor's largest magnitude (two ulps), NaN-free. Measured margins are printed per tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/kcp/rank_driver.h"
#include "device_exp2.h"
#include "gpu_harness.h"
#include "kernels/api/numeric.h"
#include "kernels/api/summary_needs.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/kda_qs.h"
#include "kernels/cuda/walk_select.h"

namespace kcp::test {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// GDN: GVA (H = 2, HV = 4), varlen with partial last chunks (and a zero-length sequence in the
// direct case), h0 and dht; head dims K and V (V = K unless given).
Case phase_case(const std::string& name, int K, kk::DType dt, bool raw, int V = 0) {
  Case c;
  c.name = name;
  c.op = kk::Op::Gdn;
  c.H = 2;
  c.HV = 4;
  c.K = K;
  c.V = V > 0 ? V : K;
  c.lens = raw ? std::vector<int64_t>{100, 37, 300} : std::vector<int64_t>{100, 0, 37, 300};
  c.dtype = dt;
  c.h0 = c.dht = true;
  c.gate_div = 8.0;
  if (raw) {
    c.l2norm = true;
    c.gate = kk::GateForm::Softplus;
    c.A_log = c.dt_bias = true;
  }
  c.seed = 101 + K + (dt == kk::DType::FP16 ? 7 : 0) + (raw ? 3 : 0) + (c.V != K ? 11 : 0);
  return c;
}

// Several waves of blocks on the H200 (132 SMs): 129 chunks x 8 value heads, so a kernel whose
// blocks overwrite each other's inputs (a cross-block hazard the small cases run in one wave and
// never show) fails here.
Case multiwave_case() {
  Case c = phase_case("multiwave_K128_bf16", 128, kk::DType::BF16, true);
  c.H = 4;
  c.HV = 8;
  c.lens = {4000, 4192};
  c.seed = 977;
  return c;
}

// GDN at K = V = 128 with G = HV / H value heads per q/k head other than 2: the kernels that form
// the finalize's dq / dk in thread block clusters of a q/k head's blocks (gdn_bwd_wy_wgmma.cuh: G
// blocks; gdn_bwd_dqk_wgmma.cuh: 2 G, fused up to G = 4) run at cluster sizes 1, 4 and 8 here, and
// G = 8 also takes the unfused B4 path beside the fused B5.
Case group_case(const std::string& name, int H, int HV, kk::DType dt, uint64_t seed) {
  Case c = phase_case(name, 128, dt, true);
  c.H = H;
  c.HV = HV;
  c.seed = seed;
  return c;
}

// KDA (per-channel gates, kg, Aqk): GVA (H = 2, HV = 4), h0 and dht, a zero-length sequence in the
// direct case; gate = the gate form (raw forms get dt_bias [HV, K]; softplus always, and
// lower_bound when a_log, get A_log: the API requires A_log with softplus); head dims K and V (V = K
// unless given).
Case kda_case(const std::string& name, int K, kk::DType dt, kk::GateForm gate, bool l2norm, bool a_log, uint64_t seed,
              int V = 0) {
  Case c;
  c.name = name;
  c.op = kk::Op::Kda;
  c.H = 2;
  c.HV = 4;
  c.K = K;
  c.V = V > 0 ? V : K;
  c.lens = gate == kk::GateForm::Direct ? std::vector<int64_t>{100, 0, 37, 300} : std::vector<int64_t>{100, 37, 300};
  c.dtype = dt;
  c.h0 = c.dht = true;
  c.gate = gate;
  c.gate_div = 8.0;
  c.l2norm = l2norm;
  if (gate != kk::GateForm::Direct) {
    c.dt_bias = true;
    c.A_log = a_log || gate == kk::GateForm::Softplus;
  }
  c.seed = seed;
  return c;
}

struct Param {
  Case c;
  int P;
};
// ctest lists the case by name, not as a byte dump.
void PrintTo(const Param& p, std::ostream* os) { *os << p.c.name << " P=" << p.P; }

class GpuPhase : public ::testing::TestWithParam<Param> {
 protected:
  // Every phase once on this case, each compared with the twin (prep to bwd_finalize).
  void every_phase_matches_the_twin();
  void grads_with_finalize_match_the_phases();
  // bwd_grads' caller outputs on the device, poisoned.
  struct GradOut {
    kcp::DtypeArray dv;
    Buf dbeta;
    GradOut(const kk::Backend& gpu, const Case& c) : dv(gpu, c.T() * c.HV * c.V, c.dtype), dbeta(gpu, c.T() * c.HV) {
      dv.poison();
      dbeta.fill(kNaN);
    }
  };
  // bwd_finalize's outputs on the device, poisoned.
  struct FinalizeOut {
    kcp::DtypeArray dq, dk;
    Buf dg, dA, ddt;
    FinalizeOut(const kk::Backend& gpu, const Case& c, int64_t gw)
        : dq(gpu, c.T() * c.H * c.K, c.dtype),
          dk(gpu, c.T() * c.H * c.K, c.dtype),
          dg(gpu, c.T() * c.HV * gw),
          dA(gpu, c.HV),
          ddt(gpu, c.HV * gw) {
      for (const Buf* b : {&dg, &dA, &ddt}) b->fill(kNaN);
      dq.poison();
      dk.poison();
    }
  };
  void SetUp() override {
    if (kk::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    gpu_ = kk::make_cuda_backend(0);
    cpu_ = kk::make_cpu_backend();
    c_ = GetParam().c;
    d_ = make_data(c_);
    p_ = c_.problem();
    layout_ = kk::RankLayout::even(c_.lens, GetParam().P);
    L_ = layout_.view();
    const int64_t T = c_.T(), N = L_.n_pieces, S = int64_t(c_.HV) * c_.K * c_.V;
    // ---- the twin, host memory ----
    h_saved_.assign(size_t(cpu_->saved_floats(p_, L_, kk::SavedKind::Full)), kNaN);
    h_ws_.assign(size_t(gpu_->workspace_floats(p_, L_, kk::SavedKind::Full)),
                 kNaN);  // the GPU's size (with its scratch)
    // The twin's storage (F32), the GPU's workspace size (its scratch last, so every other tensor
    // sits at the same offset as on the device).
    hs_ =
        cpu_->bind_saved_for(h_saved_.data(), int64_t(h_saved_.size()), p_, L_, kk::SavedKind::Full, kk::Package::Det);
    hw_ = kk::bind_workspace(h_ws_.data(), int64_t(h_ws_.size()), p_, L_, kk::SavedKind::Full, kk::Package::Det,
                             gpu_->extra_workspace_floats(p_, L_), cpu_->dtype_storage());
    h_o_ = kcp::DtypeArray(*cpu_, T * c_.HV * c_.V, c_.dtype);
    h_ht_.assign(size_t(N * S), kNaN);
    h_dq_ = kcp::DtypeArray(*cpu_, T * c_.H * c_.K, c_.dtype);
    h_dk_ = kcp::DtypeArray(*cpu_, T * c_.H * c_.K, c_.dtype);
    h_dv_ = kcp::DtypeArray(*cpu_, T * c_.HV * c_.V, c_.dtype);
    for (const kcp::DtypeArray* a : {&h_o_, &h_dq_, &h_dk_, &h_dv_}) a->poison();
    hq_ = kcp::DtypeArray(*cpu_, d_.q, c_.dtype);
    hk_ = kcp::DtypeArray(*cpu_, d_.k, c_.dtype);
    hv_ = kcp::DtypeArray(*cpu_, d_.v, c_.dtype);
    hdO_ = kcp::DtypeArray(*cpu_, d_.dO, c_.dtype);
    h_dg_.assign(size_t(T) * c_.HV * p_.gate_width(), kNaN);
    h_dbeta_.assign(size_t(T) * c_.HV, kNaN);
    h_dA_.assign(size_t(c_.HV), kNaN);
    h_ddt_.assign(size_t(c_.HV) * p_.gate_width(), kNaN);
    h_dh0_.assign(size_t(N * S), kNaN);
    kcp::RankRun run;
    run.problem = p_;
    run.layout = L_;
    run.kind = kk::SavedKind::Full;
    run.in = inputs(hq_.tensor(), hk_.tensor(), hv_.tensor(), d_.g.data(), d_.beta.data(), d_.A_log.data(),
                    d_.dt_bias.data(), d_.h0.data(), hdO_.tensor(), d_.dht.data());
    run.saved = hs_;
    run.ws = hw_;
    kcp::run_rank_forward(*cpu_, run, nullptr, kk::OutputTensors{h_o_.tensor(), h_ht_.data()});
    kk::GradTensors g{h_dq_.tensor(),
                      h_dk_.tensor(),
                      h_dv_.tensor(),
                      h_dg_.data(),
                      h_dbeta_.data(),
                      c_.A_log ? h_dA_.data() : nullptr,
                      c_.dt_bias ? h_ddt_.data() : nullptr,
                      h_dh0_.data()};
    kcp::run_rank_backward(*cpu_, run, nullptr, g);
    // The device images of the workspace and the saved set: the CUDA backend's 16-bit tensors
    // packed (cuda_backend.cu).
    h_ws_dev_ = h_ws_;
    for (const Region16& r : cuda_16bit_tensors(hw_, p_, L_)) put16(h_ws_dev_, h_ws_, r);
    h_saved_dev_ = h_saved_;
    for (const Region16& r : cuda_16bit_tensors(hs_, p_, L_)) put16(h_saved_dev_, h_saved_, r);
    // ---- device copies ----
    d_saved_ = Buf(*gpu_, int64_t(h_saved_.size()));
    d_ws_ = Buf(*gpu_, int64_t(h_ws_.size()));
    ds_ = gpu_->bind_saved_for(d_saved_.get(), d_saved_.size(), p_, L_, kk::SavedKind::Full, kk::Package::Det);
    dw_ = gpu_->bind_workspace_for(d_ws_.get(), d_ws_.size(), p_, L_, kk::SavedKind::Full, kk::Package::Det);
    for (auto* pr : {&g_, &beta_, &A_log_, &dt_bias_, &h0_, &dht_}) *pr = Buf();
    q_ = kcp::DtypeArray(*gpu_, d_.q, c_.dtype);
    k_ = kcp::DtypeArray(*gpu_, d_.k, c_.dtype);
    v_ = kcp::DtypeArray(*gpu_, d_.v, c_.dtype);
    g_ = Buf(*gpu_, d_.g);
    beta_ = Buf(*gpu_, d_.beta);
    A_log_ = Buf(*gpu_, d_.A_log);
    dt_bias_ = Buf(*gpu_, d_.dt_bias);
    h0_ = Buf(*gpu_, d_.h0);
    dO_ = kcp::DtypeArray(*gpu_, d_.dO, c_.dtype);
    dht_ = Buf(*gpu_, d_.dht);
    din_ = inputs(q_.tensor(), k_.tensor(), v_.tensor(), g_.get(), beta_.get(), A_log_.get(), dt_bias_.get(), h0_.get(),
                  dO_.tensor(), dht_.get());
  }

  // Writes the twin tensor r (F32, in harena) packed into the same place of the device image
  // `image` (a byte image of the arena: Packed16 uses the first ceil(n / 2) floats of the region).
  void put16(std::vector<float>& image, const std::vector<float>& harena, const Region16& r) const {
    const std::vector<uint16_t> pk = pack16(r.t.f32(), r.n, c_.dtype);
    std::memcpy(image.data() + (r.t.f32() - harena.data()), pk.data(), pk.size() * sizeof(uint16_t));
  }

  kk::InputTensors inputs(kk::ConstDtypeTensor q, kk::ConstDtypeTensor k, kk::ConstDtypeTensor v, const float* g,
                          const float* beta, const float* A_log, const float* dt_bias, const float* h0,
                          kk::ConstDtypeTensor dO, const float* dht) const {
    kk::InputTensors in;
    in.q = q;
    in.k = k;
    in.v = v;
    in.g = g;
    in.beta = beta;
    in.A_log = c_.A_log ? A_log : nullptr;
    in.dt_bias = c_.dt_bias ? dt_bias : nullptr;
    in.h0 = c_.h0 ? h0 : nullptr;
    in.dO = dO;
    in.dht = c_.dht ? dht : nullptr;
    return in;
  }
  kk::PhaseCtx ctx() const { return kk::PhaseCtx{p_, L_, kk::Exec{}, dw_.scratch, dw_.scratch_floats}; }
  // Fresh device arenas holding the twin's values.
  void refresh() {
    d_saved_.put(h_saved_dev_);
    d_ws_.put(h_ws_dev_);
  }
  // Poisons n floats at a device pointer.
  void poison(float* p, int64_t n) const { gpu_->fill_floats(p, kNaN, n, kk::Exec{}); }
  // Poisons a tensor in the CUDA backend's 16-bit storage: every element the dtype's NaN pattern.
  void poison16(kk::DtypeTensor t, int64_t n) const { kcp::poison_dtype(*gpu_, t, n, kk::rounding_of(c_.dtype)); }
  std::vector<float> down(const float* p, int64_t n) const {
    std::vector<float> h(static_cast<size_t>(n));
    gpu_->download(h.data(), p, n, kk::Exec{});
    return h;
  }
  // Compares the GPU's values a with the twin's b (note: how the GPU stored them).
  void expect_near(const char* phase, const char* name, const std::vector<float>& a, const std::vector<float>& b,
                   const char* note) {
    const Diff df = diff(a, b);
    const double u = unit_roundoff(c_);
    std::printf("[ phase    ] %-22s %-17s %-10s rel_rms %.2e (<= %.1e)  rel_max %.2e (<= %.1e)%s\n", c_.name.c_str(),
                phase, name, df.rel_rms, u, df.rel_max, 4 * u, note);
    EXPECT_EQ(df.bad, 0) << phase << " " << name << ": non-finite values (unwritten or NaN)";
    EXPECT_LE(df.rel_rms, u) << phase << " " << name;
    EXPECT_LE(df.rel_max, 4 * u) << phase << " " << name;
  }
  // Compares n floats of the device tensor with the host tensor at the same offset in its arena.
  void expect_close(const char* phase, const char* name, const float* dev, const float* host, int64_t n) {
    expect_near(phase, name, down(dev, n), std::vector<float>(host, host + n), "");
  }
  // A caller dtype tensor of the GPU (16-bit) against the twin's (16-bit).
  void expect_caller(const char* phase, const char* name, const kcp::DtypeArray& dev, const kcp::DtypeArray& host) {
    expect_near(phase, name, dev.to_host(), host.to_host(), "  (16-bit caller tensor)");
  }
  // Device / host pointer of the same arena tensor.
  const float* host_of(const float* dev_ptr, const Buf& darena, const std::vector<float>& harena) const {
    return harena.data() + (dev_ptr - darena.get());
  }
  void expect_saved(const char* phase, const char* name, float* dev, int64_t n) {
    expect_close(phase, name, dev, host_of(dev, d_saved_, h_saved_), n);
  }
  void expect_ws(const char* phase, const char* name, float* dev, int64_t n) {
    expect_close(phase, name, dev, host_of(dev, d_ws_, h_ws_), n);
  }
  // A workspace / saved-set tensor in the CUDA backend's 16-bit storage, unpacked to floats for
  // the comparison.
  void expect_ws16(const char* phase, const char* name, kk::DtypeTensor dev, int64_t n) {
    expect16(phase, name, dev, n, d_ws_, h_ws_);
  }
  void expect_saved16(const char* phase, const char* name, kk::DtypeTensor dev, int64_t n) {
    expect16(phase, name, dev, n, d_saved_, h_saved_);
  }
  void expect16(const char* phase, const char* name, kk::DtypeTensor dev, int64_t n, const Buf& darena,
                const std::vector<float>& harena) {
    // The region's first ceil(n / 2) floats, downloaded as bytes, are the n 16-bit elements.
    std::vector<uint16_t> raw(size_t((n + 1) / 2) * 2);
    gpu_->download(reinterpret_cast<float*>(raw.data()), reinterpret_cast<const float*>(dev.packed16()), (n + 1) / 2,
                   kk::Exec{});
    const std::vector<float> a = unpack16(raw.data(), n, c_.dtype);
    const float* dev_region = static_cast<const float*>(static_cast<const void*>(dev.packed16()));
    const float* host = host_of(dev_region, darena, harena);
    expect_near(phase, name, a, std::vector<float>(host, host + n), "  (16-bit storage)");
  }

  // The two forward walks (also run by GpuFwdWalk below): each on fresh arenas with its outputs
  // poisoned first, then its outputs against the twin's (phase: the name printed).
  int64_t state_floats() const { return int64_t(c_.HV) * c_.K * c_.V; }
  int64_t mt_floats() const { return int64_t(c_.HV) * c_.K * c_.K; }
  void run_fwd_summaries() {
    refresh();
    poison(dw_.seg_h_ext, L_.n_segments * state_floats());
    poison(ds_.seg_Mt, L_.n_segments * mt_floats());
    kk::FwdSummaryArgs a;
    a.ctx = ctx();
    a.k = ds_.k;
    a.gcum = ds_.gcum;
    a.W = ds_.W;
    a.U = ds_.U;
    a.kg = ds_.kg;
    a.seg_h_ext = dw_.seg_h_ext;
    a.seg_Mt = ds_.seg_Mt;
    gpu_->fwd_summaries(a);
  }
  void expect_fwd_summaries(const char* phase) {
    expect_ws(phase, "seg_h_ext", dw_.seg_h_ext, L_.n_segments * state_floats());
    expect_saved(phase, "seg_Mt", ds_.seg_Mt, L_.n_segments * mt_floats());
    if (::testing::Test::HasFailure()) print_mt_by_segment(phase);
  }
  // Where seg_Mt differs: one line per (segment, value head) with the summary_needs flag and the
  // largest magnitudes of the twin's and the GPU's tile and of their difference.
  void print_mt_by_segment(const char* phase) const {
    const std::vector<float> gpu = down(ds_.seg_Mt, L_.n_segments * mt_floats());
    const float* twin = host_of(ds_.seg_Mt, d_saved_, h_saved_);
    const int64_t kk2 = int64_t(c_.K) * c_.K;
    for (int32_t s = 0; s < L_.n_segments; ++s) {
      const kk::SegmentDesc& sg = L_.segments[s];
      const bool need = kk::summary_needs(L_.pieces, L_.n_pieces, sg, p_.has_h0, p_.has_dht).M;
      for (int32_t j = 0; j < c_.HV; ++j) {
        double mt = 0, mg = 0, md = 0;
        for (int64_t e = (int64_t(s) * c_.HV + j) * kk2, n = e + kk2; e < n; ++e) {
          mt = std::max(mt, double(std::fabs(twin[e])));
          mg = std::max(mg, double(std::fabs(gpu[e])));
          md = std::max(md, double(std::fabs(gpu[e] - twin[e])));
        }
        std::printf(
            "[ seg_Mt   ] %s s %d (piece %d, chunks %lld..%lld) j %d need %d max|twin| %.3e max|gpu| %.3e max|diff| "
            "%.3e\n",
            phase, s, sg.piece, (long long)sg.chunk_begin, (long long)sg.chunk_end, j, int(need), mt, mg, md);
      }
    }
  }
  // bwd_grads' Args on the device arenas, writing g's tensors.
  kk::BwdGradArgs grad_args(const GradOut& g) const {
    kk::BwdGradArgs a;
    a.ctx = ctx();
    a.q = ds_.q;
    a.k = ds_.k;
    a.v = din_.v;
    a.beta = din_.beta;
    a.gcum = ds_.gcum;
    a.Phi = ds_.Phi;
    a.Aqk = ds_.Aqk;
    a.h = dw_.h;
    a.v_new = dw_.v_new;
    a.dh = dw_.dh;
    a.dv2 = dw_.dv2;
    a.dO = din_.dO;
    a.dq_hv = dw_.dq_hv;
    a.dk_hv = dw_.dk_hv;
    a.dv = g.dv.tensor();
    a.dbeta = g.dbeta.get();
    a.dlam = dw_.dlam;
    return a;
  }
  void expect_grads(const char* phase, const GradOut& g) {
    expect_caller(phase, "dv", g.dv, h_dv_);
    expect_close(phase, "dbeta", g.dbeta.get(), h_dbeta_.data(), c_.T() * c_.HV);
  }
  // bwd_finalize's Args on the device arenas, writing f's tensors.
  kk::BwdFinalizeArgs finalize_args(const FinalizeOut& f) const {
    kk::BwdFinalizeArgs a;
    a.ctx = ctx();
    a.dq_hv = dw_.dq_hv;
    a.dk_hv = dw_.dk_hv;
    a.dlam = dw_.dlam;
    a.q = ds_.q;
    a.k = ds_.k;
    a.rstd_q = ds_.rstd_q;
    a.rstd_k = ds_.rstd_k;
    a.g = din_.g;
    a.A_log = din_.A_log;
    a.dt_bias = din_.dt_bias;
    a.dq = f.dq.tensor();
    a.dk = f.dk.tensor();
    a.dg = f.dg.get();
    a.dA_log = c_.A_log ? f.dA.get() : nullptr;
    a.ddt_bias = c_.dt_bias ? f.ddt.get() : nullptr;
    return a;
  }
  void expect_finalize(const char* phase, const FinalizeOut& f) {
    const int64_t HV = c_.HV, gw = p_.gate_width();
    expect_caller(phase, "dq", f.dq, h_dq_);
    expect_caller(phase, "dk", f.dk, h_dk_);
    expect_close(phase, "dg", f.dg.get(), h_dg_.data(), c_.T() * HV * gw);
    if (c_.A_log) expect_close(phase, "dA_log", f.dA.get(), h_dA_.data(), HV);
    if (c_.dt_bias) expect_close(phase, "ddt_bias", f.ddt.get(), h_ddt_.data(), HV * gw);
  }
  // output: the forward's o in the same call (FwdStateArgs::output), as the driver runs it.
  void run_fwd_states(const Buf& ht, const kk::FwdOutputArgs* output = nullptr) {
    refresh();
    poison16(dw_.h, L_.n_chunks * state_floats());
    poison16(dw_.v_new, c_.T() * c_.HV * c_.V);
    ht.fill(kNaN);
    kk::FwdStateArgs a;
    a.ctx = ctx();
    a.k = ds_.k;
    a.gcum = ds_.gcum;
    a.W = ds_.W;
    a.U = ds_.U;
    a.kg = ds_.kg;
    a.seg_entry = ds_.seg_entry;
    a.h = dw_.h;
    a.v_new = dw_.v_new;
    a.ht = ht.get();
    a.output = output;
    gpu_->fwd_states(a);
  }
  void expect_fwd_states(const char* phase, const Buf& ht) {
    expect_state_walk(phase, {"h", dw_.h}, {"v_new", dw_.v_new}, {"ht", ht}, h_ht_);
  }
  // What a states walk wrote: the 16-bit states of the chunks (h, dh), the 16-bit chunk outputs
  // (v_new, dv2), and the fp32 final states of the non-empty pieces (ht, dh0; the twin's: twin).
  void expect_state_walk(const char* phase, std::pair<const char*, kk::DtypeTensor> states,
                         std::pair<const char*, kk::DtypeTensor> outs, std::pair<const char*, const Buf&> fin,
                         const std::vector<float>& twin) {
    const int64_t S = state_floats();
    expect_ws16(phase, states.first, states.second, L_.n_chunks * S);
    expect_ws16(phase, outs.first, outs.second, c_.T() * c_.HV * c_.V);
    for (int32_t q = 0; q < L_.n_pieces; ++q)
      if (L_.pieces[q].end > L_.pieces[q].begin)
        expect_close(phase, fin.first, fin.second.get() + q * S, twin.data() + q * S, S);
  }

  // The two backward walks (also run by GpuBwdWalk below), as the forward ones above; Args: the
  // walk's args with the inputs both read.
  template <class Args>
  Args bwd_walk_args() const {
    Args a;
    a.ctx = ctx();
    a.q = ds_.q;
    a.k = ds_.k;
    a.gcum = ds_.gcum;
    a.W = ds_.W;
    a.kg = ds_.kg;
    a.dO = din_.dO;
    a.dv_local = dw_.dv_local;
    return a;
  }
  void run_bwd_summaries() {
    refresh();
    poison(dw_.seg_dh_ext, L_.n_segments * state_floats());
    // KDA's wgmma walk: qs rows the prepass leaves out (segments whose summary nobody reads) stay
    // NaN, so a walk that used one would leave NaN in seg_dh_ext.
    if (dw_.scratch) poison(dw_.scratch, dw_.scratch_floats);
    kk::BwdSummaryArgs a = bwd_walk_args<kk::BwdSummaryArgs>();
    a.seg_dh_ext = dw_.seg_dh_ext;
    gpu_->bwd_summaries(a);
  }
  void expect_bwd_summaries(const char* phase) {
    expect_ws(phase, "seg_dh_ext", dw_.seg_dh_ext, L_.n_segments * state_floats());
  }
  void run_bwd_states(const Buf& dh0) {
    refresh();
    poison16(dw_.dh, L_.n_chunks * state_floats());
    poison16(dw_.dv2, c_.T() * c_.HV * c_.V);
    dh0.fill(kNaN);
    kk::BwdStateArgs a = bwd_walk_args<kk::BwdStateArgs>();
    a.seg_exit = dw_.seg_exit;
    a.dh = dw_.dh;
    a.dv2 = dw_.dv2;
    a.dh0 = dh0.get();
    gpu_->bwd_states(a);
  }
  void expect_bwd_states(const char* phase, const Buf& dh0) {
    expect_state_walk(phase, {"dh", dw_.dh}, {"dv2", dw_.dv2}, {"dh0", dh0}, h_dh0_);
  }
  // The raw 16-bit patterns of a tensor in the CUDA backend's storage, as floats' bits (for
  // first_bit_difference: two patterns a float).
  std::vector<float> raw16(kk::DtypeTensor t, int64_t n) const {
    return down(reinterpret_cast<const float*>(t.packed16()), (n + 1) / 2);
  }

  std::unique_ptr<kk::Backend> gpu_, cpu_;
  Case c_;
  Data d_;
  kk::Problem p_;
  kk::RankLayout layout_;
  kk::LayoutView L_;
  std::vector<float> h_saved_, h_saved_dev_, h_ws_, h_ws_dev_, h_ht_, h_dg_, h_dbeta_, h_dA_, h_ddt_, h_dh0_;
  kcp::DtypeArray h_o_, h_dq_, h_dk_, h_dv_, hq_, hk_, hv_, hdO_;  // the twin's caller tensors (host)
  kk::SavedTensors hs_, ds_;
  kk::WorkspaceTensors hw_, dw_;
  Buf d_saved_, d_ws_, g_, beta_, A_log_, dt_bias_, h0_, dht_;
  kcp::DtypeArray q_, k_, v_, dO_;  // the GPU's caller inputs
  kk::InputTensors din_;
};

void GpuPhase::every_phase_matches_the_twin() {
  const int64_t T = c_.T(), N = L_.n_pieces;
  const int64_t HV = c_.HV, K = c_.K, V = c_.V, H = c_.H;
  const int64_t S = HV * K * V, SK = HV * K * K;
  const int64_t gw = p_.gate_width();     // 1 (GDN) or K (KDA)
  const bool kda = c_.op == kk::Op::Kda;  // KDA: Aqk and kg (saved) too

  // prep
  refresh();
  for (auto [p, n] : {std::pair{ds_.q, T * H * K}, std::pair{ds_.k, T * H * K}, std::pair{ds_.Phi, T * HV * 64}})
    poison16(p, n);
  poison(ds_.gcum, T * HV * gw);
  if (kda) poison(ds_.Aqk, T * HV * 64);
  if (c_.l2norm) {
    poison(ds_.rstd_q, T * H);
    poison(ds_.rstd_k, T * H);
  }
  {
    kk::PrepArgs a;
    a.ctx = ctx();
    a.q = din_.q;
    a.k = din_.k;
    a.g = din_.g;
    a.beta = din_.beta;
    a.A_log = din_.A_log;
    a.dt_bias = din_.dt_bias;
    a.q_out = ds_.q;
    a.k_out = ds_.k;
    a.rstd_q = ds_.rstd_q;
    a.rstd_k = ds_.rstd_k;
    a.gcum = ds_.gcum;
    a.Phi = ds_.Phi;
    a.Aqk = ds_.Aqk;
    gpu_->prep(a);
  }
  expect_saved16("prep", "q", ds_.q, T * H * K);
  expect_saved16("prep", "k", ds_.k, T * H * K);
  if (c_.l2norm) {
    expect_saved("prep", "rstd_q", ds_.rstd_q, T * H);
    expect_saved("prep", "rstd_k", ds_.rstd_k, T * H);
  }
  expect_saved("prep", "gcum", ds_.gcum, T * HV * gw);
  expect_saved16("prep", "Phi", ds_.Phi, T * HV * 64);
  if (kda) expect_saved("prep", "Aqk", ds_.Aqk, T * HV * 64);

  // wy
  refresh();
  poison16(ds_.W, T * HV * K);
  poison16(ds_.U, T * HV * V);
  if (kda) poison16(ds_.kg, T * HV * K);
  {
    kk::WyArgs a;
    a.ctx = ctx();
    a.k = ds_.k;
    a.v = din_.v;
    a.beta = din_.beta;
    a.gcum = ds_.gcum;
    a.Phi = ds_.Phi;
    a.W = ds_.W;
    a.U = ds_.U;
    a.kg = ds_.kg;
    gpu_->wy(a);
  }
  expect_saved16("wy", "W", ds_.W, T * HV * K);
  expect_saved16("wy", "U", ds_.U, T * HV * V);
  if (kda) expect_saved16("wy", "kg", ds_.kg, T * HV * K);

  // fwd_summaries
  run_fwd_summaries();
  expect_fwd_summaries("fwd_summaries");

  // fold: forward entry states of the longest piece (transposed items, x0 = h0, composed) and
  // the backward fold of the same piece (negative strides); both against the twin's fold.
  {
    int32_t pl = 0;
    for (int32_t q = 0; q < N; ++q)
      if (L_.pieces[q].seg_end - L_.pieces[q].seg_begin > L_.pieces[pl].seg_end - L_.pieces[pl].seg_begin) pl = q;
    const kk::PieceDesc& pc = L_.pieces[pl];
    for (int dir = 0; dir < 2; ++dir) {
      refresh();
      const int n = pc.seg_end - pc.seg_begin;
      std::vector<float> h_states(size_t(n) * S, kNaN), h_final(size_t(S), kNaN), h_comp(size_t(SK), kNaN);
      const Buf d_states(*gpu_, std::max<int64_t>(1, n * S)), d_final(*gpu_, S), d_comp(*gpu_, SK);
      d_states.fill(kNaN);
      d_final.fill(kNaN);
      d_comp.fill(kNaN);
      auto args = [&](bool dev) {
        kk::FoldArgs f;
        f.HV = c_.HV;
        f.K = c_.K;
        f.V = c_.V;
        f.n = n;
        const float* Mt = dev ? ds_.seg_Mt : hs_.seg_Mt;
        const float* b =
            dev ? (dir == 0 ? dw_.seg_h_ext : dw_.seg_dh_ext) : (dir == 0 ? hw_.seg_h_ext : hw_.seg_dh_ext);
        const int64_t first = dir == 0 ? pc.seg_begin : pc.seg_end - 1, sgn = dir == 0 ? 1 : -1;
        f.A = Mt + first * SK;
        f.A_stride = sgn * SK;
        f.transpose_A = dir == 0;
        f.b = b + first * S;
        f.b_stride = sgn * S;
        f.x0 = dir == 0 ? (dev ? h0_.get() : d_.h0.data()) + pl * S : (dev ? dht_.get() : d_.dht.data()) + pl * S;
        f.states_before = dev ? d_states.get() : h_states.data();
        f.states_stride = S;
        f.x_final = dev ? d_final.get() : h_final.data();
        f.composed = dev ? d_comp.get() : h_comp.data();
        return f;
      };
      cpu_->fold(args(false));
      gpu_->fold(args(true));
      const char* ph = dir == 0 ? "fold fwd" : "fold bwd";
      expect_close(ph, "states", d_states.get(), h_states.data(), n * S);
      expect_close(ph, "x_final", d_final.get(), h_final.data(), S);
      expect_close(ph, "composed", d_comp.get(), h_comp.data(), SK);
    }
  }

  // fwd_states
  {
    const Buf ht(*gpu_, N * S);
    run_fwd_states(ht);
    expect_fwd_states("fwd_states", ht);
  }

  // fwd_output, then fwd_states with the output in the same call (the driver's forward; GDN on
  // sm_90a: one kernel, gdn_walk_out.cuh): o from the walk's own v_new and states, v_new and ht as
  // fwd_states alone gives them (h is then unspecified).
  refresh();
  {
    const kcp::DtypeArray o(*gpu_, T * HV * V, c_.dtype), o_walk(*gpu_, T * HV * V, c_.dtype);
    o.poison();
    o_walk.poison();
    kk::FwdOutputArgs a;
    a.ctx = ctx();
    a.q = ds_.q;
    a.k = ds_.k;
    a.gcum = ds_.gcum;
    a.Aqk = ds_.Aqk;
    a.h = dw_.h;
    a.v_new = dw_.v_new;
    a.o = o.tensor();
    gpu_->fwd_output(a);
    expect_caller("fwd_output", "o", o, h_o_);
    const Buf ht(*gpu_, N * S);
    a.o = o_walk.tensor();
    run_fwd_states(ht, &a);
    expect_caller("fwd_states+output", "o", o_walk, h_o_);
    expect_ws16("fwd_states+output", "v_new", dw_.v_new, T * HV * V);
    for (int32_t q = 0; q < N; ++q)
      if (L_.pieces[q].end > L_.pieces[q].begin)
        expect_close("fwd_states+output", "ht", ht.get() + q * S, h_ht_.data() + q * S, S);
    const std::vector<float> x = o.to_host(), y = o_walk.to_host();
    int64_t differ = 0;
    for (size_t e = 0; e < x.size(); ++e) differ += std::memcmp(&x[e], &y[e], sizeof(float)) != 0;
    // Informational: fwd_output above read the twin's h and v_new, the walk its own.
    std::printf("[ phase    ] %-22s fwd_states+output o: %lld of %zu values differ from fwd_output's on the twin's h\n",
                c_.name.c_str(), (long long)differ, x.size());
  }

  // bwd_local_dv
  refresh();
  poison16(dw_.dv_local, T * HV * V);
  {
    kk::BwdLocalDvArgs a;
    a.ctx = ctx();
    a.q = ds_.q;
    a.k = ds_.k;
    a.gcum = ds_.gcum;
    a.Aqk = ds_.Aqk;
    a.dO = din_.dO;
    a.dv_local = dw_.dv_local;
    gpu_->bwd_local_dv(a);
  }
  expect_ws16("bwd_local_dv", "dv_local", dw_.dv_local, T * HV * V);

  // bwd_summaries
  run_bwd_summaries();
  expect_bwd_summaries("bwd_summaries");

  // bwd_states
  {
    const Buf dh0(*gpu_, N * S);
    run_bwd_states(dh0);
    expect_bwd_states("bwd_states", dh0);
  }

  // bwd_grads
  refresh();
  poison(dw_.dq_hv, T * HV * K);
  poison(dw_.dk_hv, T * HV * K);
  poison(dw_.dlam, T * HV * gw);
  {
    const GradOut g(*gpu_, c_);
    gpu_->bwd_grads(grad_args(g));
    expect_ws("bwd_grads", "dq_hv", dw_.dq_hv, T * HV * K);
    expect_ws("bwd_grads", "dk_hv", dw_.dk_hv, T * HV * K);
    expect_ws("bwd_grads", "dlam", dw_.dlam, T * HV * gw);
    expect_grads("bwd_grads", g);
  }

  // bwd_finalize
  refresh();
  {
    const FinalizeOut f(*gpu_, c_, gw);
    gpu_->bwd_finalize(finalize_args(f));
    expect_finalize("bwd_finalize", f);
  }
  grads_with_finalize_match_the_phases();
}

// bwd_grads with the finalize in the same call (BwdGradArgs::finalize, as the driver runs it): the
// twin's values, and the same bits as bwd_grads and bwd_finalize in turn on this GPU (a backend
// that finalizes dk where it is still on chip must add and round exactly as the finalize does).
void GpuPhase::grads_with_finalize_match_the_phases() {
  const int64_t gw = p_.gate_width();
  refresh();
  const GradOut g1(*gpu_, c_), g2(*gpu_, c_);
  const FinalizeOut f1(*gpu_, c_, gw), f2(*gpu_, c_, gw);
  gpu_->bwd_grads(grad_args(g1));
  gpu_->bwd_finalize(finalize_args(f1));
  refresh();
  const kk::BwdFinalizeArgs fa = finalize_args(f2);
  kk::BwdGradArgs ga = grad_args(g2);
  ga.finalize = &fa;
  gpu_->bwd_grads(ga);
  expect_grads("bwd_grads+finalize", g2);
  expect_finalize("bwd_grads+finalize", f2);
  const std::pair<const kcp::DtypeArray*, const kcp::DtypeArray*> same[] = {
      {&g1.dv, &g2.dv}, {&f1.dq, &f2.dq}, {&f1.dk, &f2.dk}};
  const char* names[] = {"dv", "dq", "dk"};
  for (int e = 0; e < 3; ++e) {
    const std::vector<float> x = same[e].first->to_host(), y = same[e].second->to_host();
    ASSERT_EQ(x.size(), y.size());
    int64_t differ = 0;
    for (size_t u = 0; u < x.size(); ++u) differ += std::memcmp(&x[u], &y[u], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0) << "bwd_grads+finalize " << names[e] << ": " << differ << " of " << x.size()
                         << " values differ from bwd_grads and bwd_finalize in turn";
  }
  const std::pair<const Buf*, const Buf*> same32[] = {{&g1.dbeta, &g2.dbeta}, {&f1.dg, &f2.dg}};
  for (const auto& [a, b] : same32) {
    const std::vector<float> x = a->host(), y = b->host();
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << "bwd_grads+finalize: dbeta / dg differ";
  }
}

TEST_P(GpuPhase, EveryPhaseMatchesTheTwin) { every_phase_matches_the_twin(); }

// The same with both walk choices on Mma (walk_select.h): on an sm_90 device the default runs the
// wgmma kernels that follow those choices, so this is where their mma.sync twins are judged at
// every phase of every case.
TEST_P(GpuPhase, EveryPhaseMatchesTheTwinOnMmaSync) {
  struct Restore {
    ~Restore() {
      kk::cuda::set_fwd_walk_choice(kk::cuda::WalkChoice::Auto);
      kk::cuda::set_bwd_walk_choice(kk::cuda::WalkChoice::Auto);
    }
  } restore;
  kk::cuda::set_fwd_walk_choice(kk::cuda::WalkChoice::Mma);
  kk::cuda::set_bwd_walk_choice(kk::cuda::WalkChoice::Mma);
  every_phase_matches_the_twin();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GpuPhase,
    ::testing::Values(
        Param{phase_case("raw_K64_bf16", 64, kk::DType::BF16, true), 3},
        Param{phase_case("raw_K128_bf16", 128, kk::DType::BF16, true), 3},
        Param{phase_case("raw_K64_fp16", 64, kk::DType::FP16, true), 2},
        // fp16 at K = V = 128: the wgmma walks, B4 and B5 twins in fp16 at the production shape.
        Param{phase_case("raw_K128_fp16", 128, kk::DType::FP16, true), 2},
        Param{phase_case("gva_direct_K128", 128, kk::DType::BF16, false), 2}, Param{multiwave_case(), 4},
        Param{group_case("g1_K128_bf16", 4, 4, kk::DType::BF16, 611), 2},
        Param{group_case("g4_K128_fp16", 1, 4, kk::DType::FP16, 612), 3},
        Param{group_case("g8_K128_bf16", 1, 8, kk::DType::BF16, 613), 2},
        Param{kda_case("kda_softplus_K64_bf16", 64, kk::DType::BF16, kk::GateForm::Softplus, false, true, 501), 3},
        Param{kda_case("kda_softplus_l2_K128_bf16", 128, kk::DType::BF16, kk::GateForm::Softplus, true, true, 502), 2},
        Param{kda_case("kda_lb_l2_K64_fp16", 64, kk::DType::FP16, kk::GateForm::LowerBound, true, true, 503), 2},
        Param{kda_case("kda_lb_noA_K128_bf16", 128, kk::DType::BF16, kk::GateForm::LowerBound, false, false, 504), 3},
        Param{kda_case("kda_direct_K64_bf16", 64, kk::DType::BF16, kk::GateForm::Direct, false, false, 505), 3},
        // K != V: every phase at (64, 128) and (128, 64), bf16 and fp16.
        Param{phase_case("raw_K64_V128_bf16", 64, kk::DType::BF16, true, 128), 3},
        Param{phase_case("raw_K128_V64_fp16", 128, kk::DType::FP16, true, 64), 2},
        Param{phase_case("gva_direct_K128_V64_bf16", 128, kk::DType::BF16, false, 64), 3},
        Param{kda_case("kda_softplus_l2_K64_V128_bf16", 64, kk::DType::BF16, kk::GateForm::Softplus, true, true, 506,
                       128),
              3},
        Param{kda_case("kda_lb_K128_V64_fp16", 128, kk::DType::FP16, kk::GateForm::LowerBound, true, true, 507, 64), 2},
        Param{kda_case("kda_direct_K128_V64_bf16", 128, kk::DType::BF16, kk::GateForm::Direct, false, false, 508, 64),
              3}),
    [](const ::testing::TestParamInfo<Param>& i) { return i.param.c.name; });

// ---- the state walks with each CUDA kernel (kernels/cuda/walk_select.h) ----
// fwd_summaries and fwd_states (GpuFwdWalk), bwd_summaries and bwd_states (GpuBwdWalk) with the
// mma.sync walk and with the wgmma + TMA walk (gdn_walk_wgmma.cuh), each against the twin at the
// tolerances above; then the wgmma walk's reruns bitwise. Cases: GVA (G = 2, or 4), varlen with
// partial last chunks, pieces of one chunk and of one token, P > 1 segments (up to 8 chunks a
// segment, so the two-stage ring wraps), with and without h0 (without: unread summaries are zero
// tiles), bf16 and fp16, K = 64 and 128, GDN and KDA (per-channel decay, the gated keys kg of wy;
// backward: qs's per-element gates, on the wgmma walk from the prepass kda_qs.cu).
// Skipped where the wgmma walk does not run (it needs an sm_90 device and an sm_90a build).
Case walk_case(const std::string& name, int K, kk::DType dt, int H, bool h0, std::vector<int64_t> lens, uint64_t seed) {
  Case c = phase_case(name, K, dt, false);
  c.H = H;
  c.h0 = h0;
  c.lens = std::move(lens);
  c.seed = seed;
  return c;
}

Case kda_walk_case(const std::string& name, int K, kk::DType dt, kk::GateForm gate, int H, bool h0,
                   std::vector<int64_t> lens, uint64_t seed) {
  Case c = kda_case(name, K, dt, gate, gate != kk::GateForm::Direct, gate == kk::GateForm::LowerBound, seed);
  c.H = H;
  c.h0 = h0;
  c.lens = std::move(lens);
  return c;
}

std::vector<Param> walk_params() {
  return {
      Param{walk_case("walk_K128_bf16_h0", 128, kk::DType::BF16, 2, true, {100, 0, 37, 1000}, 601), 3},
      Param{walk_case("walk_K128_fp16_h0", 128, kk::DType::FP16, 2, true, {1000, 37, 100}, 602), 2},
      Param{walk_case("walk_K128_bf16_noh0", 128, kk::DType::BF16, 2, false, {300, 64, 129, 1}, 603), 3},
      Param{walk_case("walk_K128_fp16_G4", 128, kk::DType::FP16, 1, true, {513}, 604), 1},
      Param{walk_case("walk_K64_bf16_h0", 64, kk::DType::BF16, 2, true, {100, 37, 300}, 605), 2},
      Param{walk_case("walk_K64_fp16_noh0", 64, kk::DType::FP16, 2, false, {700, 1}, 606), 4},
      Param{kda_walk_case("walk_kda_K128_bf16_h0", 128, kk::DType::BF16, kk::GateForm::Softplus, 2, true,
                          {100, 37, 1000}, 611),
            3},
      Param{kda_walk_case("walk_kda_K128_fp16_G4", 128, kk::DType::FP16, kk::GateForm::LowerBound, 1, true, {513}, 612),
            1},
      Param{kda_walk_case("walk_kda_K64_bf16_noh0", 64, kk::DType::BF16, kk::GateForm::Direct, 2, false,
                          {300, 0, 64, 129, 1}, 613),
            3},
      Param{kda_walk_case("walk_kda_K64_fp16_noh0", 64, kk::DType::FP16, kk::GateForm::Direct, 2, false, {700, 1}, 614),
            4},
      // KDA fp16 at K = 64 with h0, GVA and softplus gates (review of the qs prepass, session 18)
      Param{kda_walk_case("walk_kda_K64_fp16_h0_G", 64, kk::DType::FP16, kk::GateForm::Softplus, 1, true, {130, 64, 1},
                          615),
            2},
      // bwd_summaries' qs prepass over more ranges than QsRows::kMax (18 pieces, segment 1 of each
      // read, segment 0 not): the last range spans the gaps of the pieces after it. Segment 1 ends
      // in a partial chunk whose TMA box reads rows of the next piece's segment 0, qs the prepass
      // skipped (NaN in the poisoned scratch): rows >= L must be zeroed, not used.
      Param{kda_walk_case("walk_kda_K64_bf16_18pieces", 64, kk::DType::BF16, kk::GateForm::Softplus, 2, true,
                          std::vector<int64_t>(18, 130), 616),
            2}};
}

// One direction's walks with either kernel: set / uses are the direction's hooks of
// walk_select.h, run_all runs both walks of the direction and compares them with the twin
// (phase names suffixed with the kernel), outputs lists what they wrote (16-bit tensors raw).
class GpuWalk : public GpuPhase {
 protected:
  using Outputs = std::vector<std::pair<std::string, std::vector<float>>>;
  virtual void set_choice(kk::cuda::WalkChoice c) const = 0;
  virtual bool uses_wgmma() const = 0;
  virtual void run_all(bool compare, const std::string& kernel) = 0;
  virtual Outputs outputs() const = 0;
  void SetUp() override {
    GpuPhase::SetUp();
    if (IsSkipped()) return;
    set_choice(kk::cuda::WalkChoice::Wgmma);  // the wgmma walk, whatever Auto picks
    if (!uses_wgmma()) GTEST_SKIP() << "the wgmma walk does not run here (sm_90 device and sm_90a build)";
  }
  void TearDown() override { set_choice(kk::cuda::WalkChoice::Auto); }
  void both_kernels_match_the_twin() {
    for (const auto choice : {kk::cuda::WalkChoice::Mma, kk::cuda::WalkChoice::Wgmma}) {
      set_choice(choice);
      const bool wg = choice == kk::cuda::WalkChoice::Wgmma;
      ASSERT_EQ(uses_wgmma(), wg);
      run_all(true, wg ? " wgmma" : " mma");
    }
  }
  // The det package's walks must rerun to the same bits (no atomics, fixed order): the wgmma walk
  // twice on the same inputs, every output compared bitwise.
  void wgmma_reruns_are_bitwise_equal() {
    run_all(false, "");
    const Outputs first = outputs();
    run_all(false, "");
    const Outputs second = outputs();
    for (size_t e = 0; e < first.size(); ++e) {
      const int64_t at = first_bit_difference(first[e].second, second[e].second);
      EXPECT_EQ(at, -1) << first[e].first << " differs first at element " << at;
    }
  }
};

class GpuFwdWalk : public GpuWalk {
 protected:
  void set_choice(kk::cuda::WalkChoice c) const override { kk::cuda::set_fwd_walk_choice(c); }
  bool uses_wgmma() const override { return kk::cuda::fwd_walk_uses_wgmma(p_); }
  void run_all(bool compare, const std::string& kernel) override {
    run_fwd_summaries();
    if (compare) expect_fwd_summaries(("fwd_summaries" + kernel).c_str());
    run_fwd_states(ht_);
    if (compare) expect_fwd_states(("fwd_states" + kernel).c_str(), ht_);
  }
  // seg_h_ext, seg_Mt, h and v_new (raw 16-bit), ht.
  Outputs outputs() const override {
    const int64_t Sg = L_.n_segments;
    return {{"seg_h_ext", down(dw_.seg_h_ext, Sg * state_floats())},
            {"seg_Mt", down(ds_.seg_Mt, Sg * mt_floats())},
            {"h", raw16(dw_.h, L_.n_chunks * state_floats())},
            {"v_new", raw16(dw_.v_new, c_.T() * c_.HV * c_.V)},
            {"ht", ht_.host()}};
  }
  void SetUp() override {
    GpuWalk::SetUp();
    if (!IsSkipped()) ht_ = Buf(*gpu_, L_.n_pieces * state_floats());
  }
  Buf ht_;
};

class GpuBwdWalk : public GpuWalk {
 protected:
  void set_choice(kk::cuda::WalkChoice c) const override { kk::cuda::set_bwd_walk_choice(c); }
  bool uses_wgmma() const override { return kk::cuda::bwd_walk_uses_wgmma(p_); }
  void run_all(bool compare, const std::string& kernel) override {
    run_bwd_summaries();
    if (compare) expect_bwd_summaries(("bwd_summaries" + kernel).c_str());
    run_bwd_states(dh0_);
    if (compare) expect_bwd_states(("bwd_states" + kernel).c_str(), dh0_);
  }
  // seg_dh_ext, dh and dv2 (raw 16-bit), dh0.
  Outputs outputs() const override {
    return {{"seg_dh_ext", down(dw_.seg_dh_ext, L_.n_segments * state_floats())},
            {"dh", raw16(dw_.dh, L_.n_chunks * state_floats())},
            {"dv2", raw16(dw_.dv2, c_.T() * c_.HV * c_.V)},
            {"dh0", dh0_.host()}};
  }
  void SetUp() override {
    GpuWalk::SetUp();
    if (!IsSkipped()) dh0_ = Buf(*gpu_, L_.n_pieces * state_floats());
  }
  Buf dh0_;
};

TEST_P(GpuFwdWalk, BothKernelsMatchTheTwin) { both_kernels_match_the_twin(); }
TEST_P(GpuFwdWalk, WgmmaRerunsAreBitwiseEqual) { wgmma_reruns_are_bitwise_equal(); }
TEST_P(GpuBwdWalk, BothKernelsMatchTheTwin) { both_kernels_match_the_twin(); }
TEST_P(GpuBwdWalk, WgmmaRerunsAreBitwiseEqual) { wgmma_reruns_are_bitwise_equal(); }

INSTANTIATE_TEST_SUITE_P(Walks, GpuFwdWalk, ::testing::ValuesIn(walk_params()),
                         [](const ::testing::TestParamInfo<Param>& i) { return i.param.c.name; });
INSTANTIATE_TEST_SUITE_P(Walks, GpuBwdWalk, ::testing::ValuesIn(walk_params()),
                         [](const ::testing::TestParamInfo<Param>& i) { return i.param.c.name; });

// ---- KDA's qs prepass (kernels/cuda/kda_qs.cu) ----
// Its 16-bit output against the twin's formula [B3] (kernels/cpu/chunk_state.cpp: qs =
// dtype((q scale) exp2(g)), q of q/k head j / G, g = gcum of value head j, per element), evaluated
// on the host from the twin's saved q and gcum, bit for bit. exp2 is the device's exp2f
// (device_exp2.cu, the function the kernels call): CUDA documents up to 2 ulps from the exact
// value, so the twin's std::exp2 differs now and then and can flip a 16-bit rounding (the count
// is printed); the test judges what the prepass puts around it: the operands, the order of the two
// products, the rounding to the dtype and the layout [T, HV, K]. Runs on any device (no sm_90).
// Twice: over every token (bwd_states), and over bwd_summaries' tokens (qs_rows_of_summaries):
// the rows of its ranges written, every other row left as it was (NaN); the ranges cover the
// segments with summary_needs().dh_ext (a piece's segments i > 0: P = 1 has none, no piece's
// segment 0 is read here), exactly unless all kMax ranges are used (the last then spans gaps).
class GpuKdaQs : public GpuPhase {
 protected:
  void expect_prepass(const kk::cuda::QsRows& rows, bool summaries) {
    refresh();
    const int64_t T = c_.T(), HV = c_.HV, K = c_.K, n = T * HV * K;
    const Buf qs(*gpu_, (n + 1) / 2), ex(*gpu_, n);
    qs.fill(kNaN);
    kk::cuda::run_kda_qs(p_, rows, ds_.q.packed16(), ds_.gcum, reinterpret_cast<uint16_t*>(qs.get()));
    kcp::test::device_exp2(ds_.gcum, ex.get(), n);
    const std::vector<float> e = ex.host(), got = qs.host();
    const uint16_t* dev = reinterpret_cast<const uint16_t*>(got.data());
    const float* q = hs_.q.f32();
    const float scale = p_.resolved_scale();
    const kcp::RoundTo rt = kk::rounding_of(c_.dtype);
    std::vector<char> read(size_t(T), summaries ? 0 : 1);  // the tokens whose qs a walk reads
    for (int32_t s = 0; summaries && s < L_.n_segments; ++s) {
      const kk::SegmentDesc& sg = L_.segments[s];
      if (kk::summary_needs(L_.pieces, L_.n_pieces, sg, p_.has_h0, p_.has_dht).dh_ext)
        std::fill(read.begin() + sg.begin, read.begin() + sg.end, 1);
    }
    const uint32_t nan_bits = [] {
      uint32_t b;
      std::memcpy(&b, &kNaN, 4);
      return b;
    }();
    std::vector<char> covered(size_t(T), 0);  // the tokens of the prepass's ranges
    for (int r = 0; r < rows.n; ++r)
      std::fill(covered.begin() + rows.begin[r], covered.begin() + rows.begin[r] + rows.at[r + 1] - rows.at[r], 1);
    int64_t bad = 0, first = -1, exp2_differs = 0, rows_read = 0, uncovered = 0, extra = 0;
    for (int64_t t = 0; t < T; ++t) {
      rows_read += covered[size_t(t)];
      uncovered += read[size_t(t)] && !covered[size_t(t)];
      extra += covered[size_t(t)] && !read[size_t(t)];
      for (int64_t j = 0; j < HV; ++j)
        for (int64_t x = 0; x < K; ++x) {
          const size_t i = size_t((t * HV + j) * K + x);
          const float qx = q[(t * c_.H + j / p_.group()) * K + x];
          const uint16_t want = covered[size_t(t)] ? kcp::dtype16_bits((qx * scale) * e[i], rt)
                                                   : uint16_t(nan_bits >> (16 * (i & 1)));  // untouched poison
          exp2_differs += e[i] != std::exp2(hs_.gcum[i]) ? 1 : 0;
          if (dev[i] == want) continue;
          if (first < 0) first = int64_t(i);
          ++bad;
        }
    }
    std::printf("[ kda_qs   ] %-22s %-9s %lld of %lld tokens in %d ranges, device exp2f != std::exp2 at %lld\n",
                c_.name.c_str(), summaries ? "summaries" : "states", (long long)rows_read, (long long)T, rows.n,
                (long long)exp2_differs);
    EXPECT_EQ(uncovered, 0) << "tokens whose qs a walk reads, left out of the ranges";
    if (rows.n < kk::cuda::QsRows::kMax) {
      EXPECT_EQ(extra, 0) << "tokens nobody reads, in the ranges";
    }
    EXPECT_EQ(bad, 0) << "qs differs at " << bad << " elements, first at " << first;
  }
};

TEST_P(GpuKdaQs, KdaQsPrepassMatchesTheTwinFormula) {
  expect_prepass(kk::cuda::qs_rows_all(c_.T()), false);
  expect_prepass(kk::cuda::qs_rows_of_summaries(p_, L_), true);
}

std::vector<Param> kda_walk_params() {
  std::vector<Param> r;
  for (const Param& w : walk_params())
    if (w.c.op == kk::Op::Kda) r.push_back(w);
  return r;
}
INSTANTIATE_TEST_SUITE_P(Walks, GpuKdaQs, ::testing::ValuesIn(kda_walk_params()),
                         [](const ::testing::TestParamInfo<Param>& i) { return i.param.c.name; });

TEST(GpuBackend, CanImplementAndArgChecks) {
  if (kk::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = kk::make_cuda_backend(0);
  EXPECT_STREQ(be->name(), "cuda");
  kk::Problem p;
  p.op = kk::Op::Kda;  // K = V = 64
  EXPECT_TRUE(be->can_implement(p).ok) << be->can_implement(p).reason;
  p.K = p.V = 128;
  EXPECT_TRUE(be->can_implement(p).ok) << be->can_implement(p).reason;
  for (kk::Op op : {kk::Op::Gdn, kk::Op::Kda})  // K and V each 64 or 128, independently
    for (int K : {64, 128})
      for (int V : {64, 128}) {
        p.op = op;
        p.K = K;
        p.V = V;
        EXPECT_TRUE(be->can_implement(p).ok) << K << " " << V << ": " << be->can_implement(p).reason;
      }
  p.op = kk::Op::Gdn;
  p.K = p.V = 96;
  EXPECT_FALSE(be->can_implement(p).ok);
  EXPECT_NE(be->can_implement(p).reason.find("unsupported head dims K=96, V=96 on CUDA (supported (K, V): (64, 64), "
                                             "(64, 128), (128, 64), (128, 128))"),
            std::string::npos)
      << be->can_implement(p).reason;
  p.K = 128;
  p.V = 96;  // V outside the list
  EXPECT_FALSE(be->can_implement(p).ok);
  p.K = p.V = 128;
  EXPECT_TRUE(be->can_implement(p).ok);
  p.H = 3;
  p.HV = 4;
  EXPECT_FALSE(be->can_implement(p).ok);  // malformed: HV % H
  // A null pointer is refused before anything runs, naming the phase and the field.
  const kk::RankLayout lay = kk::RankLayout::even({100}, 1);
  kk::Problem ok;
  kk::WyArgs a;
  a.ctx.problem = ok;
  a.ctx.layout = lay.view();
  try {
    be->wy(a);
    FAIL() << "wy with null pointers did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("gdn wy: args.k is null"), std::string::npos) << e.what();
  }
  kk::WyArgs kda_args;  // the KDA phases name themselves "kda <phase>"
  kda_args.ctx.problem.op = kk::Op::Kda;
  kda_args.ctx.layout = lay.view();
  try {
    be->wy(kda_args);
    FAIL() << "kda wy with null pointers did not throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("kda wy: args.k is null"), std::string::npos) << e.what();
  }
  std::printf("[ device   ] %s\n", be->device_name().c_str());
}

}  // namespace
}  // namespace kcp::test
