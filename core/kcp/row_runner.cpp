#include "core/kcp/row_runner.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <set>

#include "core/compare/compare.h"
#include "core/compare/group_metrics.h"
#include "core/inputs/inputs.h"
#include "core/kcp/external_backend.h"
#include "core/kcp/head_group_run.h"
#include "core/kcp/phase_timing_backend.h"
#include "core/kcp/result_digest.h"
#include "core/plan/segment_plan.h"
#include "core/report/npy_dump.h"
#include "core/report/plan_json.h"
#include "core/util/error.h"
#include "core/util/log.h"
#include "core/util/phase.h"

namespace kcp {

ReferenceCache& ReferenceStore::for_row(const RowConfig& row, const std::string& digest, const ProbePositions& probes) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& c = caches_[digest];
  if (!c) c = std::make_unique<ReferenceCache>(row, digest, dir_, threads_, probes);
  return *c;
}

void ReferenceStore::release(const std::string& digest) {
  std::lock_guard<std::mutex> lock(mutex_);
  caches_.erase(digest);
}

std::shared_ptr<const RankPrepared> ReferenceStore::kept(const std::string& digest, int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = prepared_.find({digest, rank});
  return it == prepared_.end() ? nullptr : it->second;
}

void ReferenceStore::keep(const std::string& digest, int rank, std::shared_ptr<const RankPrepared> prepared) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (keep_) prepared_[{digest, rank}] = std::move(prepared);
}

std::vector<Form> expand_forms(const RowConfig& row, const RunOptions& opt) {
  const auto packages = opt.packages.empty() ? row.forms.packages : opt.packages;
  const auto saved = opt.saved.empty() ? row.forms.saved : opt.saved;
  std::vector<int> schedules;
  if (opt.run_planned) schedules.push_back(0);
  for (int P : opt.forced_P) schedules.push_back(P);
  if (opt.use_row_forced)
    for (int P : row.forms.forced_P)
      if (std::find(schedules.begin(), schedules.end(), P) == schedules.end()) schedules.push_back(P);
  std::vector<Form> forms;
  for (int P : schedules)
    for (Package pk : {Package::Det, Package::Nondet})
      if (std::find(packages.begin(), packages.end(), pk) != packages.end())
        for (SavedKind sk : {SavedKind::Full, SavedKind::Light})
          if (std::find(saved.begin(), saved.end(), sk) != saved.end()) forms.push_back({pk, sk, P});
  return forms;
}

std::vector<int> auto_sweep_P(const SegmentPlan& planned) {
  int64_t most = 1;
  for (const auto& rp : planned.ranks)
    for (const auto& pc : rp.pieces) most = std::max(most, (pc.length() + planned.chunk - 1) / planned.chunk);
  most = std::min<int64_t>(most, 64);
  std::vector<int> ps;
  for (int64_t P = 1; P <= most; P *= 2) ps.push_back(static_cast<int>(P));
  for (const auto& rp : planned.ranks) ps.push_back(rp.P);
  std::sort(ps.begin(), ps.end());
  ps.erase(std::unique(ps.begin(), ps.end()), ps.end());
  return ps;
}

namespace {

// The tensors whose bits differ between two results on any rank (every rank gets the same list).
std::vector<std::string> differing_tensors(Communicator& comm, const ResultDigest& a, const ResultDigest& b) {
  std::vector<int64_t> differ(a.size());
  for (size_t i = 0; i < a.size(); ++i) differ[i] = a[i] != b[i];
  comm.allreduce(differ.data(), differ.size(), ReduceOp::Max);
  std::vector<std::string> names;
  for (size_t i = 0; i < differ.size(); ++i)
    if (differ[i]) names.push_back(kResultTensors[i]);
  return names;
}

std::string p_text(const SegmentPlan& plan) {
  std::vector<int> P;
  for (const auto& rp : plan.ranks) P.push_back(rp.P);
  return fmt::format("{}", fmt::join(P, ","));
}

struct Verdict {
  const TensorMetrics* worst_ratio = nullptr;
  const TensorMetrics* worst_rms = nullptr;
  bool pass = true;
  std::string reason;
};

Verdict summarize(const std::vector<TensorMetrics>& ms) {
  Verdict v;
  for (const auto& m : ms) {
    // A tensor with no element compared (a boundary tensor where a form has none) is never the
    // worst: an entry that judged nothing names no tensor (0 and "").
    if (m.count > 0 && (!v.worst_ratio || m.ratio_max > v.worst_ratio->ratio_max)) v.worst_ratio = &m;
    if (m.count > 0 && (!v.worst_rms || m.rms_ratio > v.worst_rms->rms_ratio)) v.worst_rms = &m;
    if (!m.pass) {
      v.pass = false;
      std::string why = !m.has_budget ? "no budget (run kcpbench calibrate)"
                        : m.nonfinite ? fmt::format("{} non-finite values", m.nonfinite)
                                      : fmt::format("ratio_max {:.4f}, rms ratio {:.4f}", m.ratio_max, m.rms_ratio);
      v.reason += (v.reason.empty() ? "" : "; ") + m.name + ": " + why;
    }
  }
  return v;
}

// Median / min / max / p90 / count of a sample (null when empty).
Stats sample_stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size();
  if (m == 0) return std::nullopt;
  const double med = m % 2 ? v[m / 2] : 0.5 * (v[m / 2 - 1] + v[m / 2]);
  return SampleStats{med, v.front(), v.back(), v[std::min(m - 1, static_cast<size_t>(0.9 * double(m)))],
                     static_cast<int64_t>(m)};
}

// Per phase (engine_phase_names order) and per phase-timed run, the slowest rank; phases no rank
// called are left out. Every rank takes part (the all-reduces), rank 0 uses the result.
std::map<std::string, Stats> phase_stats(const RankResult& res, Communicator& comm, int runs) {
  const std::vector<std::string>& names = engine_phase_names();
  const size_t n = static_cast<size_t>(runs);
  std::vector<double> ms(names.size() * n, 0.0), called(names.size(), 0.0);
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = res.phase_kernel_ms.find(names[i]);
    if (it == res.phase_kernel_ms.end()) continue;
    KCP_CHECK(it->second.size() == n, "phase {}: {} timed runs, expected {}", names[i], it->second.size(), n);
    std::copy(it->second.begin(), it->second.end(), ms.begin() + i * n);
    called[i] = 1.0;
  }
  comm.allreduce(ms.data(), ms.size(), ReduceOp::Max);
  comm.allreduce(called.data(), called.size(), ReduceOp::Max);
  std::map<std::string, Stats> out;
  for (size_t i = 0; i < names.size(); ++i)
    if (called[i] > 0.0)
      out[names[i]] = sample_stats(std::vector<double>(ms.begin() + i * n, ms.begin() + (i + 1) * n));
  return out;
}

