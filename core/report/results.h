// The results document (`kcpbench.results/1`, docs/design.md 8) as
// types: Results = Context + Entry list + Summary. `run` and `replay` build these and write them
// through to_json; `compare` and `replay` read files through from_json. One writer, one reader.
//
// to_json writes exactly what `run` has always written: non-finite numbers become null, and a
// field is present or absent by the same rule as before (std::optional members: absent when
// empty). from_json checks the type of every field it reads and throws ConfigError naming the
// JSON path of a bad one ("entries[3].tensors.dq.ratio_max: expected a number or null, got
// \"abc\""). It accepts documents that leave optional fields out (absent reads as the default),
// so hand-made files and older results still read; a run entry (pass, fail, contract_broken)
// must carry its tensors.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/config/row_config.h"

namespace kcp {

// ---- tensor metrics (computed by core/compare/compare.h, written per tensor of an entry) ----

struct WorstElement {
  int rank = -1;
  int64_t token = -1;  // global token (token tensors; h_entry / dh_exit: the boundary's) or -1
  int seq = -1;        // sequence (state tensors, and the token's sequence)
  int head = -1;
  int channel = -1;                // the innermost index (K or V channel)
  int segment = -1;                // rank-local segment index
  int64_t boundary_distance = -1;  // tokens to the nearest segment or rank boundary
  bool operator==(const WorstElement&) const = default;
};

// One tensor's metrics. `name` is the key in Entry::tensors; sum_err2 / sum_ref2 are the
// reduction's working sums and are not written. ratio_max / rms_ratio are written only with a
// budget (has_budget). Non-finite doubles are written as null and read back as NaN.
struct TensorMetrics {
  std::string name;
  int64_t count = 0;
  double max_abs = 0, rel_rms = 0, ref_max_abs = 0;
  double max_rel = 0;       // max-abs error over the scale (max|ref|; per element for dA_log / ddt_bias)
  bool has_max_rel = true;  // false in a file written before max_rel (it is then not written back)
  double sum_err2 = 0, sum_ref2 = 0;
  int64_t nonfinite = 0;  // non-finite in the backend where the reference is finite
  WorstElement worst;
  bool has_budget = false;
  Budget budget;
  double ratio_max = 0, rms_ratio = 0;
  bool pass = false;
};

// ---- the document ----

struct BuildInfo {
  std::string version, git_sha;
  bool git_dirty = false;
  std::string build_type, compiler;
  std::optional<std::string> cuda, nccl, mpi;  // null when not built
  std::optional<std::string> reference_simd;   // kcp::ref::simd_description(); absent in older files
};

struct RowSetInfo {
  std::string name, file, digest;
};

// One results file that `kcpbench merge` took entries from: its own context's date, command line
// and seeds, so an entry of a merged file stays reproducible from the file alone.
struct MergedSource {
  std::string file, date;
  std::vector<std::string> command_line;
  std::vector<uint64_t> seeds;
};

struct Context {
  std::string schema_version;
  BuildInfo build;
  std::string date;
  std::vector<std::string> command_line;
  int world_size = 1;
  std::string launch_mode, comm, backend, backend_device, device_class;
  std::vector<std::string> devices;
  std::vector<uint64_t> seeds;
  RowSetInfo row_set;
  std::optional<std::vector<MergedSource>> merged_from;  // a merged file (Entry::source indexes it)
};

struct EntryForm {
  std::string package, saved;
  int P = 0;  // 0: "planned"
};

struct Determinism {
  std::optional<bool> rerun_identical, full_vs_light_identical;
  std::optional<std::vector<std::string>> differing;
  bool operator==(const Determinism&) const = default;
};

// Median / min / max / p90 / count of a sample.
struct SampleStats {
  double median = 0, min = 0, max = 0, p90 = 0;
  int64_t count = 0;
};
using Stats = std::optional<SampleStats>;  // null when the sample is empty

struct Timings {
  Stats forward, backward, total, wall_total;
  std::string what;
  std::optional<std::map<std::string, Stats>> phases;  // with --phase-times
  std::string phases_what;                             // written with phases
};

struct WorstSummary {
  double ratio_max = 0, rms_ratio = 0;
  std::string ratio_max_tensor, rms_ratio_tensor;
};

struct FaultAt {
  int rank = -1;
  int64_t token = -1;
  int segment = -1;
  bool operator==(const FaultAt&) const = default;
};

// One (row, form) of a run. The fields from `tensors` to `reference_seconds_rank0` are the
// measurements of an entry that ran: written together, when `tensors` is set.
struct Entry {
  std::string id, row, row_digest;
  std::optional<nlohmann::json> row_config;  // the row as loaded, echoed (replay rebuilds it)
  std::optional<uint64_t> seed;
  std::optional<EntryForm> form;
  std::optional<std::string> fault;
  std::optional<bool> sweep;
  std::optional<std::vector<int>> planned_P;
  std::optional<nlohmann::json> plan;  // plan_json of the form's plan
  std::string status;                  // pass, fail, contract_broken, skip, refused (reason: the backend's words)
  std::optional<std::string> reason;
  // A run entry (status pass / fail / contract_broken) has tensors and the fields below.
  std::optional<std::map<std::string, TensorMetrics>> tensors;
  WorstSummary worst;
  std::optional<Determinism> determinism;  // null when no det check ran
  Timings timings_ms;
  std::vector<int64_t> memory_bytes_per_rank;
  double reference_seconds_rank0 = 0;
  std::optional<FaultAt> fault_at;
  // --backend exec: the command, its folder, exit status, time, the tensors it did not provide and
  // why, and its log's tail (core/kcp/external_backend.h ExternalRun::to_json).
  std::optional<nlohmann::json> external;
  std::optional<int> source;  // in a merged file: the index in context.merged_from it came from

  bool ran() const { return status == "pass" || status == "fail" || status == "contract_broken"; }
};

struct Summary {
  int passed = 0, failed = 0, skipped = 0, contract_broken = 0;
  int refused = 0;               // written only when > 0 (files before it have none)
  std::optional<bool> complete;  // false while a threads launch is still writing rows
};

struct Results {
  Context context;
  std::vector<Entry> entries;
  std::optional<Summary> summary;  // replay's --json writes none
};

// ---- JSON ----

nlohmann::json to_json(const TensorMetrics& m);
nlohmann::json to_json(const Context& c);
nlohmann::json to_json(const BuildInfo& b);
nlohmann::json to_json(const Timings& t);
nlohmann::json to_json(const Determinism& d);
nlohmann::json to_json(const Entry& e);
nlohmann::json to_json(const Summary& s);
nlohmann::json to_json(const Results& r);

// `path` names where `j` sits in the document, for error messages ("" at the root).
TensorMetrics tensor_metrics_from_json(const nlohmann::json& j, const std::string& path, const std::string& name);
Context context_from_json(const nlohmann::json& j, const std::string& path = "context");
Entry entry_from_json(const nlohmann::json& j, const std::string& path);
Summary summary_from_json(const nlohmann::json& j, const std::string& path = "summary");
Results results_from_json(const nlohmann::json& j);

// The form's P as written: "planned" or the forced count.
nlohmann::json form_P_json(const EntryForm& f);

}  // namespace kcp
