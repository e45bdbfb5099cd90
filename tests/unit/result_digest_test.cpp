// The det checks compare digests of the bits (core/kcp/result_digest.h): any one changed word
// must change the digest, and so must a changed length, a NaN payload or the sign of a zero.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "core/kcp/result_digest.h"

namespace {

float with_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::vector<float> ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.25f * float(i) - 3.0f;
  return v;
}

}  // namespace

TEST(ResultDigest, EqualBitsGiveEqualDigests) {
  EXPECT_EQ(kcp::digest_bits(ramp(37)), kcp::digest_bits(ramp(37)));
  EXPECT_EQ(kcp::digest_bits({}), kcp::digest_bits({}));
}

TEST(ResultDigest, EveryOneBitChangeAtEveryPositionChangesTheDigest) {
  for (size_t n : {1u, 2u, 7u, 64u}) {
    const std::vector<float> base = ramp(n);
    const uint64_t d0 = kcp::digest_bits(base);
    for (size_t i = 0; i < n; ++i)
      for (int bit : {0, 1, 22, 23, 31}) {
        std::vector<float> v = base;
        uint32_t u;
        std::memcpy(&u, &v[i], sizeof u);
        v[i] = with_bits(u ^ (1u << bit));
        EXPECT_NE(kcp::digest_bits(v), d0) << "n " << n << " element " << i << " bit " << bit;
      }
  }
}

TEST(ResultDigest, LengthNanPayloadAndSignedZeroCount) {
  EXPECT_NE(kcp::digest_bits(std::vector<float>(4, 0.0f)), kcp::digest_bits(std::vector<float>(5, 0.0f)));
  EXPECT_NE(kcp::digest_bits({}), kcp::digest_bits({0.0f}));
  EXPECT_NE(kcp::digest_bits({0.0f, 1.0f}), kcp::digest_bits({-0.0f, 1.0f}));
  EXPECT_NE(kcp::digest_bits({with_bits(0x7fc00000u)}), kcp::digest_bits({with_bits(0x7fc00001u)}));
  // Swapped elements are a different result.
  EXPECT_NE(kcp::digest_bits({1.0f, 2.0f, 3.0f}), kcp::digest_bits({2.0f, 1.0f, 3.0f}));
}

TEST(ResultDigest, ResultDigestNamesEachTensorSeparately) {
  kcp::RankResult a;
  a[kcp::ResultTensor::o] = ramp(10);
  a[kcp::ResultTensor::dq] = ramp(6);
  kcp::RankResult b = a;
  EXPECT_EQ(kcp::digest(a), kcp::digest(b));
  b[kcp::ResultTensor::dq][3] = std::nextafter(b[kcp::ResultTensor::dq][3], 100.0f);
  const kcp::ResultDigest da = kcp::digest(a), db = kcp::digest(b);
  std::set<std::string> differ;
  for (size_t i = 0; i < da.size(); ++i)
    if (da[i] != db[i]) differ.insert(kcp::kResultTensors[i]);
  EXPECT_EQ(differ, std::set<std::string>{"dq"});
}
