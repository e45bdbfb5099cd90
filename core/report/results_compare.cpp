#include "core/report/results_compare.h"

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>

#include "core/report/report.h"
#include "core/report/results.h"
#include "core/util/error.h"

namespace kcp {

using nlohmann::json;

std::set<std::string> parse_fail_on(const std::string& text) {
  static const std::set<std::string> known = {"accuracy", "time", "missing"};
  std::set<std::string> out;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ',');) {
    if (part.empty()) continue;
    if (part == "all") {
      out.insert(known.begin(), known.end());
    } else if (part == "none") {
      continue;
    } else if (known.count(part)) {
      out.insert(part);
    } else {
      throw ConfigError(
          fmt::format("--fail-on: unknown policy \"{}\" (known: accuracy, time, missing, all, none)", part));
    }
  }
  return out;
}

std::vector<const CompareFinding*> CompareReport::regressions() const {
  std::vector<const CompareFinding*> out;
  for (const auto& f : findings)
    if (!f.policy.empty() && options.fail_on.count(f.policy)) out.push_back(&f);
  return out;
}

int CompareReport::count(const std::string& cls) const {
  int n = 0;
  for (const auto& f : findings) n += f.cls == cls;
  return n;
}

namespace {

// The match key: row digest + form + injected fault (see the header).
std::string entry_key(const Entry& e) {
  const std::string form =
      e.form ? fmt::format("{}/{}/{}", e.form->package, e.form->saved, form_P_json(*e.form).dump()) : "id=" + e.id;
  return e.row_digest + "|" + form + "|" + e.fault.value_or("none") + (e.seed ? fmt::format("|seed{}", *e.seed) : "");
}

bool failed(const std::string& status) { return status != "pass" && status != "skip" && !status.empty(); }
std::string or_text(const std::string& s, const char* dflt) { return s.empty() ? dflt : s; }

std::string device_of(const Context& ctx) {
  return fmt::format("{} / {} / class {}", or_text(ctx.backend, "?"), or_text(ctx.backend_device, "?"),
                     or_text(ctx.device_class, "?"));
}

std::string about(const Context& ctx) {
  return fmt::format("{}, git {}{}, {}", or_text(ctx.date, "undated"), or_text(ctx.build.git_sha, "?"),
                     ctx.build.git_dirty ? " (dirty)" : "", or_text(ctx.row_set.name, "?"));
}

// The friendly refusals first (not a results file, another schema), then every field's type.
Results read_document(const json& doc, const char* which) {
  if (!doc.is_object() || !doc.contains("entries") || !doc["entries"].is_array())
    throw ConfigError(fmt::format("compare: {} is not a kcpbench results file (no \"entries\" array)", which));
  const json ctx = doc.value("context", json::object());
  const auto sv = ctx.is_object() ? ctx.find("schema_version") : ctx.end();
  const std::string schema = ctx.is_object() && sv != ctx.end() && sv->is_string() ? sv->get<std::string>() : "";
  if (schema != kResultsSchema)
    throw ConfigError(fmt::format("compare: {} has schema \"{}\", expected \"{}\"", which, schema, kResultsSchema));
  try {
    return results_from_json(doc);
  } catch (const ConfigError& e) {
    throw ConfigError(fmt::format("compare: {} is a corrupt results file: {}", which, e.what()));
  }
}

struct TimeStats {
  double median = NAN, min = NAN, max = NAN;
  int64_t count = 0;
  bool valid() const { return count > 0 && std::isfinite(median) && median > 0; }
  double spread() const { return (max - min) / median; }
};

TimeStats total_time(const Entry& e) {
  TimeStats t;
  if (const Stats& s = e.timings_ms.total) t = {s->median, s->min, s->max, s->count};
  return t;
}

// A ratio as compared: NaN when the tensor has no budget (no ratio written) or it is non-finite.
double ratio(const TensorMetrics& m, double TensorMetrics::*which) {
  return m.has_budget ? m.*which : std::numeric_limits<double>::quiet_NaN();
}

void compare_tensors(
    const Entry& b, const Entry& n, const CompareOptions& opt,
    const std::function<void(std::string, std::string, std::string, double, double, std::string)>& add) {
  const std::map<std::string, TensorMetrics> none;
  const auto& bt = b.tensors ? *b.tensors : none;
  const auto& nt = n.tensors ? *n.tensors : none;
  for (const auto& [name, bm] : bt) {
    auto jt = nt.find(name);
    if (jt == nt.end()) {
      add("missing", "missing", name, 0, 0, fmt::format("tensor {} judged in BASE, not in NEW", name));
      continue;
    }
    const TensorMetrics& nm = jt->second;
    for (auto [metric, which] :
         {std::pair{"ratio_max", &TensorMetrics::ratio_max}, std::pair{"rms_ratio", &TensorMetrics::rms_ratio}}) {
      const double x = ratio(bm, which), y = ratio(nm, which);
      const bool rise = std::isfinite(x) ? (!std::isfinite(y) && nm.has_budget) || y - x > opt.ratio_threshold : false;
      if (rise)
        add("ratio_rise", "accuracy", name, x, y,
            fmt::format("{} {}: {:.4f} -> {} (rise {} > {})", name, metric, x,
                        std::isfinite(y) ? fmt::format("{:.4f}", y) : std::string("non-finite"),
                        std::isfinite(y) ? fmt::format("{:+.4f}", y - x) : std::string("inf"), opt.ratio_threshold));
    }
    if (nm.nonfinite > bm.nonfinite)
      add("new_nonfinite", "accuracy", name, double(bm.nonfinite), double(nm.nonfinite),
          fmt::format("{}: {} non-finite value(s), BASE had {}", name, nm.nonfinite, bm.nonfinite));
  }
}

void compare_times(const Entry& b, const Entry& n, const CompareOptions& opt,
                   const std::function<void(std::string, std::string, std::string, double, double, std::string)>& add) {
  const TimeStats tb = total_time(b), tn = total_time(n);
  if (!tb.valid() || !tn.valid()) return;
  const double change = tn.median / tb.median - 1.0;
  const std::string what =
      fmt::format("total median {:.3f} -> {:.3f} ms ({:+.1f}%)", tb.median, tn.median, 100 * change);
  if (tb.count < 3 || tn.count < 3) {
    add("noisy", "", "", tb.median, tn.median,
        fmt::format("{}; too few repeats to judge ({} and {}, need 3)", what, tb.count, tn.count));
  } else if (tb.spread() > opt.time_threshold || tn.spread() > opt.time_threshold) {
    add("noisy", "", "", tb.median, tn.median,
        fmt::format("{}; repeat spread {:.1f}% / {:.1f}% exceeds {:.1f}%", what, 100 * tb.spread(), 100 * tn.spread(),
                    100 * opt.time_threshold));
  } else if (tn.median > tb.median * (1 + opt.time_threshold)) {
    add("slower", "time", "", tb.median, tn.median, fmt::format("{}; beyond {:.1f}%", what, 100 * opt.time_threshold));
  } else if (tn.median < tb.median * (1 - opt.time_threshold)) {
    add("faster", "", "", tb.median, tn.median, what);
  } else {
    add("same", "", "", tb.median, tn.median, what);
  }
}

void compare_entry(const Entry& b, const Entry& n, const CompareOptions& opt, std::vector<CompareFinding>& out) {
  const std::string& id = n.id;
  const std::string& row = n.row;
  const std::string &bs = b.status, &ns = n.status;
  auto add = [&](std::string cls, std::string policy, std::string tensor, double base, double now, std::string detail) {
    out.push_back({std::move(cls), std::move(policy), id, row, std::move(tensor), base, now, std::move(detail)});
  };
  if (bs == "pass" && failed(ns)) {
    add("pass_to_fail", "accuracy", "", 0, 0, fmt::format("pass -> {}: {}", ns, n.reason.value_or("(no reason)")));
  } else if (failed(bs) && ns == "pass") {
    add("fail_to_pass", "", "", 0, 0, fmt::format("{} -> pass", bs));
  } else if (b.ran() && !n.ran()) {
    add("missing", "missing", "", 0, 0,
        fmt::format("ran in BASE ({}), {} in NEW: {}", bs, ns.empty() ? "no status" : ns,
                    n.reason.value_or("(no reason)")));
    return;
  } else if (!b.ran() && n.ran()) {
    add("now_runs", "", "", 0, 0, fmt::format("{} in BASE, runs in NEW: {}", bs.empty() ? "no status" : bs, ns));
    return;
  }
  if (!b.ran() || !n.ran()) return;
  compare_tensors(b, n, opt, add);  // per tensor: ratios and non-finite counts
  compare_times(b, n, opt, add);    // the total (forward + backward kernel time), judged against the repeat spread
}

}  // namespace

