// The memory estimate of a row (see memory_estimate.h for what is counted and why).
#include "core/plan/memory_estimate.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/inputs/inputs.h"
#include "core/kcp/kcp_engine.h"
#include "core/kcp/rank_exchange.h"
#include "core/kcp/rank_result.h"
#include "core/util/error.h"

namespace kcp {

namespace {
// a `sign` b, or ConfigError naming the row when either is negative or the result overflows.
template <class Op>
int64_t checked(int64_t a, int64_t b, Op overflows, const char* sign, const std::string& row, const char* what) {
  int64_t r = 0;
  if (a < 0 || b < 0 || overflows(a, b, &r))
    KCP_THROW(ConfigError, "row {}: the memory of {} does not fit in 64 bits ({} {} {}): the row is too large to run",
              row, what, a, sign, b);
  return r;
}
}  // namespace

int64_t checked_mul(int64_t a, int64_t b, const std::string& row, const char* what) {
  return checked(
      a, b, [](int64_t x, int64_t y, int64_t* r) { return __builtin_mul_overflow(x, y, r); }, "x", row, what);
}

int64_t checked_add(int64_t a, int64_t b, const std::string& row, const char* what) {
  return checked(
      a, b, [](int64_t x, int64_t y, int64_t* r) { return __builtin_add_overflow(x, y, r); }, "+", row, what);
}

std::string human_bytes(int64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

namespace {

constexpr int64_t kFloat = 4, kDouble = 8;
// Binary, shared libraries, allocator arenas and thread stacks of a kcpbench process: peak RSS is
// 7 MiB for `plan` and 23 MiB for the smallest int1 run (A2, one rank); 48 MiB leaves room for
// the per-thread allocator arenas of more ranks.
constexpr int64_t kFixedBytes = int64_t(48) << 20;
// Per rank of the process: what its thread's allocator arena keeps of freed arrays below glibc's
// mmap threshold (main sets it to 1 MiB) and its stacks. int3 A4's calibrate peaked 33 MB above
// the sum of the terms counted here (20685444 kB with main's code at a2569bf; 20558104 kB now,
// 94 MB under them): 32 MiB a rank keeps the estimate above both.
constexpr int64_t kPerRankBytes = int64_t(32) << 20;
// The FP64 reference's checkpoint windows (reference/detail.h Tuning: window 64, at most 256
// checkpoints per work item before it switches to two levels of about sqrt(windows) each).
constexpr int64_t kRefWindow = 64, kRefMaxCheckpoints = 256;
// The block a spilled slice's part is read back in (core/compare/reference_spill.h kReadBlockBytes).
constexpr int64_t kReadBlock = int64_t(8) << 20;

// Sums of sizes, every step checked and named.
struct Sizer {
  const std::string& row;
  int64_t mul(std::initializer_list<int64_t> f, const char* what) const {
    int64_t r = 1;
    for (int64_t x : f) r = checked_mul(r, x, row, what);
    return r;
  }
  int64_t add(std::initializer_list<int64_t> f, const char* what) const {
    int64_t r = 0;
    for (int64_t x : f) r = checked_add(r, x, row, what);
    return r;
  }
};

// Elements per token of a Token result tensor (heads x width, width 0 meaning 1).
int64_t per_token(const RowConfig& row, ResultTensor t) {
  const auto [heads, width] = token_dims(row, t);
  return heads * std::max<int64_t>(width, 1);
}

// Floats of memory an array of n 16-bit elements takes (core/kcp/device_array.h, DtypeArray).
int64_t floats_of_16bit(int64_t n) { return (n + 1) / 2; }

// Whether a result tensor is a caller dtype tensor, 16-bit in the form's arrays (kernels/api/tensors.h).
bool is_16bit_result(ResultTensor t) {
  return t == ResultTensor::o || t == ResultTensor::dq || t == ResultTensor::dk || t == ResultTensor::dv;
}

// Elements per token of the inputs q, k, v, g, beta, dO.
int64_t input_per_token(const RowConfig& row) {
  const int64_t gw = row.op == Op::Kda ? row.K : 1;
  return 2 * int64_t(row.H) * row.K + 2 * int64_t(row.HV) * row.V + int64_t(row.HV) * gw + row.HV;
}

// Host bytes of a rank's input shard (core/inputs/inputs.h): the token tensors of its range and,
// when the row has them, h0 / dht of every global sequence.
int64_t shard_bytes(const RowConfig& row, int64_t tokens, const Sizer& s) {
  const int64_t HVKV = s.mul({row.HV, row.K, row.V}, "a state");
  const int64_t nseq = static_cast<int64_t>(row.seqlens.size());
  const int64_t states = (row.initial_state ? 1 : 0) + (row.dht ? 1 : 0);
  return s.mul({kFloat, s.add({s.mul({tokens, input_per_token(row)}, "the input shard"),
                               s.mul({states, nseq, HVKV}, "the input states"), 2 * int64_t(row.HV) * row.K},
                              "the input shard")},
               "the input shard");
}

// Doubles per token of a sequence's FP64 results (o, dq, dk, dv, dg, dbeta).
int64_t reference_per_token(const RowConfig& row) {
  int64_t tok = 0;
  for (ResultTensor t :
       {ResultTensor::o, ResultTensor::dq, ResultTensor::dk, ResultTensor::dv, ResultTensor::dg, ResultTensor::dbeta})
    tok += per_token(row, t);
  return tok;
}

// Host bytes of the FP64 reference of one sequence as ReferenceCache holds it, with S_p and dS_p
// at `probes` positions (docs/algorithm.md 1.4).
int64_t sequence_reference_bytes(const RowConfig& row, int64_t len, int64_t probes, const Sizer& s) {
  const int64_t HVKV = s.mul({row.HV, row.K, row.V}, "a state");
  const int64_t tok = reference_per_token(row);
  const int64_t gw = row.op == Op::Kda ? row.K : 1;
  return s.mul({kDouble, s.add({s.mul({len, tok}, "the FP64 reference"), HVKV, row.initial_state ? HVKV : 0,
                                int64_t(row.HV) * (1 + gw), s.mul({2, probes, HVKV}, "the FP64 probes")},
                               "the FP64 reference")},
               "the FP64 reference");
}

// Host bytes the FP64 reference computation of one sequence uses besides its results: the
// sequence's inputs as float (make_inputs; the reference reads them as double where it reads
// them), the prepared per-token arrays (reference/detail.h Prepared) and the checkpointed states
// of the work items running at once (at most one per thread and value head, each over all of
// K x V). `row`: the shape computed (head_range_row of a group of heads).
int64_t reference_work_bytes(const RowConfig& row, int64_t len, int threads, const Sizer& s) {
  const int64_t HVKV = s.mul({row.HV, row.K, row.V}, "a state");
  const int64_t gw = row.op == Op::Kda ? row.K : 1;
  const int64_t nseq = static_cast<int64_t>(row.seqlens.size());
  const int64_t states = (row.initial_state ? 1 : 0) + (row.dht ? 1 : 0);
  // Every input token tensor, and h0 / dht of every sequence (make_inputs makes them for all).
  const int64_t in_f = s.mul({kFloat, s.add({s.mul({len, input_per_token(row)}, "the reference inputs"),
                                             s.mul({states, nseq, HVKV}, "the reference inputs")},
                                            "the reference inputs")},
                             "the reference inputs");
  int64_t prep_per_token = int64_t(row.H) + int64_t(row.HV) * gw;  // qk, dec
  if (row.qk_l2norm) prep_per_token += 2 * int64_t(row.H);         // rstd_q, rstd_k
  const int64_t prepared = s.mul({kDouble, len, prep_per_token}, "the reference's prepared arrays");
  const int64_t windows = (len + kRefWindow - 1) / kRefWindow;
  const int64_t seg = int64_t(std::ceil(std::sqrt(double(windows))));
  const int64_t ckpt = windows <= kRefMaxCheckpoints ? windows : seg + (windows + seg - 1) / seg;
  const int64_t items = std::min<int64_t>(std::max(threads, 1), row.HV);
  const int64_t checkpoints =
      s.mul({kDouble, items, ckpt + 4, int64_t(row.K), int64_t(row.V)}, "the reference's checkpoints");
  return s.add({in_f, prepared, checkpoints}, "the FP64 reference's working set");
}

// One form's arrays on one rank (core/kcp/form_buffers.cpp), in bytes; saved / ws out.
int64_t form_bytes(const RowConfig& row, const RankPlan& rp, int world, SavedKind kind, const MemoryRequest& req,
                   const Sizer& s, int64_t& saved_out, int64_t& ws_out, int64_t& inputs_out) {
  const kernels::Problem p = kernel_problem(row);
  const int64_t T = rp.tokens(), NT = rp.chunks, S = static_cast<int64_t>(rp.segments.size()),
                N = static_cast<int64_t>(rp.pieces.size());
  const int64_t HV = row.HV, K = row.K, V = row.V, gw = row.op == Op::Kda ? row.K : 1;
  // The kernel API's sizes (kernels/api/tensors.h) multiply unchecked: their largest products,
  // with room for the ~20 arrays they add up and the alignment, must fit first.
  const int64_t widest = std::max<int64_t>({K, V, p.chunk, gw});
  s.mul({T, HV, widest, 64}, "the workspace");
  s.mul({NT + S + N + 1, HV, K, std::max(K, V), 64}, "the workspace");
  kernels::LayoutView L;  // the counts are all the sizes read (no tables: a huge row has billions of chunks)
  L.T = T;
  L.n_chunks = NT;
  L.n_pieces = static_cast<int32_t>(N);
  L.n_segments = static_cast<int32_t>(S);
  const int64_t scratch = req.backend ? req.backend->extra_workspace_floats(p, L) : 0;
  const int64_t saved = kernels::saved_sizes(p, L, kind).total_floats();
  const int64_t ws = kernels::workspace_sizes(p, L, kind, scratch).total_floats() * (req.spare_workspace ? 2 : 1);
  const int64_t HVKV = HV * K * V;
  // q, k, v, dO as 16-bit dtype patterns (the caller storage of the CUDA backend and the CPU twin
  // that `run` uses; kernels/api/tensors.h); g and beta as floats.
  const int64_t qk16 = floats_of_16bit(s.mul({T, row.H, K}, "the form's inputs")),
                vo16 = floats_of_16bit(s.mul({T, HV, V}, "the form's inputs"));
  const int64_t inputs = s.add(
      {2 * qk16, 2 * vo16, s.mul({T, HV * gw + HV}, "the form's inputs"), row.A_log ? HV : 0, row.dt_bias ? HV * gw : 0,
       s.mul({(row.initial_state ? 1 : 0) + (row.dht ? 1 : 0), N, HVKV}, "the form's inputs")},
      "the form's inputs");
  int64_t results = 0;
  for (int i = 0; i < kResultTensorCount; ++i) {
    const ResultTensor t = result_tensor(i);
    if (place_of(t) == TensorPlace::Token) {
      const int64_t n = s.mul({T, per_token(row, t)}, "the results");
      results = s.add({results, is_16bit_result(t) ? floats_of_16bit(n) : n}, "the results");
    }
    if (place_of(t) == TensorPlace::State) results = s.add({results, s.mul({N, HVKV}, "the results")}, "the results");
    if (place_of(t) == TensorPlace::Param && row_has(row, t)) results += t == ResultTensor::ddt_bias ? HV * gw : HV;
  }
  const SummaryBlock block = summary_block(p);
  // send and gathered blocks, the incoming state and exit gradient, and the fold's start states.
  const bool sends_fwd = !rp.pieces.empty() && rp.pieces.back().to_next_rank;
  const bool receives = !rp.pieces.empty() && rp.pieces.front().from_prev_rank;
  const int64_t fold_states = 2 + (row.initial_state && receives ? 1 : 0) + (row.dht && sends_fwd ? 1 : 0);
  const int64_t exchange =
      s.add({s.mul({int64_t(world) + 1, block.floats()}, "the exchange"), fold_states * HVKV}, "the exchange");
  saved_out = s.mul({kFloat, saved}, "the saved set");
  ws_out = s.mul({kFloat, ws}, "the workspace");
  inputs_out = s.mul({kFloat, inputs}, "the form's inputs");
  return s.mul({kFloat, s.add({inputs, saved, ws, results, exchange}, "the form's arrays")}, "the form's arrays");
}

// Elements of a rank's reference slice (reference_tensor_for_rank: Token tensors, and ht / dh0
// per piece), the same count as the downloaded results of those tensors; `largest` the largest
// tensor's.
int64_t slice_elements(const RowConfig& row, const RankPlan& rp, const Sizer& s, int64_t* largest = nullptr) {
  const int64_t T = rp.tokens(), N = static_cast<int64_t>(rp.pieces.size());
  const int64_t HVKV = s.mul({row.HV, row.K, row.V}, "a state");
  int64_t elems = 0, most = 0;
  for (int i = 0; i < kResultTensorCount; ++i) {
    const ResultTensor t = result_tensor(i);
    if (!row_has(row, t)) continue;
    int64_t n = 0;
    if (place_of(t) == TensorPlace::Token) n = s.mul({T, per_token(row, t)}, "the reference slice");
    if (place_of(t) == TensorPlace::State) n = s.mul({N, HVKV}, "the reference slice");
    elems = s.add({elems, n}, "the reference slice");
    most = std::max(most, n);
  }
  if (largest) *largest = most;
  return elems;
}

// Host bytes of one rank while a row runs (core/kcp/row_runner.cpp, core/kcp/kcp_engine.cpp).
// Besides what it keeps for the whole row (`kept`: the probes of its pieces, and its reference
// slice unless spilled), one of: uploading a form (the shard made for it and the form's inputs),
// running it (the form's arrays on a host backend, the host exchange, the boundary states
// downloaded before the arrays go), or judging it (the results downloaded as the arrays were
// freed, the slice read back when spilled, the boundary reference, the comparison's scratch).
// Host bytes the CPU twin uses beside a form's arrays while a phase runs: it decodes the 16-bit
// caller tensors a phase reads or writes to floats for that phase (kernels/cpu/cpu_common.h
// CallerIn / CallerOut; at most three [T, HV, V] in the chunk backward: dO, v, dv; two [T, H, K]
// in prep and finalize); calibrate's exact-storage twin instead keeps the eight caller tensors
// as floats (2 bytes more an element than the 16-bit arrays counted). The larger of the two.
int64_t twin_scratch_bytes(const RowConfig& row, int64_t T, const Sizer& s) {
  const int64_t qk = s.mul({T, row.H, row.K}, "the twin's scratch"),
                vo = s.mul({T, row.HV, row.V}, "the twin's scratch");
  const int64_t decode = kFloat * std::max(3 * vo, 2 * qk);
  const int64_t exact = 2 * s.add({4 * qk, 4 * vo}, "the twin's scratch");
  return std::max(decode, exact);
}

// Host bytes of a rank while the row is prepared (core/kcp/row_runner.cpp prepare_reference):
// its pieces' probes (twice: a group's part and every head's), and one group of heads' part of a
// tensor on its way to the spill file or into the slice in memory (the whole slice then); then
// the scales of dA_log / ddt_bias: the rank's gates (float) and, read back when spilled, its dg.
int64_t rank_prepare_bytes(const RowConfig& row, const RowConfig& part, const RankPlan& rp, const RankMemory& m,
                           const Sizer& s) {
  int64_t largest = 0, largest_part = 0;
  slice_elements(row, rp, s, &largest);
  slice_elements(part, rp, s, &largest_part);
  const int64_t gw = row.op == Op::Kda ? row.K : 1, dg = s.mul({rp.tokens(), row.HV, gw}, "the scales");
  int64_t scales = 0;
  if (row.A_log || row.dt_bias) scales = s.mul({dg, m.reference_spilled ? kFloat + kDouble : kFloat}, "the scales");
  const bool grouped = part.H != row.H;
  const int64_t building = s.mul({kDouble, grouped || m.reference_spilled ? largest_part : 0}, "the reference slice");
  return s.add({m.probes, m.probes, m.reference_spilled ? 0 : m.reference, std::max(building, scales)},
               "the row's preparation");
}

// `part`: the shape the FP64 reference computes (one of its groups of heads); `run`: the shape a
// form runs in (one of its groups of heads, head_range_row).
void rank_host_bytes(const RowConfig& row, const RowConfig& part, const RowConfig& run, const RankPlan& rp,
                     const std::vector<SegmentPlan>& plans, const std::vector<std::set<int64_t>>& probes,
                     const MemoryRequest& req, const Sizer& s, RankMemory& m) {
  const int r = rp.rank, world = plans.front().world;
  const int64_t T = rp.tokens();
  const int64_t HVKV = s.mul({row.HV, row.K, row.V}, "a state"), run_HVKV = s.mul({run.HV, run.K, run.V}, "a state");
  const bool grouped = run.H != row.H;
  int64_t largest = 0, run_largest = 0;
  const int64_t elems = slice_elements(row, rp, s, &largest), run_elems = slice_elements(run, rp, s, &run_largest);
  m.reference = s.mul({kDouble, elems}, "the reference slice");
  const int64_t spill_at =
      req.reference_spill_bytes == kReferenceSpillAuto ? kReferenceSpillBytes : req.reference_spill_bytes;
  m.reference_spilled = spill_at >= 0 && m.reference >= spill_at;
  // piece_slice: S_p and dS_p at every probe inside each piece (over every schedule's probes).
  int64_t kept_probes = 0;
  for (const Piece& pc : rp.pieces)
    for (int64_t p : probes[size_t(pc.seq)])
      if (p >= pc.seq_offset && p <= pc.seq_offset + pc.length()) ++kept_probes;
  m.probes = s.mul({kDouble, 2, kept_probes, HVKV}, "the probes");
  m.kept = s.add({m.probes, m.reference_spilled ? 0 : m.reference}, "the reference slice");
  if (req.keep_inputs) m.kept = s.add({m.kept, m.inputs}, "the kept input shard");
  const int64_t block = int64_t(run.HV) * run.K * (run.K + run.V);
  const int64_t exchange = s.mul({kFloat, int64_t(world) + 1, block}, "the exchange");
  int64_t S = 0;  // the most segments of any schedule
  for (const SegmentPlan& pl : plans) S = std::max<int64_t>(S, static_cast<int64_t>(pl.ranks[r].segments.size()));
  const int64_t boundary_f = s.mul({kFloat, 2, S, run_HVKV}, "the boundary states");
  const int64_t boundary_d = s.mul({kDouble, 2, S, run_HVKV}, "the boundary states");
  const int64_t host_form = req.device_is_host ? m.form_arrays : 0;
  const int64_t host_inputs = req.device_is_host ? m.form_inputs : 0;
  m.upload = s.add({req.keep_inputs ? 0 : m.inputs, host_inputs}, "a form's upload");  // a kept shard is in kept
  m.twin_scratch = req.device_is_host ? twin_scratch_bytes(run, T, s) : 0;
  m.run = s.add({host_form, m.twin_scratch, exchange, boundary_f}, "a form's run");
  // The slice while judging: a spilled one read back one tensor at a time (with one reference
  // group's part of it in a buffer); by groups of heads, one run group's part of one tensor
  // (gathered from memory, or read back in blocks of ReferenceSpill::kReadBlockBytes).
  int64_t largest_part = 0;
  slice_elements(part, rp, s, &largest_part);
  int64_t read_back = 0;
  if (grouped)
    read_back = s.add({s.mul({kDouble, run_largest}, "the slice read back"), m.reference_spilled ? kReadBlock : 0},
                      "the slice read back");
  else if (m.reference_spilled)
    read_back =
        s.mul({kDouble, s.add({largest, part.H != row.H ? largest_part : 0}, "the slice")}, "the slice read back");
  m.judge = s.add({s.mul({kFloat, run_elems}, "the downloaded results"), boundary_f, read_back, boundary_d,
                   s.mul({4, T}, "the comparison")},
                  "a form's judging");
  m.host_results = m.judge;
  m.host_peak = s.add({m.kept, std::max({m.upload, m.run, m.judge})}, "the rank");
  m.prepare = rank_prepare_bytes(row, part, rp, m, s);
}

}  // namespace

namespace {

// Bytes of every sequence's FP64 results: a threads launch holds them until its ranks have their part.
double reference_results_bytes(const RowConfig& row) {
  return double(kDouble) * double(row.total_tokens()) * double(reference_per_token(row));
}

// Work items of one sequence's reference computation in one of `groups` groups of heads:
// (value head, 16 columns) pairs (reference/recurrence.cpp).
int64_t reference_items(const RowConfig& row, int groups) { return int64_t(row.HV / groups) * ((row.V + 15) / 16); }

}  // namespace

int reference_groups_for_threads(const RowConfig& row, int threads) {
  for (int n = row.H; n > 1; --n)
    if (row.H % n == 0 && reference_items(row, n) >= threads) return n;
  return 1;
}

int64_t reference_group_bytes_for(const RowConfig& row, int groups) {
  return static_cast<int64_t>(std::ceil(reference_results_bytes(row) / groups));
}

int reference_head_groups(const RowConfig& row, int64_t group_bytes) {
  if (group_bytes == kReferenceGroupNever || row.seqlens.empty()) return 1;
  KCP_CHECK(group_bytes >= 0 || group_bytes == kReferenceGroupAuto, "row {}: reference group bytes {}", row.name,
            group_bytes);
  const double whole = reference_results_bytes(row);
  const double cap = double(group_bytes == kReferenceGroupAuto ? kReferenceGroupBytes : group_bytes);
  for (int n = 1; n < row.H; ++n)
    if (row.H % n == 0 && whole / n <= cap) return n;
  return row.H;
}

int64_t spilled_reference_bytes(const MemoryEstimate& e) {
  int64_t total = 0;
  for (const RankMemory& r : e.ranks) total += r.reference_spilled ? r.reference : 0;
  return total;
}

int64_t reference_slice_bytes(const RowConfig& row, const RankPlan& rp) {
  const Sizer s{row.name};
  return s.mul({kDouble, slice_elements(row, rp, s)}, "the reference slice");
}

MemoryEstimate estimate_memory(const RowConfig& row, const MemoryRequest& req) {
  const Sizer s{row.name};
  MemoryEstimate e;
  e.row = row.name;
  const SegmentPlan planned = make_plan(row, req.plan);
  // The largest form: the planned schedule or a forced one (more segments), of either saved kind
  // (their saved set and workspace hold the same floats; with the spare workspace of the
  // workspace-of-other-package fault, a light form's larger workspace counts twice).
  std::vector<SegmentPlan> plans{planned};
  for (int P : std::set<int>(req.forced_P.begin(), req.forced_P.end())) {
    if (P <= 0 || !forced_p_unfit_reason(planned, P).empty()) continue;
    PlanRequest fr = req.plan;
    fr.forced_P = P;
    plans.push_back(make_plan(row, fr));
  }
  // The FP64 reference runs one group of heads at a time: the sequences' results and its working
  // set are those of one group (head_range_row's shape); every rank's slice gets all of them.
  e.reference_groups = reference_head_groups(row, req.reference_group_bytes);
  const RowConfig part = head_range_row(row, HeadRange{0, row.H / e.reference_groups});
  // The forms run one group of heads at a time: their shard, arrays and results are one group's.
  if (req.head_groups < 1 || row.H % req.head_groups != 0)
    KCP_THROW(ConfigError, "row {}: {} groups of heads do not divide H = {}", row.name, req.head_groups, row.H);
  KCP_CHECK(!req.keep_inputs || req.head_groups == 1, "row {}: kept inputs, {} groups", row.name, req.head_groups);
  e.head_groups = req.head_groups;
  e.keep_inputs = req.keep_inputs;
  const RowConfig run = head_range_row(row, HeadRange{0, row.H / req.head_groups});

  std::vector<int> ranks = req.ranks;
  if (ranks.empty())
    for (int r = 0; r < planned.world; ++r) ranks.push_back(r);
  e.fixed = kFixedBytes + kPerRankBytes * static_cast<int64_t>(ranks.size());
  // The probe positions the reference computes (every schedule's segment boundaries).
  std::vector<std::set<int64_t>> probes(row.seqlens.size());
  for (const SegmentPlan& pl : plans) add_probe_positions(pl, row.seqlens, probes);
  std::set<int> seqs;
  int64_t prepare = 0, forms = 0, device = 0;
  for (int r : ranks) {
    KCP_CHECK(r >= 0 && r < planned.world, "rank {} of a world of {}", r, planned.world);
    const RankPlan& rp = planned.ranks[r];
    RankMemory m;
    m.rank = r;
    m.inputs = shard_bytes(run, rp.tokens(), s);
    // One form's arrays at a time: the largest form (FormRun frees them before the next).
    for (const SegmentPlan& pl : plans)
      for (SavedKind kind : {SavedKind::Full, SavedKind::Light}) {
        int64_t saved = 0, ws = 0, in = 0;
        const int64_t f = form_bytes(run, pl.ranks[r], pl.world, kind, req, s, saved, ws, in);
        if (f > m.form_arrays) {
          m.form_arrays = f;
          m.saved_set = saved;
          m.workspace = ws;
        }
        m.form_inputs = std::max(m.form_inputs, in);
      }
    rank_host_bytes(row, part, run, rp, plans, probes, req, s, m);
    for (const Piece& pc : rp.pieces) seqs.insert(pc.seq);
    prepare = s.add({prepare, m.prepare}, "the row");
    forms = s.add({forms, m.host_peak}, "the row");
    device = s.add({device, req.device_is_host ? 0 : m.form_arrays}, "the row");
    e.ranks.push_back(m);
  }
  // The sequences the process's ranks touch are all held until every rank has its slice; as
  // many are computed at once as there are ranks (each at most one), the longest ones counted.
  std::vector<int64_t> lens;
  for (int q : seqs) {
    const int64_t n_probes = static_cast<int64_t>(probes[size_t(q)].size());
    e.sequences =
        s.add({e.sequences, sequence_reference_bytes(part, row.seqlens[q], n_probes, s)}, "the FP64 reference");
    lens.push_back(row.seqlens[q]);
  }
  std::sort(lens.rbegin(), lens.rend());
  const size_t at_once = std::min(lens.size(), ranks.size());
  for (size_t i = 0; i < at_once; ++i)
    e.reference_work =
        s.add({e.reference_work, reference_work_bytes(part, lens[i], req.reference_threads, s)}, "the FP64 reference");
  e.phase_prepare = s.add({prepare, e.sequences, e.reference_work}, "the row");
  e.phase_forms = forms;
  e.host_bytes = s.add({e.fixed, std::max(e.phase_prepare, e.phase_forms)}, "the row");
  e.device_bytes = device;
  return e;
}

}  // namespace kcp