// Median, min, max, p90 and count of per-repeat times, each the slowest rank's, and with
// phase_times the same per phase (collective).
Timings timing_stats(const RankResult& res, Communicator& comm, bool phase_times, int repeats) {
  const size_t n = res.forward_kernel_ms.size();
  std::vector<double> f(res.forward_kernel_ms), b(res.backward_kernel_ms), fw(res.forward_wall_ms),
      bw(res.backward_wall_ms);
  for (auto* v : {&f, &b, &fw, &bw})
    if (n) comm.allreduce(v->data(), n, ReduceOp::Max);
  std::vector<double> t(n), tw(n);
  for (size_t i = 0; i < n; ++i) {
    t[i] = f[i] + b[i];
    tw[i] = fw[i] + bw[i];
  }
  Timings out;
  out.forward = sample_stats(f);
  out.backward = sample_stats(b);
  out.total = sample_stats(t);
  out.wall_total = sample_stats(tw);
  out.what =
      "forward/backward/total: backend timers around the kernel phases (CUDA events on a GPU), "
      "the exchange excluded; wall_total: host clock, exchange included; each the slowest rank";
  if (phase_times) {
    out.phases = phase_stats(res, comm, repeats);
    out.phases_what =
        "per backend phase (kernels/api/backend.h) of the forward and of the backward (which recomputes the forward "
        "states, and wy with a light saved set): the kernel time of its calls in one run, summed, the slowest rank; "
        "measured on as many separate runs as the totals, with a timer pair around each call";
  }
  return out;
}

// The table's per-phase lines of an entry: median ms per phase, one line per section.
void log_phase_medians(const std::map<std::string, Stats>& phases) {
  for (const char* section : {"forward", "backward"}) {
    std::string line;
    const std::string prefix = std::string(section) + ".";
    for (const std::string& name : engine_phase_names())
      if (auto it = phases.find(name); name.rfind(prefix, 0) == 0 && it != phases.end() && it->second)
        line += fmt::format("  {} {:.3f}", name.substr(prefix.size()), it->second->median);
    if (!line.empty()) log::info0("      {:<8} phases, median ms:{}", section, line);
  }
}

// --dump: the rank's inputs and reference once per row (the row's per-sequence inputs h0, dht,
// A_log, dt_bias once, from rank 0), the backend's tensors once per form; the manifest's
// description of the row (shape, scale, gate, loss) and the reference of the Param gradients (this
// rank's part of the total: the sequences that start on it, as compare_parameter_grads sums them)
// with their cancellation-aware scales (kind "scale", from rank 0: the same on every rank).
void dump_row(Dumper& d, const RowConfig& row, const RankPlan& rp, const RowInputs& in, const RankReference& ref,
              const std::vector<std::shared_ptr<const SequenceReference>>& piece_refs, const ParamScales& scales,
              int r) {
  const int64_t T = rp.tokens(), H = row.H, HV = row.HV, K = row.K, V = row.V, gw = row.op == Op::Kda ? K : 1;
  const int64_t N = static_cast<int64_t>(rp.pieces.size()), b = rp.global_begin, e = rp.global_end;
  auto in_ = [&](const char* n, const std::vector<float>& v, std::vector<int64_t> shape) {
    d.add(row.name, "row", r, "input", n, v, shape, b, e);
  };
  in_("q", in.q, {T, H, K});
  in_("k", in.k, {T, H, K});
  in_("v", in.v, {T, HV, V});
  in_("g", in.g, {T, HV, gw});
  in_("beta", in.beta, {T, HV});
  in_("dO", in.dO, {T, HV, V});
  if (r == 0) {
    const int64_t S = row.sequences();
    d.add(row.name, "row", r, "input", "h0", in.h0, {S, HV, K, V}, -1, -1);
    d.add(row.name, "row", r, "input", "dht", in.dht, {S, HV, K, V}, -1, -1);
    d.add(row.name, "row", r, "input", "A_log", in.A_log, {HV}, -1, -1);
    d.add(row.name, "row", r, "input", "dt_bias", in.dt_bias, {HV, gw}, -1, -1);
    nlohmann::json info = row_summary_json(row, "");
    info.erase("digest");
    info["scale"] = row.scale > 0 ? row.scale : 1.0 / std::sqrt(double(K));
    info["gate_width"] = gw;
    info["A_log"] = row.A_log;
    info["dt_bias"] = row.dt_bias;
    if (row.gate == GateForm::LowerBound) info["lower_bound"] = row.lower_bound;
    info["loss"] = row.dht ? "sum(o * dO) + sum(ht * dht)" : "sum(o * dO)";
    d.describe_row(row.name, info);
    if (row.A_log) d.add(row.name, "row", r, "scale", "dA_log", scales.dA_log, {HV}, -1, -1);
    if (row.dt_bias) d.add(row.name, "row", r, "scale", "ddt_bias", scales.ddt_bias, {HV * gw}, -1, -1);
  }
  for (int i = 0; i < kResultTensorCount; ++i) {
    const ResultTensor t = result_tensor(i);
    if (place_of(t) == TensorPlace::Boundary) continue;  // per form: dump_result
    if (place_of(t) != TensorPlace::Param) {
      d.add(row.name, "row", r, "reference", to_string(t), ref[t], result_shape(row, t, T, N, 0), b, e);
      continue;
    }
    if (!row_has(row, t)) continue;
    std::vector<double> part;
    for (size_t p = 0; p < piece_refs.size(); ++p) {
      if (rp.pieces[p].from_prev_rank) continue;
      const std::vector<double>& v = (*piece_refs[p])[t];
      if (part.empty()) part.assign(v.size(), 0.0);
      for (size_t j = 0; j < v.size() && j < part.size(); ++j) part[j] += v[j];
    }
    // A rank where no sequence starts still writes its (zero) part, so every rank has the file.
    if (part.empty()) part.assign(size_t(HV * (t == ResultTensor::dA_log ? 1 : gw)), 0.0);
    d.add(row.name, "row", r, "reference", to_string(t), part, {int64_t(part.size())}, -1, -1);
  }
}

