// kcpbench merge: several results files of one build and device into one (results_merge.h).
#include "core/report/results_merge.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "core/util/error.h"

namespace kcp {

namespace {

using nlohmann::json;

// The context fields that must agree, as written: a name for messages and the JSON value.
std::vector<std::pair<std::string, json>> identity(const Context& c) {
  return {{"schema_version", c.schema_version}, {"build", to_json(c.build)},      {"backend", c.backend},
          {"backend_device", c.backend_device}, {"device_class", c.device_class}, {"comm", c.comm},
          {"launch_mode", c.launch_mode},       {"row_set.name", c.row_set.name}, {"row_set.digest", c.row_set.digest}};
}

void require_same_identity(const MergeInput& first, const MergeInput& other) {
  const auto a = identity(first.results.context), b = identity(other.results.context);
  for (size_t i = 0; i < a.size(); ++i)
    KCP_REQUIRE(a[i].second == b[i].second,
                "merge: context.{} differs: {} has {}, {} has {}; only runs of the same build on the same device "
                "and row set merge",
                a[i].first, first.file, a[i].second.dump(), other.file, b[i].second.dump());
}

// The source list of one input: its own merged_from when it is a merged file, else the file itself.
std::vector<MergedSource> sources_of(const MergeInput& in) {
  const Context& c = in.results.context;
  if (c.merged_from) return *c.merged_from;
  return {MergedSource{in.file, c.date, c.command_line, c.seeds}};
}

// Replay finds an entry by its id (which names the row, the form and a seed other than the
// row's own), so a merged file holds each (id, seed) once, whatever its fault.
using EntryKey = std::pair<std::string, uint64_t>;
EntryKey key_of(const Entry& e) { return {e.id, e.seed.value_or(0)}; }

// A row that a launch could not run at all (an mpirun of another world size): one skip entry
// without a form, superseded when another file ran the row.
bool is_launch_skip(const Entry& e) { return e.status == "skip" && !e.form; }

// The counts of `run` (every entry counts once, by its status; core/report/results.h Summary).
Summary count(const std::vector<Entry>& entries, bool complete) {
  Summary s;
  for (const Entry& e : entries) {
    s.passed += e.status == "pass";
    s.failed += e.status == "fail";
    s.skipped += e.status == "skip";
    s.contract_broken += e.status == "contract_broken";
    s.refused += e.status == "refused";
  }
  s.complete = complete;
  return s;
}

}  // namespace

MergeResult merge_results(const std::vector<MergeInput>& inputs, const std::vector<std::string>& command_line,
                          const std::string& date, bool allow_dirty) {
  KCP_REQUIRE(inputs.size() >= 2, "merge: needs at least two results files, got {}", inputs.size());
  std::set<std::string> ran_rows;  // row digests some file has entries with a form of
  for (const MergeInput& in : inputs) {
    require_same_identity(inputs[0], in);
    KCP_REQUIRE(in.results.summary, "merge: {} has no summary (a replay's --json file?); merge only run files",
                in.file);
    KCP_REQUIRE(allow_dirty || !in.results.context.build.git_dirty,
                "merge: {} was built from a tree with uncommitted changes (context.build.git_dirty), so its git sha "
                "does not pin the code; --allow-dirty merges such files",
                in.file);
    for (const Entry& e : in.results.entries)
      if (e.form) ran_rows.insert(e.row_digest);
  }
  MergeResult m;
  Results& out = m.results;
  out.context = inputs[0].results.context;
  out.context.date = date;
  out.context.command_line = command_line;
  out.context.merged_from.emplace();
  out.context.seeds.clear();
  out.context.world_size = 0;
  bool complete = true;
  std::map<EntryKey, std::string> seen;  // entry key -> the file it came from
  std::set<std::string> skipped_rows;    // launch skips kept (one a row)
  for (const MergeInput& in : inputs) {
    const Results& r = in.results;
    complete = complete && r.summary->complete.value_or(true);
    if (r.context.world_size > out.context.world_size) {
      out.context.world_size = r.context.world_size;
      out.context.devices = r.context.devices;
    }
    for (uint64_t s : r.context.seeds)
      if (std::find(out.context.seeds.begin(), out.context.seeds.end(), s) == out.context.seeds.end())
        out.context.seeds.push_back(s);
    const std::vector<MergedSource> src = sources_of(in);
    const int base = static_cast<int>(out.context.merged_from->size());
    out.context.merged_from->insert(out.context.merged_from->end(), src.begin(), src.end());
    for (Entry e : r.entries) {
      const int local = r.context.merged_from ? e.source.value_or(-1) : 0;
      KCP_REQUIRE(local >= 0 && local < static_cast<int>(src.size()),
                  "merge: {}: entry {} has source {} outside its context.merged_from ({} files)", in.file, e.id, local,
                  src.size());
      if (is_launch_skip(e) && (ran_rows.count(e.row_digest) || !skipped_rows.insert(e.row_digest).second)) {
        ++m.superseded_skips;
        continue;
      }
      const auto [it, fresh] = seen.emplace(key_of(e), in.file);
      KCP_REQUIRE(fresh, "merge: entry {} (seed {}) is in {} and in {}; a merged file holds each once", e.id,
                  e.seed.value_or(0), it->second, in.file);
      e.source = base + local;
      out.entries.push_back(std::move(e));
    }
  }
  std::sort(out.context.seeds.begin(), out.context.seeds.end());
  out.summary = count(out.entries, complete);
  return m;
}

}  // namespace kcp
