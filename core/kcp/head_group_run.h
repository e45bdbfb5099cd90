// A form run one group of heads at a time (docs/design.md 4; core/plan/memory_estimate.h): heads
// are independent in GDN and KDA (a value head's recurrence, gates, beta, h0 / dht, the rank
// exchange's summaries and folds and its dA_log / ddt_bias are its own; the value heads of one
// q/k head meet only in dq / dk, which a group holds whole), so each group of q/k heads (with all
// their value heads) runs as the row restricted to those heads (head_range_row, its inputs the
// same values: make_inputs with the range) on the row's own plan, and its result is the bits of
// those heads in a run of every head. Only one group's arrays and results exist at a time: the
// form's memory (device memory on a GPU, host memory on the CPU twin) is divided by the groups.
//
// Each group's result goes to a judge callback (compared, its metrics folded: core/compare/
// group_metrics.h) and is then freed; what stays for the whole form is below. Timings are the
// groups' summed per run (the whole form's work, run in pieces: not the time of one run of every
// head). One group is a plain run_form of the whole row.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/kcp/kcp_engine.h"
#include "core/kcp/result_digest.h"

namespace kcp {

// Group g of `groups` (a divisor of H): q/k heads [g H / groups, (g + 1) H / groups) with their
// value heads; every head ({}) when groups is 1.
HeadRange head_group(const RowConfig& row, int g, int groups);

struct GroupedFormRun {
  // The Param tensors of every head (each group's at its value heads), per run the forward /
  // backward times and per phase the kernel times summed over the groups, device_bytes of the
  // largest group, where the fault was placed. No Token, State or Boundary tensor.
  RankResult rest;
  ResultDigest bits{};  // the groups' digests folded in group order (fold_digest); one group: its digest
  // This rank's host clock, summed over the groups: making the inputs (make_inputs), run_form
  // (upload, every warm-up and timed run, download), the judge callback with the digest and what stays. A long
  // row's progress lines show them (where a form's minutes go besides the kernels).
  double inputs_s = 0, run_s = 0, judge_s = 0;
};

// Called on every rank with each group's row (head_range_row), heads and result (after finish(),
// so its dA_log / ddt_bias are all-reduced); the result's tensors go once it returns.
using GroupJudge = std::function<void(const RowConfig& part, HeadRange heads, const RankResult& res)>;

// Runs the form on this rank group by group (collective: every rank runs the same groups in
// order). `opt.heads` is set per group; a RefusedError of the backend propagates. `kept`, with
// one group only: the row's input shard kept across its forms (made here at the first form that
// needs it, then read, never taken over); null: each group's inputs made and freed once uploaded.
GroupedFormRun run_form_by_head_groups(const RowConfig& row, const std::string& row_digest, const SegmentPlan& plan,
                                       const Form& form, int groups, Communicator& comm,
                                       const kernels::Backend& backend, EngineOptions opt, const GroupJudge& judge,
                                       std::shared_ptr<const RowInputs>* kept = nullptr);

}  // namespace kcp
