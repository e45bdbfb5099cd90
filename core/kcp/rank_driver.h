// Single-rank driver: chains the backend phases of one rank (docs/design.md 4) for tests and for the
// KCP engine. Written against the abstract kernels::Backend only (no CPU-specific code), so it also
// drives a device backend when every pointer is device memory.
//
// Each direction is split at the rank's one exchange point:
//   forward:  rank_forward_begin  -> (M, h_ext) of the LAST piece from a zero state
//             [engine: all-gather, fold earlier ranks -> incoming state of the first piece]
//             rank_forward_end(incoming) -> o, ht
//   backward: rank_backward_begin -> (M^T, dh_ext) of the FIRST piece from a zero exit gradient
//             [engine: all-gather, fold later ranks -> exit gradient of the last piece]
//             rank_backward_end(exit_grad) -> dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0
// run_rank_forward / run_rank_backward do both halves (one rank, or a test that folds by hand).
//
// Rules:
//  * incoming must be null when piece 0 starts its sequence (h0 applies there); when piece 0
//    continues from an earlier rank, null means a zero incoming state. The forward stores it in
//    saved.incoming (zeros when null) and uses that copy, so the backward recompute sees the
//    same bits.
//  * exit_grad must be null when the last piece ends its sequence (dht applies there); else
//    null means zero.
//  * the same RankRun (problem, layout, kind, package, inputs, saved set) must be passed to the
//    forward and the backward; the workspace may be re-poisoned in between: the backward reads
//    only the saved set and the inputs.
//  * rank summaries are taken from a ZERO state (forward) and a ZERO exit gradient (backward), so
//    the engine's fold over the ranks of one sequence must start from that sequence's h0
//    (FoldArgs::x0 = h0[seq] when problem.has_h0; the first rank of the chain starts the
//    sequence) and, backward, from its dht (x0 = dht[seq] when problem.has_dht); otherwise the
//    initial state / final-state gradient of a sequence that crosses ranks is lost.
//    tests/kcp/twin_harness.cpp (run_twin) is a reference emulation of these exchanges.
//  * the driver never synchronizes: with an asynchronous (device) backend call
//    be.synchronize(run.exec) before reading summaries or results on the host.
//  * summary pointers may be null (not computed), and must be null where nothing is sent: the
//    forward summary when the last piece ends its sequence, the backward one when piece 0 starts
//    its sequence (std::invalid_argument; the segment summaries it would fold may be zeros,
//    kernels/api/summary_needs.h). Shapes: M / Mt [HV, K, K], h_ext / dh_ext
//    [HV, K, V], all fp32; M is in natural orientation (X -> M X + h_ext), Mt is M^T
//    (Y -> Mt Y + dh_ext).
#pragma once

#include "kernels/api/backend.h"

namespace kcp {

struct RankRun {
  kernels::Problem problem;
  kernels::LayoutView layout;
  kernels::Exec exec;
  kernels::SavedKind kind = SavedKind::Full;
  kernels::InputTensors in;
  kernels::SavedTensors saved;   // bind_saved(..., kind, exec.package)
  kernels::WorkspaceTensors ws;  // Backend::bind_workspace_for(..., kind, exec.package)
};

void rank_forward_begin(const kernels::Backend& be, const RankRun& run, float* summary_M, float* summary_h_ext);
void rank_forward_end(const kernels::Backend& be, const RankRun& run, const float* incoming,
                      const kernels::OutputTensors& out);
void run_rank_forward(const kernels::Backend& be, const RankRun& run, const float* incoming,
                      const kernels::OutputTensors& out, float* summary_M = nullptr, float* summary_h_ext = nullptr);

void rank_backward_begin(const kernels::Backend& be, const RankRun& run, float* summary_Mt, float* summary_dh_ext);
void rank_backward_end(const kernels::Backend& be, const RankRun& run, const float* exit_grad,
                       const kernels::GradTensors& grads);
void run_rank_backward(const kernels::Backend& be, const RankRun& run, const float* exit_grad,
                       const kernels::GradTensors& grads, float* summary_Mt = nullptr, float* summary_dh_ext = nullptr);

// Where the segment entry states [S, HV, K, V] fp32 live: the saved set (full) or the workspace
// (light; the light backward recomputes them). After the backward, they and ws.seg_exit are the
// run's h_entry and dh_exit (core/config/result_tensors.h).
const float* segment_entry_states(const RankRun& run);

}  // namespace kcp
