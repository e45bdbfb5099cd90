// The one exchange-and-fold of KCP across ranks (docs/design.md 4 step 3, docs/algorithm.md 4.2,
// 4.3), used by the engine (through a Communicator) and by the test harnesses (which emulate the
// all-gather by writing every rank's block themselves).
//
// Every rank contributes one block [A | b] fp32 to an all-gathered buffer of W blocks:
//   forward:  A = M (HV x K x K, natural orientation: X -> M X + h_ext), b = h_ext (HV x K x V),
//             the summary of the rank's LAST piece from a zero state (zeros if nothing is sent);
//   backward: A = M^T, b = dh_ext, the reverse summary of the rank's FIRST piece from a zero exit
//             gradient.
// Then a rank that continues a sequence folds the blocks of the other ranks of that sequence:
//   incoming state of the first piece:  X = h0(seq) or 0;  for q = r - pre .. r - 1:  X <- M_q X + h_ext_q
//   exit gradient of the last piece:    Y = dht(seq) or 0; for q = r + post .. r + 1: Y <- M_q^T Y + dh_ext_q
// The chain's end rank summarised from zero, so the fold must start from the sequence's h0 / dht:
// that is where a sequence's initial state (or final-state gradient) enters when it crosses ranks.
#pragma once

#include <cstdint>

#include "kernels/api/backend.h"

namespace kcp {

// Sizes of one rank's block in the gathered buffer (floats).
struct SummaryBlock {
  int64_t A = 0;  // HV * K * K
  int64_t b = 0;  // HV * K * V
  int64_t floats() const { return A + b; }
};
SummaryBlock summary_block(const kernels::Problem& p);

// Forward fold: the incoming state of rank r's first piece from the gathered forward blocks of
// ranks r - pre_ranks .. r - 1 (pre_ranks >= 1), starting from x0 (null: zeros).
void fold_earlier_ranks(const kernels::Backend& be, const kernels::Exec& exec, const kernels::Problem& p,
                        const float* gathered, int r, int pre_ranks, const float* x0, float* incoming);
// Backward fold: the exit gradient of rank r's last piece from the gathered backward blocks of
// ranks r + post_ranks down to r + 1 (post_ranks >= 1), starting from y0 (null: zeros).
void fold_later_ranks(const kernels::Backend& be, const kernels::Exec& exec, const kernels::Problem& p,
                      const float* gathered, int r, int post_ranks, const float* y0, float* exit_grad);

}  // namespace kcp
