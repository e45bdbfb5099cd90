// `kcpbench compare` logic (core/report/results_compare.h) on synthetic results pairs: every
// finding class, and the exit code under every --fail-on policy (all 8 subsets of
// accuracy, time, missing).
#include "core/report/results_compare.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>

#include "core/util/error.h"

using kcp::compare_results;
using kcp::CompareOptions;
using nlohmann::json;

namespace {

json context(const std::string& backend = "cpu", const std::string& device = "cpu (fp32 twin)",
             const std::string& cls = "h200") {
  return {{"schema_version", "kcpbench.results/1"},
          {"backend", backend},
          {"backend_device", device},
          {"device_class", cls},
          {"date", "2026-01-01T00:00:00Z"},
          {"build", {{"git_sha", "abc"}, {"git_dirty", false}}},
          {"row_set", {{"name", "int1"}}}};
}

json timing(double median, double min, double max, int count) {
  return {{"median", median}, {"min", min}, {"max", max}, {"p90", max}, {"count", count}};
}

// A passing entry of row A1 in det/full at schedule P with two tensors and 20 tight repeats.
json entry(const std::string& P = "planned", const std::string& status = "pass", const std::string& digest = "d1") {
  json e;
  const json p = P == "planned" ? json("planned") : json(std::stoi(P));
  e["id"] = "A1/det/full/" + (P == "planned" ? std::string("planned") : "P=" + P);
  e["row"] = "A1";
  e["row_digest"] = digest;
  e["form"] = {{"package", "det"}, {"saved", "full"}, {"P", p}};
  e["fault"] = "none";
  e["status"] = status;
  if (status == "skip") {
    e["reason"] = "rank 1 cannot take forced P = " + P;
    return e;
  }
  if (status != "pass") e["reason"] = "o: ratio_max 2.0";
  e["tensors"]["o"] = {{"ratio_max", 0.30}, {"rms_ratio", 0.25}, {"nonfinite", 0}, {"pass", true}};
  e["tensors"]["dq"] = {{"ratio_max", 0.40}, {"rms_ratio", 0.35}, {"nonfinite", 0}, {"pass", true}};
  e["timings_ms"]["total"] = timing(100.0, 99.0, 101.0, 20);
  return e;
}

json doc(std::vector<json> entries, json ctx = context()) { return {{"context", ctx}, {"entries", entries}}; }

struct Case {
  const char* name;
  json base, now;
  std::vector<std::string> classes;           // findings other than same/noisy, sorted
  std::vector<std::string> fail_on;           // policies under which the pair is a regression
  std::vector<std::string> all_classes = {};  // when set: every finding class, same/noisy included
};

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<Case> cases() {
  std::vector<Case> cs;
  auto with = [](json e, const std::function<void(json&)>& f) {
    f(e);
    return e;
  };
  cs.push_back({"identical", doc({entry()}), doc({entry()}), {}, {}, {"same"}});
  cs.push_back({"pass_to_fail", doc({entry()}), doc({entry("planned", "fail")}), {"pass_to_fail"}, {"accuracy"}});
  cs.push_back({"pass_to_contract_broken",
                doc({entry()}),
                doc({entry("planned", "contract_broken")}),
                {"pass_to_fail"},
                {"accuracy"}});
  cs.push_back({"fail_to_pass_never_fails", doc({entry("planned", "fail")}), doc({entry()}), {"fail_to_pass"}, {}});
  cs.push_back(
      {"still_failing_is_not_a_regression", doc({entry("planned", "fail")}), doc({entry("planned", "fail")}), {}, {}});
  cs.push_back({"ratio_max_rise",
                doc({entry()}),
                doc({with(entry(), [](json& e) { e["tensors"]["o"]["ratio_max"] = 0.40; })}),
                {"ratio_rise"},
                {"accuracy"}});
  cs.push_back({"rms_ratio_rise",
                doc({entry()}),
                doc({with(entry(), [](json& e) { e["tensors"]["dq"]["rms_ratio"] = 0.50; })}),
                {"ratio_rise"},
                {"accuracy"}});
  cs.push_back({"ratio_rise_within_threshold",
                doc({entry()}),
                doc({with(entry(), [](json& e) { e["tensors"]["o"]["ratio_max"] = 0.34; })}),
                {},
                {}});
  cs.push_back({"ratio_fall",
                doc({entry()}),
                doc({with(entry(), [](json& e) { e["tensors"]["o"]["ratio_max"] = 0.05; })}),
                {},
                {}});
  cs.push_back({"ratio_becomes_non_finite",
                doc({entry()}),
                doc({with(entry(), [](json& e) { e["tensors"]["o"]["ratio_max"] = nullptr; })}),
                {"ratio_rise"},
                {"accuracy"}});
  cs.push_back({"new_nonfinite",
                doc({entry()}),
                doc({with(entry(), [](json& e) { e["tensors"]["o"]["nonfinite"] = 3; })}),
                {"new_nonfinite"},
                {"accuracy"}});
  cs.push_back({"fewer_nonfinite",
                doc({with(entry(), [](json& e) { e["tensors"]["o"]["nonfinite"] = 3; })}),
                doc({entry()}),
                {},
                {}});
  cs.push_back({"missing_entry", doc({entry(), entry("2")}), doc({entry()}), {"missing"}, {"missing"}});
  cs.push_back({"new_entry_never_fails", doc({entry()}), doc({entry(), entry("2")}), {"new_entry"}, {}});
  cs.push_back({"pass_to_skip_is_missing", doc({entry("2")}), doc({entry("2", "skip")}), {"missing"}, {"missing"}});
  cs.push_back({"skip_to_pass_never_fails", doc({entry("2", "skip")}), doc({entry("2")}), {"now_runs"}, {}});
  cs.push_back({"skip_to_skip", doc({entry("2", "skip")}), doc({entry("2", "skip")}), {}, {}});
  cs.push_back({"tensor_no_longer_judged",
                doc({entry()}),
                doc({with(entry(), [](json& e) { e["tensors"].erase("dq"); })}),
                {"missing"},
                {"missing"}});
  cs.push_back({"row_changed_digest",
                doc({entry()}),
                doc({entry("planned", "pass", "d2")}),
                {"missing", "new_entry"},
                {"missing"}});
  cs.push_back({"other_fault_is_another_entry",
                doc({entry()}),
                doc({with(entry(), [](json& e) { e["fault"] = "drop-segment-entry"; })}),
                {"missing", "new_entry"},
                {"missing"}});
  cs.push_back({"slower",
                doc({entry()}),
                doc({with(entry(), [](json& e) { e["timings_ms"]["total"] = timing(120.0, 119.0, 121.0, 20); })}),
                {"slower"},
                {"time"}});
  cs.push_back({"faster_never_fails",
                doc({entry()}),
                doc({with(entry(), [](json& e) { e["timings_ms"]["total"] = timing(50.0, 49.5, 50.5, 20); })}),
                {"faster"},
                {}});
  cs.push_back({"small_change_is_same",
                doc({entry()}),
                doc({with(entry(), [](json& e) { e["timings_ms"]["total"] = timing(105.0, 104.0, 106.0, 20); })}),
                {},
                {},
                {"same"}});
  cs.push_back({"wide_spread_is_noisy",
                doc({entry()}),
                doc({with(entry(), [](json& e) { e["timings_ms"]["total"] = timing(150.0, 100.0, 200.0, 20); })}),
                {},
                {},
                {"noisy"}});
  cs.push_back({"wide_base_spread_is_noisy",
                doc({with(entry(), [](json& e) { e["timings_ms"]["total"] = timing(100.0, 60.0, 140.0, 20); })}),
                doc({with(entry(), [](json& e) { e["timings_ms"]["total"] = timing(150.0, 149.0, 151.0, 20); })}),
                {},
                {},
                {"noisy"}});
  cs.push_back({"few_repeats_is_noisy",
                doc({with(entry(), [](json& e) { e["timings_ms"]["total"] = timing(100, 100, 100, 1); })}),
                doc({with(entry(), [](json& e) { e["timings_ms"]["total"] = timing(300, 300, 300, 1); })}),
                {},
                {},
                {"noisy"}});
  cs.push_back({"accuracy_and_time_together",
                doc({entry(), entry("2")}),
                doc({with(entry(), [](json& e) { e["timings_ms"]["total"] = timing(130.0, 129.0, 131.0, 20); }),
                     entry("2", "fail")}),
                {"pass_to_fail", "slower"},
                {"accuracy", "time"}});
  cs.push_back({"every_policy",
                doc({entry(), entry("2"), entry("4")}),
                doc({with(entry(), [](json& e) { e["timings_ms"]["total"] = timing(130.0, 129.0, 131.0, 20); }),
                     entry("2", "fail")}),
                {"missing", "pass_to_fail", "slower"},
                {"accuracy", "time", "missing"}});
  return cs;
}

// The 8 subsets of the three policies.
std::vector<std::set<std::string>> policies() {
  std::vector<std::set<std::string>> out;
  const char* names[3] = {"accuracy", "time", "missing"};
  for (int m = 0; m < 8; ++m) {
    std::set<std::string> s;
    for (int i = 0; i < 3; ++i)
      if (m & (1 << i)) s.insert(names[i]);
    out.push_back(s);
  }
  return out;
}

}  // namespace

