#include "core/kcp/rank_result.h"

namespace kcp {

bool row_has(const RowConfig& row, ResultTensor t) {
  switch (t) {
    case ResultTensor::ht:
      return row.final_state;
    case ResultTensor::dh0:
      return row.initial_state;
    case ResultTensor::dA_log:
      return row.A_log;
    case ResultTensor::ddt_bias:
      return row.dt_bias;
    default:
      return true;
  }
}

std::array<int64_t, 2> token_dims(const RowConfig& row, ResultTensor t) {
  const int64_t H = row.H, HV = row.HV, K = row.K, V = row.V, gw = row.op == Op::Kda ? K : 1;
  (void)H, (void)HV, (void)K, (void)V, (void)gw;
  switch (t) {
#define KCP_X(name, place, heads, width)                                                   \
  case ResultTensor::name:                                                                 \
    return TensorPlace::place == TensorPlace::Token ? std::array<int64_t, 2>{heads, width} \
                                                    : std::array<int64_t, 2>{0, 0};
    KCP_RESULT_TENSORS(KCP_X)
#undef KCP_X
  }
  return {0, 0};
}

std::vector<int64_t> result_shape(const RowConfig& row, ResultTensor t, int64_t tokens, int64_t pieces,
                                  int64_t segments) {
  const int64_t HV = row.HV, gw = row.op == Op::Kda ? row.K : 1;
  switch (place_of(t)) {
    case TensorPlace::Token: {
      const auto [heads, width] = token_dims(row, t);
      return width == 0 ? std::vector<int64_t>{tokens, heads} : std::vector<int64_t>{tokens, heads, width};
    }
    case TensorPlace::State:
      return {pieces, HV, row.K, row.V};
    case TensorPlace::Param:
      return {t == ResultTensor::ddt_bias ? HV * gw : HV};
    case TensorPlace::Boundary:
      return {segments, HV, row.K, row.V};
  }
  return {};
}

int64_t result_elements(const RowConfig& row, ResultTensor t, int64_t tokens, int64_t pieces, int64_t segments) {
  int64_t n = 1;
  for (int64_t d : result_shape(row, t, tokens, pieces, segments)) n *= d;
  return n;
}

}  // namespace kcp
