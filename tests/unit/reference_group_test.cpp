// The FP64 reference one group of heads at a time (core/compare/reference_data.h,
// core/compare/reference_spill.h, core/inputs/inputs.h HeadRange): a head range's inputs are those
// heads of the whole shard, its reference those heads of the whole reference, bit for bit, and a
// slice put away part by part reads back as the whole tensor.
#include <gtest/gtest.h>

#include <cstring>

#include "core/compare/reference_data.h"
#include "core/compare/reference_spill.h"
#include "core/inputs/inputs.h"
#include "core/util/error.h"

using namespace kcp;

namespace {
RowConfig row_of(Op op, GateForm gate, bool l2norm, GateRecipe recipe) {
  RowConfig r;
  r.name = "G1";
  r.op = op;
  r.H = 3;
  r.HV = op == Op::Kda ? 3 : 6;
  r.K = r.V = 64;
  r.seqlens = {130, 77};
  r.gate = gate;
  r.qk_l2norm = l2norm;
  r.A_log = gate != GateForm::Direct;
  r.dt_bias = gate != GateForm::Direct;
  r.lower_bound = -5.0;
  r.initial_state = r.final_state = r.dht = true;
  r.inputs.gate_recipe = recipe;
  return r;
}

std::vector<RowConfig> rows() {
  return {row_of(Op::Gdn, GateForm::Direct, false, GateRecipe::Logsigmoid),
          row_of(Op::Gdn, GateForm::Softplus, true, GateRecipe::ModelInit),
          row_of(Op::Kda, GateForm::LowerBound, true, GateRecipe::ModelInit),
          row_of(Op::Kda, GateForm::Direct, false, GateRecipe::Logsigmoid)};
}

// Heads [first, first + count) of `rows` rows of `heads` heads of `width` values.
template <class T>
std::vector<T> heads_of(const std::vector<T>& v, int64_t rows, int64_t heads, int64_t width, int64_t first,
                        int64_t count) {
  std::vector<T> out;
  if (v.empty()) return out;  // a tensor the row does not have
  for (int64_t r = 0; r < rows; ++r)
    out.insert(out.end(), v.begin() + (r * heads + first) * width, v.begin() + (r * heads + first + count) * width);
  return out;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
}  // namespace

TEST(ReferenceGroups, AHeadRangesInputsAreThoseHeadsOfTheWholeShard) {
  for (const RowConfig& row : rows()) {
    const int64_t G = row.HV / row.H, gw = row.op == Op::Kda ? row.K : 1, N = row.sequences(), KV = row.K * row.V;
    const RowInputs whole = make_inputs(row, "d", 20, 190);
    const RowInputs part = make_inputs(row, "d", 20, 190, HeadRange{1, 2});
    const int64_t T = 170, vf = G, vn = 2 * G;
    SCOPED_TRACE(to_string(row.op) + std::string(" ") + to_string(row.gate));
    EXPECT_TRUE(same_bits(part.q, heads_of(whole.q, T, row.H, row.K, 1, 2)));
    EXPECT_TRUE(same_bits(part.k, heads_of(whole.k, T, row.H, row.K, 1, 2)));
    EXPECT_TRUE(same_bits(part.v, heads_of(whole.v, T, row.HV, row.V, vf, vn)));
    EXPECT_TRUE(same_bits(part.dO, heads_of(whole.dO, T, row.HV, row.V, vf, vn)));
    EXPECT_TRUE(same_bits(part.beta, heads_of(whole.beta, T, row.HV, 1, vf, vn)));
    EXPECT_TRUE(same_bits(part.g, heads_of(whole.g, T, row.HV, gw, vf, vn)));
    EXPECT_TRUE(same_bits(part.A_log, heads_of(whole.A_log, 1, row.HV, 1, vf, vn)));
    EXPECT_TRUE(same_bits(part.dt_bias, heads_of(whole.dt_bias, 1, row.HV, gw, vf, vn)));
    EXPECT_TRUE(same_bits(part.h0, heads_of(whole.h0, N, row.HV, KV, vf, vn)));
    EXPECT_TRUE(same_bits(part.dht, heads_of(whole.dht, N, row.HV, KV, vf, vn)));
    EXPECT_TRUE(same_bits(make_inputs(row, "d", 20, 190, HeadRange{0, row.H}).q, whole.q)) << "every head: whole";
    const RowInputs gates = make_gate_inputs(row, "d", 20, 190);
    EXPECT_TRUE(same_bits(gates.g, whole.g) && same_bits(gates.A_log, whole.A_log) &&
                same_bits(gates.dt_bias, whole.dt_bias));
    EXPECT_TRUE(gates.q.empty() && gates.v.empty() && gates.dO.empty());
    const RowConfig shape = head_range_row(row, HeadRange{1, 2});
    EXPECT_EQ(shape.H, 2);
    EXPECT_EQ(shape.HV, 2 * G);
  }
  EXPECT_THROW(make_inputs(rows()[0], "d", 0, 10, HeadRange{2, 2}), InvariantError);
}

// Every field of a head range's reference is those heads of the whole sequence's, bit for bit
// (heads are independent; dq, dk sum a q/k head's value heads in the same order).
TEST(ReferenceGroups, AHeadRangesReferenceIsThoseHeadsOfTheWholeBitForBit) {
  for (const RowConfig& row : rows()) {
    SCOPED_TRACE(to_string(row.op) + std::string(" ") + to_string(row.gate));
    const int64_t G = row.HV / row.H, gw = row.op == Op::Kda ? row.K : 1, KV = row.K * row.V, len = row.seqlens[0];
    ReferenceCache cache(row, "d", "", 2, ProbePositions{{40, 64, 129}, {}});
    const auto whole = cache.get(0);
    const auto part = cache.get(0, HeadRange{2, 1});
    EXPECT_EQ(part->heads.first, 2);
    const int64_t vf = 2 * G, vn = G;
    EXPECT_TRUE(same_bits(part->o, heads_of(whole->o, len, row.HV, row.V, vf, vn)));
    EXPECT_TRUE(same_bits(part->dv, heads_of(whole->dv, len, row.HV, row.V, vf, vn)));
    EXPECT_TRUE(same_bits(part->dq, heads_of(whole->dq, len, row.H, row.K, 2, 1)));
    EXPECT_TRUE(same_bits(part->dk, heads_of(whole->dk, len, row.H, row.K, 2, 1)));
    EXPECT_TRUE(same_bits(part->dg, heads_of(whole->dg, len, row.HV, gw, vf, vn)));
    EXPECT_TRUE(same_bits(part->dbeta, heads_of(whole->dbeta, len, row.HV, 1, vf, vn)));
    EXPECT_TRUE(same_bits(part->ht, heads_of(whole->ht, 1, row.HV, KV, vf, vn)));
    EXPECT_TRUE(same_bits(part->dh0, heads_of(whole->dh0, 1, row.HV, KV, vf, vn)));
    EXPECT_TRUE(same_bits(part->probe_S, heads_of(whole->probe_S, 3, row.HV, KV, vf, vn)));
    EXPECT_TRUE(same_bits(part->probe_dS, heads_of(whole->probe_dS, 3, row.HV, KV, vf, vn)));
    EXPECT_TRUE(same_bits(part->dA_log, heads_of(whole->dA_log, 1, row.HV, 1, vf, vn)));
    EXPECT_TRUE(same_bits(part->ddt_bias, heads_of(whole->ddt_bias, 1, row.HV, gw, vf, vn)));
    cache.release(HeadRange{2, 1});
    EXPECT_EQ(cache.get(0).get(), whole.get()) << "releasing a head range keeps the whole sequence";
  }
}

// A tensor put away one group of heads at a time (in any order) reads back as the whole tensor;
// a tensor missing some heads is an error, not zeros.
TEST(ReferenceGroups, ASliceSpilledPartByPartReadsBackWhole) {
  const int64_t rows = 5, heads = 4, width = 3;
  std::vector<double> whole(rows * heads * width);
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = 0.5 + double(i) * 1.25;
  ReferenceSpill spill;
  for (int64_t first : {2, 0}) {
    std::vector<double> part = heads_of(whole, rows, heads, width, first, 2);
    spill.put_part(ResultTensor::o, part, rows, heads, width, first, 2);
    EXPECT_TRUE(part.empty()) << "freed once written";
  }
  EXPECT_TRUE(same_bits(spill.load_tensor(ResultTensor::o), whole));
  std::vector<double> copy = whole;
  spill.put(ResultTensor::dv, copy);
  EXPECT_TRUE(same_bits(spill.load().tensors[static_cast<int>(ResultTensor::dv)], whole));
  EXPECT_TRUE(spill.load_tensor(ResultTensor::dq).empty()) << "never put";
  std::vector<double> one = heads_of(whole, rows, heads, width, 1, 1);
  spill.put_part(ResultTensor::dk, one, rows, heads, width, 1, 1);
  EXPECT_THROW(spill.load_tensor(ResultTensor::dk), InvariantError);
}