CompareReport compare_results(const json& base, const json& now, const CompareOptions& options) {
  const Results b = read_document(base, "BASE");
  const Results n = read_document(now, "NEW");
  return compare_results(b, n, options);
}

CompareReport compare_results(const Results& base, const Results& now, const CompareOptions& options) {
  CompareReport rep;
  rep.options = options;
  const Context &bc = base.context, &nc = now.context;
  rep.base_device = device_of(bc);
  rep.new_device = device_of(nc);
  rep.base_about = about(bc);
  rep.new_about = about(nc);
  for (auto [k, field] :
       {std::pair{"backend", &Context::backend}, std::pair{"backend_device", &Context::backend_device},
        std::pair{"device_class", &Context::device_class}})
    if (bc.*field != nc.*field)
      rep.device_notes.push_back(fmt::format("{}: \"{}\" in BASE, \"{}\" in NEW", k, bc.*field, nc.*field));
  if (!rep.device_notes.empty() && !options.allow_device_mismatch) {
    std::string msg = "compare: BASE and NEW come from different device classes (";
    for (size_t i = 0; i < rep.device_notes.size(); ++i) msg += (i ? "; " : "") + rep.device_notes[i];
    msg += "); timings and ratios are not comparable. Pass --allow-device-mismatch to compare anyway";
    throw ConfigError(msg);
  }

  // A side cut short (summary.complete false: a deadline, a killed job) is a finding of its own,
  // first: its absent entries are not regressions of the code.
  if (base.summary && base.summary->complete == false)
    rep.findings.push_back({"incomplete", "", "BASE", "", "", 0, 0,
                            "BASE is incomplete (summary.complete false: that run was cut short); entries it lacks "
                            "show as new"});
  if (now.summary && now.summary->complete == false)
    rep.findings.push_back({"incomplete", "missing", "NEW", "", "", 0, 0,
                            "NEW is incomplete (summary.complete false: that run was cut short, e.g. by a "
                            "deadline); entries it lacks show as missing"});

  // Keys of NEW (a repeated key gets "#2", "#3" in order, on both sides alike).
  auto keyed = [](const std::vector<Entry>& entries) {
    std::vector<std::pair<std::string, const Entry*>> out;
    std::map<std::string, int> seen;
    for (const auto& e : entries) {
      std::string k = entry_key(e);
      if (int c = ++seen[k]; c > 1) k += fmt::format("#{}", c);
      out.push_back({k, &e});
    }
    return out;
  };
  const auto bk = keyed(base.entries), nk = keyed(now.entries);
  std::map<std::string, const Entry*> nmap;
  for (const auto& [k, e] : nk) nmap[k] = e;
  std::set<std::string> used;
  rep.base_entries = static_cast<int>(bk.size());
  rep.new_entries = static_cast<int>(nk.size());
  // Row names whose digest is in NEW, to say "the row changed" for a missing entry.
  std::map<std::string, std::string> new_digest_of_row;
  for (const auto& [k, e] : nk) new_digest_of_row[e->row] = e->row_digest;

  for (const auto& [k, b] : bk) {
    auto it = nmap.find(k);
    if (it == nmap.end()) {
      std::string why = "in BASE, not in NEW";
      if (auto d = new_digest_of_row.find(b->row); d != new_digest_of_row.end() && d->second != b->row_digest)
        why += fmt::format(" (row {} has another digest in NEW: the row changed)", b->row);
      rep.findings.push_back({"missing", "missing", b->id, b->row, "", 0, 0, why});
      continue;
    }
    used.insert(k);
    ++rep.matched;
    compare_entry(*b, *it->second, options, rep.findings);
  }
  for (const auto& [k, e] : nk)
    if (!used.count(k))
      rep.findings.push_back(
          {"new_entry", "", e->id, e->row, "", 0, 0, fmt::format("in NEW only (status {})", or_text(e->status, "?"))});
  return rep;
}

