#include "core/kcp/form_buffers.h"

#include <limits>

namespace kcp {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The result tensors that are caller dtype tensors (kernels/api/tensors.h).
bool is_dtype_result(ResultTensor t) {
  return t == ResultTensor::o || t == ResultTensor::dq || t == ResultTensor::dk || t == ResultTensor::dv;
}

// Per local piece, the [HV, K, V] state of the piece's sequence (h0 or dht); empty without.
std::vector<float> per_piece(const std::vector<float>& per_seq, bool has, const RankPlan& rp, int64_t HVKV) {
  if (!has) return {};
  std::vector<float> out(rp.pieces.size() * HVKV, 0.0f);
  for (size_t p = 0; p < rp.pieces.size(); ++p)
    std::copy_n(per_seq.data() + rp.pieces[p].seq * HVKV, HVKV, out.data() + p * HVKV);
  return out;
}

// The state of one sequence, in the backend's memory; empty when `has` is false.
DeviceArray seq_state(const kernels::Backend& be, const std::vector<float>& per_seq, bool has, int seq, int64_t HVKV,
                      const kernels::Exec& exec) {
  if (!has) return DeviceArray();
  return DeviceArray(be, std::vector<float>(per_seq.begin() + seq * HVKV, per_seq.begin() + (seq + 1) * HVKV), exec);
}

}  // namespace

FormBuffers::FormBuffers(const kernels::Backend& be, const RowConfig& row, const RankPlan& rp, int world,
                         const RowInputs& shard, const kernels::Problem& problem, const kernels::LayoutView& layout,
                         SavedKind kind, const kernels::Exec& exec)
    : be_(be), block_(summary_block(problem)) {
  const int64_t HVKV = block_.b, T = rp.tokens(), N = layout.n_pieces;
  q_ = DtypeArray(be, shard.q, problem.dtype, exec);
  k_ = DtypeArray(be, shard.k, problem.dtype, exec);
  v_ = DtypeArray(be, shard.v, problem.dtype, exec);
  g_ = DeviceArray(be, shard.g, exec);
  beta_ = DeviceArray(be, shard.beta, exec);
  dO_ = DtypeArray(be, shard.dO, problem.dtype, exec);
  A_log_ = DeviceArray(be, row.A_log ? shard.A_log : std::vector<float>{}, exec);
  dt_bias_ = DeviceArray(be, row.dt_bias ? shard.dt_bias : std::vector<float>{}, exec);
  h0_ = DeviceArray(be, per_piece(shard.h0, row.initial_state, rp, HVKV), exec);
  dht_ = DeviceArray(be, per_piece(shard.dht, row.dht, rp, HVKV), exec);

  saved_ = DeviceArray(be, be.saved_floats(problem, layout, kind));
  ws_ = DeviceArray(be, be.workspace_floats(problem, layout, kind));
  // Token and State tensors always (the kernels write ht and dh0 for every piece); the Param
  // gradients only when the row has them (a null pointer tells the kernels there is none). The
  // Boundary tensors are the saved set's / workspace's own arrays (FormRun downloads them).
  for (int i = 0; i < kResultTensorCount; ++i) {
    const ResultTensor t = result_tensor(i);
    if (place_of(t) == TensorPlace::Boundary) continue;
    if (is_dtype_result(t))
      dtype_results_[i] = DtypeArray(be, result_elements(row, t, T, N, 0), problem.dtype);
    else if (place_of(t) != TensorPlace::Param || row_has(row, t))
      results_[i] = DeviceArray(be, result_elements(row, t, T, N, 0));
  }

  const bool sends_fwd = !rp.pieces.empty() && rp.pieces.back().to_next_rank;
  const bool receives = !rp.pieces.empty() && rp.pieces.front().from_prev_rank;
  send_ = DeviceArray(be, block_.floats());
  gathered_ = DeviceArray(be, int64_t(world) * block_.floats());
  incoming_ = DeviceArray(be, HVKV);
  exit_ = DeviceArray(be, HVKV);
  h0_seq_ = seq_state(be, shard.h0, row.initial_state && receives, receives ? rp.pieces.front().seq : 0, HVKV, exec);
  dht_seq_ = seq_state(be, shard.dht, row.dht && sends_fwd, sends_fwd ? rp.pieces.back().seq : 0, HVKV, exec);
}