// The backend's tensors of a form, and the reference of its Boundary tensors (they depend on the
// form's segments; NaN where not judged).
void dump_result(Dumper& d, const RowConfig& row, const Form& form, const RankPlan& rp, const RankResult& res,
                 const RankReference& boundary, int r) {
  const int64_t T = rp.tokens(), N = static_cast<int64_t>(rp.pieces.size()), b = rp.global_begin, e = rp.global_end;
  const int64_t S = static_cast<int64_t>(rp.segments.size());
  for (int i = 0; i < kResultTensorCount; ++i) {
    const ResultTensor t = result_tensor(i);
    const bool tokens = place_of(t) != TensorPlace::Param;
    std::vector<int64_t> shape = result_shape(row, t, T, N, S);
    if (!tokens) shape = {int64_t(res[t].size())};
    d.add(row.name, form.label(), r, "backend", to_string(t), res[t], shape, tokens ? b : -1, tokens ? e : -1);
    if (place_of(t) == TensorPlace::Boundary)
      d.add(row.name, form.label(), r, "reference", to_string(t), boundary[t], shape, b, e);
  }
}

// What every form of a row shares on this rank: the planned schedule, the rank's inputs and its
// slice of the FP64 reference.
struct RowContext {
  const RowConfig& row;
  const SelectedRow& sel;
  PlanRequest req;
  SegmentPlan planned;
  // The rank's inputs: only with an external command (which reads them once); the forms make
  // their shard afresh and free it once uploaded (run_form), unless it is kept (kept_shard).
  RowInputs shard;
  kernels::Status backend_status;
  std::vector<Form> forms;  // every form the row runs (expand_forms, with an automatic sweep's P)
  // The rank's FP64 reference slice (Token and State tensors, in memory or spilled); per piece
  // dA_log, ddt_bias and the probes inside the piece (piece_slice); the cancellation-aware scales.
  std::shared_ptr<const RankPrepared> prep;
  double ref_seconds = 0;
  bool announce = false;  // long rows print their steps
  size_t row_no = 0, row_total = 0;
  int head_groups = 1;  // every form runs in this many groups of heads (core/kcp/head_group_run.h)
  int rank = 0;
  // The rank's input shard kept across the row's forms (SelectedRow::keep_inputs; made by the
  // first form that runs, dropped with the row).
  mutable std::shared_ptr<const RowInputs> kept_shard{};
  std::shared_ptr<const RowInputs>* keep() const { return sel.keep_inputs && head_groups == 1 ? &kept_shard : nullptr; }
};

// The schedule a forced P runs with (forced_p_unfit_reason, the row's rule unless in a sweep),
// or why it is skipped; plan_form adds the fault's and the backend's reasons.
std::string forced_plan(const RowContext& c, int forced_P, const RunOptions& opt, SegmentPlan& plan) {
  std::string skip = forced_p_unfit_reason(c.planned, forced_P);
  if (skip.empty() && !opt.sweep) skip = forced_p_skip_reason(c.row, c.planned, forced_P);
  if (skip.empty()) {
    PlanRequest fr = c.req;
    fr.forced_P = forced_P;
    plan = make_plan(c.row, fr);
  }
  return skip;
}

// The probe positions of every sequence (docs/algorithm.md 1.4): over every schedule the row's
// forms run with and every rank, the segment begins p > 0 and ends p < len (h_entry, dh_exit).
// The same on every rank, so the ranks of a process share one FP64 computation per sequence.
ProbePositions probe_positions(const RowContext& c, const RunOptions& opt) {
  std::vector<std::set<int64_t>> sets(c.row.seqlens.size());
  for (const Form& form : c.forms) {
    SegmentPlan plan = c.planned;
    if (form.forced_P == 0 || forced_plan(c, form.forced_P, opt, plan).empty())
      add_probe_positions(plan, c.row.seqlens, sets);
  }
  ProbePositions probes;
  for (const auto& p : sets) probes.emplace_back(p.begin(), p.end());  // ascending
  return probes;
}

// This rank's shard of the row's inputs (make_inputs: the same values every time).
RowInputs form_shard(const RowContext& c, int r) {
  const RankPlan& my = c.planned.ranks[r];
  return make_inputs(c.row, c.sel.digest, my.global_begin, my.global_end);
}

// The reference slice a form is judged against: the one in memory, or read back into `loaded`.
const RankReference& judged_reference(const RowContext& c, RankReference& loaded) {
  if (c.prep->ref) return *c.prep->ref;
  loaded = c.prep->spill->load();
  return loaded;
}

// The same, one tensor at a time: a spilled slice is read back tensor by tensor into `loaded`
// (the previous tensor freed first), so judging holds one tensor of it. With a head range, the
// range's part of each tensor ([rows, heads of the range, width]; a form run by groups of heads).
ReferenceSource judged_source(const RowContext& c, std::vector<double>& loaded, HeadRange heads = {}) {
  std::shared_ptr<const RankReference> ref = c.prep->ref;
  std::shared_ptr<const ReferenceSpill> spill = c.prep->spill;
  if (!heads.whole(c.row.H)) {
    const RowConfig& row = c.row;
    const RankPlan& rp = c.planned.ranks[static_cast<size_t>(c.rank)];
    return [ref, spill, &loaded, &row, &rp, heads](ResultTensor t) -> const std::vector<double>& {
      std::vector<double>().swap(loaded);
      const HeadPart at = head_part(row, rp, t, heads);
      loaded = ref ? gather_heads((*ref)[t], at) : spill->load_part(t, at);
      return loaded;
    };
  }
  if (ref) return [ref](ResultTensor t) -> const std::vector<double>& { return (*ref)[t]; };
  return [spill, &loaded](ResultTensor t) -> const std::vector<double>& {
    std::vector<double>().swap(loaded);
    loaded = spill->load_tensor(t);
    return loaded;
  };
}

