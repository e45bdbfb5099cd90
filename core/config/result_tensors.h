// The one table of the result tensors: the outputs and gradients a row is judged on. Every list
// of result tensors in kcpbench (the row loader's budget names, the engine's downloads, the
// comparison, the dump, the digests, the report) walks KCP_RESULT_TENSORS, so a tensor is added
// here once.
#pragma once

#include <iterator>

namespace kcp {

// Where a result tensor lives:
//   Token: per local token, [T, heads, width] (heads/width below, from the row);
//   State: per local piece, [n_pieces, HV, K, V] fp32 (ht: state at each piece end; dh0: gradient
//          w.r.t. each piece's entry state);
//   Param: per value head, totals over all ranks (all-reduced), [HV] or [HV * gate width];
//   Boundary: per local segment, [n_segments, HV, K, V] fp32 (h_entry: the state entering each
//          segment after the folds, judged against S_p at the segment's first token where p > 0;
//          dh_exit: the gradient w.r.t. each segment's exit state, judged against dS_p at its end
//          where p < len; docs/algorithm.md 1.4, docs/design.md 4). A rank with no such segment
//          judges none of them (count 0, passes without a budget).
enum class TensorPlace { Token, State, Param, Boundary };

// X(name, place, heads, width): heads / width of Token tensors in terms of the row (H, HV, K, V,
// gw = gate width: 1 for GDN, K for KDA; width 0: one value per head, shape [T, heads]); unused
// for State / Param / Boundary. The order is the digest's and the comparison's (Token, State and
// Boundary tensors first, in this order, then Param).
#define KCP_RESULT_TENSORS(X) \
  X(o, Token, HV, V)          \
  X(ht, State, HV, V)         \
  X(dq, Token, H, K)          \
  X(dk, Token, H, K)          \
  X(dv, Token, HV, V)         \
  X(dg, Token, HV, gw)        \
  X(dbeta, Token, HV, 0)      \
  X(dA_log, Param, HV, 1)     \
  X(ddt_bias, Param, HV, gw)  \
  X(dh0, State, HV, V)        \
  X(h_entry, Boundary, HV, V) \
  X(dh_exit, Boundary, HV, V)

enum class ResultTensor {
#define KCP_X(name, place, heads, width) name,
  KCP_RESULT_TENSORS(KCP_X)
#undef KCP_X
};
inline constexpr const char* kResultTensors[] = {
#define KCP_X(name, place, heads, width) #name,
    KCP_RESULT_TENSORS(KCP_X)
#undef KCP_X
};
inline constexpr int kResultTensorCount = static_cast<int>(std::size(kResultTensors));
inline constexpr TensorPlace kResultPlaces[] = {
#define KCP_X(name, place, heads, width) TensorPlace::place,
    KCP_RESULT_TENSORS(KCP_X)
#undef KCP_X
};
inline const char* to_string(ResultTensor t) { return kResultTensors[static_cast<int>(t)]; }
inline TensorPlace place_of(ResultTensor t) { return kResultPlaces[static_cast<int>(t)]; }
inline ResultTensor result_tensor(int i) { return static_cast<ResultTensor>(i); }

}  // namespace kcp
