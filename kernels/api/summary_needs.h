// Which segment summaries anybody reads. fwd_summaries and bwd_summaries of every backend ask
// this (host and device code alike) and write ZEROS for the parts that are not needed instead of
// walking the segment, so the folds of core/kcp/rank_driver.cpp stay exactly as they are and
// never read poison (the workspace is NaN-filled, and NaN * 0 is NaN). Outputs, gradients and
// final states keep every bit: an unneeded entry only ever meets a zero operand or feeds a fold
// result nobody stores (derivation below).
//
// Piece p (of N on the rank) with n segments i = 0 .. n-1; the driver's folds over it (fold.h):
//   forward  X_0 = x0, X_{i+1} = M_i X_i + h_ext_i; stored: X_0 .. X_{n-1} (segment entry states);
//   backward Y_0 = y0 at segment n-1, then segment i = n-1 .. 0: Y <- M_i^T Y + dh_ext_i; stored:
//            the exit gradient of every segment (that of i-1 is M_i^T exit_i + dh_ext_i).
// The result after the last item (X_n, Y_n) and the composed transfer are stored only for the
// rank summaries: forward for the last piece when it does not end its sequence (its summary is
// sent to later ranks), backward for piece 0 when it does not start its sequence (sent to earlier
// ranks). ht and dh0 of non-empty pieces come from the state walks, not from the folds.
// x0 is null (zeros) when the piece starts its sequence without h0, y0 when it ends it without
// dht; otherwise x0 / y0 may be nonzero. Hence:
//   h_ext_i  feeds X_{i+1}: read for i < n-1, or for X_n of a wanted forward summary;
//   dh_ext_i feeds the exit gradient of i-1: read for i > 0, or for Y_n of a wanted backward one;
//   M_i      every M of a piece whose summary is wanted (the composed transfer), else where it
//            multiplies a possibly nonzero operand into a stored result: forward M_i X_i with
//            X_i nonzero (i > 0, or x0 given) and X_{i+1} stored (i < n-1); backward M_i^T exit_i
//            with exit_i nonzero (i < n-1, or y0 given) and the result stored (i > 0: M_0 only
//            feeds Y_n). A zero M times a zero operand adds +0 to an accumulator that starts at +0
//            in every fold (CPU and CUDA), exactly what the real M gave, so the bits stay equal.
// Every fold result that is stored reads only needed entries; a fold result that reads a zero
// entry (X_n, Y_n, the composed transfer of a piece whose summary is not wanted) is never stored.
// rank_forward_begin / rank_backward_begin therefore refuse to compute a summary that is not sent.
#pragma once

#include <cstdint>

#include "kernels/api/layout.h"
#include "kernels/api/numeric.h"  // KCP_HD: __host__ __device__ under nvcc

namespace kcp::kernels {

struct SummaryNeeds {
  bool h_ext = true;   // seg_h_ext[s]
  bool M = true;       // seg_Mt[s]
  bool dh_ext = true;  // seg_dh_ext[s]
};

// Segment i of n in piece p of N; starts / ends: the piece's starts_sequence / ends_sequence;
// has_h0 / has_dht: Problem's flags.
KCP_HD SummaryNeeds summary_needs(int32_t i, int32_t n, int32_t p, int32_t N, bool starts, bool ends, bool has_h0,
                                  bool has_dht) {
  const bool fwd_final = p == N - 1 && !ends;  // the rank's forward summary is sent
  const bool bwd_final = p == 0 && !starts;    // the rank's backward summary is sent
  const bool x0_given = !starts || has_h0;
  const bool y0_given = !ends || has_dht;
  const bool not_last = i<n - 1, not_first = i> 0;
  SummaryNeeds r;
  r.h_ext = not_last || fwd_final;
  r.dh_ext = not_first || bwd_final;
  r.M = fwd_final || bwd_final || ((not_first || x0_given) && not_last) || ((not_last || y0_given) && not_first);
  return r;
}

// The same for segment `seg` of a layout (pieces: the layout's piece table, n_pieces entries).
KCP_HD SummaryNeeds summary_needs(const PieceDesc* pieces, int32_t n_pieces, const SegmentDesc& seg, bool has_h0,
                                  bool has_dht) {
  const PieceDesc& pc = pieces[seg.piece];
  return summary_needs(seg.index_in_piece, pc.seg_end - pc.seg_begin, seg.piece, n_pieces, pc.starts_sequence != 0,
                       pc.ends_sequence != 0, has_h0, has_dht);
}

}  // namespace kcp::kernels