// Where a rank's reference slice goes while it is built: into memory, or its spill file.
struct SliceSink {
  std::shared_ptr<RankReference> ref;  // null when spilled
  std::shared_ptr<ReferenceSpill> file;
  // Tensor t's part of the head range (the whole tensor when whole), freed once put.
  void put(const RowConfig& row, const RankPlan& rp, ResultTensor t, HeadRange heads, std::vector<double>& part) {
    if (heads.whole(row.H)) {
      if (file) return file->put(t, part);
      (*ref)[t] = std::move(part);
      return;
    }
    const HeadPart at = head_part(row, rp, t, heads);
    if (file) return file->put_part(t, part, at.rows, at.heads, at.width, at.first, at.count);
    std::vector<double>& whole = (*ref)[t];
    whole.resize(static_cast<size_t>(at.rows * at.heads * at.width));
    scatter_heads(part, at, whole);
    std::vector<double>().swap(part);
  }
};

// One head range of the rank's slice: its sequences' references for those heads, their parts of
// every tensor and of the pieces' probes and Param gradients.
void add_head_range(const RowContext& c, const RankPlan& my, ReferenceCache& cache, HeadRange heads, SliceSink& sink,
                    std::vector<SequenceReference>& pieces) {
  const auto refs = rank_references(my, cache, heads);
  for (size_t p = 0; p < refs.size(); ++p) add_piece_part(c.row, *piece_slice(*refs[p], my.pieces[p]), pieces[p]);
  for (int i = 0; i < kResultTensorCount; ++i) {
    const ResultTensor t = result_tensor(i);
    std::vector<double> v = reference_tensor_for_rank(c.row, my, refs, t, heads);
    if (!v.empty()) sink.put(c.row, my, t, heads, v);
  }
}

// The cancellation-aware scales of dA_log / ddt_bias from the rank's gates and reference dg
// (collective; none without those parameters).
ParamScales rank_param_scales(const RowContext& c, const RankPlan& my, const SliceSink& sink, Communicator& comm) {
  if (!c.row.A_log && !c.row.dt_bias) return {};
  std::vector<double> loaded;  // a spilled slice's dg, read back
  if (sink.file) loaded = sink.file->load_tensor(ResultTensor::dg);
  const std::vector<double>& dg = sink.file ? loaded : (*sink.ref)[ResultTensor::dg];
  return param_grad_scales(c.row, make_gate_inputs(c.row, c.sel.digest, my.global_begin, my.global_end), dg, comm);
}

// This rank's slice of the row's FP64 reference, built one group of heads at a time (all heads
// at once unless the sequences' results pass RunOptions::reference_group_bytes) and one tensor at
// a time from the sequences' references, put away part by part when it is large; the scales from
// the gates, and per piece the Param gradients and probes. Collective (a barrier per group, after
// which the group's sequences go; the scales).
std::shared_ptr<const RankPrepared> prepare_reference(const RowContext& c, const RunOptions& opt, Communicator& comm,
                                                      ReferenceCache& cache) {
  const RowConfig& row = c.row;
  const RankPlan& my = c.planned.ranks[comm.rank()];
  const int64_t spill_at = c.sel.reference_spill_bytes != kReferenceSpillAuto ? c.sel.reference_spill_bytes
                           : opt.reference_spill_bytes == kReferenceSpillAuto ? kReferenceSpillBytes
                                                                              : opt.reference_spill_bytes;
  const bool spill = spill_at >= 0 && reference_slice_bytes(row, my) >= spill_at;
  SliceSink sink{spill ? nullptr : std::make_shared<RankReference>(),
                 spill ? std::make_shared<ReferenceSpill>() : nullptr};
  std::vector<SequenceReference> pieces(my.pieces.size());
  // One count for every rank (a barrier per group): the hosts of an mpirun may have chosen
  // differently (SelectedRow::reference_group_bytes, from each host's memory).
  const int64_t group_bytes =
      c.sel.reference_group_bytes != kReferenceGroupAuto ? c.sel.reference_group_bytes : opt.reference_group_bytes;
  int64_t wanted = reference_head_groups(row, group_bytes);
  comm.allreduce(&wanted, 1, ReduceOp::Max);
  const int groups = static_cast<int>(wanted);
  if (groups > 1 && comm.rank() == 0)
    log::debug("row {}: the FP64 reference runs in {} groups of heads ({} q/k heads each)", row.name, groups,
               row.H / groups);
  for (int g = 0; g < groups; ++g) {
    const HeadRange heads = groups == 1 ? HeadRange{} : HeadRange{g * row.H / groups, row.H / groups};
    add_head_range(c, my, cache, heads, sink, pieces);
    if (groups == 1) continue;
    comm.barrier();  // every rank of the process has its part: the group's sequences go
    cache.release(heads);
  }
  auto prep = std::make_shared<RankPrepared>();
  for (SequenceReference& p : pieces)
    prep->piece_refs.push_back(std::make_shared<const SequenceReference>(std::move(p)));
  prep->param_scales = rank_param_scales(c, my, sink, comm);
  prep->ref = sink.ref;
  prep->spill = sink.file;
  return prep;
}  // this rank's hold on the sequences' full FP64 results ends here

