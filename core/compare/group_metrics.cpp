#include "core/compare/group_metrics.h"

#include <algorithm>
#include <tuple>

#include "core/util/error.h"

namespace kcp {

namespace {

// The order compare_rank meets elements in: tokens (or the pieces' sequences, or the segments'
// boundary tokens), then heads, then channels.
bool met_before(const WorstElement& a, const WorstElement& b) {
  return std::tie(a.token, a.seq, a.segment, a.head, a.channel) <
         std::tie(b.token, b.seq, b.segment, b.head, b.channel);
}

// The first head of the range in tensor `name`'s numbering: q/k heads for dq and dk, value
// heads for the others.
int first_head(const RowConfig& row, const std::string& name, HeadRange heads) {
  const int G = row.HV / row.H;
  for (int i = 0; i < kResultTensorCount; ++i)
    if (name == kResultTensors[i]) {
      const ResultTensor t = result_tensor(i);
      const bool qk = place_of(t) == TensorPlace::Token && token_dims(row, t)[0] == row.H;
      return qk ? heads.first : heads.first * G;
    }
  KCP_THROW(InvariantError, "fold_head_group: {} is not a result tensor", name);
}

void fold_one(TensorMetrics& a, const TensorMetrics& b) {
  const bool a_nf = a.nonfinite > 0, b_nf = b.nonfinite > 0;
  const bool take_b = a_nf || b_nf ? b_nf && (!a_nf || met_before(b.worst, a.worst))
                                   : b.max_abs > a.max_abs ||
                                         (b.max_abs == a.max_abs && b.worst.head >= 0 && met_before(b.worst, a.worst));
  if (take_b) a.worst = b.worst;
  a.max_abs = std::max(a.max_abs, b.max_abs);
  a.ref_max_abs = std::max(a.ref_max_abs, b.ref_max_abs);
  a.sum_err2 += b.sum_err2;
  a.sum_ref2 += b.sum_ref2;
  a.count += b.count;
  a.nonfinite += b.nonfinite;
}

}  // namespace

void fold_head_group(std::vector<TensorMetrics>& into, const std::vector<TensorMetrics>& part, const RowConfig& row,
                     HeadRange heads) {
  std::vector<TensorMetrics> shifted = part;
  for (TensorMetrics& m : shifted)
    if (m.worst.head >= 0 && !heads.whole(row.H)) m.worst.head += first_head(row, m.name, heads);
  if (into.empty()) {
    into = std::move(shifted);
    return;
  }
  KCP_CHECK(into.size() == shifted.size(), "fold_head_group: {} tensors, then {}", into.size(), shifted.size());
  for (size_t i = 0; i < into.size(); ++i) {
    KCP_CHECK(into[i].name == shifted[i].name, "fold_head_group: tensor {} is {}, then {}", i, into[i].name,
              shifted[i].name);
    fold_one(into[i], shifted[i]);
  }
}

}  // namespace kcp
