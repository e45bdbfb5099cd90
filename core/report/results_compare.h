// `kcpbench compare BASE.json NEW.json` below the CLI (docs/design.md 8): matches the entries of two
// results files (`kcpbench.results/1`) and classifies every difference, so a nightly job fails on
// real regressions and only on them.
//
// Matching: an entry's key is its row digest + form (package, saved, P) + injected fault; the two
// files must come from the same device class (context.backend, backend_device, device_class),
// else compare refuses (ConfigError, exit 2) unless allow_device_mismatch.
//
// Classes, each with the policy that can fail on it (--fail-on accuracy,time,missing):
//   pass_to_fail   accuracy  BASE passed, NEW failed (or broke the det contract)
//   ratio_rise     accuracy  a tensor's ratio_max or rms ratio rose by more than ratio_threshold
//                            (an absolute rise in units of the budget: 0.30 -> 0.36 is 0.06)
//   new_nonfinite  accuracy  a tensor holds more non-finite values than in BASE
//   missing        missing   an entry of BASE is not in NEW, or ran in BASE and is skipped in NEW,
//                            or a tensor judged in BASE is not judged in NEW
//   slower         time      both sides timed >= 3 repeats with a spread (max-min)/median within
//                            time_threshold, and NEW's median total > BASE's * (1 + time_threshold)
//   incomplete     missing   NEW has summary.complete false (a run cut short); in BASE it is
//                            reported and never fails
//   new_entry, fail_to_pass, now_runs, faster, noisy, same: reported, never fail.
// Time uses timings_ms.total; fewer than 3 repeats or a wider spread on either side is "noisy".
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "core/report/results.h"

namespace kcp {

struct CompareOptions {
  double ratio_threshold = 0.05;  // absolute rise of ratio_max / rms ratio that counts
  double time_threshold = 0.10;   // relative: slower/faster beyond it, noisy when the spread exceeds it
  bool allow_device_mismatch = false;
  std::set<std::string> fail_on = {"accuracy", "time", "missing"};
};

// "accuracy,time,missing" (any subset), "all" or "none". Throws ConfigError on an unknown name.
std::set<std::string> parse_fail_on(const std::string& text);

struct CompareFinding {
  std::string cls;           // pass_to_fail, ratio_rise, new_nonfinite, missing, slower, new_entry, ...
  std::string policy;        // accuracy, time, missing, or "" (never fails)
  std::string id;            // the entry's id ("A1/det/full/P=2")
  std::string row;           // row name
  std::string tensor;        // for tensor findings, else ""
  double base = 0, now = 0;  // the numbers compared (ratio, count or median ms), when there are any
  std::string detail;        // one line for a human
};

struct CompareReport {
  std::vector<CompareFinding> findings;  // in BASE's entry order, then NEW-only entries
  int base_entries = 0, new_entries = 0, matched = 0;
  std::vector<std::string> device_notes;  // context differences (empty when the devices match)
  std::string base_device, new_device;    // "cpu / cpu (fp32 twin) / class h200"
  std::string base_about, new_about;      // "2026-12-02T15:53:01Z, git 94bc167277ed (dirty), int1"
  CompareOptions options;

  // Findings that fail under the report's policy.
  std::vector<const CompareFinding*> regressions() const;
  int count(const std::string& cls) const;
  int exit_code() const { return regressions().empty() ? 0 : 1; }
};

// Compares two results documents. Throws ConfigError when a document is not a results file or
// a field has the wrong type (a corrupt file is refused, never reported as a regression; the
// message names the field's JSON path), or when the device classes differ and
// options.allow_device_mismatch is false.
CompareReport compare_results(const nlohmann::json& base, const nlohmann::json& now, const CompareOptions& options);
CompareReport compare_results(const Results& base, const Results& now, const CompareOptions& options);

// Plain text for the terminal: one line per finding that is not "same", then a summary line.
std::string render_text(const CompareReport& report);
// A short markdown summary for a pull-request comment.
std::string render_markdown(const CompareReport& report, const std::string& base_name, const std::string& new_name);

// Reads a results file (ConfigError naming the path when it is missing or not JSON).
nlohmann::json read_results_file(const std::string& path);

}  // namespace kcp
