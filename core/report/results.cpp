#include "core/report/results.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/util/error.h"

namespace kcp {

using nlohmann::json;

namespace {

// ---- writing ----

// Non-finite doubles are written as null (what nlohmann's dump does with them anyway, made
// explicit so a document compares equal to its parsed text).
json num(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }

json stats_json(const Stats& s) {
  if (!s) return json(nullptr);
  return {{"median", num(s->median)},
          {"min", num(s->min)},
          {"max", num(s->max)},
          {"p90", num(s->p90)},
          {"count", s->count}};
}

// ---- reading: every reader names the JSON path of what it reads ----

[[noreturn]] void bad(const std::string& path, const char* expected, const json& v) {
  throw ConfigError(fmt::format("{}: expected {}, got {}", path, expected, v.dump()));
}

std::string sub(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }

const json& object_at(const json& v, const std::string& path) {
  if (!v.is_object()) bad(path, "an object", v);
  return v;
}

// Every reader, declared first so the templates below find each one.
void get(const json& v, const std::string& p, std::string& out);
void get(const json& v, const std::string& p, bool& out);
void get(const json& v, const std::string& p, int64_t& out);
void get(const json& v, const std::string& p, int& out);
void get(const json& v, const std::string& p, uint64_t& out);
void get(const json& v, const std::string& p, double& out);
template <class T>
void get(const json& v, const std::string& p, std::vector<T>& out);
void get(const json& v, const std::string& p, WorstElement& w);
void get(const json& v, const std::string& p, SampleStats& s);
void get(const json& v, const std::string& p, std::map<std::string, Stats>& out);
void get(const json& v, const std::string& p, Timings& t);
void get(const json& v, const std::string& p, Determinism& d);
void get(const json& v, const std::string& p, EntryForm& f);
void get(const json& v, const std::string& p, WorstSummary& w);
void get(const json& v, const std::string& p, FaultAt& f);
void get(const json& v, const std::string& p, std::map<std::string, TensorMetrics>& out);
void get(const json& v, const std::string& p, BuildInfo& b);
void get(const json& v, const std::string& p, RowSetInfo& r);
void get(const json& v, const std::string& p, MergedSource& m);

void get(const json& v, const std::string& p, std::string& out) {
  if (!v.is_string()) bad(p, "a string", v);
  out = v.get<std::string>();
}
void get(const json& v, const std::string& p, bool& out) {
  if (!v.is_boolean()) bad(p, "true or false", v);
  out = v.get<bool>();
}
void get(const json& v, const std::string& p, int64_t& out) {
  if (!v.is_number_integer()) bad(p, "an integer", v);
  out = v.get<int64_t>();
}
void get(const json& v, const std::string& p, int& out) {
  int64_t x = 0;
  get(v, p, x);
  out = static_cast<int>(x);
}
void get(const json& v, const std::string& p, uint64_t& out) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) bad(p, "a non-negative integer", v);
  out = v.get<uint64_t>();
}
// Doubles: a number, or null for a non-finite value (read as NaN).
void get(const json& v, const std::string& p, double& out) {
  if (v.is_null()) {
    out = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  if (!v.is_number()) bad(p, "a number or null", v);
  out = v.get<double>();
}
template <class T>
void get(const json& v, const std::string& p, std::vector<T>& out) {
  if (!v.is_array()) bad(p, "an array", v);
  out.assign(v.size(), T{});
  for (size_t i = 0; i < v.size(); ++i) get(v[i], fmt::format("{}[{}]", p, i), out[i]);
}

// A field that may be absent (left as it is then).
template <class T>
void field(const json& obj, const std::string& path, const char* key, T& out) {
  if (auto it = obj.find(key); it != obj.end()) get(*it, sub(path, key), out);
}
template <class T>
void field(const json& obj, const std::string& path, const char* key, std::optional<T>& out) {
  if (auto it = obj.find(key); it != obj.end()) get(*it, sub(path, key), out.emplace());
}
// A field that may be absent, or null (then empty), or the value.
template <class T>
void nullable(const json& obj, const std::string& path, const char* key, std::optional<T>& out) {
  auto it = obj.find(key);
  if (it == obj.end()) return;
  if (it->is_null())
    out.reset();
  else
    get(*it, sub(path, key), out.emplace());
}
template <class T>
void required(const json& obj, const std::string& path, const char* key, T& out) {
  auto it = obj.find(key);
  if (it == obj.end()) throw ConfigError(fmt::format("{}: missing", sub(path, key)));
  get(*it, sub(path, key), out);
}

void get(const json& v, const std::string& p, WorstElement& w) {
  object_at(v, p);
  field(v, p, "rank", w.rank);
  field(v, p, "token", w.token);
  field(v, p, "seq", w.seq);
  field(v, p, "head", w.head);
  field(v, p, "channel", w.channel);
  field(v, p, "segment", w.segment);
  field(v, p, "boundary_distance", w.boundary_distance);
}

void get(const json& v, const std::string& p, SampleStats& x) {
  object_at(v, p);
  field(v, p, "median", x.median);
  field(v, p, "min", x.min);
  field(v, p, "max", x.max);
  field(v, p, "p90", x.p90);
  field(v, p, "count", x.count);
}

void get(const json& v, const std::string& p, std::map<std::string, Stats>& out) {
  object_at(v, p);
  for (auto it = v.begin(); it != v.end(); ++it) nullable(v, p, it.key().c_str(), out[it.key()]);
}

void get(const json& v, const std::string& p, Timings& t) {
  object_at(v, p);
  nullable(v, p, "forward", t.forward);
  nullable(v, p, "backward", t.backward);
  nullable(v, p, "total", t.total);
  nullable(v, p, "wall_total", t.wall_total);
  field(v, p, "what", t.what);
  field(v, p, "phases", t.phases);
  field(v, p, "phases_what", t.phases_what);
}

void get(const json& v, const std::string& p, Determinism& x) {
  object_at(v, p);
  field(v, p, "rerun_identical", x.rerun_identical);
  field(v, p, "full_vs_light_identical", x.full_vs_light_identical);
  field(v, p, "differing", x.differing);
}

void get(const json& v, const std::string& p, EntryForm& f) {
  object_at(v, p);
  field(v, p, "package", f.package);
  field(v, p, "saved", f.saved);
  if (auto it = v.find("P"); it != v.end()) {
    if (it->is_string() && *it == "planned")
      f.P = 0;
    else if (it->is_number_integer() && it->get<int64_t>() >= 1)
      f.P = it->get<int>();
    else
      bad(sub(p, "P"), "\"planned\" or a segment count", *it);
  }
}

void get(const json& v, const std::string& p, WorstSummary& w) {
  object_at(v, p);
  field(v, p, "ratio_max", w.ratio_max);
  field(v, p, "ratio_max_tensor", w.ratio_max_tensor);
  field(v, p, "rms_ratio", w.rms_ratio);
  field(v, p, "rms_ratio_tensor", w.rms_ratio_tensor);
}

void get(const json& v, const std::string& p, FaultAt& f) {
  object_at(v, p);
  field(v, p, "rank", f.rank);
  field(v, p, "token", f.token);
  field(v, p, "segment", f.segment);
}

void get(const json& v, const std::string& p, std::map<std::string, TensorMetrics>& out) {
  object_at(v, p);
  for (auto it = v.begin(); it != v.end(); ++it)
    out[it.key()] = tensor_metrics_from_json(*it, sub(p, it.key()), it.key());
}

void get(const json& v, const std::string& p, BuildInfo& b) {
  object_at(v, p);
  field(v, p, "version", b.version);
  field(v, p, "git_sha", b.git_sha);
  field(v, p, "git_dirty", b.git_dirty);
  field(v, p, "build_type", b.build_type);
  field(v, p, "compiler", b.compiler);
  nullable(v, p, "cuda", b.cuda);
  nullable(v, p, "nccl", b.nccl);
  nullable(v, p, "mpi", b.mpi);
  field(v, p, "reference_simd", b.reference_simd);
}

void get(const json& v, const std::string& p, RowSetInfo& r) {
  object_at(v, p);
  field(v, p, "name", r.name);
  field(v, p, "file", r.file);
  field(v, p, "digest", r.digest);
}

void get(const json& v, const std::string& p, MergedSource& m) {
  object_at(v, p);
  required(v, p, "file", m.file);
  field(v, p, "date", m.date);
  required(v, p, "command_line", m.command_line);
  field(v, p, "seeds", m.seeds);
}

}  // namespace

