// kcpbench merge: several results files of one build and device into one (results_merge.h).
#include "core/report/results_merge.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

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

using EntryKey = std::tuple<std::string, std::string, uint64_t, std::string>;
EntryKey key_of(const Entry& e) { return {e.row_digest, e.id, e.seed.value_or(0), e.fault.value_or("none")}; }

void add_summary(Summary& sum, const Summary& s) {
  sum.passed += s.passed;
  sum.failed += s.failed;
  sum.skipped += s.skipped;
  sum.contract_broken += s.contract_broken;
  sum.refused += s.refused;
  sum.complete = sum.complete.value_or(true) && s.complete.value_or(true);
}

}  // namespace

Results merge_results(const std::vector<MergeInput>& inputs, const std::vector<std::string>& command_line,
                      const std::string& date) {
  KCP_REQUIRE(inputs.size() >= 2, "merge: needs at least two results files, got {}", inputs.size());
  Results out;
  out.context = inputs[0].results.context;
  out.context.date = date;
  out.context.command_line = command_line;
  out.context.merged_from.emplace();
  out.context.seeds.clear();
  out.context.world_size = 0;
  Summary sum;
  std::map<EntryKey, std::string> seen;  // entry key -> the file it came from
  for (const MergeInput& in : inputs) {
    require_same_identity(inputs[0], in);
    const Results& r = in.results;
    KCP_REQUIRE(r.summary, "merge: {} has no summary (a replay's --json file?); merge only run files", in.file);
    add_summary(sum, *r.summary);
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
      const auto [it, fresh] = seen.emplace(key_of(e), in.file);
      KCP_REQUIRE(fresh, "merge: entry {} (seed {}, fault {}) is in {} and in {}; a merged file holds each once", e.id,
                  e.seed.value_or(0), e.fault.value_or("none"), it->second, in.file);
      e.source = base + local;
      out.entries.push_back(std::move(e));
    }
  }
  std::sort(out.context.seeds.begin(), out.context.seeds.end());
  out.summary = sum;
  return out;
}

}  // namespace kcp
