// Metrics and verdicts (docs/design.md 3 step 5, section 6): every output and gradient of a rank is
// compared with the FP64 reference on the rank's own tokens (or sequences, for states); sums
// and maxima are then reduced over ranks, so every rank holds the same global metrics.
//
// Per tensor: max-abs error and where it lies (rank, global token or sequence, head, channel,
// segment, distance in tokens to the nearest segment or rank boundary; for h_entry / dh_exit the
// global token at the segment's first token / end), rel-RMS error
// sqrt(sum err^2 / sum ref^2), the count of non-finite values where the reference is finite,
// max |ref|; with a budget: ratio_max = max_abs / budget.max_abs, rms_ratio = rel_rms /
// budget.rel_rms, and pass = both <= 1 and no unexpected non-finite value.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/comm/communicator.h"
#include "core/compare/reference_data.h"
#include "core/config/row_config.h"
#include "core/inputs/inputs.h"
#include "core/kcp/kcp_engine.h"
#include "core/plan/segment_plan.h"
#include "core/report/results.h"

namespace kcp {

// WorstElement and TensorMetrics are types of the results document (core/report/results.h).

// Reference data a rank needs: the sequences its pieces belong to (with a head range: those heads).
std::vector<std::shared_ptr<const SequenceReference>> rank_references(const RankPlan& rp, ReferenceCache& cache,
                                                                      HeadRange heads = {});

// The reference of one rank's tokens and pieces, in the backend's layouts (kcp_engine.h
// RankResult); ht / dh0 hold NaN for pieces without a final state / an initial state. Boundary
// tensors (h_entry, dh_exit) depend on the form's segments: boundary_reference.
struct RankReference {
  std::array<std::vector<double>, kResultTensorCount> tensors;  // Token, State or Boundary tensors; Param empty
  std::vector<double>& operator[](ResultTensor t) { return tensors[static_cast<int>(t)]; }
  const std::vector<double>& operator[](ResultTensor t) const { return tensors[static_cast<int>(t)]; }
};
RankReference reference_for_rank(const RowConfig& row, const RankPlan& rp,
                                 const std::vector<std::shared_ptr<const SequenceReference>>& refs);
// One tensor of reference_for_rank (a Token or State tensor the row has), so a rank can build
// and put away its slice one tensor at a time (core/compare/reference_spill.h). With a head
// range (refs computed for it), the part of those heads: [rows, heads of the range, width].
std::vector<double> reference_tensor_for_rank(const RowConfig& row, const RankPlan& rp,
                                              const std::vector<std::shared_ptr<const SequenceReference>>& refs,
                                              ResultTensor t, HeadRange heads = {});
// Where a head range's part of a Token or State tensor lies in the rank's tensor: `rows` rows
// (tokens or pieces) of `heads` heads of `width` elements, of which heads [first, first + count).
struct HeadPart {
  int64_t rows = 0, heads = 0, width = 0, first = 0, count = 0;
};
HeadPart head_part(const RowConfig& row, const RankPlan& rp, ResultTensor t, HeadRange heads);
// Copies a part ([rows, count, width]) into its heads of `whole` ([rows, heads, width]).
void scatter_heads(const std::vector<double>& part, const HeadPart& at, std::vector<double>& whole);
// The reverse: heads [first, first + count) of `whole` as a part [rows, count, width].
std::vector<double> gather_heads(const std::vector<double>& whole, const HeadPart& at);

// What a rank keeps of its sequences' references after the row's preparation, per piece: dA_log,
// ddt_bias, and the probes inside the piece (seq_offset <= p <= seq_offset + length) with their
// S_p, dS_p; t_begin / t_end of the sequence.
std::shared_ptr<const SequenceReference> piece_slice(const SequenceReference& full, const Piece& pc);
// Adds a head range's piece_slice (part.heads) to the piece's slice of every head built so far
// (`into`; the first part sets its probe positions and sequence).
void add_piece_part(const RowConfig& row, const SequenceReference& part, SequenceReference& into);
// h_entry / dh_exit of a form's segments on this rank ([S, HV, K, V]): S_p at each segment's first
// token p where p > 0, dS_p at its end p where p < len (docs/algorithm.md 1.4); NaN elsewhere
// (not judged). piece_refs: piece_slice per piece (every head). With a head range, only those
// heads' value heads: [S, count G, K, V] (a form run by groups of heads, core/kcp/head_group_run.h).
RankReference boundary_reference(const RowConfig& row, const RankPlan& rp,
                                 const std::vector<std::shared_ptr<const SequenceReference>>& piece_refs,
                                 HeadRange heads = {});

// Local metrics of one rank; then reduce_metrics makes them global (collective). ref: Token and
// State tensors; boundary: the form's boundary_reference.
std::vector<TensorMetrics> compare_rank(const RowConfig& row, const RankPlan& rp, const RankResult& res,
                                        const RankReference& ref, const RankReference& boundary, int rank);
// The same, the reference of each Token and State tensor asked for when it is compared (ref_of(t)
// stays valid until the next call): a spilled slice is read back one tensor at a time.
using ReferenceSource = std::function<const std::vector<double>&(ResultTensor)>;
std::vector<TensorMetrics> compare_rank(const RowConfig& row, const RankPlan& rp, const RankResult& res,
                                        const ReferenceSource& ref_of, const RankReference& boundary, int rank);
void reduce_metrics(std::vector<TensorMetrics>& m, Communicator& comm);
// The cancellation-aware scale of dA_log and ddt_bias (docs/design.md 6): per element, the sum
// over all tokens of the absolute per-token contributions, |dg x da/d(param) / da/dg|, from the
// FP64 reference's dg (the gradient w.r.t. the raw gate g) and the inputs: for ddt_bias the
// contribution is dg itself (a depends on g + dt_bias); for dA_log it is dg x softplus(x) /
// sigmoid(x) (softplus form, x = g + dt_bias) or dg x x (lower-bound form), summed over a head's
// channels. A sum that cancels is judged against what it sums, not against its small total.
// Collective (the ranks' token sums are all-reduced); ref_dg is this rank's reference dg.
struct ParamScales {
  std::vector<double> dA_log, ddt_bias;
};
ParamScales param_grad_scales(const RowConfig& row, const RowInputs& shard, const std::vector<double>& ref_dg,
                              Communicator& comm);
// dA_log / ddt_bias (totals over all sequences, identical on every rank): global metrics
// directly (collective). max_rel and rel_rms are relative to the per-element scale.
std::vector<TensorMetrics> compare_parameter_grads(const RowConfig& row, const RankPlan& rp, const RankResult& res,
                                                   const std::vector<std::shared_ptr<const SequenceReference>>& refs,
                                                   const ParamScales& scales, Communicator& comm);
// Applies the row's budgets (after reduce_metrics). A tensor without a budget does not pass,
// except one with no judged element (count 0: e.g. h_entry where no segment carries state),
// which passes without one. P: the form's schedule (0 planned): a forced P with budgets of its own
// (RowConfig::forced_budgets) is judged by them.
void judge(std::vector<TensorMetrics>& m, const RowConfig& row, int P = 0);

}  // namespace kcp
