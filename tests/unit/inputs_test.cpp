#include "core/inputs/inputs.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/plan/segment_plan.h"
#include "core/util/sha256.h"

using namespace kcp;

namespace {
RowConfig small_row(Op op) {
  RowConfig r;
  r.name = "T1";
  r.op = op;
  r.H = 2;
  r.HV = 4;
  r.K = 64;
  r.V = 64;
  r.seqlens = {100, 0, 283, 49};
  r.world = 1;
  r.gate = op == Op::Kda ? GateForm::Direct : GateForm::Softplus;
  r.A_log = r.dt_bias = (op == Op::Gdn);
  r.initial_state = r.final_state = r.dht = true;
  r.inputs.gate_mask_p = 0.1;
  r.inputs.gate_zero_p = 0.1;
  return r;
}

// Token-major slice [t0, t1) of a tensor with `per` elements per token.
std::vector<float> slice(const std::vector<float>& x, int64_t per, int64_t t0, int64_t t1) {
  return {x.begin() + t0 * per, x.begin() + t1 * per};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// SHA-256 of the bytes of every generated tensor, in a fixed order.
std::string inputs_hash(const RowInputs& in) {
  std::string bytes;
  for (const auto* x : {&in.q, &in.k, &in.v, &in.g, &in.beta, &in.dO, &in.A_log, &in.dt_bias, &in.h0, &in.dht})
    bytes.append(reinterpret_cast<const char*>(x->data()), x->size() * sizeof(float));
  return sha256_hex(bytes);
}

// A row for gate_recipe model_init: enough heads (and KDA channels) that A and dt span their ranges.
RowConfig model_init_row(Op op, GateForm gate) {
  RowConfig r;
  r.name = "M1";
  r.op = op;
  r.H = 2;
  r.HV = op == Op::Kda ? 4 : 32;
  r.seqlens = {300, 212};
  r.gate = gate;
  r.A_log = r.dt_bias = gate != GateForm::Direct;
  r.inputs.gate_recipe = GateRecipe::ModelInit;
  return r;
}

// Per-token log-decays a of generated inputs (docs/algorithm.md 1.2), in double.
std::vector<double> decays(const RowConfig& row, const RowInputs& in) {
  const size_t gw = row.op == Op::Kda ? size_t(row.K) : 1, per = size_t(row.HV) * gw;
  std::vector<double> a(in.g.size());
  for (size_t c = 0; c < in.g.size(); ++c) {
    const size_t i = c % per;
    const double x = double(in.g[c]) + (in.dt_bias.empty() ? 0.0 : in.dt_bias[i]);
    const double eA = in.A_log.empty() ? 1.0 : std::exp(double(in.A_log[i / gw]));
    if (row.gate == GateForm::Direct) a[c] = in.g[c];
    if (row.gate == GateForm::Softplus) a[c] = -eA * std::log1p(std::exp(x));
    if (row.gate == GateForm::LowerBound) a[c] = row.lower_bound / (1.0 + std::exp(-eA * x));
  }
  return a;
}
}  // namespace

TEST(Inputs, ShardsForAnyWorldAreSlicesOfTheWholeTensor) {
  for (Op op : {Op::Gdn, Op::Kda}) {
    RowConfig row = small_row(op);
    const RowInputs all = make_inputs(row, "digest", 0, row.total_tokens());
    const int64_t gw = op == Op::Kda ? row.K : 1;
    for (int W : {1, 2, 3, 8}) {
      row.world = W;
      row.seqlens = {100, 0, 283, 49 + (W - (432 % W)) % W};  // make T divisible by W
      const RowInputs whole = make_inputs(row, "digest", 0, row.total_tokens());
      for (const auto& rp : make_plan(row, {0, "h200", 0, 0}).ranks) {
        const RowInputs s = make_inputs(row, "digest", rp.global_begin, rp.global_end);
        EXPECT_TRUE(same_bits(s.q, slice(whole.q, row.H * row.K, rp.global_begin, rp.global_end))) << "W=" << W;
        EXPECT_TRUE(same_bits(s.k, slice(whole.k, row.H * row.K, rp.global_begin, rp.global_end)));
        EXPECT_TRUE(same_bits(s.v, slice(whole.v, row.HV * row.V, rp.global_begin, rp.global_end)));
        EXPECT_TRUE(same_bits(s.dO, slice(whole.dO, row.HV * row.V, rp.global_begin, rp.global_end)));
        EXPECT_TRUE(same_bits(s.g, slice(whole.g, row.HV * gw, rp.global_begin, rp.global_end)));
        EXPECT_TRUE(same_bits(s.beta, slice(whole.beta, row.HV, rp.global_begin, rp.global_end)));
        EXPECT_TRUE(same_bits(s.h0, whole.h0));
      }
      // The first 432 tokens do not depend on the row's length: element i draws counter i.
      EXPECT_TRUE(same_bits(slice(whole.q, row.H * row.K, 0, 432), slice(all.q, row.H * row.K, 0, 432)));
    }
  }
}

// make_inputs' threads cut the token range into parts made at once: the same bits as one thread,
// for every tensor, gate recipe, key norm and head range, from any first token.
TEST(Inputs, ThreadsGiveTheBitsOfOneThread) {
  for (Op op : {Op::Gdn, Op::Kda})
    for (GateRecipe recipe : {GateRecipe::Logsigmoid, GateRecipe::ModelInit})
      for (bool l2 : {true, false}) {
        RowConfig row = small_row(op);
        row.seqlens = {1000, 0, 283, 49};  // 1332 tokens: five parts of at least 256
        row.inputs.gate_recipe = recipe;
        row.qk_l2norm = l2;
        for (HeadRange heads : {HeadRange{}, HeadRange{1, 1}})
          for (int threads : {2, 3, 16}) {
            const std::string what =
                fmt::format("{} recipe {} l2 {} heads {}+{} threads {}", op == Op::Kda ? "kda" : "gdn",
                            to_string(recipe), l2, heads.first, heads.count, threads);
            const RowInputs one = make_inputs(row, "d", 17, row.total_tokens(), heads);
            const RowInputs many = make_inputs(row, "d", 17, row.total_tokens(), heads, threads);
            EXPECT_TRUE(same_bits(one.q, many.q)) << what;
            EXPECT_TRUE(same_bits(one.k, many.k)) << what;
            EXPECT_TRUE(same_bits(one.v, many.v)) << what;
            EXPECT_TRUE(same_bits(one.dO, many.dO)) << what;
            EXPECT_TRUE(same_bits(one.g, many.g)) << what;
            EXPECT_TRUE(same_bits(one.beta, many.beta)) << what;
            EXPECT_TRUE(same_bits(one.A_log, many.A_log)) << what;
            EXPECT_TRUE(same_bits(one.dt_bias, many.dt_bias)) << what;
            EXPECT_TRUE(same_bits(one.h0, many.h0) && same_bits(one.dht, many.dht)) << what;
            EXPECT_EQ(one.q.size(), size_t(row.total_tokens() - 17) * size_t(heads.count ? heads.count : row.H) * 64u);
          }
      }
}

TEST(Inputs, ValuesAreRoundedAndDistributedAsAsked) {
  RowConfig row = small_row(Op::Kda);
  row.inputs.keys = KeyDist::Skewed;
  row.qk_l2norm = true;  // raw keys; the kernel normalizes them
  const RowInputs in = make_inputs(row, "d", 0, row.total_tokens());
  double kmean = 0;
  for (float x : in.k) {
    EXPECT_EQ(x, round_to_bf16(x));
    kmean += x;
  }
  kmean /= double(in.k.size());
  EXPECT_NEAR(kmean, -50.0, 1.0);  // 10 * randn - 50
  int masked = 0, zero = 0;
  for (float a : in.g) {
    EXPECT_LE(a, 0.0f);
    masked += a == -1000.0f;
    zero += a == 0.0f;
  }
  const double n = double(in.g.size());
  EXPECT_NEAR(masked / n, 0.1, 0.02);
  EXPECT_NEAR(zero / n, 0.1, 0.02);
  for (float b : in.beta) EXPECT_TRUE(b > 0.0f && b < 1.0f);
  row.dtype = DType::FP16;
  const RowInputs h = make_inputs(row, "d", 0, 10);
  for (float x : h.q) EXPECT_EQ(x, round_to_fp16(x));
  // A different seed or row digest gives different data.
  EXPECT_NE(make_inputs(row, "d", 0, 4).q, make_inputs(row, "e", 0, 4).q);
}

TEST(Inputs, UnitNormQueriesAndKeysWithoutInKernelNorm) {
  RowConfig row = small_row(Op::Gdn);
  row.qk_l2norm = false;
  const RowInputs in = make_inputs(row, "d", 0, 50);
  for (const auto* x : {&in.q, &in.k})
    for (int64_t t = 0; t < 50 * row.H; ++t) {
      double ss = 0;
      for (int d = 0; d < row.K; ++d) ss += double((*x)[t * row.K + d]) * (*x)[t * row.K + d];
      EXPECT_NEAR(ss, 1.0, 0.02);  // unit norm up to bf16 rounding
    }
}

TEST(Inputs, RawGateParameters) {
  RowConfig row = small_row(Op::Gdn);
  const RowInputs in = make_inputs(row, "d", 0, 16);
  ASSERT_EQ(in.A_log.size(), 4u);
  EXPECT_FLOAT_EQ(in.A_log[0], 0.0f);
  EXPECT_FLOAT_EQ(in.A_log[3], std::log(8.0f));
  ASSERT_EQ(in.dt_bias.size(), 4u);
  for (float b : in.dt_bias) {
    const double dt = std::log1p(std::exp(double(b)));  // softplus(dt_bias) = dt in [1e-3, 1e-1]
    EXPECT_GE(dt, 0.99e-3);
    EXPECT_LE(dt, 1.01e-1);
  }
}

// Rows that name no gate recipe keep today's inputs bit for bit: committed baselines depend on them.
// The hashes were computed on the code before gate recipes existed (branch gates at bf0f5c8).
TEST(Inputs, DefaultGateRecipeKeepsTheInputsBitForBit) {
  RowConfig gdn = small_row(Op::Gdn);  // softplus form, A_log and dt_bias
  RowConfig kda = small_row(Op::Kda);  // direct form with masked and zero gates
  RowConfig strong = small_row(Op::Gdn);
  strong.gate = GateForm::Direct;
  strong.A_log = strong.dt_bias = false;
  strong.inputs.gate_strength = 16;
  RowConfig lb = small_row(Op::Kda);
  lb.gate = GateForm::LowerBound;
  lb.A_log = lb.dt_bias = lb.qk_l2norm = true;
  lb.inputs.keys = KeyDist::Skewed;
  const std::vector<std::pair<const RowConfig*, const char*>> cases = {
      {&gdn, "d76d2cb4d8ef843353a0a6d5a1fd92c8f273767a28bd1c283e89aaa7bd51fdbb"},
      {&kda, "29bbf53b0b399df502bb5455f35992530aea16f0b26568267fc6f4120340bd69"},
      {&strong, "ea8d9995e0637c0503b726c48571607e4bbd18eaf3b221260b3524aef1e65726"},
      {&lb, "f1c55146d4052d996f043265a36f64a62d912488ac25c8f5964814c5f7f416ce"}};
  for (const auto& [row, expect] : cases)
    EXPECT_EQ(inputs_hash(make_inputs(*row, "digest", 0, row->total_tokens())), expect) << to_string(row->gate);
}

// beta_scale, h0_scale and dht_scale scale what they name and nothing else (same digest: the same
// draws); h0 and dht are fp32, so power-of-two scales are exact; beta is rounded again to the dtype.
TEST(Inputs, InputScalesScaleBetaH0AndDhtOnly) {
  const RowConfig base = small_row(Op::Gdn);
  RowConfig scaled = base;
  scaled.inputs.beta_scale = 0.01;
  scaled.inputs.h0_scale = 16;
  scaled.inputs.dht_scale = 0.25;
  const RowInputs a = make_inputs(base, "digest", 0, base.total_tokens());
  const RowInputs b = make_inputs(scaled, "digest", 0, scaled.total_tokens());
  for (const auto& [x, y] : {std::pair{&a.q, &b.q}, std::pair{&a.k, &b.k}, std::pair{&a.v, &b.v}, std::pair{&a.g, &b.g},
                             std::pair{&a.dO, &b.dO}, std::pair{&a.dt_bias, &b.dt_bias}})
    EXPECT_TRUE(same_bits(*x, *y));
  ASSERT_EQ(a.h0.size(), b.h0.size());
  ASSERT_FALSE(a.h0.empty());
  for (size_t i = 0; i < a.h0.size(); ++i) ASSERT_EQ(b.h0[i], 16.0f * a.h0[i]) << i;
  ASSERT_EQ(a.dht.size(), b.dht.size());
  ASSERT_FALSE(a.dht.empty());
  for (size_t i = 0; i < a.dht.size(); ++i) ASSERT_EQ(b.dht[i], 0.25f * a.dht[i]) << i;
  ASSERT_EQ(a.beta.size(), b.beta.size());
  float bmax = 0;
  for (size_t i = 0; i < a.beta.size(); ++i) {
    ASSERT_GT(b.beta[i], 0.0f) << i;
    bmax = std::max(bmax, b.beta[i]);
    // each rounded to bf16 once (relative error at most 2^-8 each): together at most about 2^-7
    EXPECT_NEAR(b.beta[i], 0.01 * a.beta[i], 0.01 * a.beta[i] * std::ldexp(1.01, -7)) << i;
  }
  EXPECT_LE(bmax, 0.01f);
  EXPECT_GT(bmax, 0.008f) << "sigmoid(randn) reaches above 0.8 over this many draws";
}

// model_init: a = -A softplus(g + dt_bias) with A in [1, 16], dt = softplus(dt_bias) in [1e-3, 1e-1]
// and g = 0.1 randn, so every decay lies in [-1.6, -1e-3] up to the factor e^{+-|g|} (at most
// e^{+-0.5} at 5 sigma), and a row's decays span most of that range.
TEST(Inputs, ModelInitDecaysSpanTheTrainingStartRange) {
  const std::vector<std::pair<Op, GateForm>> forms = {{Op::Gdn, GateForm::Softplus},
                                                      {Op::Gdn, GateForm::Direct},
                                                      {Op::Kda, GateForm::Softplus},
                                                      {Op::Kda, GateForm::Direct},
                                                      {Op::Kda, GateForm::LowerBound}};
  for (const auto& [op, gate] : forms) {
    const RowConfig row = model_init_row(op, gate);
    const RowInputs in = make_inputs(row, "d", 0, row.total_tokens());
    const std::vector<double> a = decays(row, in);
    const auto [lo, hi] = std::minmax_element(a.begin(), a.end());
    const std::string what = fmt::format("{} {}: a in [{}, {}]", to_string(op), to_string(gate), *lo, *hi);
    EXPECT_GE(*lo, -1.6 * std::exp(0.5)) << what;
    EXPECT_LE(*hi, -1e-3 * std::exp(-0.5)) << what;
    EXPECT_LT(*lo, -0.5) << what << ": the fast heads forget within a few tokens";
    EXPECT_GT(*hi, -4e-3) << what << ": the slow heads remember thousands of tokens";
    for (float g : in.g) EXPECT_EQ(g, round_to_bf16(g)) << what;
  }
}

TEST(Inputs, ModelInitParametersPerHeadAndChannel) {
  for (Op op : {Op::Gdn, Op::Kda}) {
    const RowConfig row = model_init_row(op, GateForm::Softplus);
    const RowInputs in = make_inputs(row, "d", 0, 16);
    const size_t gw = op == Op::Kda ? size_t(row.K) : 1;
    ASSERT_EQ(in.A_log.size(), size_t(row.HV));
    ASSERT_EQ(in.dt_bias.size(), size_t(row.HV) * gw);
    for (float A_log : in.A_log) {
      EXPECT_GE(std::exp(double(A_log)), 1.0 - 1e-6);
      EXPECT_LE(std::exp(double(A_log)), 16.0 * (1 + 1e-6));
    }
    EXPECT_NE(in.A_log[0], in.A_log[1]) << "A is drawn per value head";
    for (float b : in.dt_bias) {
      const double dt = std::log1p(std::exp(double(b)));
      EXPECT_GE(dt, 1e-3 * (1 - 1e-5));
      EXPECT_LE(dt, 1e-1 * (1 + 1e-5));
    }
    if (op == Op::Kda) {
      EXPECT_NE(in.dt_bias[0], in.dt_bias[1]) << "KDA: dt is drawn per channel";
    }
  }
}

// The forms share the draws of A, dt and the raw gate: the direct gate is the softplus form's
// decay rounded once (bf16: 2^-8 relative at most, plus the softplus form's rounded g), and
// lower_bound's decay at g = 0 is the same -A dt.
TEST(Inputs, ModelInitFormsShareTheirDraws) {
  const RowConfig sp = model_init_row(Op::Kda, GateForm::Softplus), direct = model_init_row(Op::Kda, GateForm::Direct);
  RowConfig lb = model_init_row(Op::Kda, GateForm::LowerBound);
  const RowInputs s = make_inputs(sp, "d", 0, 64), d = make_inputs(direct, "d", 0, 64), l = make_inputs(lb, "d", 0, 64);
  const std::vector<double> a = decays(sp, s);
  for (size_t c = 0; c < a.size(); ++c) EXPECT_NEAR(d.g[c], a[c], 6e-3 * std::abs(a[c])) << c;
  EXPECT_EQ(l.A_log, s.A_log);
  for (size_t i = 0; i < s.dt_bias.size(); ++i) {
    const double A = std::exp(double(s.A_log[i / size_t(sp.K)])), dt = std::log1p(std::exp(double(s.dt_bias[i])));
    const double a0 = lb.lower_bound / (1.0 + std::exp(-A * double(l.dt_bias[i])));  // g = 0
    EXPECT_NEAR(a0, -A * dt, 1e-5 * A * dt) << i;
  }
}

TEST(Inputs, ModelInitIsSeededAndShardable) {
  RowConfig row = model_init_row(Op::Kda, GateForm::LowerBound);
  const RowInputs a = make_inputs(row, "d", 0, row.total_tokens()), b = make_inputs(row, "d", 0, row.total_tokens());
  EXPECT_TRUE(same_bits(a.g, b.g) && same_bits(a.A_log, b.A_log) && same_bits(a.dt_bias, b.dt_bias));
  const RowInputs part = make_inputs(row, "d", 100, 300);
  EXPECT_TRUE(same_bits(part.g, slice(a.g, row.HV * row.K, 100, 300)));
  EXPECT_TRUE(same_bits(part.dt_bias, a.dt_bias));
  row.seed = 2;
  const RowInputs c = make_inputs(row, "d", 0, row.total_tokens());
  EXPECT_NE(a.g, c.g);
  EXPECT_NE(a.A_log, c.A_log);
  EXPECT_NE(a.dt_bias, c.dt_bias);
  EXPECT_NE(a.A_log, make_inputs(row, "e", 0, 4).A_log) << "the row digest seeds the draws too";
}

TEST(Numeric, RoundingIsNearestEven) {
  EXPECT_EQ(round_to_bf16(1.0f + 1.0f / 256.0f), 1.0f);                  // tie -> even (down)
  EXPECT_EQ(round_to_bf16(1.0f + 3.0f / 256.0f), 1.0f + 4.0f / 256.0f);  // tie -> even (up)
  EXPECT_EQ(round_to_fp16(1.0f + 1.0f / 2048.0f), 1.0f);
  EXPECT_EQ(round_to_fp16(65504.0f), 65504.0f);
  EXPECT_TRUE(std::isinf(round_to_fp16(70000.0f)));
  EXPECT_EQ(round_to_fp16(std::ldexp(1.0f, -24)), std::ldexp(1.0f, -24));  // smallest subnormal
}