// The planned schedule and the reference slice of one row on this rank (collective: the row's
// reference cache is released once every rank of the process has its slice).
RowContext prepare_row(const SelectedRow& sel, const RunOptions& opt, Communicator& comm,
                       const kernels::Backend& backend, ReferenceStore& refs, size_t row_no, size_t row_total) {
  const RowConfig& row = *sel.row;
  const int r = comm.rank(), W = comm.size();
  if (W != row.world)
    KCP_THROW(ConfigError, "row {} needs W = {} ranks, this run has {} (launch with mpirun -np {} or without mpirun)",
              row.name, row.world, W, row.world);
  RowContext c{row, sel, {}, {}, {}, {}, {}, {}};
  c.row_no = row_no;
  c.row_total = row_total;
  c.rank = r;
  int64_t groups = opt.external ? 1 : sel.head_groups;  // every rank runs the most any was given
  comm.allreduce(&groups, 1, ReduceOp::Max);
  c.head_groups = static_cast<int>(groups);
  KCP_REQUIRE(!opt.dumper || groups == 1,
              "row {}: --dump writes whole tensors, and the row runs in {} groups of heads (--head-group never, or a "
              "smaller row)",
              row.name, groups);
  KCP_CHECK(groups >= 1 && row.H % groups == 0, "row {}: {} groups of heads do not divide H = {}", row.name, groups,
            row.H);
  c.req.world = W;
  c.req.device = !row.plan_device.empty() ? row.plan_device : opt.device_class;
  c.req.sm_count = opt.sm_count;
  if (opt.external) c.req.forced_P = 1;  // whole sequences: one segment each, no boundary to judge
  c.planned = make_plan(row, c.req);
  RunOptions row_opt = opt;
  if (opt.sweep_auto) row_opt.forced_P = auto_sweep_P(c.planned);
  c.forms = opt.external ? std::vector<Form>{Form{}} : expand_forms(row, row_opt);
  const RankPlan& my = c.planned.ranks[r];
  if (opt.external) c.shard = form_shard(c, r);
  // A row the backend cannot run is recorded as skipped in every form, with its reason, and
  // needs no reference.
  c.backend_status = opt.external ? kernels::Status::success() : backend.can_implement(kernel_problem(row));
  // Rows whose state work (tokens x value heads x K x V) passes 2^30 take a while per step on a
  // CPU (int3 row B4 on 2 cores: 21 s of FP64 reference, ~50 s per form), so their steps are
  // announced; int1-sized rows stay one line per entry.
  c.announce = double(row.total_tokens()) * row.HV * row.K * row.V > double(1 << 30);
  const bool runnable = c.backend_status.ok;
  // calibrate's second twin takes the slices its first twin prepared (ReferenceStore keep).
  c.prep = runnable ? refs.kept(sel.digest, r) : nullptr;
  const bool compute = runnable && !c.prep;
  if (c.announce && compute)
    log::progress0("[{}/{}] {}: FP64 reference of {} tokens, {} value heads ...", row_no, row_total, row.name,
                   row.total_tokens(), row.HV);
  const auto t_ref = std::chrono::steady_clock::now();
  set_phase("FP64 reference");
  ReferenceCache* cache = nullptr;
  if (compute) {
    cache = &refs.for_row(row, sel.digest, probe_positions(c, opt));
    c.prep = prepare_reference(c, opt, comm, *cache);
    refs.keep(sel.digest, r, c.prep);
  }
  if (!c.prep) c.prep = std::make_shared<RankPrepared>();
  c.ref_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_ref).count();
  if (c.announce && compute)
    log::progress0("[{}/{}] {}: FP64 reference ready ({:.1f} s)", row_no, row_total, row.name, c.ref_seconds);
  if (opt.dumper && runnable) {
    RankReference loaded;
    dump_row(*opt.dumper, row, my, form_shard(c, r), judged_reference(c, loaded), c.prep->piece_refs,
             c.prep->param_scales, r);
  }
  comm.barrier();
  if (c.announce) {  // every rank has its slice: the computing is done (and the cache lives on
                     // until every rank has read it: release destroys it)
    if (cache)
      log::progress0(
          "[{}/{}] {}: FP64 reference split: recurrence {:.1f} s and input draws {:.1f} s, summed over "
          "sequences and groups of heads; the rest slicing, spilling, loading",
          row_no, row_total, row.name, cache->compute_seconds() - cache->inputs_seconds(), cache->inputs_seconds());
    comm.barrier();
  }
  refs.release(sel.digest);  // every rank of this process has its slice: the row's cache goes
  return c;
}

// The plan of a form (forced schedules: eligibility by the row's rule unless in a sweep, then a
// plan of their own), or why the form is skipped.
std::string plan_form(const RowContext& c, const Form& form, const RunOptions& opt, const kernels::Backend& backend,
                      SegmentPlan& plan) {
  plan = c.planned;
  std::string skip;
  // A rank that cannot take the P at all is said first (no rule could run it), then the rule.
  if (form.forced_P > 0) skip = forced_plan(c, form.forced_P, opt, plan);
  if (skip.empty()) skip = fault_skip_reason(opt.fault, plan);
  if (skip.empty() && !c.backend_status.ok)
    skip = fmt::format("backend {} cannot run this row: {}", backend.name(), c.backend_status.reason);
  return skip;
}

// The fields every entry of a form has, run or skipped.
Entry entry_head(const RowContext& c, const Form& form, const RunOptions& opt, const SegmentPlan& plan) {
  Entry entry;
  entry.id = c.row.name + "/" + form.label() + (c.sel.other_seed ? fmt::format("/seed{}", c.row.seed) : "");
  entry.row = c.row.name;
  entry.row_digest = c.sel.digest;
  if (!c.sel.json.empty()) entry.row_config = nlohmann::json::parse(c.sel.json);
  entry.seed = c.row.seed;
  entry.form = EntryForm{to_string(form.package), to_string(form.saved), form.forced_P};
  entry.fault = opt.fault.name();
  if (opt.sweep) entry.sweep = true;
  entry.planned_P.emplace();
  for (const auto& rp : c.planned.ranks) entry.planned_P->push_back(rp.P);
  entry.plan = plan_json(plan, false);
  return entry;
}

// The det package's bitwise checks (docs/design.md 5): a rerun of det/full gives the same bits,
// and det/light the bits of det/full (compared by digest; det_full keeps one per schedule; a
// form run by groups of heads compares the groups' digests folded in group order). Returns the checks made (none when
// no check applies) and sets `broken` to why not.
Determinism det_checks(const RowContext& c, const Form& form, const SegmentPlan& plan, const ResultDigest& bits,
                       std::map<int, ResultDigest>& det_full, Communicator& comm, const kernels::Backend& backend,
                       const EngineOptions& eo, std::string& broken) {
  Determinism det;
  std::vector<std::string> differ;
  if (form.saved == SavedKind::Full) {
    // The rerun draws its inputs again (never the kept shard): it holds the whole path, inputs
    // included, to the same bits.
    const ResultDigest again =
        run_form_by_head_groups(c.row, c.sel.digest, plan, form, c.head_groups, comm, backend, eo, nullptr).bits;
    differ = differing_tensors(comm, bits, again);
    det.rerun_identical = differ.empty();
    if (!differ.empty()) broken = fmt::format("det package: a rerun differs in {}", fmt::join(differ, ", "));
    det_full[form.forced_P] = bits;
  } else if (auto it = det_full.find(form.forced_P); it != det_full.end()) {
    differ = differing_tensors(comm, it->second, bits);
    det.full_vs_light_identical = differ.empty();
    if (!differ.empty()) broken = fmt::format("det package: light differs from full in {}", fmt::join(differ, ", "));
  }
  if (!differ.empty()) det.differing = differ;
  return det;
}

