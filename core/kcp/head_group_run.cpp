#include "core/kcp/head_group_run.h"

#include <algorithm>
#include <chrono>

#include "core/util/error.h"
#include "core/util/log.h"

namespace kcp {

HeadRange head_group(const RowConfig& row, int g, int groups) {
  KCP_CHECK(groups >= 1 && row.H % groups == 0 && g >= 0 && g < groups,
            "row {}: group {} of {} groups of heads (H = {} must be a multiple of the groups)", row.name, g, groups,
            row.H);
  if (groups == 1) return HeadRange{};
  return HeadRange{g * (row.H / groups), row.H / groups};
}

namespace {

// v[i] += add[i] (v takes add's size when empty).
void add_each(std::vector<double>& v, const std::vector<double>& add) {
  if (v.empty()) v.assign(add.size(), 0.0);
  KCP_CHECK(v.size() == add.size(), "per-run times of {} and {} runs", v.size(), add.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] += add[i];
}

// What stays of group g's result: its Param tensors at its heads, its times added, its device
// bytes and fault place.
void keep_rest(GroupedFormRun& out, const RankResult& res, int g, int groups) {
  RankResult& rest = out.rest;
  for (ResultTensor t : {ResultTensor::dA_log, ResultTensor::ddt_bias}) {
    const std::vector<float>& part = res[t];
    if (part.empty()) continue;
    rest[t].resize(part.size() * size_t(groups));
    std::copy(part.begin(), part.end(), rest[t].begin() + std::ptrdiff_t(part.size() * size_t(g)));
  }
  add_each(rest.forward_kernel_ms, res.forward_kernel_ms);
  add_each(rest.backward_kernel_ms, res.backward_kernel_ms);
  add_each(rest.forward_wall_ms, res.forward_wall_ms);
  add_each(rest.backward_wall_ms, res.backward_wall_ms);
  for (const auto& [name, ms] : res.phase_kernel_ms) add_each(rest.phase_kernel_ms[name], ms);
  rest.device_bytes = std::max(rest.device_bytes, res.device_bytes);
  rest.faulted_segment = res.faulted_segment;
  rest.faulted_token = res.faulted_token;
}

}  // namespace

GroupedFormRun run_form_by_head_groups(const RowConfig& row, const std::string& row_digest, const SegmentPlan& plan,
                                       const Form& form, int groups, Communicator& comm,
                                       const kernels::Backend& backend, EngineOptions opt, const GroupJudge& judge,
                                       std::shared_ptr<const RowInputs>* kept) {
  KCP_CHECK(!kept || groups == 1, "row {}: a kept input shard with {} groups of heads", row.name, groups);
  const RankPlan& rp = plan.ranks[comm.rank()];
  GroupedFormRun out;
  auto t = std::chrono::steady_clock::now();
  auto lap = [&t](double& acc) {  // acc += seconds since the last lap
    const auto now = std::chrono::steady_clock::now();
    acc += std::chrono::duration<double>(now - t).count();
    t = now;
  };
  for (int g = 0; g < groups; ++g) {
    opt.heads = head_group(row, g, groups);
    const RowConfig part = head_range_row(row, opt.heads);
    RankResult res;
    if (kept) {  // the row's shard, kept across its forms
      if (!*kept) {
        *kept = std::make_shared<const RowInputs>(
            make_inputs(row, row_digest, rp.global_begin, rp.global_end, opt.heads, opt.threads));
        if (comm.rank() == 0) log::debug("row {}: rank 0 keeps its input shard across the row's forms", row.name);
      }
      lap(out.inputs_s);
      res = run_form(part, plan, form, **kept, comm, backend, opt);
    } else {  // the group's inputs (the values they have in the whole shard), freed once uploaded
      RowInputs inputs = make_inputs(row, row_digest, rp.global_begin, rp.global_end, opt.heads, opt.threads);
      lap(out.inputs_s);
      res = run_form(part, plan, form, std::move(inputs), comm, backend, opt);
    }
    lap(out.run_s);
    if (judge) judge(part, opt.heads, res);
    fold_digest(out.bits, digest(res));
    keep_rest(out, res, g, groups);
    lap(out.judge_s);
  }  // the group's result goes here, before the next group's arrays
  return out;
}

}  // namespace kcp
