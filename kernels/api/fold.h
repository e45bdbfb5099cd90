// The fold: a chain of affine maps applied to a start state, all fp32 (never bf16; docs/algorithm.md 4.5,
// 7.2). Used for every summary merge of docs/design.md 4 step 3 and its backward mirror:
//   X_0 = x0 (zeros when null);  X_{i+1} = op(A_i) X_i + b_i  for i = 0 .. n-1,
//   op(A) = A^T when transpose_A else A;  composed = op(A_{n-1}) ... op(A_0)  (identity when n = 0).
// Per value head j (independent): A_i[j] is K x K, b_i[j] and X are K x V.
//
// Typical uses (seg_Mt holds M^T of each segment, forward order inside a piece):
//   forward entry states of piece p:  A = seg_Mt + s0*HVKK, stride +HVKK, transpose_A = true,
//     b = seg_h_ext + s0*HVKV, x0 = incoming / h0[p] / null, states_before = seg_entry + s0*HVKV;
//   forward rank summary of the last piece: same list with x0 = null; x_final = h_ext,
//     composed = M (natural orientation);
//   backward exit gradients of piece p: the same segments last to first (negative strides),
//     transpose_A = false, b = seg_dh_ext, x0 = dht[p] / the rank exit gradient / null,
//     states_before = seg_exit (also with a negative stride);
//   backward rank summary of the first piece: x0 = null, x_final = dh_ext, composed = M^T;
//   rank-level folds over gathered rank summaries: transpose_A = false.
// A packed exchange buffer [W][HV*K*K | HV*K*V] is addressed with A = buf, b = buf + HV*K*K and
// both strides HV*K*(K+V).
//
// Arithmetic (det and nondet alike, since a fold is a chain): (op(A) X)[a][c] accumulated in
// fp32 over the inner index in increasing order, then + b; composed likewise.
// Backends skip work nobody reads, with the same bits as the full chain when every A_i is finite
// (an Inf or NaN in A_0 times X_0 = 0 would give NaN; the segment summaries are finite, and those
// nobody reads are zeros, kernels/api/summary_needs.h): X_n is not formed when x_final is null
// (and, on the CPU twin, composed too), and with x0 null (X_0 = 0) X_1 = 0 + b_0 without reading
// A_0 for the states (the sum of zero products is +0). A_0 is still read for composed.
#pragma once

#include <cstdint>

#include "kernels/api/problem.h"

namespace kcp::kernels {

struct FoldArgs {
  Exec exec;
  int32_t HV = 1, K = 1, V = 1;
  int32_t n = 0;             // items in the chain (may be 0)
  const float* A = nullptr;  // item i at A + i * A_stride: [HV, K, K] fp32
  int64_t A_stride = 0;      // floats between items; may be negative
  bool transpose_A = false;
  const float* b = nullptr;  // item i at b + i * b_stride: [HV, K, V] fp32
  int64_t b_stride = 0;
  const float* x0 = nullptr;       // [HV, K, V] fp32 or null (zeros)
  float* states_before = nullptr;  // item i at states_before + i * states_stride: X_i (or null)
  int64_t states_stride = 0;
  float* x_final = nullptr;   // [HV, K, V] fp32: X_n (or null); may alias x0
  float* composed = nullptr;  // [HV, K, K] fp32 (or null)
};

}  // namespace kcp::kernels
