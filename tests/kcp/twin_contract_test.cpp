// (d) full and light saved sets give identical bits (and so do det / nondet and 1 / 2 threads
// in the twin), full keeping the forward's WY factors for the backward; (e) extreme gates (-1000 and 0) give no
// NaN/Inf; (f) bad Args throw with a message naming the field.
#include <cstring>
#include <limits>

#include "core/kcp/backend_decorator.h"
#include "twin_test_util.h"

namespace kcp::test {
namespace {

namespace kk = kcp::kernels;

bool same_bits(const TwinResults& a, const TwinResults& b, std::string& which) {
  for (const auto& [name, x] : a.t) {
    const auto& y = b.t.at(name);
    if (x.size() != y.size() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0) {
      which = name;
      return false;
    }
  }
  return true;
}

class Contract : public ::testing::TestWithParam<kk::Op> {};

TEST_P(Contract, FullAndLightGiveTheSameBits) {
  Case c = GetParam() == kk::Op::Gdn ? gdn_raw_l2() : kda_raw_l2();
  c.name += "_bits";
  c.lens = {300, 0, 200};
  const Data& d = data_for(c);
  TwinOptions full;
  full.rank_bounds = {0, 250, 500};
  full.P = {3, 2};
  full.kind = kk::SavedKind::Full;
  const TwinResults a = run_twin(c, d, full);
  TwinOptions light = full;
  light.kind = kk::SavedKind::Light;
  std::string which;
  EXPECT_TRUE(same_bits(a, run_twin(c, d, light), which)) << "full vs light differ in " << which;
  TwinOptions nondet = light;
  nondet.package = kk::Package::Nondet;
  EXPECT_TRUE(same_bits(a, run_twin(c, d, nondet), which)) << "det vs nondet differ in " << which;
  TwinOptions threads = full;
  threads.threads = 2;
  EXPECT_TRUE(same_bits(a, run_twin(c, d, threads), which)) << "1 vs 2 threads differ in " << which;
  for (const auto& [name, x] : a.t) EXPECT_EQ(non_finite(x), 0) << name;
}

// The twin, counting its wy calls.
class WyCounter final : public kcp::BackendDecorator {
 public:
  explicit WyCounter(const kk::Backend& in) : BackendDecorator(in) {}
  void wy(const kk::WyArgs& a) const override {
    ++calls;
    inner_.wy(a);
  }
  mutable int calls = 0;
};

// A full saved set keeps W, U (kg) from the forward, so its backward does not run wy again; light
// recomputes them. Each rank's forward runs wy once (rank_driver.cpp B1). A full workspace has no
// W, U (a phase given them refuses a null tensor), and light's is NaN-poisoned between forward
// and backward (run_backend), so a light backward that skipped wy shows non-finite results;
// FullAndLightGiveTheSameBits compares the two kinds' bits.
TEST_P(Contract, FullKeepsTheWyFactorsAndLightRecomputesThem) {
  Case c = GetParam() == kk::Op::Gdn ? gdn_raw_l2() : kda_raw_l2();
  c.name += "_wy";
  c.lens = {300, 0, 200};
  const Data& d = data_for(c);
  const std::unique_ptr<kk::Backend> twin = kk::make_cpu_backend();
  for (kk::SavedKind kind : {kk::SavedKind::Full, kk::SavedKind::Light}) {
    SCOPED_TRACE(kk::to_string(kind));
    WyCounter be(*twin);
    TwinOptions opt;
    opt.rank_bounds = {0, 250, 500};
    opt.P = {3, 2};
    opt.kind = kind;
    const TwinResults r = run_backend(be, c, d, opt);
    EXPECT_EQ(be.calls, kind == kk::SavedKind::Full ? 2 : 4) << "wy calls over 2 ranks' forward and backward";
    for (const auto& [name, x] : r.t) EXPECT_EQ(non_finite(x), 0) << name;
  }
}

TEST_P(Contract, ExtremeGatesStayFinite) {
  // Direct gates with 15% of positions at -1000 (extreme decay, the KDA varlen stress) and 15%
  // at 0 (no decay); partial chunks everywhere; split over segments and ranks.
  Case c = GetParam() == kk::Op::Gdn ? gdn_gva_state() : kda_gva_state();
  c.name += "_extreme";
  c.mask_p = 0.15;
  c.zero_p = 0.15;
  const Data& d = data_for(c);
  const RefResults& ref = reference_for(c, d);
  TwinOptions opt;
  opt.threads = 2;
  opt.rank_bounds = {0, 130, c.T()};
  opt.P = {2, 3};
  const TwinResults r = run_twin(c, d, opt);
  for (const auto& [name, x] : r.t) EXPECT_EQ(non_finite(x), 0) << name << " has NaN/Inf";
  expect_within_thresholds(c.name, ref, r);
}

TEST_P(Contract, ExtremeRawGatesStayFinite) {
  // Raw gates at +-1000 (softplus / lower-bound sigmoid at both ends), 15% each. Every tensor
  // must be finite and within the thresholds, except the GDN softplus dA_log: graw = +1000
  // gives a = -exp(A_log) * 1000 (down to -8000 per token), the chunk-local cumsum reaches
  // |gcum| ~ 7e5 (log2 units) where fp32 spacing is 0.06, so decay ratios after such a position
  // carry percent-level fp32 errors (GPU and FLA alike: measured 9e-2 for dA_log with every bf16
  // rounding switched off), and dA_log = sum dA * a weights exactly those positions by |a|.
  // The KDA lower-bound form keeps a in (lb, 0), so its dA_log stays checked.
  Case c = GetParam() == kk::Op::Gdn ? gdn_raw_l2() : kda_lower_bound();
  c.name += "_extreme";
  c.mask_p = 0.15;
  c.zero_p = 0.15;
  const Data& d = data_for(c);
  const RefResults& ref = reference_for(c, d);
  TwinOptions opt;
  opt.threads = 2;
  opt.rank_bounds = {0, 130, c.T()};
  opt.P = {2, 3};
  const TwinResults r = run_twin(c, d, opt);
  for (const auto& [name, x] : r.t) EXPECT_EQ(non_finite(x), 0) << name << " has NaN/Inf";
  expect_within_thresholds(c.name, ref, r, GetParam() == kk::Op::Gdn ? "dA_log" : "");
}

INSTANTIATE_TEST_SUITE_P(Ops, Contract, ::testing::Values(kk::Op::Gdn, kk::Op::Kda),
                         [](const ::testing::TestParamInfo<kk::Op>& i) { return std::string(kk::to_string(i.param)); });

// ---- (f) bad Args ----

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

#define EXPECT_MESSAGE_HAS(call, needle)                                            \
  do {                                                                              \
    const std::string msg_ = error_of([&] { call; });                               \
    EXPECT_NE(msg_.find(needle), std::string::npos) << "message: '" << msg_ << "'"; \
  } while (0)

TEST(BadArgs, ProblemFieldsAreNamed) {
  kk::Problem p;
  p.H = 2;
  p.HV = 3;
  EXPECT_MESSAGE_HAS(kk::validate_problem(p), "problem.HV (3) must be a multiple of problem.H (2)");
  p = kk::Problem{};
  p.K = 300;
  EXPECT_MESSAGE_HAS(kk::validate_problem(p), "problem.K (300)");
  p = kk::Problem{};
  p.chunk = 32;
  EXPECT_MESSAGE_HAS(kk::validate_problem(p), "problem.chunk");
  p = kk::Problem{};
  p.gate = kk::GateForm::Softplus;
  EXPECT_MESSAGE_HAS(kk::validate_problem(p), "problem.has_A_log");
  p = kk::Problem{};
  p.gate = kk::GateForm::LowerBound;
  EXPECT_MESSAGE_HAS(kk::validate_problem(p), "problem.gate = lower_bound is KDA only");
  p = kk::Problem{};
  p.has_dt_bias = true;
  EXPECT_MESSAGE_HAS(kk::validate_problem(p), "problem.has_dt_bias");
  auto be = kk::make_cpu_backend();
  p = kk::Problem{};
  p.V = 0;
  const kk::Status st = be->can_implement(p);
  EXPECT_FALSE(st.ok);
  EXPECT_NE(st.reason.find("problem.V"), std::string::npos) << st.reason;
  EXPECT_TRUE(be->can_implement(kk::Problem{}).ok);
}

TEST(BadArgs, LayoutFieldsAreNamed) {
  // segment boundary not on a chunk boundary of its piece
  EXPECT_MESSAGE_HAS(kk::RankLayout({{0, 200, true, true}}, {{0, 0, 100}, {0, 100, 200}}),
                     "segments[0].end (100) is not on a chunk boundary of piece 0 nor the piece end");
  // segments that do not reach the piece end
  EXPECT_MESSAGE_HAS(kk::RankLayout({{0, 200, true, true}}, {{0, 0, 128}}), "not at the piece end 200");
  // a non-first piece that continues from an earlier rank
  EXPECT_MESSAGE_HAS(kk::RankLayout({{0, 10, true, true}, {10, 20, false, true}}, {{0, 0, 10}, {1, 10, 20}}),
                     "pieces[1].starts_sequence must be 1");
  // pieces with a gap
  EXPECT_MESSAGE_HAS(kk::RankLayout({{0, 10, true, true}, {12, 20, true, true}}, {{0, 0, 10}, {1, 12, 20}}),
                     "pieces[1].begin (12)");
}

struct Fixture {
  Case c;
  Data d;
  kk::RankLayout layout;
  std::unique_ptr<kk::Backend> be = kk::make_cpu_backend();
  std::vector<float> saved, ws, o, out;
  std::vector<uint16_t> q16, k16, v16, dO16, o16;  // the caller dtype tensors, 16-bit (the twin's caller storage)
  kcp::RankRun run;
  explicit Fixture(kk::Package pkg = kk::Package::Det) {
    c = gdn_varlen();
    c.lens = {100};
    d = make_data(c);
    layout = kk::RankLayout::even({100}, 2);
    const kk::Problem p = c.problem();
    saved.assign(size_t(be->saved_floats(p, layout.view(), kk::SavedKind::Full)), 0.0f);
    ws.assign(size_t(be->workspace_floats(p, layout.view(), kk::SavedKind::Full)), 0.0f);
    o.assign(size_t(100) * c.HV * c.V, 0.0f);
    out.assign(size_t(100) * c.HV * c.V, 0.0f);
    run.problem = p;
    run.layout = layout.view();
    run.exec.package = pkg;
    run.kind = kk::SavedKind::Full;
    q16 = pack16(d.q.data(), int64_t(d.q.size()), c.dtype);
    k16 = pack16(d.k.data(), int64_t(d.k.size()), c.dtype);
    v16 = pack16(d.v.data(), int64_t(d.v.size()), c.dtype);
    dO16 = pack16(d.dO.data(), int64_t(d.dO.size()), c.dtype);
    o16.assign(o.size(), 0);
    run.in = {in16(q16), in16(k16), in16(v16), d.g.data(), d.beta.data(),
              nullptr,   nullptr,   nullptr,   in16(dO16), nullptr};
    run.saved = be->bind_saved_for(saved.data(), int64_t(saved.size()), p, run.layout, kk::SavedKind::Full, pkg);
    run.ws = be->bind_workspace_for(ws.data(), int64_t(ws.size()), p, run.layout, kk::SavedKind::Full, pkg);
  }
  static kk::ConstDtypeTensor in16(const std::vector<uint16_t>& x) {
    return kk::ConstDtypeTensor::of_packed16(x.data());
  }
  kk::DtypeTensor o_tensor() { return kk::DtypeTensor::of_packed16(o16.data()); }
  kk::PhaseCtx ctx() const { return {run.problem, run.layout, run.exec}; }
  // Well-formed GDN wy Args on the bound (full) saved set, which keeps W and U.
  kk::WyArgs wy_args() const {
    kk::WyArgs w;
    w.ctx = ctx();
    w.k = run.saved.k;
    w.v = in16(v16);
    w.beta = d.beta.data();
    w.gcum = run.saved.gcum;
    w.Phi = run.saved.Phi;
    w.W = run.saved.W;
    w.U = run.saved.U;
    return w;
  }
};

TEST(BadArgs, NullTensorsAreNamed) {
  Fixture f;
  kk::PrepArgs a;
  a.ctx = f.ctx();
  a.k = f.in16(f.k16);
  EXPECT_MESSAGE_HAS(f.be->prep(a), "gdn prep: args.q is null");
  kk::FwdStateArgs s;
  s.ctx = f.ctx();
  s.k = f.run.saved.k;
  s.gcum = f.run.saved.gcum;
  s.W = f.run.saved.W;
  s.U = f.run.saved.U;
  EXPECT_MESSAGE_HAS(f.be->fwd_states(s), "gdn fwd_states: args.seg_entry is null");
  kk::WyArgs w = f.wy_args();
  w.kg = f.run.saved.W;
  EXPECT_MESSAGE_HAS(f.be->wy(w), "args.kg must be null");
  kk::FoldArgs fo;
  fo.HV = 1;
  fo.K = 4;
  fo.V = 4;
  fo.n = 1;
  EXPECT_MESSAGE_HAS(f.be->fold(fo), "fold: args.A is null");
  kk::BwdFinalizeArgs fin;
  fin.ctx = f.ctx();
  fin.dq_hv = fin.dk_hv = fin.dlam = f.run.ws.dq_hv;
  fin.dq = fin.dk = f.o_tensor();
  fin.dg = fin.dA_log = f.o.data();
  EXPECT_MESSAGE_HAS(f.be->bwd_finalize(fin), "args.dA_log must be null (problem.has_A_log is false)");
  // a phase with a malformed problem names the problem field
  kk::PhaseCtx bad = f.ctx();
  bad.problem.HV = 3;
  s.ctx = bad;
  EXPECT_MESSAGE_HAS(f.be->fwd_states(s), "problem.HV (3)");
}

// The twin binds its "dtype" tensors as F32 and refuses one in another storage (a saved set or
// workspace bound for the CUDA backend) before it writes anything, naming the field.
// fwd_states with the output in the same call: the output must read this call's h and v_new.
TEST(BadArgs, AnOutputOfOtherStatesIsRefused) {
  Fixture f;
  kk::FwdStateArgs s;
  s.ctx = f.ctx();
  s.k = f.run.saved.k;
  s.gcum = f.run.saved.gcum;
  s.W = f.run.saved.W;
  s.U = f.run.saved.U;
  s.seg_entry = f.run.saved.seg_entry ? f.run.saved.seg_entry : f.run.ws.seg_entry;
  s.h = f.run.ws.h;
  s.v_new = f.run.ws.v_new;
  kk::FwdOutputArgs o;
  o.ctx = f.ctx();
  o.q = f.run.saved.q;
  o.k = f.run.saved.k;
  o.gcum = f.run.saved.gcum;
  o.h = f.run.ws.dh;  // not the walk's h
  o.v_new = f.run.ws.v_new;
  o.o = f.o_tensor();
  s.output = &o;
  EXPECT_MESSAGE_HAS(f.be->fwd_states(s), "gdn fwd_states: args.output->h / v_new are not this call's h / v_new");
}

// bwd_grads with the finalize in the same call: the finalize must read this call's dq_hv, dk_hv and
// dlam.
TEST(BadArgs, AFinalizeOfOtherGradsIsRefused) {
  Fixture f;
  kk::BwdGradArgs g;
  g.ctx = f.ctx();
  g.q = f.run.saved.q;
  g.k = f.run.saved.k;
  g.v = f.run.in.v;
  g.beta = f.d.beta.data();
  g.gcum = f.run.saved.gcum;
  g.Phi = f.run.saved.Phi;
  g.h = f.run.ws.h;
  g.v_new = f.run.ws.v_new;
  g.dh = f.run.ws.dh;
  g.dv2 = f.run.ws.dv2;
  g.dO = f.run.in.dO;
  g.dq_hv = f.run.ws.dq_hv;
  g.dk_hv = f.run.ws.dk_hv;
  g.dv = f.o_tensor();
  g.dbeta = f.out.data();
  g.dlam = f.run.ws.dlam;
  kk::BwdFinalizeArgs fin;
  fin.ctx = f.ctx();
  fin.dq_hv = f.run.ws.dq_hv;
  fin.dk_hv = f.run.ws.dq_hv;  // not the call's dk_hv
  fin.dlam = f.run.ws.dlam;
  g.finalize = &fin;
  EXPECT_MESSAGE_HAS(f.be->bwd_grads(g),
                     "gdn bwd_grads: args.finalize->dq_hv / dk_hv / dlam are not this call's dq_hv / dk_hv / dlam");
}

TEST(BadArgs, DtypeTensorsOfAnotherStorageAreRefused) {
  Fixture f;
  EXPECT_EQ(f.be->dtype_storage(), kk::Storage::F32);
  EXPECT_EQ(f.run.saved.q.storage(), kk::Storage::F32);
  EXPECT_EQ(f.run.ws.dv2.storage(), kk::Storage::F32);
  const kk::SavedTensors s16 = kk::bind_saved(f.saved.data(), int64_t(f.saved.size()), f.run.problem, f.run.layout,
                                              kk::SavedKind::Full, kk::Package::Det, kk::Storage::Packed16);
  EXPECT_EQ(s16.Phi.storage(), kk::Storage::Packed16);
  EXPECT_EQ(s16.Phi.address(), f.run.saved.Phi.address());  // same carving, only the tag differs
  kk::WyArgs w = f.wy_args();
  w.k = s16.k;
  const std::vector<float> before(f.ws.begin(), f.ws.end());
  EXPECT_MESSAGE_HAS(f.be->wy(w), "gdn wy: args.k is stored as packed16, this backend stores dtype tensors as f32");
  EXPECT_EQ(std::memcmp(before.data(), f.ws.data(), before.size() * sizeof(float)), 0) << "wrote before refusing";
}

// The caller tensors cross as 16-bit patterns (tensors.h): the twin refuses a float caller tensor,
// and the exact-storage twin (fp32 everywhere) a 16-bit one, before writing anything.
TEST(BadArgs, CallerTensorsOfAnotherStorageAreRefused) {
  Fixture f;
  EXPECT_EQ(f.be->caller_storage(), kk::Storage::Packed16);
  EXPECT_EQ(f.run.in.q.storage(), kk::Storage::Packed16);
  kk::WyArgs w = f.wy_args();
  w.v = kk::ConstDtypeTensor::of_f32(f.d.v.data());
  const std::vector<float> before(f.ws.begin(), f.ws.end());
  EXPECT_MESSAGE_HAS(f.be->wy(w), "gdn wy: args.v is stored as f32, this backend takes caller tensors as packed16");
  EXPECT_EQ(std::memcmp(before.data(), f.ws.data(), before.size() * sizeof(float)), 0) << "wrote before refusing";
  kk::FwdOutputArgs o;
  o.ctx = f.ctx();
  o.q = f.run.saved.q;
  o.k = f.run.saved.k;
  o.gcum = f.run.saved.gcum;
  o.h = f.run.ws.h;
  o.v_new = f.run.ws.v_new;
  o.o = kk::DtypeTensor::of_f32(f.o.data());
  EXPECT_MESSAGE_HAS(f.be->fwd_output(o), "gdn fwd_output: args.o is stored as f32, this backend takes caller tensors");
  const auto exact = kk::make_cpu_backend(kk::CpuStorage::Exact);
  EXPECT_EQ(exact->caller_storage(), kk::Storage::F32);
  EXPECT_MESSAGE_HAS(exact->wy(f.wy_args()),
                     "gdn wy: args.v is stored as packed16, this backend takes caller tensors as f32");
}

TEST(BadArgs, DriverRulesAndTags) {
  Fixture f;
  kk::OutputTensors out{f.o_tensor(), nullptr};
  std::vector<float> incoming(size_t(f.c.HV) * f.c.K * f.c.V, 0.0f);
  // a rank summary where nothing is sent (the one piece starts and ends its sequence)
  std::vector<float> summary(size_t(f.c.HV) * f.c.K * f.c.K, 0.0f);
  EXPECT_MESSAGE_HAS(kcp::rank_forward_begin(*f.be, f.run, summary.data(), nullptr),
                     "rank_forward_begin: a forward rank summary was requested but the last piece ends its sequence");
  EXPECT_MESSAGE_HAS(kcp::rank_forward_begin(*f.be, f.run, nullptr, incoming.data()), "nothing is sent");
  kcp::rank_forward_begin(*f.be, f.run, nullptr, nullptr);
  EXPECT_MESSAGE_HAS(kcp::rank_forward_end(*f.be, f.run, incoming.data(), out), "piece 0 starts its sequence");
  kcp::rank_forward_end(*f.be, f.run, nullptr, out);
  EXPECT_MESSAGE_HAS(kcp::rank_backward_begin(*f.be, f.run, summary.data(), incoming.data()),
                     "rank_backward_begin: a backward rank summary was requested but piece 0 starts its sequence");
  // a saved set from the nondet package passed to the det backward names both sides
  Fixture g(kk::Package::Nondet);
  kcp::RankRun mixed = f.run;
  mixed.saved = g.run.saved;
  EXPECT_MESSAGE_HAS(kcp::rank_backward_begin(*f.be, mixed, nullptr, nullptr),
                     "saved set from the nondet package (deterministic=false) passed to the det backward");
  // a workspace of the other package
  mixed = f.run;
  mixed.ws = g.run.ws;
  EXPECT_MESSAGE_HAS(kcp::rank_backward_begin(*f.be, mixed, nullptr, nullptr), "workspace of the nondet package");
  // a saved set made for another layout
  mixed = f.run;
  kk::RankLayout other = kk::RankLayout::even({100}, 1);
  mixed.layout = other.view();
  mixed.ws.fingerprint = kk::layout_fingerprint(mixed.problem, mixed.layout);
  EXPECT_MESSAGE_HAS(kcp::rank_backward_begin(*f.be, mixed, nullptr, nullptr), "saved set was made for another");
  // a light run given a full saved set (and a light workspace)
  mixed = f.run;
  mixed.kind = kk::SavedKind::Light;
  mixed.ws.kind = kk::SavedKind::Light;
  EXPECT_MESSAGE_HAS(kcp::rank_backward_begin(*f.be, mixed, nullptr, nullptr),
                     "saved set is full but run.kind is light");
  // a light run given the workspace of a full one (which has no room for W, U, seg_Mt, seg_entry)
  mixed = f.run;
  mixed.kind = kk::SavedKind::Light;
  mixed.saved.tag.kind = kk::SavedKind::Light;
  EXPECT_MESSAGE_HAS(kcp::rank_backward_begin(*f.be, mixed, nullptr, nullptr),
                     "workspace sized for a full saved set passed to a light run");
  // arena too small
  EXPECT_MESSAGE_HAS(
      kk::bind_saved(f.saved.data(), 10, f.run.problem, f.run.layout, kk::SavedKind::Full, kk::Package::Det),
      "bind_saved: arena holds 10 floats");
  // an arena off the 16-byte boundary the CUDA kernels' vector loads need (one float in)
  const float* base = f.saved.data();
  ASSERT_EQ(reinterpret_cast<uintptr_t>(base) % 16, 0u);
  EXPECT_MESSAGE_HAS(kk::bind_saved(f.saved.data() + 1, int64_t(f.saved.size()) - 1, f.run.problem, f.run.layout,
                                    kk::SavedKind::Full, kk::Package::Det),
                     "bind_saved: arena is not 16-byte aligned");
  EXPECT_MESSAGE_HAS(f.be->bind_workspace_for(f.ws.data() + 1, int64_t(f.ws.size()) - 1, f.run.problem, f.run.layout,
                                              kk::SavedKind::Full, kk::Package::Det),
                     "bind_workspace: arena is not 16-byte aligned");
}

}  // namespace
}  // namespace kcp::test

