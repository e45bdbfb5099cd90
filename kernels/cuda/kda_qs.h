// KDA's qs prepass (kda_qs.cu): which tokens it covers, and its test hook. Host-only, no CUDA
// types: the GPU tests include it.
#pragma once

#include <cstdint>

#include "kernels/api/layout.h"
#include "kernels/api/problem.h"
#include "kernels/api/summary_needs.h"

namespace kcp::kernels::cuda {

// Token ranges of the prepass in increasing order: range r covers [begin[r], begin[r] + at[r + 1]
// - at[r]), r < n (at[r]: the tokens of the ranges before r). Past kMax ranges the last one grows
// over the gaps (qs of a token nobody reads is written and never read: the cover is a superset).
struct QsRows {
  static constexpr int kMax = 16;
  int32_t n = 0;
  int64_t begin[kMax] = {}, at[kMax + 1] = {};
  void add(int64_t b, int64_t e) {  // b < e, after the ranges added so far
    if (n > 0 && (b == begin[n - 1] + at[n] - at[n - 1] || n == kMax)) {
      at[n] = at[n - 1] + (e - begin[n - 1]);  // adjacent (or no slot left): extend the last range
      return;
    }
    begin[n] = b;
    at[n + 1] = at[n] + (e - b);
    ++n;
  }
};

// Every token: bwd_states' walk reads qs of every chunk.
inline QsRows qs_rows_all(int64_t T) {
  QsRows r;
  if (T > 0) r.add(0, T);
  return r;
}

// bwd_summaries: the tokens of the segments whose seg_dh_ext somebody reads (summary_needs.h: i >
// 0 in its piece, or the rank's backward summary); the walk's blocks of any other segment write
// zeros and return before loading anything (skip_unread_tile, gdn_walk_wgmma.cuh). No range (P =
// 1 on a rank that starts every sequence): no prepass at all.
inline QsRows qs_rows_of_summaries(const Problem& p, const LayoutView& L) {
  QsRows r;
  for (int32_t s = 0; s < L.n_segments; ++s) {
    const SegmentDesc& sg = L.segments[s];
    if (summary_needs(L.pieces, L.n_pieces, sg, p.has_h0, p.has_dht).dh_ext) r.add(sg.begin, sg.end);
  }
  return r;
}

// Test hook: qs [T, HV, K] = dtype((q[t, j / G, c] scale) exp2(gcum[t, j, c])) (16-bit storage) of
// a KDA problem `p` for the tokens of `rows` (the rest of qs untouched), from the saved q [T, H, K]
// (16-bit storage) and gcum [T, HV, K] (fp32), all device pointers of the current device; runs on
// the default stream and waits for it.
void run_kda_qs(const Problem& p, const QsRows& rows, const uint16_t* q, const float* gcum, uint16_t* qs);

}  // namespace kcp::kernels::cuda
