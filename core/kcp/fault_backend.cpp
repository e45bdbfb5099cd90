#include "core/kcp/fault_backend.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>

#include "core/util/phase.h"

namespace kcp {

namespace {
Package other(Package p) { return p == Package::Det ? Package::Nondet : Package::Det; }
// NondeterministicRerun: forward outputs made on the faulted rank, over every form and run of the
// process (one engine, and so one decorator, per run: the count must outlive them).
std::atomic<int64_t> g_nondet_outputs{0};

// Element 0 of o (token 0, value head 0, column 0) one unit in the last place up: its lowest bit
// flipped, in the caller storage of the tensor (16-bit pattern or float).
void flip_lowest_bit(const kernels::Backend& be, kernels::DtypeTensor o, const kernels::Exec& exec) {
  if (o.storage() == kernels::Storage::F32) {
    float x = 0.0f;
    be.download(&x, o.f32(), 1, exec);
    uint32_t u = 0;
    std::memcpy(&u, &x, sizeof u);
    u ^= 1u;
    std::memcpy(&x, &u, sizeof x);
    be.upload(o.f32(), &x, 1, exec);
    return;
  }
  uint16_t bits = 0;
  be.download_16(&bits, o.packed16(), 1, exec);
  bits ^= 1u;
  be.upload_16(o.packed16(), &bits, 1, exec);
}
}  // namespace

FaultInjectingBackend::FaultInjectingBackend(const kernels::Backend& inner, const Fault& fault, const FaultSite& site,
                                             int rank, bool holds_head0)
    : BackendDecorator(inner),
      kind_(fault.kind),
      here_(site.rank == rank &&
            (holds_head0 || (kind_ != FaultKind::SkipOutputTile && kind_ != FaultKind::NondeterministicRerun))) {
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
  if (a.output) after_output(*a.output);
}

void FaultInjectingBackend::fwd_output(const kernels::FwdOutputArgs& a) const {
  inner_.fwd_output(a);
  after_output(a);
}

void FaultInjectingBackend::after_output(const kernels::FwdOutputArgs& a) const {
  // Every second forward of the process on this rank: the first run of a det form is exact, its
  // rerun differs in o by one ulp (a backend whose det package is not reproducible).
  if (here_ && kind_ == FaultKind::NondeterministicRerun && a.ctx.layout.T > 0 && (g_nondet_outputs++ % 2) == 1)
    flip_lowest_bit(inner_, a.o, a.ctx.exec);
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
    run.ws = bind_workspace_for(ws.get(), ws.size(), run.problem, run.layout, run.kind, run.exec.package);
  } else if (kind_ == FaultKind::WorkspaceOfOtherPackage) {
    const DeviceArray& ws = buf.spare_workspace_arena();
    ws.fill(std::numeric_limits<float>::quiet_NaN(), run.exec);
    run.ws = bind_workspace_for(ws.get(), ws.size(), run.problem, run.layout, run.kind, other(run.exec.package));
  }
}

}  // namespace kcp