namespace kcp::test {
namespace {

// The fold contract of kernels/api/fold.h against a naive double computation: transpose,
// negative strides, states_before, composed, n = 0, and x_final aliasing x0.
TEST(Fold, MatchesNaiveChain) {
  const int HV = 2, K = 3, V = 2, n = 3;
  const int64_t KK = int64_t(HV) * K * K, KV = int64_t(HV) * K * V;
  std::vector<float> A(n * KK), b(n * KV), x0(KV);
  uint64_t s = 7;
  auto rnd = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return float(int(s >> 40) % 17 - 8) / 8.0f;
  };
  for (auto& x : A) x = rnd();
  for (auto& x : b) x = rnd();
  for (auto& x : x0) x = rnd();
  auto be = kk::make_cpu_backend();
  for (bool transpose : {false, true})
    for (bool reverse : {false, true}) {
      // naive (double): items in fold order
      std::vector<double> X(x0.begin(), x0.end()), C(HV * K * K, 0.0), before(n * KV);
      for (int j = 0; j < HV; ++j)
        for (int a = 0; a < K; ++a) C[(j * K + a) * K + a] = 1.0;
      for (int it = 0; it < n; ++it) {
        const int item = reverse ? n - 1 - it : it;
        for (int64_t e = 0; e < KV; ++e) before[it * KV + e] = X[e];
        std::vector<double> Xn(KV, 0.0), Cn(HV * K * K, 0.0);
        for (int j = 0; j < HV; ++j) {
          const float* Aj = &A[item * KK + j * K * K];
          auto op = [&](int r, int c) { return double(transpose ? Aj[c * K + r] : Aj[r * K + c]); };
          for (int r = 0; r < K; ++r) {
            for (int e = 0; e < V; ++e) {
              double acc = b[item * KV + (j * K + r) * V + e];
              for (int m = 0; m < K; ++m) acc += op(r, m) * X[(j * K + m) * V + e];
              Xn[(j * K + r) * V + e] = acc;
            }
            for (int e = 0; e < K; ++e) {
              double acc = 0.0;
              for (int m = 0; m < K; ++m) acc += op(r, m) * C[(j * K + m) * K + e];
              Cn[(j * K + r) * K + e] = acc;
            }
          }
        }
        X = Xn;
        C = Cn;
      }
      std::vector<float> states(n * KV, -1.0f), composed(HV * K * K), xf(x0);
      kk::FoldArgs f;
      f.HV = HV;
      f.K = K;
      f.V = V;
      f.n = n;
      f.transpose_A = transpose;
      f.A = reverse ? &A[(n - 1) * KK] : A.data();
      f.A_stride = reverse ? -KK : KK;
      f.b = reverse ? &b[(n - 1) * KV] : b.data();
      f.b_stride = reverse ? -KV : KV;
      f.x0 = xf.data();
      f.x_final = xf.data();  // aliases x0
      f.states_before = states.data();
      f.states_stride = KV;
      f.composed = composed.data();
      be->fold(f);
      for (int64_t e = 0; e < KV; ++e) EXPECT_NEAR(xf[e], X[e], 1e-5) << "x_final " << e;
      for (int64_t e = 0; e < n * KV; ++e) EXPECT_NEAR(states[e], before[e], 1e-5) << "states_before " << e;
      for (size_t e = 0; e < C.size(); ++e) EXPECT_NEAR(composed[e], C[e], 1e-5) << "composed " << e;
    }
  // n = 0: x_final = x0 (zeros when null), composed = I
  std::vector<float> xf(KV, 5.0f), composed(HV * K * K, 5.0f);
  kk::FoldArgs f;
  f.HV = HV;
  f.K = K;
  f.V = V;
  f.n = 0;
  f.x_final = xf.data();
  f.composed = composed.data();
  be->fold(f);
  for (float x : xf) EXPECT_EQ(x, 0.0f);
  for (int j = 0; j < HV; ++j)
    for (int r = 0; r < K; ++r)
      for (int c = 0; c < K; ++c) EXPECT_EQ(composed[(j * K + r) * K + c], r == c ? 1.0f : 0.0f);
}

}  // namespace
}  // namespace kcp::test