// ---- to_json ----

json form_P_json(const EntryForm& f) { return f.P > 0 ? json(f.P) : json("planned"); }

json to_json(const TensorMetrics& m) {
  json j;
  j["max_abs"] = num(m.max_abs);
  j["rel_rms"] = num(m.rel_rms);
  j["ref_max_abs"] = num(m.ref_max_abs);
  if (m.has_max_rel) j["max_rel"] = num(m.max_rel);
  j["count"] = m.count;
  j["nonfinite"] = m.nonfinite;
  j["worst"] = {{"rank", m.worst.rank},
                {"token", m.worst.token},
                {"seq", m.worst.seq},
                {"head", m.worst.head},
                {"channel", m.worst.channel},
                {"segment", m.worst.segment},
                {"boundary_distance", m.worst.boundary_distance}};
  if (m.has_budget) {
    j["budget"] = m.budget.relative ? json{{"max_rel", num(m.budget.max_rel)}, {"rel_rms", num(m.budget.rel_rms)}}
                                    : json{{"max_abs", num(m.budget.max_abs)}, {"rel_rms", num(m.budget.rel_rms)}};
    j["ratio_max"] = num(m.ratio_max);
    j["rms_ratio"] = num(m.rms_ratio);
  } else {
    j["budget"] = nullptr;
  }
  j["pass"] = m.pass;
  return j;
}

