// One row, one form, one rank: forward, exchange, backward (see kcp_engine.h).
#include "core/kcp/kcp_engine.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "core/kcp/fault_backend.h"
#include "core/util/error.h"
#include "core/util/log.h"
#include "kernels/cpu/rank_driver.h"

namespace kcp {

namespace {
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

kernels::Package to_kernel(Package p) { return p == Package::Det ? kernels::Package::Det : kernels::Package::Nondet; }
kernels::SavedKind to_kernel(SavedKind s) { return s == SavedKind::Full ? kernels::SavedKind::Full : kernels::SavedKind::Light; }
Package other(Package p) { return p == Package::Det ? Package::Nondet : Package::Det; }

const std::vector<std::pair<const char*, FaultKind>> kFaults = {
    {"none", FaultKind::None},
    {"drop-segment-entry", FaultKind::DropSegmentEntry},
    {"drop-rank-incoming", FaultKind::DropRankIncoming},
    {"skip-output-tile", FaultKind::SkipOutputTile},
    {"saved-to-other-package", FaultKind::SavedToOtherPackage},
    {"workspace-of-other-package", FaultKind::WorkspaceOfOtherPackage}};

// Kernel-API misuse (std::invalid_argument from the backend's Args checks, e.g. a saved set of
// the other package) is the caller's error: ConfigError, exit code 2, message kept whole.
template <class F>
void call_backend(const char* phase, F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    throw ConfigError(fmt::format("{} {} refused its arguments: {}", rank_prefix(), phase, e.what()));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw ApiError(fmt::format("{} {} failed: {}", rank_prefix(), phase, e.what()));
  }
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

std::string Form::label() const {
  return fmt::format("{}/{}/{}", to_string(package), to_string(saved), forced_P ? fmt::format("P={}", forced_P) : "planned");
}

std::string Fault::name() const {
  for (auto& [n, k] : kFaults)
    if (k == kind) return n;
  return "?";
}

FaultKind parse_fault(const std::string& name) {
  std::string known;
  for (auto& [n, k] : kFaults) {
    if (name == n) return k;
    known += (known.empty() ? "" : ", ") + std::string(n);
  }
  KCP_THROW(ConfigError, "--inject: unknown fault \"{}\" (known: {})", name, known);
}

std::vector<std::string> fault_names() {
  std::vector<std::string> v;
  for (auto& [n, k] : kFaults) v.push_back(n);
  return v;
}

kernels::Problem kernel_problem(const RowConfig& row) {
  kernels::Problem p;
  p.op = row.op == OpKind::Gdn ? kernels::Op::Gdn : kernels::Op::Kda;
  p.H = row.H;
  p.HV = row.HV;
  p.K = row.K;
  p.V = row.V;
  p.chunk = row.chunk;
  p.scale = static_cast<float>(row.scale);
  p.qk_l2norm = row.qk_l2norm;
  p.gate = row.gate == GateForm::Direct     ? kernels::GateForm::Direct
           : row.gate == GateForm::Softplus ? kernels::GateForm::Softplus
                                            : kernels::GateForm::LowerBound;
  p.lower_bound = static_cast<float>(row.lower_bound);
  p.has_A_log = row.A_log;
  p.has_dt_bias = row.dt_bias;
  p.has_h0 = row.initial_state;
  p.has_dht = row.dht;
  p.dtype = row.dtype == DType::BF16 ? kernels::DType::BF16 : kernels::DType::FP16;
  return p;
}

kernels::RankLayout kernel_layout(const RankPlan& rp) {
  std::vector<kernels::PieceSpec> pieces;
  for (const auto& pc : rp.pieces) pieces.push_back({pc.local_begin, pc.local_end, !pc.from_prev_rank, !pc.to_next_rank});
  std::vector<kernels::SegmentSpec> segs;
  for (const auto& s : rp.segments) segs.push_back({s.piece, s.local_begin, s.local_end});
  return kernels::RankLayout(pieces, segs);
}

RankResult run_form(const RowConfig& row, const SegmentPlan& plan, const Form& form, const RowInputs& shard,
                    Communicator& comm, const kernels::Backend& real_backend, const EngineOptions& opt) {
  const int r = comm.rank(), W = comm.size();
  KCP_CHECK(W == plan.world, "world size {} differs from the plan's {}", W, plan.world);
  const RankPlan& rp = plan.ranks[r];
  KCP_CHECK(shard.t_begin == rp.global_begin && shard.t_end == rp.global_end, "shard [{}, {}) is not rank {}'s [{}, {})",
            shard.t_begin, shard.t_end, r, rp.global_begin, rp.global_end);
  const kernels::Problem problem = kernel_problem(row);
  const kernels::RankLayout layout = kernel_layout(rp);
  const kernels::LayoutView lv = layout.view();
  const int64_t HV = row.HV, K = row.K, V = row.V, T = rp.tokens(), N = lv.n_pieces;
  const int64_t HVKK = HV * K * K, HVKV = HV * K * V, gw = row.op == OpKind::Kda ? K : 1;

  // Faults: pick where they apply. The rank defaults to the last rank that can take the fault.
  RankResult res;
  int fault_segment = -1;
  int64_t fault_tile = -1;
  const FaultKind fk = opt.fault.kind;
  auto fault_rank_for = [&](auto&& eligible) {
    if (opt.fault.rank >= 0) return opt.fault.rank;
    for (int q = W - 1; q >= 0; --q)
      if (eligible(plan.ranks[q])) return q;
    return -1;
  };
  if (fk == FaultKind::DropSegmentEntry) {
    // The first segment that starts after a cut inside a piece (index_in_piece > 0).
    const int fr = fault_rank_for([](const RankPlan& q) {
      for (const auto& s : q.segments) if (s.index_in_piece > 0) return true;
      return false;
    });
    if (fr < 0) KCP_THROW(ConfigError, "--inject drop-segment-entry: no rank of row {} cuts a piece into segments (P = 1 everywhere)", row.name);
    if (r == fr)
      for (size_t s = 0; s < rp.segments.size(); ++s)
        if (rp.segments[s].index_in_piece > 0) {
          fault_segment = static_cast<int>(s);
          res.faulted_segment = fault_segment;
          res.faulted_token = rp.global_begin + rp.segments[s].local_begin;
          break;
        }
  }
  if (fk == FaultKind::SkipOutputTile && r == fault_rank_for([](const RankPlan&) { return true; })) {
    fault_tile = (T / 2) / 64 * 64;
    res.faulted_token = rp.global_begin + fault_tile;
  }
  int incoming_fault_rank = -1;
  if (fk == FaultKind::DropRankIncoming) {
    incoming_fault_rank = fault_rank_for([](const RankPlan& q) { return !q.pieces.empty() && q.pieces.front().from_prev_rank; });
    if (incoming_fault_rank < 0)
      KCP_THROW(ConfigError, "--inject drop-rank-incoming: no rank of row {} continues a sequence from an earlier rank", row.name);
    if (r == incoming_fault_rank) res.faulted_token = rp.global_begin;
  }
  FaultInjectingBackend backend(real_backend, fault_segment, fault_tile);

  const kernels::Status st = backend.can_implement(problem);
  if (!st.ok) KCP_THROW(ConfigError, "backend {} cannot run row {}: {}", backend.name(), row.name, st.reason);

  // Inputs: the shard, plus per-piece h0 / dht taken from the sequence each piece belongs to.
  std::vector<float> h0_local, dht_local;
  if (row.initial_state) h0_local.assign(N * HVKV, 0.0f);
  if (row.dht) dht_local.assign(N * HVKV, 0.0f);
  for (int64_t p = 0; p < N; ++p) {
    const int seq = rp.pieces[p].seq;
    if (row.initial_state) std::copy_n(shard.h0.data() + seq * HVKV, HVKV, h0_local.data() + p * HVKV);
    if (row.dht) std::copy_n(shard.dht.data() + seq * HVKV, HVKV, dht_local.data() + p * HVKV);
  }
  kernels::InputTensors in;
  in.q = shard.q.data();
  in.k = shard.k.data();
  in.v = shard.v.data();
  in.g = shard.g.data();
  in.beta = shard.beta.data();
  in.A_log = row.A_log ? shard.A_log.data() : nullptr;
  in.dt_bias = row.dt_bias ? shard.dt_bias.data() : nullptr;
  in.h0 = row.initial_state ? h0_local.data() : nullptr;
  in.dO = shard.dO.data();
  in.dht = row.dht ? dht_local.data() : nullptr;

  // Saved set and workspace: allocated once for the form, poisoned with NaN.
  kernels::Exec exec;
  exec.package = to_kernel(form.package);
  exec.threads = opt.threads;
  const kernels::SavedKind kind = to_kernel(form.saved);
  std::vector<float> saved_arena(static_cast<size_t>(backend.saved_floats(problem, lv, kind)), kNaN);
  std::vector<float> ws_arena(static_cast<size_t>(backend.workspace_floats(problem, lv)), kNaN);
  kernels::RankRun run;
  run.problem = problem;
  run.layout = lv;
  run.exec = exec;
  run.kind = kind;
  run.in = in;
  call_backend("bind", [&] {
    run.saved = kernels::bind_saved(saved_arena.data(), int64_t(saved_arena.size()), problem, lv, kind, exec.package);
    run.ws = backend.bind_workspace_for(ws_arena.data(), int64_t(ws_arena.size()), problem, lv, exec.package);
  });

  res.o.assign(T * HV * V, kNaN);
  std::vector<float> ht_all(N * HVKV, kNaN);
  kernels::OutputTensors out;
  out.o = res.o.data();
  out.ht = ht_all.data();

  // ---- forward ----
  comm.barrier();
  auto t0 = std::chrono::steady_clock::now();
  const bool sends_fwd = !rp.pieces.empty() && rp.pieces.back().to_next_rank;
  std::vector<float> send(HVKK + HVKV, 0.0f), gathered(W * (HVKK + HVKV));
  call_backend("forward summary", [&] {
    kernels::rank_forward_begin(backend, run, send.data(), send.data() + HVKK);
  });
  if (!sends_fwd) std::fill(send.begin(), send.end(), 0.0f);  // the last rank of a chain contributes zeros
  comm.allgather(send.data(), gathered.data(), send.size());
  std::vector<float> incoming(HVKV, 0.0f);
  const bool receives = !rp.pieces.empty() && rp.pieces.front().from_prev_rank;
  if (receives && rp.pre_ranks > 0) {
    // X = 0; for q = r - pre .. r - 1: X <- M_q X + h_ext_q (fp32, ALGORITHM.md 4.2).
    kernels::FoldArgs fa;
    fa.exec = exec;
    fa.HV = row.HV;
    fa.K = row.K;
    fa.V = row.V;
    fa.n = rp.pre_ranks;
    const float* first = gathered.data() + (r - rp.pre_ranks) * (HVKK + HVKV);
    fa.A = first;
    fa.A_stride = HVKK + HVKV;
    fa.b = first + HVKK;
    fa.b_stride = HVKK + HVKV;
    // The chain's first rank summarised its piece from a zero state, so the fold starts from the
    // sequence's own initial state.
    fa.x0 = row.initial_state ? shard.h0.data() + rp.pieces.front().seq * HVKV : nullptr;
    fa.x_final = incoming.data();
    call_backend("forward rank fold", [&] { backend.fold(fa); });
  }
  if (r == incoming_fault_rank) std::fill(incoming.begin(), incoming.end(), 0.0f);
  call_backend("forward", [&] { kernels::rank_forward_end(backend, run, receives ? incoming.data() : nullptr, out); });
  res.forward_ms = ms_since(t0);

  // Final states: only pieces that end their sequence have one.
  if (row.final_state) res.ht = ht_all;

  // ---- backward: workspace poisoned again, so only the saved set carries state over ----
  std::fill(ws_arena.begin(), ws_arena.end(), kNaN);
  std::vector<float> ws_other;
  if (fk == FaultKind::SavedToOtherPackage) {
    // The other package's backward, with its own workspace: only the saved set is foreign.
    run.exec.package = to_kernel(other(form.package));
    run.ws = backend.bind_workspace_for(ws_arena.data(), int64_t(ws_arena.size()), problem, lv, run.exec.package);
  }
  if (fk == FaultKind::WorkspaceOfOtherPackage) {
    ws_other.assign(ws_arena.size(), kNaN);
    run.ws = backend.bind_workspace_for(ws_other.data(), int64_t(ws_other.size()), problem, lv,
                                        to_kernel(other(form.package)));
  }
  res.dq.assign(T * row.H * K, kNaN);
  res.dk.assign(T * row.H * K, kNaN);
  res.dv.assign(T * HV * V, kNaN);
  res.dg.assign(T * HV * gw, kNaN);
  res.dbeta.assign(T * HV, kNaN);
  std::vector<float> dA_log(row.A_log ? HV : 0, kNaN), ddt_bias(row.dt_bias ? HV * gw : 0, kNaN);
  std::vector<float> dh0_all(N * HVKV, kNaN);
  kernels::GradTensors gr;
  gr.dq = res.dq.data();
  gr.dk = res.dk.data();
  gr.dv = res.dv.data();
  gr.dg = res.dg.data();
  gr.dbeta = res.dbeta.data();
  gr.dA_log = row.A_log ? dA_log.data() : nullptr;
  gr.ddt_bias = row.dt_bias ? ddt_bias.data() : nullptr;
  gr.dh0 = dh0_all.data();

  comm.barrier();
  t0 = std::chrono::steady_clock::now();
  const bool sends_bwd = receives;  // the first piece's reverse summary goes to earlier ranks
  std::fill(send.begin(), send.end(), 0.0f);
  call_backend("backward summary", [&] {
    kernels::rank_backward_begin(backend, run, send.data(), send.data() + HVKK);
  });
  if (!sends_bwd) std::fill(send.begin(), send.end(), 0.0f);
  comm.allgather(send.data(), gathered.data(), send.size());
  std::vector<float> exit_grad(HVKV, 0.0f);
  const bool continues = sends_fwd;
  if (continues && rp.post_ranks > 0) {
    // Y = 0; for q = r + post down to r + 1: Y <- M_q^T Y + dh_ext_q (ALGORITHM.md 4.3).
    kernels::FoldArgs fa;
    fa.exec = run.exec;
    fa.HV = row.HV;
    fa.K = row.K;
    fa.V = row.V;
    fa.n = rp.post_ranks;
    const float* first = gathered.data() + (r + rp.post_ranks) * (HVKK + HVKV);
    fa.A = first;
    fa.A_stride = -(HVKK + HVKV);
    fa.b = first + HVKK;
    fa.b_stride = -(HVKK + HVKV);
    // Likewise the chain's last rank summarised from a zero exit gradient: start from dht.
    fa.x0 = row.dht ? shard.dht.data() + rp.pieces.back().seq * HVKV : nullptr;
    fa.x_final = exit_grad.data();
    call_backend("backward rank fold", [&] { backend.fold(fa); });
  }
  call_backend("backward", [&] {
    kernels::rank_backward_end(backend, run, continues ? exit_grad.data() : nullptr, gr);
  });
  // Raw-gate parameter gradients: this rank's partial sums, all-reduced in rank order.
  for (std::vector<float>* v : {&dA_log, &ddt_bias}) {
    std::vector<double> d(v->begin(), v->end());
    if (!d.empty()) comm.allreduce(d.data(), d.size(), ReduceOp::Sum);
    for (size_t i = 0; i < d.size(); ++i) (*v)[i] = static_cast<float>(d[i]);
  }
  res.dA_log = std::move(dA_log);
  res.ddt_bias = std::move(ddt_bias);
  if (row.initial_state) res.dh0 = std::move(dh0_all);
  res.backward_ms = ms_since(t0);
  return res;
}

}  // namespace kcp
