// One row, one form, one rank: forward, exchange, backward (see kcp_engine.h).
#include "core/kcp/kcp_engine.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <thread>

#include "core/kcp/device_array.h"
#include "core/kcp/fault_backend.h"
#include "core/kcp/fault_site.h"
#include "core/kcp/phase_timing_backend.h"
#include "core/util/error.h"
#include "core/util/log.h"
#include "core/util/phase.h"
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
    {"workspace-of-other-package", FaultKind::WorkspaceOfOtherPackage},
    {"hang", FaultKind::Hang}};

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

std::string fault_skip_reason(const Fault& fault, const SegmentPlan& plan) { return place_fault(fault, plan).why; }

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

  // Faults: where they apply (fault_site.cpp); the runner already skipped forms that cannot take one.
  RankResult res;
  const FaultKind fk = opt.fault.kind;
  const FaultSite site = place_fault(opt.fault, plan);
  const bool faulted_here = site.rank == r;
  if (faulted_here) {
    res.faulted_segment = site.segment;
    res.faulted_token = rp.global_begin + site.local_token;
  }
  const int fault_segment = faulted_here && fk == FaultKind::DropSegmentEntry ? site.segment : -1;
  const int64_t fault_tile = faulted_here && fk == FaultKind::SkipOutputTile ? site.local_token : -1;
  const bool drop_incoming = faulted_here && fk == FaultKind::DropRankIncoming;
  const FaultInjectingBackend faulty(real_backend, fault_segment, fault_tile);
  // Every phase call goes through the timing decorator; it records only on the phase-timed runs.
  PhaseTimingBackend backend(faulty);

  const kernels::Status st = backend.can_implement(problem);
  if (!st.ok) KCP_THROW(ConfigError, "backend {} cannot run row {}: {}", backend.name(), row.name, st.reason);

  // Inputs: the shard, plus per-piece h0 / dht taken from the sequence each piece belongs to,
  // uploaded once to the backend's memory (outside every timed region).
  kernels::Exec exec;
  exec.package = to_kernel(form.package);
  exec.threads = opt.threads;
  std::vector<float> h0_local, dht_local;
  if (row.initial_state) h0_local.assign(N * HVKV, 0.0f);
  if (row.dht) dht_local.assign(N * HVKV, 0.0f);
  for (int64_t p = 0; p < N; ++p) {
    const int seq = rp.pieces[p].seq;
    if (row.initial_state) std::copy_n(shard.h0.data() + seq * HVKV, HVKV, h0_local.data() + p * HVKV);
    if (row.dht) std::copy_n(shard.dht.data() + seq * HVKV, HVKV, dht_local.data() + p * HVKV);
  }
  const DeviceArray d_q(backend, shard.q, exec), d_k(backend, shard.k, exec), d_v(backend, shard.v, exec),
      d_g(backend, shard.g, exec), d_beta(backend, shard.beta, exec), d_dO(backend, shard.dO, exec),
      d_A_log(backend, row.A_log ? shard.A_log : std::vector<float>{}, exec),
      d_dt_bias(backend, row.dt_bias ? shard.dt_bias : std::vector<float>{}, exec), d_h0(backend, h0_local, exec),
      d_dht(backend, dht_local, exec);
  kernels::InputTensors in;
  in.q = d_q.get();
  in.k = d_k.get();
  in.v = d_v.get();
  in.g = d_g.get();
  in.beta = d_beta.get();
  in.A_log = d_A_log.get();
  in.dt_bias = d_dt_bias.get();
  in.h0 = d_h0.get();
  in.dO = d_dO.get();
  in.dht = d_dht.get();

  // Saved set, workspace, outputs and gradients: allocated once for the form.
  const kernels::SavedKind kind = to_kernel(form.saved);
  const DeviceArray saved_arena(backend, backend.saved_floats(problem, lv, kind));
  const DeviceArray ws_arena(backend, backend.workspace_floats(problem, lv));
  DeviceArray ws_other;  // the other package's workspace, for the cross-package faults
  const DeviceArray d_o(backend, T * HV * V), d_ht(backend, N * HVKV), d_dq(backend, T * row.H * K),
      d_dk(backend, T * row.H * K), d_dv(backend, T * HV * V), d_dg(backend, T * HV * gw), d_dbeta(backend, T * HV),
      d_dA_log(backend, row.A_log ? HV : 0), d_ddt_bias(backend, row.dt_bias ? HV * gw : 0), d_dh0(backend, N * HVKV);
  const DeviceArray d_send(backend, HVKK + HVKV), d_gathered(backend, W * (HVKK + HVKV)), d_incoming(backend, HVKV),
      d_exit(backend, HVKV);
  kernels::RankRun run;
  run.problem = problem;
  run.layout = lv;
  run.exec = exec;
  run.kind = kind;
  run.in = in;
  call_backend("bind", [&] {
    run.saved = kernels::bind_saved(saved_arena.get(), saved_arena.size(), problem, lv, kind, exec.package);
  });
  kernels::OutputTensors out;
  out.o = d_o.get();
  out.ht = d_ht.get();
  kernels::GradTensors gr;
  gr.dq = d_dq.get();
  gr.dk = d_dk.get();
  gr.dv = d_dv.get();
  gr.dg = d_dg.get();
  gr.dbeta = d_dbeta.get();
  gr.dA_log = d_dA_log.get();
  gr.ddt_bias = d_ddt_bias.get();
  gr.dh0 = d_dh0.get();

  const bool sends_fwd = !rp.pieces.empty() && rp.pieces.back().to_next_rank;
  const bool receives = !rp.pieces.empty() && rp.pieces.front().from_prev_rank;
  std::vector<float> host_send(HVKK + HVKV), host_gathered(W * (HVKK + HVKV));
  // All-gathers this rank's summary (zeros unless `sends`) through the host communicator; a
  // world of one rank has nothing to exchange.
  auto exchange = [&](bool sends) {
    if (W == 1) return;
    if (comm.has_device_allgather()) {  // nccl: device buffers, no host round trip
      if (!sends) d_send.fill(0.0f, run.exec);
      comm.allgather_device(d_send.get(), d_gathered.get(), static_cast<size_t>(HVKK + HVKV), run.exec.stream);
      return;
    }
    if (sends) host_send = d_send.to_host(run.exec);
    else std::fill(host_send.begin(), host_send.end(), 0.0f);
    comm.allgather(host_send.data(), host_gathered.data(), host_send.size());
    d_gathered.from_host(host_gathered, run.exec);
  };
  auto rank_fold = [&](int first_rank, int n, int64_t stride, const float* x0, float* x_final) {
    kernels::FoldArgs fa;
    fa.exec = run.exec;
    fa.HV = row.HV;
    fa.K = row.K;
    fa.V = row.V;
    fa.n = n;
    const float* first = d_gathered.get() + first_rank * (HVKK + HVKV);
    fa.A = first;
    fa.A_stride = stride;
    fa.b = first + HVKK;
    fa.b_stride = stride;
    fa.x0 = x0;
    fa.x_final = x_final;
    call_backend("rank fold", [&] { backend.fold(fa); });
  };

  // The states the rank folds start from: the first piece's sequence h0, the last piece's dht.
  auto seq_state = [&](const std::vector<float>& all, bool has, int seq) {
    return has ? DeviceArray(backend, std::vector<float>(all.begin() + seq * HVKV, all.begin() + (seq + 1) * HVKV), exec)
               : DeviceArray();
  };
  const DeviceArray d_h0_seq = seq_state(shard.h0, row.initial_state && receives, receives ? rp.pieces.front().seq : 0);
  const DeviceArray d_dht_seq = seq_state(shard.dht, row.dht && sends_fwd, sends_fwd ? rp.pieces.back().seq : 0);

  for (const DeviceArray* a : {&d_q, &d_k, &d_v, &d_g, &d_beta, &d_dO, &d_A_log, &d_dt_bias, &d_h0, &d_dht, &saved_arena,
                               &ws_arena, &d_o, &d_ht, &d_dq, &d_dk, &d_dv, &d_dg, &d_dbeta, &d_dA_log, &d_ddt_bias,
                               &d_dh0, &d_send, &d_gathered, &d_incoming, &d_exit, &d_h0_seq, &d_dht_seq})
    res.device_bytes += a->size() * int64_t(sizeof(float));

  auto t_fwd_local = backend.make_timer(), t_fwd_rest = backend.make_timer(), t_bwd_local = backend.make_timer(),
       t_bwd_rest = backend.make_timer();
  // Runs: warm-up, timed (forward / backward totals), then with --phase-times as many again with
  // a timer pair around each phase call (separate runs: those timers add gaps between launches).
  const int timed_end = std::max(1, opt.warmup + opt.repeats);
  const int runs = timed_end + (opt.phase_times ? opt.repeats : 0);
  for (int rep = 0; rep < runs; ++rep) {
    const bool phase_timed = rep >= timed_end;
    // Poison everything the kernels write (DESIGN.md 5): an unwritten element shows as NaN.
    for (const DeviceArray* a : {&saved_arena, &ws_arena, &d_o, &d_ht, &d_dq, &d_dk, &d_dv, &d_dg, &d_dbeta, &d_dA_log,
                                 &d_ddt_bias, &d_dh0})
      a->fill(kNaN, exec);
    run.exec = exec;
    call_backend("bind", [&] {
      run.ws = backend.bind_workspace_for(ws_arena.get(), ws_arena.size(), problem, lv, exec.package);
    });
    backend.synchronize(exec);
    comm.barrier();

    // ---- forward ----
    const auto w0 = std::chrono::steady_clock::now();
    d_send.fill(0.0f, exec);
    backend.set_timing(phase_timed, "forward");
    t_fwd_local->start(exec);
    set_phase(form.label() + " forward summary");
    // A rank that sends nothing asks for no summary (the kernels skip what nobody reads) and
    // contributes the zeros of d_send.
    call_backend("forward summary", [&] {
      kernels::rank_forward_begin(backend, run, sends_fwd ? d_send.get() : nullptr,
                                  sends_fwd ? d_send.get() + HVKK : nullptr);
    });
    t_fwd_local->stop(exec);
    if (fk == FaultKind::Hang && faulted_here) {
      set_phase(form.label() + " injected hang");
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // only the deadline ends this
    }
    set_phase(form.label() + " forward exchange");
    backend.set_timing(false);
    exchange(sends_fwd);
    backend.set_timing(phase_timed, "forward");
    t_fwd_rest->start(exec);
    if (receives && rp.pre_ranks > 0) {
      // X = h0(seq) or 0; for q = r - pre .. r - 1: X <- M_q X + h_ext_q (ALGORITHM.md 4.2). The
      // chain's first rank summarised its piece from a zero state, so the fold starts from h0.
      rank_fold(r - rp.pre_ranks, rp.pre_ranks, HVKK + HVKV, d_h0_seq.get(), d_incoming.get());
    } else {
      d_incoming.fill(0.0f, exec);
    }
    if (drop_incoming) d_incoming.fill(0.0f, exec);
    set_phase(form.label() + " forward");
    call_backend("forward", [&] { kernels::rank_forward_end(backend, run, receives ? d_incoming.get() : nullptr, out); });
    t_fwd_rest->stop(exec);
    backend.set_timing(false);
    backend.synchronize(exec);
    const double fwd_wall = ms_since(w0);

    // ---- backward: the workspace poisoned again, so only the saved set carries state over ----
    ws_arena.fill(kNaN, exec);
    if (fk == FaultKind::SavedToOtherPackage) {
      // The other package's backward, with its own workspace: only the saved set is foreign.
      run.exec.package = to_kernel(other(form.package));
      run.ws = backend.bind_workspace_for(ws_arena.get(), ws_arena.size(), problem, lv, run.exec.package);
    }
    if (fk == FaultKind::WorkspaceOfOtherPackage) {
      ws_other = DeviceArray(backend, ws_arena.size());
      ws_other.fill(kNaN, exec);
      run.ws = backend.bind_workspace_for(ws_other.get(), ws_other.size(), problem, lv, to_kernel(other(form.package)));
    }
    backend.synchronize(exec);
    comm.barrier();
    const auto w1 = std::chrono::steady_clock::now();
    d_send.fill(0.0f, exec);
    backend.set_timing(phase_timed, "backward");
    t_bwd_local->start(run.exec);
    set_phase(form.label() + " backward summary");
    call_backend("backward summary", [&] {
      kernels::rank_backward_begin(backend, run, receives ? d_send.get() : nullptr, receives ? d_send.get() + HVKK : nullptr);
    });
    t_bwd_local->stop(run.exec);
    set_phase(form.label() + " backward exchange");
    backend.set_timing(false);
    exchange(receives);  // the first piece's reverse summary goes to earlier ranks
    backend.set_timing(phase_timed, "backward");
    t_bwd_rest->start(run.exec);
    if (sends_fwd && rp.post_ranks > 0) {
      // Y = dht(seq) or 0; for q = r + post down to r + 1: Y <- M_q^T Y + dh_ext_q (ALGORITHM.md 4.3);
      // the chain's last rank summarised from a zero exit gradient, so the fold starts from dht.
      rank_fold(r + rp.post_ranks, rp.post_ranks, -(HVKK + HVKV), d_dht_seq.get(), d_exit.get());
    }
    set_phase(form.label() + " backward");
    call_backend("backward", [&] { kernels::rank_backward_end(backend, run, sends_fwd ? d_exit.get() : nullptr, gr); });
    t_bwd_rest->stop(run.exec);
    backend.set_timing(false);
    backend.synchronize(run.exec);
    const double bwd_wall = ms_since(w1);
    if (phase_timed) {
      const std::map<std::string, double> ms = backend.collect();
      for (const std::string& name : engine_phase_names()) {
        auto it = ms.find(name);
        if (it != ms.end()) res.phase_kernel_ms[name].push_back(it->second);
      }
    } else if (rep >= opt.warmup) {
      res.forward_kernel_ms.push_back(t_fwd_local->elapsed_ms() + t_fwd_rest->elapsed_ms());
      res.backward_kernel_ms.push_back(t_bwd_local->elapsed_ms() + t_bwd_rest->elapsed_ms());
      res.forward_wall_ms.push_back(fwd_wall);
      res.backward_wall_ms.push_back(bwd_wall);
    }
  }

  // Results back to the host (after the last repeat).
  res.o = d_o.to_host(exec);
  if (row.final_state) res.ht = d_ht.to_host(exec);
  res.dq = d_dq.to_host(exec);
  res.dk = d_dk.to_host(exec);
  res.dv = d_dv.to_host(exec);
  res.dg = d_dg.to_host(exec);
  res.dbeta = d_dbeta.to_host(exec);
  if (row.initial_state) res.dh0 = d_dh0.to_host(exec);
  // Raw-gate parameter gradients: this rank's partial sums, all-reduced in rank order.
  for (auto [dev, dst] : {std::pair{&d_dA_log, &res.dA_log}, std::pair{&d_ddt_bias, &res.ddt_bias}}) {
    const std::vector<float> part = dev->to_host(exec);
    std::vector<double> d(part.begin(), part.end());
    if (!d.empty()) comm.allreduce(d.data(), d.size(), ReduceOp::Sum);
    dst->assign(d.begin(), d.end());
  }
  return res;
}

}  // namespace kcp
