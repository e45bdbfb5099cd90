// A Backend decorator that injects the faults of --inject (core/kcp/fault_site.h), so the engine
// and the kernels stay free of test-only branches. Faults inside a phase (a segment's entry
// state, an output tile) wrap that phase; faults at the engine's own exchange points (a hang, a
// rank's incoming state, the backward's package and workspace) are hooks the engine calls at
// those points, each a no-op unless this rank takes the fault.
#pragma once

#include "core/kcp/backend_decorator.h"
#include "core/kcp/fault_site.h"
#include "core/kcp/form_buffers.h"
#include "core/kcp/rank_driver.h"

namespace kcp {

class FaultInjectingBackend final : public BackendDecorator {
 public:
  // rank: the calling rank; site: place_fault(fault, plan). holds_head0: the run holds value head
  // 0 of the row (false for the other groups of a form run by groups of heads, core/kcp/
  // head_group_run.h): the faults of one head (skip-output-tile, nondeterministic-rerun: value
  // head 0) go only into the run that holds it, as they would into a run of every head.
  FaultInjectingBackend(const kernels::Backend& inner, const Fault& fault, const FaultSite& site, int rank,
                        bool holds_head0 = true);

  // The output faults act on o after whichever call wrote it: fwd_output, or fwd_states with
  // args.output (the driver's forward).
  void fwd_states(const kernels::FwdStateArgs& a) const override;
  void fwd_output(const kernels::FwdOutputArgs& a) const override;

  // Hang: never returns (only the deadline watchdog ends the run).
  void at_forward_exchange(const std::string& form_label) const;
  // DropRankIncoming: the state folded from earlier ranks is replaced by zeros.
  void after_incoming_fold(float* incoming, int64_t n, const kernels::Exec& exec) const;
  // The backward's package and workspace: the form's, or the other package's for the
  // cross-package faults (the backward must then refuse before reading a tensor).
  void bind_backward(RankRun& run, FormBuffers& buf) const;

 private:
  FaultKind kind_;
  bool here_;                // this rank takes the fault
  int segment_ = -1;         // DropSegmentEntry: the local segment whose entry state is zeroed
  int64_t tile_token_ = -1;  // SkipOutputTile: the first local token of the o tile left unwritten

  void after_output(const kernels::FwdOutputArgs& a) const;  // the output faults on a.o
};

}  // namespace kcp
