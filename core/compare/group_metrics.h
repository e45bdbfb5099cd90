// Judging a form run by groups of heads (core/kcp/head_group_run.h): each group is compared on
// its own (compare_rank on head_range_row's shape, its heads numbered from 0), and its local
// metrics are folded into the rank's metrics of every head before reduce_metrics makes them
// global. The fold gives what compare_rank gives on every head at once:
//   count, nonfinite, sum_err2, sum_ref2: sums (the sums in another order: rel-RMS equal to
//     rounding, ~1e-15 relative);
//   max_abs, ref_max_abs: maxima;
//   the worst element: the first non-finite one when there is any, else the one of the largest
//     max_abs, ties to the element compare_rank meets first (token, sequence, segment, head,
//     channel order), with its head in the row's numbering (a q/k head for dq / dk, else a value
//     head).
#pragma once

#include <vector>

#include "core/compare/compare.h"

namespace kcp {

// Folds one group's local metrics (`part`, compare_rank's order) into `into` (empty before the
// first group: it takes the group's). Throws InvariantError when the tensors differ.
void fold_head_group(std::vector<TensorMetrics>& into, const std::vector<TensorMetrics>& part, const RowConfig& row,
                     HeadRange heads);

}  // namespace kcp