TEST(ResultsCompare, EveryClassUnderEveryFailOnPolicy) {
  for (const Case& c : cases()) {
    for (const auto& policy : policies()) {
      CompareOptions opt;
      opt.fail_on = policy;
      const kcp::CompareReport rep = compare_results(c.base, c.now, opt);
      std::vector<std::string> got, all;
      for (const auto& f : rep.findings) {
        all.push_back(f.cls);
        if (f.cls != "same" && f.cls != "noisy") got.push_back(f.cls);
      }
      EXPECT_EQ(sorted(got), sorted(c.classes)) << c.name;
      if (!c.all_classes.empty()) {
        EXPECT_EQ(sorted(all), sorted(c.all_classes)) << c.name;
      }
      bool should_fail = false;
      for (const auto& p : c.fail_on) should_fail = should_fail || policy.count(p);
      std::string ptext;
      for (const auto& p : policy) ptext += p + ",";
      EXPECT_EQ(rep.exit_code(), should_fail ? 1 : 0) << c.name << " under --fail-on " << ptext << "\n"
                                                      << kcp::render_text(rep);
    }
  }
}

TEST(ResultsCompare, FindingsCarryTheNumbers) {
  json now = doc({entry()});
  now["entries"][0]["tensors"]["o"]["ratio_max"] = 0.9;
  now["entries"][0]["timings_ms"]["total"] = timing(120.0, 119.0, 121.0, 20);
  const auto rep = compare_results(doc({entry()}), now, CompareOptions{});
  ASSERT_EQ(rep.findings.size(), 2u);
  const auto& r = rep.findings[0];
  EXPECT_EQ(r.cls, "ratio_rise");
  EXPECT_EQ(r.tensor, "o");
  EXPECT_EQ(r.id, "A1/det/full/planned");
  EXPECT_DOUBLE_EQ(r.base, 0.30);
  EXPECT_DOUBLE_EQ(r.now, 0.9);
  EXPECT_NE(r.detail.find("ratio_max"), std::string::npos) << r.detail;
  EXPECT_EQ(rep.findings[1].cls, "slower");
  EXPECT_DOUBLE_EQ(rep.findings[1].now, 120.0);
  EXPECT_EQ(rep.matched, 1);
}