const DeviceArray& FormBuffers::spare_workspace_arena() {
  if (ws_spare_.size() == 0) ws_spare_ = DeviceArray(be_, ws_.size());
  return ws_spare_;
}

kernels::InputTensors FormBuffers::inputs() const {
  kernels::InputTensors in;
  in.q = q_.tensor();
  in.k = k_.tensor();
  in.v = v_.tensor();
  in.g = g_.get();
  in.beta = beta_.get();
  in.A_log = A_log_.get();
  in.dt_bias = dt_bias_.get();
  in.h0 = h0_.get();
  in.dO = dO_.tensor();
  in.dht = dht_.get();
  return in;
}

kernels::OutputTensors FormBuffers::outputs() const {
  return {dtype_result(ResultTensor::o), result(ResultTensor::ht)};
}

kernels::GradTensors FormBuffers::grads() const {
  kernels::GradTensors g;
  g.dq = dtype_result(ResultTensor::dq);
  g.dk = dtype_result(ResultTensor::dk);
  g.dv = dtype_result(ResultTensor::dv);
  g.dg = result(ResultTensor::dg);
  g.dbeta = result(ResultTensor::dbeta);
  g.dA_log = result(ResultTensor::dA_log);
  g.ddt_bias = result(ResultTensor::ddt_bias);
  g.dh0 = result(ResultTensor::dh0);
  return g;
}

void FormBuffers::poison(const kernels::Exec& exec) const {
  saved_.fill(kNaN, exec);
  ws_.fill(kNaN, exec);
  for (const DeviceArray& a : results_) a.fill(kNaN, exec);
  for (const DtypeArray& a : dtype_results_) a.poison(exec);
}

int64_t FormBuffers::bytes() const {
  int64_t n = 0;
  for (const DeviceArray* a : {&g_, &beta_, &A_log_, &dt_bias_, &h0_, &dht_, &saved_, &ws_, &ws_spare_, &send_,
                               &gathered_, &incoming_, &exit_, &h0_seq_, &dht_seq_})
    n += a->size();
  for (const DeviceArray& a : results_) n += a.size();
  int64_t bytes = n * int64_t(sizeof(float));
  for (const DtypeArray* a : {&q_, &k_, &v_, &dO_}) bytes += a->bytes();
  for (const DtypeArray& a : dtype_results_) bytes += a.bytes();
  return bytes;
}

RankResult FormBuffers::download(const RowConfig& row, const kernels::Exec& exec) const {
  RankResult res;
  for (int i = 0; i < kResultTensorCount; ++i)
    if (row_has(row, result_tensor(i)) && place_of(result_tensor(i)) != TensorPlace::Boundary)
      res.tensors[i] = is_dtype_result(result_tensor(i)) ? dtype_results_[i].to_host(exec) : results_[i].to_host(exec);
  return res;
}

void FormBuffers::release_all_but_results() {
  for (DtypeArray* a : {&q_, &k_, &v_, &dO_}) *a = DtypeArray();
  for (DeviceArray* a : {&g_, &beta_, &A_log_, &dt_bias_, &h0_, &dht_, &saved_, &ws_, &ws_spare_, &send_, &gathered_,
                         &incoming_, &exit_, &h0_seq_, &dht_seq_})
    *a = DeviceArray();
}

RankResult FormBuffers::take_results(const RowConfig& row, const kernels::Exec& exec) {
  RankResult res;
  for (int i = 0; i < kResultTensorCount; ++i) {
    const ResultTensor t = result_tensor(i);
    if (row_has(row, t) && place_of(t) != TensorPlace::Boundary)
      res.tensors[i] = is_dtype_result(t) ? dtype_results_[i].to_host(exec) : results_[i].to_host(exec);
    results_[i] = DeviceArray();
    dtype_results_[i] = DtypeArray();
  }
  return res;
}

}  // namespace kcp
