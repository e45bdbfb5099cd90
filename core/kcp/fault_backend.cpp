#include "core/kcp/fault_backend.h"

#include <chrono>
#include <limits>
#include <thread>

#include "core/util/phase.h"

namespace kcp {

namespace {
Package other(Package p) { return p == Package::Det ? Package::Nondet : Package::Det; }
}  // namespace

FaultInjectingBackend::FaultInjectingBackend(const kernels::Backend& inner, const Fault& fault, const FaultSite& site,
                                             int rank)
    : BackendDecorator(inner), kind_(fault.kind), here_(site.rank == rank) {
  if (here_ && kind_ == FaultKind::DropSegmentEntry) segment_ = site.segment;
  if (here_ && kind_ == FaultKind::SkipOutputTile) tile_token_ = site.local_token;
}

void FaultInjectingBackend::fwd_states(const kernels::FwdStateArgs& a) const {
  if (segment_ >= 0 && segment_ < a.ctx.layout.n_segments) {
    // The entry states live in the caller's workspace; the fault overwrites one of them just
    // before the recurrence reads it, as a lost hand-off between segments would.
    const int64_t state = int64_t(a.ctx.problem.HV) * a.ctx.problem.K * a.ctx.problem.V;
    float* entry = const_cast<float*>(a.seg_entry) + segment_ * state;
    inner_.fill_floats(entry, 0.0f, state, a.ctx.exec);
  }
  inner_.fwd_states(a);
}

void FaultInjectingBackend::fwd_output(const kernels::FwdOutputArgs& a) const {
  inner_.fwd_output(a);
  if (tile_token_ >= 0 && tile_token_ < a.ctx.layout.T) {
    // Head 0, V columns of tokens [tile_token, tile_token + 64): as if that tile was skipped.
    const int64_t HVV = int64_t(a.ctx.problem.HV) * a.ctx.problem.V;
    const int64_t end = std::min<int64_t>(a.ctx.layout.T, tile_token_ + 64);
    for (int64_t t = tile_token_; t < end; ++t)
      poison_dtype(inner_, a.o.at(t * HVV), a.ctx.problem.V, kernels::rounding_of(a.ctx.problem.dtype), a.ctx.exec);
  }
}

void FaultInjectingBackend::at_forward_exchange(const std::string& form_label) const {
  if (!here_ || kind_ != FaultKind::Hang) return;
  set_phase(form_label + " injected hang");
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // only the deadline ends this
}

void FaultInjectingBackend::after_incoming_fold(float* incoming, int64_t n, const kernels::Exec& exec) const {
  if (here_ && kind_ == FaultKind::DropRankIncoming) inner_.fill_floats(incoming, 0.0f, n, exec);
}

void FaultInjectingBackend::bind_backward(RankRun& run, FormBuffers& buf) const {
  if (kind_ == FaultKind::SavedToOtherPackage) {
    // The other package's backward, with its own workspace: only the saved set is foreign.
    run.exec.package = other(run.exec.package);
    const DeviceArray& ws = buf.workspace_arena();
    run.ws = bind_workspace_for(ws.get(), ws.size(), run.problem, run.layout, run.exec.package);
  } else if (kind_ == FaultKind::WorkspaceOfOtherPackage) {
    const DeviceArray& ws = buf.spare_workspace_arena();
    ws.fill(std::numeric_limits<float>::quiet_NaN(), run.exec);
    run.ws = bind_workspace_for(ws.get(), ws.size(), run.problem, run.layout, other(run.exec.package));
  }
}

}  // namespace kcp