namespace {
std::string policy_text(const std::set<std::string>& p) {
  std::string s;
  for (const auto& x : p) s += (s.empty() ? "" : ",") + x;
  return s.empty() ? "none" : s;
}

std::string summary_line(const CompareReport& r) {
  const auto regs = r.regressions();
  int acc = 0, tim = 0, mis = 0;
  for (const auto* f : regs) {
    acc += f->policy == "accuracy";
    tim += f->policy == "time";
    mis += f->policy == "missing";
  }
  return fmt::format(
      "{} matched of {} in BASE and {} in NEW; {} regression{} (accuracy {}, time {}, missing {}; --fail-on {}); "
      "time: {} same, {} faster, {} slower, {} noisy; {} new, {} missing; {} fail -> pass",
      r.matched, r.base_entries, r.new_entries, regs.size(), regs.size() == 1 ? "" : "s", acc, tim, mis,
      policy_text(r.options.fail_on), r.count("same"), r.count("faster"), r.count("slower"), r.count("noisy"),
      r.count("new_entry"), r.count("missing"), r.count("fail_to_pass"));
}

std::string md_escape(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|')
      out += "\\|";
    else if (c == '\n')
      out += ' ';
    else
      out += c;
  }
  return out;
}
}  // namespace

std::string render_text(const CompareReport& r) {
  std::string s;
  for (const auto& note : r.device_notes) s += "note: device differs: " + note + "\n";
  for (const auto& f : r.findings) {
    if (f.cls == "same" || f.cls == "noisy") continue;
    const bool fails = !f.policy.empty() && r.options.fail_on.count(f.policy);
    s += fmt::format("{:<10} {:<13} {:<28} {}\n",
                     fails              ? "REGRESSION"
                     : f.policy.empty() ? "info"
                                        : "warn",
                     f.cls, f.id, f.detail);
  }
  s += summary_line(r) + "\n";
  return s;
}

