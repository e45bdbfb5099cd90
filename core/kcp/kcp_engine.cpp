// One row, one form, one rank: forward, exchange, backward (see kcp_engine.h).
#include "core/kcp/kcp_engine.h"

#include <chrono>
#include <limits>
#include <memory>
#include <stdexcept>

#include "core/kcp/fault_backend.h"
#include "core/kcp/form_buffers.h"
#include "core/kcp/phase_timing_backend.h"
#include "core/kcp/rank_driver.h"
#include "core/kcp/rank_exchange.h"
#include "core/util/error.h"
#include "core/util/phase.h"

namespace kcp {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Kernel-API misuse (std::invalid_argument from the backend's Args checks, e.g. a saved set of
// the other package) is the caller's error: RefusedError (a ConfigError), message kept whole.
template <class F>
void call_backend(const char* phase, F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    throw RefusedError(fmt::format("{} {} refused its arguments: {}", rank_prefix(), phase, e.what()));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    throw ApiError(fmt::format("{} {} failed: {}", rank_prefix(), phase, e.what()));
  }
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// One rank's run of one form: its buffers, bindings and timers, and the repeated run.
class FormRun {
 public:
  FormRun(const RowConfig& row, const SegmentPlan& plan, const Form& form, const RowInputs& shard, Communicator& comm,
          const kernels::Backend& real_backend, const EngineOptions& opt);
  // Poison, bind, forward, backward; the times go to res_ (totals, or per phase when phase_timed).
  void run_once(bool timed, bool phase_timed);
  // The last run's tensors on the host, the raw-gate parameter gradients all-reduced (collective).
  RankResult finish();

 private:
  double forward(bool phase_timed);   // returns the host wall time
  double backward(bool phase_timed);  // returns the host wall time
  void all_gather(bool sends);
  void record_phases();

  const RowConfig& row_;
  const RankPlan& rp_;
  const Form& form_;
  Communicator& comm_;
  const FaultSite site_;
  const kernels::Problem problem_;
  const kernels::RankLayout layout_;
  const FaultInjectingBackend faulty_;
  PhaseTimingBackend backend_;  // every phase call goes through it; it records only when told to
  RankRun run_;
  kernels::Exec exec_;  // the form's execution context (run_.exec may be the other package's)
  FormBuffers buf_;
  const bool sends_fwd_, receives_;
  std::vector<float> host_send_, host_gathered_;
  std::unique_ptr<kernels::PhaseTimer> t_fwd_local_, t_fwd_rest_, t_bwd_local_, t_bwd_rest_;
  RankResult res_;
};

kernels::Exec form_exec(const Form& form, const EngineOptions& opt) {
  kernels::Exec e;
  e.package = form.package;
  e.threads = opt.threads;
  return e;
}

FormRun::FormRun(const RowConfig& row, const SegmentPlan& plan, const Form& form, const RowInputs& shard,
                 Communicator& comm, const kernels::Backend& real_backend, const EngineOptions& opt)
    : row_(row),
      rp_(plan.ranks[comm.rank()]),
      form_(form),
      comm_(comm),
      site_(place_fault(opt.fault, plan)),
      problem_(kernel_problem(row)),
      layout_(kernel_layout(rp_)),
      faulty_(real_backend, opt.fault, site_, comm.rank(), opt.heads.first == 0),
      backend_(faulty_),
      exec_(form_exec(form, opt)),
      buf_(backend_, row, rp_, plan.world, shard, problem_, layout_.view(), form.saved, exec_),
      sends_fwd_(!rp_.pieces.empty() && rp_.pieces.back().to_next_rank),
      receives_(!rp_.pieces.empty() && rp_.pieces.front().from_prev_rank),
      t_fwd_local_(backend_.make_timer()),
      t_fwd_rest_(backend_.make_timer()),
      t_bwd_local_(backend_.make_timer()),
      t_bwd_rest_(backend_.make_timer()) {
  if (site_.rank == comm.rank()) {
    res_.faulted_segment = site_.segment;
    res_.faulted_token = rp_.global_begin + site_.local_token;
  }
  run_.problem = problem_;
  run_.layout = layout_.view();
  run_.exec = exec_;
  run_.kind = form.saved;
  run_.in = buf_.inputs();
  const DeviceArray& saved = buf_.saved_arena();
  call_backend("bind", [&] {
    run_.saved = backend_.bind_saved_for(saved.get(), saved.size(), problem_, run_.layout, form.saved, exec_.package);
  });
  res_.device_bytes = buf_.bytes();
}

// All-gathers this rank's block (zeros unless `sends`); a world of one rank has nothing to exchange.
void FormRun::all_gather(bool sends) {
  const int64_t n = buf_.send().size();
  if (comm_.size() == 1) return;
  if (comm_.has_device_allgather()) {  // nccl: device buffers, no host round trip
    if (!sends) buf_.send().fill(0.0f, run_.exec);
    comm_.allgather_device(buf_.send().get(), buf_.gathered().get(), static_cast<size_t>(n), run_.exec.stream);
    return;
  }
  if (sends)
    host_send_ = buf_.send().to_host(run_.exec);
  else
    host_send_.assign(static_cast<size_t>(n), 0.0f);
  host_gathered_.resize(static_cast<size_t>(n * comm_.size()));
  comm_.allgather(host_send_.data(), host_gathered_.data(), host_send_.size());
  buf_.gathered().from_host(host_gathered_, run_.exec);
}

double FormRun::forward(bool phase_timed) {
  const auto w0 = std::chrono::steady_clock::now();
  const std::string label = form_.label();
  buf_.send().fill(0.0f, exec_);
  backend_.set_timing(phase_timed, "forward");
  t_fwd_local_->start(exec_);
  set_phase(label + " forward summary");
  // A rank that sends nothing asks for no summary (the kernels skip what nobody reads) and
  // contributes the zeros of its send block.
  call_backend("forward summary", [&] {
    rank_forward_begin(backend_, run_, sends_fwd_ ? buf_.send_A() : nullptr, sends_fwd_ ? buf_.send_b() : nullptr);
  });
  t_fwd_local_->stop(exec_);
  faulty_.at_forward_exchange(label);
  set_phase(label + " forward exchange");
  backend_.set_timing(false);
  all_gather(sends_fwd_);
  backend_.set_timing(phase_timed, "forward");
  t_fwd_rest_->start(exec_);
  if (receives_ && rp_.pre_ranks > 0)
    call_backend("rank fold", [&] {
      fold_earlier_ranks(backend_, exec_, problem_, buf_.gathered().get(), comm_.rank(), rp_.pre_ranks, buf_.fold_h0(),
                         buf_.incoming());
    });
  else
    backend_.fill_floats(buf_.incoming(), 0.0f, summary_block(problem_).b, exec_);
  faulty_.after_incoming_fold(buf_.incoming(), summary_block(problem_).b, exec_);
  set_phase(label + " forward");
  call_backend("forward",
               [&] { rank_forward_end(backend_, run_, receives_ ? buf_.incoming() : nullptr, buf_.outputs()); });
  t_fwd_rest_->stop(exec_);
  backend_.set_timing(false);
  backend_.synchronize(exec_);
  return ms_since(w0);
}

double FormRun::backward(bool phase_timed) {
  const std::string label = form_.label();
  // The workspace poisoned again, so only the saved set carries state over.
  buf_.workspace_arena().fill(kNaN, exec_);
  faulty_.bind_backward(run_, buf_);
  backend_.synchronize(exec_);
  comm_.barrier();
  const auto w1 = std::chrono::steady_clock::now();
  buf_.send().fill(0.0f, exec_);
  backend_.set_timing(phase_timed, "backward");
  t_bwd_local_->start(run_.exec);
  set_phase(label + " backward summary");
  call_backend("backward summary", [&] {
    rank_backward_begin(backend_, run_, receives_ ? buf_.send_A() : nullptr, receives_ ? buf_.send_b() : nullptr);
  });
  t_bwd_local_->stop(run_.exec);
  set_phase(label + " backward exchange");
  backend_.set_timing(false);
  all_gather(receives_);  // the first piece's reverse summary goes to earlier ranks
  backend_.set_timing(phase_timed, "backward");
  t_bwd_rest_->start(run_.exec);
  if (sends_fwd_ && rp_.post_ranks > 0)
    call_backend("rank fold", [&] {
      fold_later_ranks(backend_, run_.exec, problem_, buf_.gathered().get(), comm_.rank(), rp_.post_ranks,
                       buf_.fold_dht(), buf_.exit_grad());
    });
  set_phase(label + " backward");
  call_backend("backward",
               [&] { rank_backward_end(backend_, run_, sends_fwd_ ? buf_.exit_grad() : nullptr, buf_.grads()); });
  t_bwd_rest_->stop(run_.exec);
  backend_.set_timing(false);
  backend_.synchronize(run_.exec);
  return ms_since(w1);
}

void FormRun::run_once(bool timed, bool phase_timed) {
  // Poison everything the kernels write (docs/design.md 5): an unwritten element shows as NaN.
  buf_.poison(exec_);
  run_.exec = exec_;
  const DeviceArray& ws = buf_.workspace_arena();
  call_backend("bind", [&] {
    run_.ws = backend_.bind_workspace_for(ws.get(), ws.size(), problem_, run_.layout, run_.kind, exec_.package);
  });
  backend_.synchronize(exec_);
  comm_.barrier();
  const double fwd_wall = forward(phase_timed);
  const double bwd_wall = backward(phase_timed);
  if (phase_timed) {
    record_phases();
  } else if (timed) {
    res_.forward_kernel_ms.push_back(t_fwd_local_->elapsed_ms() + t_fwd_rest_->elapsed_ms());
    res_.backward_kernel_ms.push_back(t_bwd_local_->elapsed_ms() + t_bwd_rest_->elapsed_ms());
    res_.forward_wall_ms.push_back(fwd_wall);
    res_.backward_wall_ms.push_back(bwd_wall);
  }
}

void FormRun::record_phases() {
  const std::map<std::string, double> ms = backend_.collect();
  for (const std::string& name : engine_phase_names()) {
    auto it = ms.find(name);
    if (it != ms.end()) res_.phase_kernel_ms[name].push_back(it->second);
  }
}

RankResult FormRun::finish() {
  // The boundary states as the run left them (core/config/result_tensors.h): the entry states
  // after every fold, and the exit gradients of the backward; they live in the saved set and the
  // workspace, which go next.
  const int64_t n = int64_t(layout_.view().n_segments) * summary_block(problem_).b;
  std::vector<float> h_entry(static_cast<size_t>(n)), dh_exit(static_cast<size_t>(n));
  if (n > 0) backend_.download(h_entry.data(), segment_entry_states(run_), n, run_.exec);
  if (n > 0) backend_.download(dh_exit.data(), run_.ws.seg_exit, n, run_.exec);
  // Then the results, each array freed as it arrives: the form's arrays and its results on the
  // host never exist whole at once (core/plan/memory_estimate.h).
  run_.saved = {};
  run_.ws = {};
  run_.in = {};
  buf_.release_all_but_results();
  RankResult out = buf_.take_results(row_, exec_);
  out[ResultTensor::h_entry] = std::move(h_entry);
  out[ResultTensor::dh_exit] = std::move(dh_exit);
  out.forward_kernel_ms = std::move(res_.forward_kernel_ms);
  out.backward_kernel_ms = std::move(res_.backward_kernel_ms);
  out.forward_wall_ms = std::move(res_.forward_wall_ms);
  out.backward_wall_ms = std::move(res_.backward_wall_ms);
  out.phase_kernel_ms = std::move(res_.phase_kernel_ms);
  out.device_bytes = res_.device_bytes;
  out.faulted_segment = res_.faulted_segment;
  out.faulted_token = res_.faulted_token;
  // Raw-gate parameter gradients: this rank's partial sums, all-reduced in rank order.
  for (ResultTensor t : {ResultTensor::dA_log, ResultTensor::ddt_bias}) {
    std::vector<double> d(out[t].begin(), out[t].end());
    if (!d.empty()) comm_.allreduce(d.data(), d.size(), ReduceOp::Sum);
    out[t].assign(d.begin(), d.end());
  }
  return out;
}

}  // namespace

std::string Form::label() const {
  return fmt::format("{}/{}/{}", to_string(package), to_string(saved),
                     forced_P ? fmt::format("P={}", forced_P) : "planned");
}

kernels::Problem kernel_problem(const RowConfig& row) {
  kernels::Problem p;
  p.op = row.op;
  p.H = row.H;
  p.HV = row.HV;
  p.K = row.K;
  p.V = row.V;
  p.chunk = row.chunk;
  p.scale = static_cast<float>(row.scale);
  p.qk_l2norm = row.qk_l2norm;
  p.gate = row.gate;
  p.lower_bound = static_cast<float>(row.lower_bound);
  p.has_A_log = row.A_log;
  p.has_dt_bias = row.dt_bias;
  p.has_h0 = row.initial_state;
  p.has_dht = row.dht;
  p.dtype = row.dtype;
  return p;
}

kernels::RankLayout kernel_layout(const RankPlan& rp) {
  std::vector<kernels::PieceSpec> pieces;
  for (const auto& pc : rp.pieces)
    pieces.push_back({pc.local_begin, pc.local_end, !pc.from_prev_rank, !pc.to_next_rank});
  std::vector<kernels::SegmentSpec> segs;
  for (const auto& s : rp.segments) segs.push_back({s.piece, s.local_begin, s.local_end});
  return kernels::RankLayout(pieces, segs);
}

namespace {
// run_form; `drop` (the shard itself, or null) is freed once the form's buffers hold its values.
RankResult run_form_impl(const RowConfig& row, const SegmentPlan& plan, const Form& form, const RowInputs& shard,
                         RowInputs* drop, Communicator& comm, const kernels::Backend& backend,
                         const EngineOptions& opt) {
  const int r = comm.rank();
  KCP_CHECK(comm.size() == plan.world, "world size {} differs from the plan's {}", comm.size(), plan.world);
  const RankPlan& rp = plan.ranks[r];
  KCP_CHECK(shard.t_begin == rp.global_begin && shard.t_end == rp.global_end,
            "shard [{}, {}) is not rank {}'s [{}, {})", shard.t_begin, shard.t_end, r, rp.global_begin, rp.global_end);
  const kernels::Status st = backend.can_implement(kernel_problem(row));
  if (!st.ok) KCP_THROW(ConfigError, "backend {} cannot run row {}: {}", backend.name(), row.name, st.reason);

  FormRun fr(row, plan, form, shard, comm, backend, opt);
  if (drop) *drop = RowInputs();  // uploaded: the form reads only its own arrays from here on
  // Warm-up, timed (forward / backward totals), then with phase_times as many again with a timer
  // pair around each phase call (separate runs: those timers add gaps between launches).
  const int timed_end = std::max(1, opt.warmup + opt.repeats);
  const int runs = timed_end + (opt.phase_times ? opt.repeats : 0);
  for (int rep = 0; rep < runs; ++rep) fr.run_once(rep >= opt.warmup && rep < timed_end, rep >= timed_end);
  return fr.finish();
}
}  // namespace

RankResult run_form(const RowConfig& row, const SegmentPlan& plan, const Form& form, const RowInputs& shard,
                    Communicator& comm, const kernels::Backend& backend, const EngineOptions& opt) {
  return run_form_impl(row, plan, form, shard, nullptr, comm, backend, opt);
}

RankResult run_form(const RowConfig& row, const SegmentPlan& plan, const Form& form, RowInputs&& shard,
                    Communicator& comm, const kernels::Backend& backend, const EngineOptions& opt) {
  return run_form_impl(row, plan, form, shard, &shard, comm, backend, opt);
}

}  // namespace kcp