// A ratio for the table: 4 decimals, from 1e6 on scientific notation (a huge ratio printed
// hundreds of digits), non-finite as "nan" / "inf".
std::string ratio_text(double r) {
  if (!std::isfinite(r)) return fmt::format("{}", r);
  return std::fabs(r) >= 1e6 ? fmt::format("{:.3e}", r) : fmt::format("{:.4f}", r);
}

// " at rank 1, token 1023, segment 2" (a state tensor names its sequence), "" when unknown.
std::string where_text(const WorstElement& w) {
  if (w.rank < 0) return "";
  std::string s = fmt::format(" at rank {}", w.rank);
  if (w.token >= 0)
    s += fmt::format(", token {}", w.token);
  else if (w.seq >= 0)
    s += fmt::format(", sequence {}", w.seq);
  if (w.segment >= 0) s += fmt::format(", segment {}", w.segment);
  return s;
}

// The table's short reason of a failing entry: its worst failing tensor (non-finite values first,
// then the larger ratio), with the worst element's location, and how many more tensors fail.
// The entry's `reason` in the JSON keeps every tensor.
std::string short_reason(const std::map<std::string, TensorMetrics>& tensors) {
  auto severity = [](const TensorMetrics& m) {
    if (!m.has_budget) return -1.0;
    if (m.nonfinite > 0) return double(INFINITY);
    const double r = std::max(m.ratio_max, m.rms_ratio);
    return std::isnan(r) ? double(INFINITY) : r;
  };
  const TensorMetrics* worst = nullptr;
  int failing = 0;
  for (const auto& [name, m] : tensors) {
    if (m.pass) continue;
    ++failing;
    if (!worst || severity(m) > severity(*worst)) worst = &m;
  }
  if (!worst) return "";
  const TensorMetrics& m = *worst;
  std::string s = !m.has_budget ? m.name + ": no budget (run kcpbench calibrate)"
                  : m.nonfinite ? fmt::format("{}: {} non-finite values{}", m.name, m.nonfinite, where_text(m.worst))
                                : fmt::format("{}: ratio_max {}, rms ratio {}{}", m.name, ratio_text(m.ratio_max),
                                              ratio_text(m.rms_ratio), where_text(m.worst));
  if (failing > 1) s += fmt::format(" (+{} more tensor{})", failing - 1, failing > 2 ? "s" : "");
  return s;
}

// The table's columns (table_header names them).
constexpr const char* kTableLine = "{:<8}{:<4} {:<22} {:<12} {:>10} {:<6} {:>10} {:<6} {:>9}  {}";

}  // namespace

std::string table_header() {
  return fmt::format(kTableLine, "", "row", "form", "P per rank", "ratio_max", "tensor", "rms ratio", "tensor",
                     "total ms", "verdict");
}