std::string render_markdown(const CompareReport& r, const std::string& base_name, const std::string& new_name) {
  const auto regs = r.regressions();
  std::string s = fmt::format("### kcpbench compare: {}\n\n",
                              regs.empty() ? std::string("no regressions")
                                           : fmt::format("{} regression{}", regs.size(), regs.size() == 1 ? "" : "s"));
  s += fmt::format("BASE `{}` ({}) vs NEW `{}` ({}) on {}.\n", md_escape(base_name), md_escape(r.base_about),
                   md_escape(new_name), md_escape(r.new_about), md_escape(r.new_device));
  for (const auto& note : r.device_notes) s += fmt::format("Device differs (allowed): {}.\n", md_escape(note));
  s += fmt::format("Policy `--fail-on {}`, ratio threshold +{}, time threshold {:.0f}%.\n\n",
                   policy_text(r.options.fail_on), r.options.ratio_threshold, 100 * r.options.time_threshold);
  auto table = [&](const std::vector<const CompareFinding*>& rows, size_t limit) {
    if (rows.empty()) return;
    s += "| class | entry | detail |\n|---|---|---|\n";
    for (size_t i = 0; i < rows.size() && i < limit; ++i)
      s += fmt::format("| {} | `{}` | {} |\n", rows[i]->cls, md_escape(rows[i]->id), md_escape(rows[i]->detail));
    if (rows.size() > limit)
      s += fmt::format("\n... and {} more (see the full output of `kcpbench compare`).\n", rows.size() - limit);
    s += "\n";
  };
  if (!regs.empty()) {
    s += "**Regressions**\n\n";
    table(regs, 30);
  }
  std::vector<const CompareFinding*> other;
  for (const auto& f : r.findings)
    if (f.cls != "same" && f.cls != "noisy" && !(!f.policy.empty() && r.options.fail_on.count(f.policy)))
      other.push_back(&f);
  if (!other.empty()) {
    s += "<details><summary>Other changes (" + std::to_string(other.size()) + ")</summary>\n\n";
    table(other, 30);
    s += "</details>\n\n";
  }
  s += summary_line(r) + "\n";
  return s;
}

json read_results_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw ConfigError(fmt::format("cannot read results file {}", path));
  try {
    return json::parse(f);
  } catch (const json::exception& e) {
    throw ConfigError(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
}

}  // namespace kcp
