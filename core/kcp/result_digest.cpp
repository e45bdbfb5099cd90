#include "core/kcp/result_digest.h"

#include <cstring>

namespace kcp {

uint64_t digest_bits(const std::vector<float>& v) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ uint64_t(v.size());
  auto mix = [&h](uint64_t w) {
    h = (h ^ w) * 0x100000001B3ull;  // xor, then an odd multiplier: both invertible mod 2^64
    h ^= h >> 29;                    // an xorshift: invertible too
  };
  const size_t pairs = v.size() / 2;
  for (size_t i = 0; i < pairs; ++i) {
    uint64_t w;
    std::memcpy(&w, v.data() + 2 * i, sizeof w);
    mix(w);
  }
  if (v.size() % 2) {
    uint32_t w;
    std::memcpy(&w, v.data() + v.size() - 1, sizeof w);
    mix(w);
  }
  return h;
}

ResultDigest digest(const RankResult& r) {
  ResultDigest d{};
  for (size_t i = 0; i < d.size(); ++i) d[i] = digest_bits(r.tensors[i]);
  return d;
}

void fold_digest(ResultDigest& into, const ResultDigest& group) {
  for (size_t i = 0; i < into.size(); ++i) into[i] = (into[i] * 0x100000001B3ull) ^ group[i];
}

}  // namespace kcp
