// Row inputs from a counter-based generator (docs/design.md 3 step 3).
// Every element of every tensor is a pure function of (seed, row digest, tensor, global index),
// so any rank regenerates its own shard, and the shard of any W is bitwise the slice of W = 1.
// q and k are unit-norm per (token, head) unless the row normalizes them in kernel (qk_l2norm).
// Values are rounded once to the row's input dtype (bf16 or fp16) and stored as float, which
// represents them exactly. Gates (and gate parameters) stay fp32, as the kernels keep them.
//
// Layouts (token-major, B = 1, tokens are the shard's global range [t_begin, t_end)):
//   q, k  [T, H, K]     v, dO  [T, HV, V]     beta [T, HV]
//   g     GDN [T, HV], KDA [T, HV, K]  (direct log-decay, or the raw gate for raw forms)
//   A_log [HV]          dt_bias GDN [HV], KDA [HV, K]
//   h0, dht  [N, HV, K, V] for all N global sequences (fp32)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config/row_config.h"
#include "kernels/api/numeric.h"  // round_to_bf16 / round_to_fp16

namespace kcp {

// Heads [first, first + count) of the row's q/k heads and their value heads [first G, (first +
// count) G) (G = HV / H); count 0 = every head. Heads are independent in the recurrence, so the
// FP64 reference can run a row one group of heads at a time (core/compare/reference_data.h).
struct HeadRange {
  int first = 0, count = 0;
  bool whole(int H) const { return count == 0 || (first == 0 && count == H); }
};

// The row restricted to a head range: H = count, HV = count G, every other field as the row's
// (the shape of what the FP64 reference computes for the range).
RowConfig head_range_row(const RowConfig& row, HeadRange heads);

struct RowInputs {
  int64_t t_begin = 0, t_end = 0;  // global token range of this shard
  std::vector<float> q, k, v, g, beta, dO;
  std::vector<float> A_log, dt_bias;  // empty unless the row has them
  std::vector<float> h0, dht;         // empty unless the row has them
  int64_t tokens() const { return t_end - t_begin; }
};

// Generates the shard [t_begin, t_end) of the row's inputs; with a head range only those heads
// (q, k: its q/k heads; v, dO, g, beta, A_log, dt_bias, h0, dht: its value heads), each element
// the value it has in the whole shard (the same counters), packed as a row of that many heads.
// threads: the token tensors are made by that many threads at once (the same bits: every element
// is its counter's value).
RowInputs make_inputs(const RowConfig& row, const std::string& row_digest, int64_t t_begin, int64_t t_end,
                      HeadRange heads = {}, int threads = 1);
// Only the gates of the shard (g, A_log, dt_bias; the other tensors empty): the same values as
// make_inputs (what the reference's dA_log / ddt_bias scales read).
RowInputs make_gate_inputs(const RowConfig& row, const std::string& row_digest, int64_t t_begin, int64_t t_end);

// Counter-based RNG: a stateless hash of (key, counter) (Philox-like quality is not needed;
// SplitMix64 finalisers on a 128-bit input are enough for test data and are exactly reproducible).
uint64_t hash_counter(uint64_t key, uint64_t counter);
double uniform01(uint64_t key, uint64_t counter);        // in (0, 1)
double standard_normal(uint64_t key, uint64_t counter);  // Box-Muller on two derived uniforms
uint64_t tensor_key(uint64_t seed, const std::string& row_digest, const std::string& tensor);

}  // namespace kcp