json to_json(const BuildInfo& b) {
  auto opt = [](const std::optional<std::string>& s) { return s ? json(*s) : json(nullptr); };
  json j = {{"version", b.version},   {"git_sha", b.git_sha}, {"git_dirty", b.git_dirty}, {"build_type", b.build_type},
            {"compiler", b.compiler}, {"cuda", opt(b.cuda)},  {"nccl", opt(b.nccl)},      {"mpi", opt(b.mpi)}};
  if (b.reference_simd) j["reference_simd"] = *b.reference_simd;
  return j;
}

json to_json(const Context& c) {
  json j;
  j["schema_version"] = c.schema_version;
  j["build"] = to_json(c.build);
  j["date"] = c.date;
  j["command_line"] = c.command_line;
  j["world_size"] = c.world_size;
  j["launch_mode"] = c.launch_mode;
  j["comm"] = c.comm;
  j["backend"] = c.backend;
  j["backend_device"] = c.backend_device;
  j["device_class"] = c.device_class;
  j["devices"] = c.devices;
  j["seeds"] = c.seeds;
  j["row_set"] = {{"name", c.row_set.name}, {"file", c.row_set.file}, {"digest", c.row_set.digest}};
  if (c.merged_from) {
    j["merged_from"] = json::array();
    for (const MergedSource& m : *c.merged_from)
      j["merged_from"].push_back(
          {{"file", m.file}, {"date", m.date}, {"command_line", m.command_line}, {"seeds", m.seeds}});
  }
  return j;
}

json to_json(const Timings& t) {
  json j = {{"forward", stats_json(t.forward)},
            {"backward", stats_json(t.backward)},
            {"total", stats_json(t.total)},
            {"wall_total", stats_json(t.wall_total)},
            {"what", t.what}};
  if (t.phases) {
    json ph = json::object();
    for (const auto& [name, s] : *t.phases) ph[name] = stats_json(s);
    j["phases"] = std::move(ph);
    j["phases_what"] = t.phases_what;
  }
  return j;
}

