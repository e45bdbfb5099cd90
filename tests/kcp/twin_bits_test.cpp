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
      {"dA_log", 0x0ull},
  };
  expect_bits(b);
}

// The same shapes in fp16.
TEST(TwinBits, GdnRawL2TwoRanksFp16) {
  BitsCase b{gdn_raw_l2(), {}, {}};
  b.c.dtype = kernels::DType::FP16;
  b.opt = ranks(b.c, {180}, {1, 2});
  b.want = {
      {"dA_log", 0x0ull},
  };
  expect_bits(b);
}

// KDA, lower-bound gate, L2 norm, h0 / dht, bf16, one rank with two segments per piece.
TEST(TwinBits, KdaLowerBoundBf16) {
  BitsCase b{kda_lower_bound(), {}, {}};
  b.opt = ranks(b.c, {}, {2});
  b.want = {
      {"dA_log", 0x0ull},
  };
  expect_bits(b);
}

}  // namespace
}  // namespace kcp::test