namespace {

// The table line of a run entry (rank 0). A failing line survives -q. An entry without any
// budget (and every entry while calibrating) shows what it measured: the largest max-abs error
// and rel-RMS error over its tensors.
void log_entry(const Entry& entry, const RowContext& c, const std::string& label, const SegmentPlan& plan,
               const RunOptions& opt) {
  const Timings& t = entry.timings_ms;
  const std::string prog = fmt::format("[{}/{}]", c.row_no, c.row_total);
  const double ms = t.total ? t.total->median : 0.0;
  bool any_budget = false;
  const TensorMetrics *abs = nullptr, *rel = nullptr;
  for (const auto& [name, m] : *entry.tensors) {
    any_budget = any_budget || m.has_budget;
    if (!abs || !(m.max_abs <= abs->max_abs)) abs = &m;
    if (!rel || !(m.rel_rms <= rel->rel_rms)) rel = &m;
  }
  // A failure no tensor explains (an external adapter's missing or malformed output) shows the
  // entry's reason.
  const std::string why = short_reason(*entry.tensors);
  const std::string verdict = entry.status == "pass"   ? std::string("PASS")
                              : entry.status == "fail" ? "FAIL: " + (why.empty() ? entry.reason.value_or("") : why)
                                                       : "CONTRACT BROKEN: " + entry.reason.value_or("");
  std::string line;
  if (abs && (opt.calibrating || !any_budget)) {
    line = fmt::format("{:<8}{:<4} {:<22} {:<12} max-abs {:.3e} ({}) rel-RMS {:.3e} ({}) {:>9.1f}  {}", prog,
                       c.row.name, label, p_text(plan), abs->max_abs, abs->name, rel->rel_rms, rel->name, ms,
                       opt.calibrating          ? std::string("measured (calibrating)")
                       : entry.status == "fail" ? std::string("FAIL: no budget (run kcpbench calibrate)")
                                                : verdict);
  } else {
    line = fmt::format(kTableLine, prog, c.row.name, label, p_text(plan), ratio_text(entry.worst.ratio_max),
                       entry.worst.ratio_max_tensor, ratio_text(entry.worst.rms_ratio), entry.worst.rms_ratio_tensor,
                       fmt::format("{:.1f}", ms), verdict);
  }
  if (entry.status != "pass" && !opt.calibrating)
    log::always0("{}", line);
  else
    log::info0("{}", line);
  if (t.phases) log_phase_medians(*t.phases);
}

// Rank 0's entry fields of a run form, and its table line.
void finish_entry(Entry& entry, const RowContext& c, const std::string& label, const SegmentPlan& plan,
                  const std::vector<TensorMetrics>& ms, const Verdict& v, const std::string& status,
                  const std::string& broken, const std::optional<Determinism>& det, const Timings& timings,
                  const std::vector<double>& mem_all, const RunOptions& opt) {
  entry.status = status;
  if (!v.pass) entry.reason = v.reason;
  if (!broken.empty()) entry.reason = broken;
  entry.tensors.emplace();
  for (const auto& m : ms) (*entry.tensors)[m.name] = m;
  entry.worst = {v.worst_ratio ? v.worst_ratio->ratio_max : 0.0, v.worst_rms ? v.worst_rms->rms_ratio : 0.0,
                 v.worst_ratio ? v.worst_ratio->name : "", v.worst_rms ? v.worst_rms->name : ""};
  entry.determinism = det;
  entry.timings_ms = timings;
  entry.memory_bytes_per_rank.clear();
  for (double b : mem_all) entry.memory_bytes_per_rank.push_back(int64_t(b));
  entry.reference_seconds_rank0 = c.ref_seconds;
  log_entry(entry, c, label, plan, opt);
}

// The faulting rank's location, gathered from every rank (rank 0 writes it into the entry).
void record_fault_at(Entry* entry, const RankResult& res, Communicator& comm) {
  const int W = comm.size();
  double loc[3] = {double(res.faulted_token >= 0 ? comm.rank() : -1), double(res.faulted_token),
                   double(res.faulted_segment)};
  std::vector<double> all(3 * W);
  comm.allgather(loc, all.data(), 3);
  if (!entry) return;
  for (int q = 0; q < W; ++q)
    if (all[3 * q + 1] >= 0) entry->fault_at = FaultAt{q, int64_t(all[3 * q + 1]), int(all[3 * q + 2])};
}

// A form whose backend refused an injected package mismatch (the contract's answer): an entry of
// its own, with the backend's message as the reason, which -q keeps.
void record_refusal(const RowContext& c, const Form& form, const std::string& message, Entry entry, int rank,
                    RunOutcome& outcome) {
  ++outcome.refused;
  if (rank != 0) return;
  entry.status = "refused";
  entry.reason = message;
  log::always0("[{}/{}] {} {}: REFUSED (as it must be): {}", c.row_no, c.row_total, c.row.name, form.label(), message);
  outcome.entries.push_back(std::move(entry));
}

// Runs one form on this rank group of heads by group (one group: every head at once) and judges
// each group's result as it comes: `ms` gets this rank's local metrics of every head (before
// reduce_metrics), --dump the whole result (one group). Returns the Param tensors, the times and
// the digest of the bits.
GroupedFormRun run_and_judge(const RowContext& c, const Form& form, const SegmentPlan& plan, Communicator& comm,
                             const kernels::Backend& backend, const EngineOptions& eo, Dumper* dumper,
                             std::vector<TensorMetrics>& ms) {
  const int r = comm.rank();
  const RankPlan& rp = plan.ranks[r];
  auto judge_group = [&](const RowConfig& part, HeadRange heads, const RankResult& res) {
    const RankReference boundary = boundary_reference(c.row, rp, c.prep->piece_refs, heads);
    std::vector<double> loaded;  // a spilled slice's tensor lives only while it is judged
    fold_head_group(ms, compare_rank(part, rp, res, judged_source(c, loaded, heads), boundary, r), c.row, heads);
    if (dumper) dump_result(*dumper, c.row, form, rp, res, boundary, r);
  };
  return run_form_by_head_groups(c.row, c.sel.digest, plan, form, c.head_groups, comm, backend, eo, judge_group,
                                 c.keep());
}

// A long row's progress line of where a form's host time went on rank 0 (GroupedFormRun; the det
// rerun is a second run without judging).
void log_host_seconds(const RowContext& c, const Form& form, const GroupedFormRun& run, double det_s) {
  if (!c.announce) return;
  log::progress0("[{}/{}] {} {}: rank 0 host time: inputs {:.1f} s, run {:.1f} s, judge {:.1f} s{}", c.row_no,
                 c.row_total, c.row.name, form.label(), run.inputs_s, run.run_s, run.judge_s,
                 det_s > 0 ? fmt::format(", det checks {:.1f} s", det_s) : std::string());  // 0: none ran
}

// Runs one form on every rank, judges it and counts it; rank 0 appends its entry.
void run_one_form(const RowContext& c, const Form& form, const RunOptions& opt, Communicator& comm,
                  const kernels::Backend& backend, std::map<int, ResultDigest>& det_full, RunOutcome& outcome) {
  const int r = comm.rank();
  SegmentPlan plan;
  const std::string skip = plan_form(c, form, opt, backend, plan);
  Entry entry = entry_head(c, form, opt, plan);
  if (!skip.empty()) {
    entry.status = "skip";
    entry.reason = skip;
    ++outcome.skipped;
    if (r == 0) {
      // A skip because the backend cannot run the row is an error -q keeps; a planned skip is not.
      if (!c.backend_status.ok)
        log::always0("[{}/{}] {} {}: skipped: {}", c.row_no, c.row_total, c.row.name, form.label(), skip);
      else
        log::info0("[{}/{}] {} {}: skipped: {}", c.row_no, c.row_total, c.row.name, form.label(), skip);
      outcome.entries.push_back(std::move(entry));
    }
    return;
  }
  EngineOptions eo;
  eo.threads = opt.threads;
  eo.fault = opt.fault;
  eo.warmup = opt.warmup;
  eo.repeats = opt.repeats;
  eo.phase_times = opt.phase_times;
  // The det checks run without faults, and with the one fault that exists to fail them.
  const bool checks = form.package == Package::Det && opt.determinism_checks &&
                      (opt.fault.kind == FaultKind::None || opt.fault.kind == FaultKind::NondeterministicRerun);
  if (c.announce)
    log::progress0("[{}/{}] {} {}: running{} ...", c.row_no, c.row_total, c.row.name, form.label(),
                   checks && form.saved == SavedKind::Full ? " (and a det rerun)" : "");
  GroupedFormRun run;
  std::vector<TensorMetrics> ms;  // this rank's, every group folded in
  try {
    run = run_and_judge(c, form, plan, comm, backend, eo, opt.dumper, ms);
  } catch (const RefusedError& e) {
    if (!is_package_mismatch(opt.fault.kind)) throw;
    record_refusal(c, form, e.what(), std::move(entry), r, outcome);  // every rank refuses in the same phase
    return;
  }
  reduce_metrics(ms, comm);
  RankResult& res = run.rest;  // the Param tensors of every head, the times
  for (auto& m : compare_parameter_grads(c.row, plan.ranks[r], res, c.prep->piece_refs, c.prep->param_scales, comm))
    ms.push_back(m);
  judge(ms, c.row, form.forced_P);
  const Verdict v = summarize(ms);
  const ResultDigest bits = run.bits;
  std::string broken;
  if (is_package_mismatch(opt.fault.kind))
    broken = fmt::format("the backend ran a backward given {} instead of refusing it", opt.fault.name());
  std::optional<Determinism> det;  // null when no det check runs
  const auto t_det = std::chrono::steady_clock::now();
  if (checks) det = det_checks(c, form, plan, bits, det_full, comm, backend, eo, broken);
  log_host_seconds(c, form, run,
                   checks ? std::chrono::duration<double>(std::chrono::steady_clock::now() - t_det).count() : 0.0);
  // Timings: per repeat the slowest rank, then median / min / max / p90 over repeats.
  Timings timings = timing_stats(res, comm, opt.phase_times, opt.repeats);
  if (c.head_groups > 1)
    timings.what += fmt::format("; the forms ran in {} groups of heads (--head-group): each time is the groups' sum",
                                c.head_groups);
  std::vector<double> mem_all(comm.size());
  const double mem_mine = double(res.device_bytes);
  comm.allgather(&mem_mine, mem_all.data(), 1);
  const std::string status = !broken.empty() ? "contract_broken" : v.pass ? "pass" : "fail";
  ++(status == "pass" ? outcome.passed : status == "fail" ? outcome.failed : outcome.contract_broken);
  if (r == 0) finish_entry(entry, c, form.label(), plan, ms, v, status, broken, det, timings, mem_all, opt);
  if (opt.fault.kind != FaultKind::None) record_fault_at(r == 0 ? &entry : nullptr, res, comm);
  if (r == 0) outcome.entries.push_back(std::move(entry));
}

// The metrics of what an external command wrote: the built-in comparison (compare_rank,
// compare_parameter_grads, judge), less the tensors it did not provide or wrote malformed, which
// fail the entry through its reason instead of a metric (docs/external.md).
std::vector<TensorMetrics> judge_external(const RowContext& c, const ExternalRun& run, Communicator& comm, Verdict& v) {
  const RankPlan& rp = c.planned.ranks[0];
  const RankReference boundary = boundary_reference(c.row, rp, c.prep->piece_refs);
  std::vector<double> loaded;
  std::vector<TensorMetrics> ms = compare_rank(c.row, rp, run.result, judged_source(c, loaded), boundary, 0);
  reduce_metrics(ms, comm);
  for (auto& m : compare_parameter_grads(c.row, rp, run.result, c.prep->piece_refs, c.prep->param_scales, comm))
    ms.push_back(m);
  const auto& missing = run.not_provided;
  ms.erase(std::remove_if(ms.begin(), ms.end(),
                          [&](const TensorMetrics& m) {
                            return std::find(missing.begin(), missing.end(), m.name) != missing.end();
                          }),
           ms.end());
  judge(ms, c.row);
  v = summarize(ms);
  if (!run.problems.empty()) {
    v.pass = false;
    v.reason = fmt::format("{}", fmt::join(run.problems, "; ")) + (v.reason.empty() ? "" : "; " + v.reason);
  }
  return ms;
}

// --backend exec: the row's one external form (W = 1, one process): write the inputs, run the
// command, judge what it wrote like any backend's result. A command that fails as a whole (exit
// status, signal, time limit, no output) fails the entry with no tensors; past the time limit it
// also counts as timed out (exit code 5).
void run_external_form(const RowContext& c, const RunOptions& opt, Communicator& comm, RunOutcome& outcome) {
  Entry entry = entry_head(c, Form{}, opt, c.planned);
  entry.id = c.row.name + "/external" + (c.sel.other_seed ? fmt::format("/seed{}", c.row.seed) : "");
  entry.form = EntryForm{"external", "none", 0};
  // The command has the row deadline as its own time limit (it kills the process group), so the
  // watchdog leaves this rank alone while it runs and watches the judging again afterwards.
  clear_phase();
  const ExternalRun run = run_external(*opt.external, c.row, c.sel.digest, c.shard, c.planned.ranks[0]);
  set_row(c.row.name);
  set_phase("judge the external outputs");
  entry.external = run.to_json(opt.external->command);
  Timings timings;
  timings.wall_total = timings.total = sample_stats({1e3 * run.seconds});
  timings.what = "external command: total and wall_total are its wall time (start, kernel, files); no kernel timers";
  Verdict v;
  std::vector<TensorMetrics> ms;
  if (run.failure.empty()) ms = judge_external(c, run, comm, v);
  if (!run.failure.empty()) v = Verdict{nullptr, nullptr, false, run.failure};
  outcome.timed_out += run.timed_out ? 1 : 0;
  ++(v.pass ? outcome.passed : outcome.failed);
  finish_entry(entry, c, "external", c.planned, ms, v, v.pass ? "pass" : "fail", "", std::nullopt, timings, {0.0}, opt);
  outcome.entries.push_back(std::move(entry));
}

}  // namespace

RunOutcome run_rows(const std::vector<SelectedRow>& rows, const RunOptions& opt, Communicator& comm,
                    const kernels::Backend& backend, ReferenceStore& refs) {
  RunOutcome outcome;
  size_t row_no = static_cast<size_t>(opt.progress_offset);
  const size_t row_total = opt.progress_total > 0 ? static_cast<size_t>(opt.progress_total) : rows.size();
  for (const SelectedRow& sel : rows) {
    set_row(sel.row->name);  // the deadline watchdog measures each row from here
    const RowContext c = prepare_row(sel, opt, comm, backend, refs, ++row_no, row_total);
    std::map<int, ResultDigest> det_full;  // per schedule: the det/full result's digest
    if (opt.external && c.backend_status.ok) {
      run_external_form(c, opt, comm, outcome);
      continue;
    }
    for (const Form& form : c.forms) {
      run_one_form(c, form, opt, comm, backend, det_full, outcome);
      if (c.announce && opt.after_long_form && comm.rank() == 0) opt.after_long_form(outcome);
    }
  }
  clear_phase();
  return outcome;
}

}  // namespace kcp