TEST(ResultsCompare, ThresholdsAreOptions) {
  json now = doc({entry()});
  now["entries"][0]["tensors"]["o"]["ratio_max"] = 0.34;                       // +0.04
  now["entries"][0]["timings_ms"]["total"] = timing(105.0, 104.5, 105.5, 20);  // +5%
  CompareOptions opt;
  EXPECT_EQ(compare_results(doc({entry()}), now, opt).exit_code(), 0);
  opt.ratio_threshold = 0.01;
  opt.time_threshold = 0.02;
  const auto rep = compare_results(doc({entry()}), now, opt);
  EXPECT_EQ(rep.count("ratio_rise"), 1);
  EXPECT_EQ(rep.count("slower"), 1);
  EXPECT_EQ(rep.exit_code(), 1);
}

TEST(ResultsCompare, RefusesDifferentDeviceClassesUnlessAllowed) {
  const json base = doc({entry()}), gpu = doc({entry()}, context("cuda", "NVIDIA H200 (132 SMs)"));
  try {
    compare_results(base, gpu, CompareOptions{});
    FAIL() << "expected a ConfigError";
  } catch (const kcp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--allow-device-mismatch"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("backend"), std::string::npos) << e.what();
  }
  EXPECT_THROW(compare_results(base, doc({entry()}, context("cpu", "cpu (fp32 twin)", "b200")), CompareOptions{}),
               kcp::ConfigError);
  CompareOptions allow;
  allow.allow_device_mismatch = true;
  const auto rep = compare_results(base, gpu, allow);
  EXPECT_EQ(rep.device_notes.size(), 2u);
  EXPECT_EQ(rep.matched, 1);
  EXPECT_EQ(rep.exit_code(), 0);
}

TEST(ResultsCompare, RejectsWhatIsNotAResultsFile) {
  EXPECT_THROW(compare_results(json::object(), doc({entry()}), CompareOptions{}), kcp::ConfigError);
  json wrong = doc({entry()});
  wrong["context"]["schema_version"] = "kcpbench.rows/1";
  EXPECT_THROW(compare_results(doc({entry()}), wrong, CompareOptions{}), kcp::ConfigError);
}

