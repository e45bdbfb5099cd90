// The CPU twin's results, bit for bit, through the public driver (run_twin: the engine's rank
// driver and rank folds over emulated ranks) on fixed inputs, against digests recorded with the
// float caller API (commit 6d9f143, before q, k, v, dO, o, dq, dk, dv crossed the kernel API as
// 16-bit patterns). Changing how tensors cross the API must not change a bit of any result; a
// deliberate change of the twin's arithmetic updates the digests here (run the test: a mismatch
// prints the new digest of every tensor).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "twin_harness.h"
#include "twin_test_util.h"

namespace kcp::test {
namespace {

// FNV-1a over the bits of a tensor.
uint64_t digest(const std::vector<float>& x) {
  uint64_t h = 1469598103934665603ull;
  for (float v : x) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    for (int b = 0; b < 4; ++b) {
      h ^= (u >> (8 * b)) & 0xffu;
      h *= 1099511628211ull;
    }
  }
  return h;
}

struct BitsCase {
  Case c;
  TwinOptions opt;
  std::map<std::string, uint64_t> want;  // per result tensor
};

void expect_bits(const BitsCase& b) {
  const TwinResults r = run_twin(b.c, make_data(b.c), b.opt);
  std::string all;
  for (const auto& [name, x] : r.t) {
    char line[96];
    std::snprintf(line, sizeof line, "      {\"%s\", 0x%016llxull},\n", name.c_str(),
                  static_cast<unsigned long long>(digest(x)));
    all += line;
  }
  std::printf("[ digests  ] %s\n%s", b.c.name.c_str(), all.c_str());
  ASSERT_EQ(r.t.size(), b.want.size()) << b.c.name << ": tensors\n" << all;
  for (const auto& [name, want] : b.want) {
    ASSERT_TRUE(r.t.count(name)) << b.c.name << ": no " << name;
    EXPECT_EQ(digest(r.t.at(name)), want) << b.c.name << " " << name << ": the bits changed\n" << all;
  }
}

// Ranks cut at `cuts` (none: one rank), P segments per piece on each rank.
TwinOptions ranks(const Case& c, std::vector<int64_t> cuts, std::vector<int> P) {
  TwinOptions o;
  if (!cuts.empty()) {
    o.rank_bounds = {0};
    o.rank_bounds.insert(o.rank_bounds.end(), cuts.begin(), cuts.end());
    o.rank_bounds.push_back(c.T());
  }
  o.P = std::move(P);
  return o;
}

// GDN, in-kernel L2 norm, softplus gate with A_log / dt_bias, h0 / dht, grouped value heads, bf16,
// over two ranks (the second cut into two segments).
TEST(TwinBits, GdnRawL2TwoRanksBf16) {
  BitsCase b{gdn_raw_l2(), {}, {}};
  b.opt = ranks(b.c, {180}, {1, 2});
  b.want = {
      {"dA_log", 0x6b3208819edbf289ull}, {"dbeta", 0xa6e5cc84e7336576ull}, {"ddt_bias", 0x7199b3ed5031209eull},
      {"dg", 0xed408174febc33a4ull},     {"dh0", 0xc4f9aad3c392f192ull},   {"dk", 0x02544e918213f348ull},
      {"dq", 0x1956c421ce4b95cfull},     {"dv", 0xa31c284ca0fcb01eull},    {"ht", 0x21709b87337d8fe6ull},
      {"o", 0x08775798b72b4685ull},
  };
  expect_bits(b);
}

// The same shapes in fp16.
TEST(TwinBits, GdnRawL2TwoRanksFp16) {
  BitsCase b{gdn_raw_l2(), {}, {}};
  b.c.dtype = kernels::DType::FP16;
  b.opt = ranks(b.c, {180}, {1, 2});
  b.want = {
      {"dA_log", 0xb49a3b057b4dd458ull}, {"dbeta", 0x6c1d4cf217322cd1ull}, {"ddt_bias", 0xb5758aedbc2a57c1ull},
      {"dg", 0x62b35b46297d5030ull},     {"dh0", 0xa5f1e068a634775full},   {"dk", 0x1c3786863baa8385ull},
      {"dq", 0xb197009874c3901dull},     {"dv", 0x58d85811e700392bull},    {"ht", 0xd93961601620c705ull},
      {"o", 0x6d4c63ee8338bce6ull},
  };
  expect_bits(b);
}

// KDA, lower-bound gate, L2 norm, h0 / dht, bf16, one rank with two segments per piece.
TEST(TwinBits, KdaLowerBoundBf16) {
  BitsCase b{kda_lower_bound(), {}, {}};
  b.opt = ranks(b.c, {}, {2});
  b.want = {
      {"dA_log", 0x5934f0c7135413b2ull}, {"dbeta", 0x0ecbaa34a1b08febull}, {"ddt_bias", 0xb77738596700e2afull},
      {"dg", 0x5d55730d97f95238ull},     {"dh0", 0x883520da0b2f7630ull},   {"dk", 0xd0151d356e675953ull},
      {"dq", 0x7e4bdfc6a2d7ec86ull},     {"dv", 0x638e45982bb30e62ull},    {"ht", 0x6d84a7e19d31c29eull},
      {"o", 0x108f02ec9026c1d3ull},
  };
  expect_bits(b);
}

}  // namespace
}  // namespace kcp::test
