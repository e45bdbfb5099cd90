// Digests of the bits of a rank's result, for the det package's bitwise checks (docs/design.md 5): a
// rerun and the light saved set must give the bits of det/full. The checks keep digests, not
// whole results, which at int3 sizes are GBs per copy.
#pragma once

#include <array>
#include <cstdint>
#include <iterator>
#include <vector>

#include "core/kcp/rank_result.h"

namespace kcp {

// One digest per result tensor, in the table's order (core/kcp/rank_result.h, kResultTensors).
using ResultDigest = std::array<uint64_t, kResultTensorCount>;

// 64-bit digest of the bits of v (NaN payloads included) and its length. Each step is a bijection
// of the state for a given 64-bit word, so a difference in any one word always changes the
// digest; several differences collide with probability ~2^-64.
uint64_t digest_bits(const std::vector<float>& v);
// One digest_bits per tensor, in kResultTensors order.
ResultDigest digest(const RankResult& r);
// Folds the digest of one group of heads into `into`, tensor by tensor (a form run by groups of
// heads: core/kcp/head_group_run.h). Each step is a bijection of either side for a given other, so
// two runs whose groups, folded in the same order, differ in one group's bits differ here.
void fold_digest(ResultDigest& into, const ResultDigest& group);

}  // namespace kcp
