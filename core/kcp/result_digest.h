// Digests of the bits of a rank's result, for the det package's bitwise checks (DESIGN.md 5): a
// rerun and the light saved set must give the bits of det/full. The checks keep digests, not
// whole results, which at int3 sizes are GBs per copy.
#pragma once

#include <array>
#include <cstdint>
#include <iterator>
#include <vector>

#include "core/kcp/kcp_engine.h"

namespace kcp {

// The tensors of a RankResult, in ResultDigest order.
inline constexpr const char* kResultTensors[] = {"o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dA_log", "ddt_bias", "dh0"};
using ResultDigest = std::array<uint64_t, std::size(kResultTensors)>;

// The tensors of r (RankResult or const RankResult), in kResultTensors order: one list for the
// digest and for whoever frees them.
template <class Result>
auto result_tensors(Result& r) {
  return std::array{&r.o, &r.ht, &r.dq, &r.dk, &r.dv, &r.dg, &r.dbeta, &r.dA_log, &r.ddt_bias, &r.dh0};
}

// 64-bit digest of the bits of v (NaN payloads included) and its length. Each step is a bijection
// of the state for a given 64-bit word, so a difference in any one word always changes the
// digest; several differences collide with probability ~2^-64.
uint64_t digest_bits(const std::vector<float>& v);
// One digest_bits per tensor, in kResultTensors order.
ResultDigest digest(const RankResult& r);

}  // namespace kcp