json to_json(const Entry& e) {
  json j;
  j["id"] = e.id;
  j["row"] = e.row;
  j["row_digest"] = e.row_digest;
  if (e.row_config) j["row_config"] = *e.row_config;
  if (e.seed) j["seed"] = *e.seed;
  if (e.form) j["form"] = {{"package", e.form->package}, {"saved", e.form->saved}, {"P", form_P_json(*e.form)}};
  if (e.fault) j["fault"] = *e.fault;
  if (e.sweep) j["sweep"] = *e.sweep;
  if (e.planned_P) j["planned_P"] = *e.planned_P;
  if (e.plan) j["plan"] = *e.plan;
  j["status"] = e.status;
  if (e.reason) j["reason"] = *e.reason;
  if (e.tensors) {
    json ts = json::object();
    for (const auto& [name, m] : *e.tensors) ts[name] = to_json(m);
    j["tensors"] = std::move(ts);
    j["worst"] = {{"ratio_max", num(e.worst.ratio_max)},
                  {"ratio_max_tensor", e.worst.ratio_max_tensor},
                  {"rms_ratio", num(e.worst.rms_ratio)},
                  {"rms_ratio_tensor", e.worst.rms_ratio_tensor}};
    j["determinism"] = e.determinism ? to_json(*e.determinism) : json(nullptr);
    j["timings_ms"] = to_json(e.timings_ms);
    j["memory_bytes_per_rank"] = e.memory_bytes_per_rank;
    j["reference_seconds_rank0"] = num(e.reference_seconds_rank0);
  }
  if (e.fault_at)
    j["fault_at"] = {{"rank", e.fault_at->rank}, {"token", e.fault_at->token}, {"segment", e.fault_at->segment}};
  if (e.external) j["external"] = *e.external;
  if (e.source) j["source"] = *e.source;
  return j;
}

json to_json(const Determinism& d) {
  json j = json::object();
  if (d.rerun_identical) j["rerun_identical"] = *d.rerun_identical;
  if (d.full_vs_light_identical) j["full_vs_light_identical"] = *d.full_vs_light_identical;
  if (d.differing) j["differing"] = *d.differing;
  return j;
}

json to_json(const Summary& s) {
  json j = {{"passed", s.passed}, {"failed", s.failed}, {"skipped", s.skipped}, {"contract_broken", s.contract_broken}};
  if (s.refused > 0) j["refused"] = s.refused;
  if (s.complete) j["complete"] = *s.complete;
  return j;
}

json to_json(const Results& r) {
  json j;
  j["context"] = to_json(r.context);
  j["entries"] = json::array();
  for (const Entry& e : r.entries) j["entries"].push_back(to_json(e));
  if (r.summary) j["summary"] = to_json(*r.summary);
  return j;
}

// ---- from_json ----

TensorMetrics tensor_metrics_from_json(const json& j, const std::string& p, const std::string& name) {
  object_at(j, p);
  TensorMetrics m;
  m.name = name;
  field(j, p, "max_abs", m.max_abs);
  field(j, p, "rel_rms", m.rel_rms);
  field(j, p, "ref_max_abs", m.ref_max_abs);
  m.has_max_rel = j.contains("max_rel");
  field(j, p, "max_rel", m.max_rel);
  field(j, p, "count", m.count);
  field(j, p, "nonfinite", m.nonfinite);
  field(j, p, "worst", m.worst);
  if (auto it = j.find("budget"); it != j.end() && !it->is_null()) {
    const std::string bp = sub(p, "budget");
    object_at(*it, bp);
    m.has_budget = true;
    m.budget.relative = it->contains("max_rel");
    if (m.budget.relative)
      required(*it, bp, "max_rel", m.budget.max_rel);
    else
      required(*it, bp, "max_abs", m.budget.max_abs);
    required(*it, bp, "rel_rms", m.budget.rel_rms);
  }
  // Ratios are written with a budget; a hand-made file may give them without one.
  m.has_budget = m.has_budget || j.contains("ratio_max") || j.contains("rms_ratio");
  if (m.has_budget) {
    m.ratio_max = m.rms_ratio = std::numeric_limits<double>::quiet_NaN();
    field(j, p, "ratio_max", m.ratio_max);
    field(j, p, "rms_ratio", m.rms_ratio);
  }
  field(j, p, "pass", m.pass);
  return m;
}