// A corrupt NEW file (a field of the wrong type, a run entry without its tensors) is refused as a
// ConfigError naming the field, not read as a regression (a string ratio is not a rise).
TEST(ResultsCompare, ACorruptNewFileIsAConfigErrorNotARegression) {
  auto refusal = [](const json& now) -> std::string {
    try {
      (void)compare_results(doc({entry(), entry("2")}), now, CompareOptions{});
    } catch (const kcp::ConfigError& e) {
      return e.what();
    }
    return "";
  };
  json string_ratio = doc({entry(), entry("2")});
  string_ratio["entries"][1]["tensors"]["dq"]["ratio_max"] = "abc";
  std::string msg = refusal(string_ratio);
  EXPECT_NE(msg.find("NEW"), std::string::npos) << msg;
  EXPECT_NE(msg.find("entries[1].tensors.dq.ratio_max: expected a number or null, got \"abc\""), std::string::npos)
      << msg;

  json no_tensors = doc({entry(), entry("2")});
  no_tensors["entries"][0].erase("tensors");
  msg = refusal(no_tensors);
  EXPECT_NE(msg.find("entries[0].tensors: missing"), std::string::npos) << msg;

  json bad_count = doc({entry()});
  bad_count["entries"][0]["tensors"]["o"]["nonfinite"] = "many";
  msg = refusal(bad_count);
  EXPECT_NE(msg.find("entries[0].tensors.o.nonfinite: expected an integer"), std::string::npos) << msg;

  // The same corruption in BASE is refused the same way, naming BASE.
  try {
    (void)compare_results(string_ratio, doc({entry()}), CompareOptions{});
    ADD_FAILURE() << "a corrupt BASE was accepted";
  } catch (const kcp::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("BASE"), std::string::npos) << e.what();
  }
}

// A null ratio (non-finite, as written) is still a rise; a tensor without a budget is not judged.
TEST(ResultsCompare, NullRatioIsNonFinite) {
  json now = doc({entry()});
  now["entries"][0]["tensors"]["o"]["ratio_max"] = nullptr;
  const auto rep = compare_results(doc({entry()}), now, CompareOptions{});
  EXPECT_EQ(rep.count("ratio_rise"), 1);
  EXPECT_EQ(rep.exit_code(), 1);
}

TEST(ResultsCompare, ParseFailOn) {
  EXPECT_EQ(kcp::parse_fail_on("accuracy,time"), (std::set<std::string>{"accuracy", "time"}));
  EXPECT_EQ(kcp::parse_fail_on("all"), (std::set<std::string>{"accuracy", "time", "missing"}));
  EXPECT_TRUE(kcp::parse_fail_on("none").empty());
  EXPECT_THROW(kcp::parse_fail_on("accuracy,speed"), kcp::ConfigError);
}

TEST(ResultsCompare, MarkdownSummary) {
  const auto clean = compare_results(doc({entry()}), doc({entry()}), CompareOptions{});
  const std::string a = kcp::render_markdown(clean, "base.json", "new.json");
  EXPECT_NE(a.find("no regressions"), std::string::npos) << a;
  EXPECT_NE(a.find("`base.json`"), std::string::npos) << a;
  const auto bad = compare_results(doc({entry(), entry("2")}), doc({entry("planned", "fail")}), CompareOptions{});
  const std::string b = kcp::render_markdown(bad, "base.json", "new.json");
  EXPECT_NE(b.find("2 regressions"), std::string::npos) << b;
  EXPECT_NE(b.find("| pass_to_fail | `A1/det/full/planned` |"), std::string::npos) << b;
  EXPECT_NE(b.find("| missing | `A1/det/full/P=2` |"), std::string::npos) << b;
  const std::string t = kcp::render_text(bad);
  EXPECT_NE(t.find("REGRESSION"), std::string::npos) << t;
}

// A results file with summary.complete false (a run cut short) used to be compared silently, its
// absent entries just "missing": an incomplete input is now a finding of its own, naming the side.
TEST(ResultsCompare, AnIncompleteInputIsFlagged) {
  json full = doc({entry()});
  full["summary"] = {{"passed", 1}, {"failed", 0}, {"skipped", 0}, {"contract_broken", 0}, {"complete", true}};
  json cut = full;
  cut["summary"]["complete"] = false;
  CompareOptions opt;
  const kcp::CompareReport now_cut = compare_results(full, cut, opt);
  ASSERT_EQ(now_cut.count("incomplete"), 1) << kcp::render_text(now_cut);
  EXPECT_EQ(now_cut.exit_code(), 1) << "an incomplete NEW fails under --fail-on missing";
  EXPECT_NE(kcp::render_text(now_cut).find("NEW is incomplete (summary.complete false"), std::string::npos)
      << kcp::render_text(now_cut);
  opt.fail_on = {};
  EXPECT_EQ(compare_results(full, cut, opt).exit_code(), 0);
  const kcp::CompareReport base_cut = compare_results(cut, full, CompareOptions{});
  ASSERT_EQ(base_cut.count("incomplete"), 1);
  EXPECT_NE(kcp::render_text(base_cut).find("BASE is incomplete"), std::string::npos);
  EXPECT_EQ(compare_results(full, full, CompareOptions{}).count("incomplete"), 0);
}
