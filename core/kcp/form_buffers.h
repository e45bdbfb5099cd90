// FormBuffers: every array one rank's run of one form touches, in the backend's memory space,
// allocated once per form and freed with it: the uploaded inputs, the saved set and workspace
// arenas, the outputs and gradients (one per result tensor, core/kcp/rank_result.h), the rank
// exchange buffers, and the start states of the rank folds. It binds the kernel API's tensor
// sets onto them, poisons what the kernels write (docs/design.md 5), counts their bytes and
// downloads the results. The caller tensors q, k, v, dO, o, dq, dk, dv live as DtypeArray in the
// backend's caller_storage() (16-bit patterns, half the bytes of floats): q, k, v, dO are
// encoded from the shard's floats on upload, o, dq, dk, dv decoded to floats by download(), so
// everything judged stays float.
#pragma once

#include <array>

#include "core/inputs/inputs.h"
#include "core/kcp/device_array.h"
#include "core/kcp/rank_driver.h"
#include "core/kcp/rank_exchange.h"
#include "core/kcp/rank_result.h"
#include "core/plan/segment_plan.h"

namespace kcp {

class FormBuffers {
 public:
  // shard: this rank's inputs (make_inputs over rp's tokens); h0 / dht are taken per piece from
  // the sequence each piece belongs to. Uploads happen here, outside every timed region.
  FormBuffers(const kernels::Backend& be, const RowConfig& row, const RankPlan& rp, int world, const RowInputs& shard,
              const kernels::Problem& problem, const kernels::LayoutView& layout, SavedKind kind,
              const kernels::Exec& exec);

  kernels::InputTensors inputs() const;
  kernels::OutputTensors outputs() const;
  kernels::GradTensors grads() const;

  // The saved set and workspace arenas (bind them with kernels/api/tensors.h).
  const DeviceArray& saved_arena() const { return saved_; }
  const DeviceArray& workspace_arena() const { return ws_; }
  // A second workspace arena of the same size, allocated on first use (the cross-package fault).
  const DeviceArray& spare_workspace_arena();

  // The exchange: this rank's block (send_A(), send_b()), the gathered blocks of every rank,
  // and the folds' outputs and start states (null when the rank has none).
  float* send_A() const { return send_.get(); }
  float* send_b() const { return send_.get() + block_.A; }
  const DeviceArray& send() const { return send_; }
  const DeviceArray& gathered() const { return gathered_; }
  float* incoming() const { return incoming_.get(); }
  float* exit_grad() const { return exit_.get(); }
  const float* fold_h0() const { return h0_seq_.get(); }
  const float* fold_dht() const { return dht_seq_.get(); }

  // NaN into everything the kernels write: saved set, workspace, outputs, gradients.
  void poison(const kernels::Exec& exec) const;
  // Bytes of every array above.
  int64_t bytes() const;
  // The result tensors the row has, to the host (the Param tensors are this rank's partial sums;
  // the Boundary tensors are left to the caller, who knows where the bound sets put them).
  RankResult download(const RowConfig& row, const kernels::Exec& exec) const;
  // The end of a form (once the Boundary tensors are downloaded): every array but the results is
  // freed, then each result comes to the host and its array is freed at once, so the form's
  // arrays and its downloaded results never exist whole at the same time (core/plan/
  // memory_estimate.h counts the larger of the two). The buffers are empty afterwards.
  void release_all_but_results();
  RankResult take_results(const RowConfig& row, const kernels::Exec& exec);

 private:
  const kernels::Backend& be_;
  SummaryBlock block_;
  // The fp32 result tensors (results_) and the dtype ones o, dq, dk, dv (dtype_results_); each
  // holds only its own kind.
  float* result(ResultTensor t) const { return results_[static_cast<int>(t)].get(); }
  kernels::DtypeTensor dtype_result(ResultTensor t) const { return dtype_results_[static_cast<int>(t)].tensor(); }

  DtypeArray q_, k_, v_, dO_;
  DeviceArray g_, beta_, A_log_, dt_bias_, h0_, dht_;
  DeviceArray saved_, ws_, ws_spare_;
  std::array<DeviceArray, kResultTensorCount> results_;
  std::array<DtypeArray, kResultTensorCount> dtype_results_;
  DeviceArray send_, gathered_, incoming_, exit_, h0_seq_, dht_seq_;
};

}  // namespace kcp