Context context_from_json(const json& j, const std::string& p) {
  object_at(j, p);
  Context c;
  required(j, p, "schema_version", c.schema_version);
  field(j, p, "build", c.build);
  field(j, p, "date", c.date);
  field(j, p, "command_line", c.command_line);
  field(j, p, "world_size", c.world_size);
  field(j, p, "launch_mode", c.launch_mode);
  field(j, p, "comm", c.comm);
  field(j, p, "backend", c.backend);
  field(j, p, "backend_device", c.backend_device);
  field(j, p, "device_class", c.device_class);
  field(j, p, "devices", c.devices);
  field(j, p, "seeds", c.seeds);
  field(j, p, "row_set", c.row_set);
  field(j, p, "merged_from", c.merged_from);
  return c;
}

Entry entry_from_json(const json& j, const std::string& p) {
  object_at(j, p);
  Entry e;
  required(j, p, "id", e.id);
  required(j, p, "row", e.row);
  required(j, p, "row_digest", e.row_digest);
  if (auto it = j.find("row_config"); it != j.end()) e.row_config = object_at(*it, sub(p, "row_config"));
  field(j, p, "seed", e.seed);
  field(j, p, "form", e.form);
  field(j, p, "fault", e.fault);
  field(j, p, "sweep", e.sweep);
  field(j, p, "planned_P", e.planned_P);
  if (auto it = j.find("plan"); it != j.end()) e.plan = object_at(*it, sub(p, "plan"));
  required(j, p, "status", e.status);
  field(j, p, "reason", e.reason);
  if (e.ran() && !j.contains("tensors"))
    throw ConfigError(
        fmt::format("{}: missing (an entry with status \"{}\" ran and has tensors)", sub(p, "tensors"), e.status));
  field(j, p, "tensors", e.tensors);
  field(j, p, "worst", e.worst);
  nullable(j, p, "determinism", e.determinism);
  field(j, p, "timings_ms", e.timings_ms);
  field(j, p, "memory_bytes_per_rank", e.memory_bytes_per_rank);
  field(j, p, "reference_seconds_rank0", e.reference_seconds_rank0);
  field(j, p, "fault_at", e.fault_at);
  if (auto it = j.find("external"); it != j.end()) e.external = object_at(*it, sub(p, "external"));
  field(j, p, "source", e.source);
  return e;
}

Summary summary_from_json(const json& j, const std::string& p) {
  object_at(j, p);
  Summary s;
  field(j, p, "passed", s.passed);
  field(j, p, "failed", s.failed);
  field(j, p, "skipped", s.skipped);
  field(j, p, "contract_broken", s.contract_broken);
  if (j.contains("refused")) field(j, p, "refused", s.refused);
  field(j, p, "complete", s.complete);
  return s;
}

Results results_from_json(const json& j) {
  object_at(j, "(document)");
  Results r;
  auto ctx = j.find("context");
  if (ctx == j.end()) throw ConfigError("context: missing");
  r.context = context_from_json(*ctx, "context");
  auto entries = j.find("entries");
  if (entries == j.end()) throw ConfigError("entries: missing");
  if (!entries->is_array()) bad("entries", "an array", *entries);
  const size_t sources = r.context.merged_from ? r.context.merged_from->size() : 0;
  if (r.context.merged_from && sources < 2)
    throw ConfigError(fmt::format("context.merged_from: {} files (a merged file has at least 2)", sources));
  for (size_t i = 0; i < entries->size(); ++i) {
    r.entries.push_back(entry_from_json((*entries)[i], fmt::format("entries[{}]", i)));
    const std::optional<int>& src = r.entries.back().source;
    if (sources > 0 && !src)
      throw ConfigError(fmt::format("entries[{}].source: missing (the file has context.merged_from)", i));
    if (src && (*src < 0 || size_t(*src) >= sources))
      throw ConfigError(
          fmt::format("entries[{}].source: {} is not an index of context.merged_from ({} files)", i, *src, sources));
  }
  if (auto s = j.find("summary"); s != j.end()) r.summary = summary_from_json(*s, "summary");
  return r;
}

}  // namespace kcp
