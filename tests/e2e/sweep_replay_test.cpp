// Whole-program tests of `kcpbench run --sweep-P`, `kcpbench replay` and `kcpbench compare` on
// the CPU twin (int1 rows, det/full, no reference cache): a sweep writes one entry per requested P
// (pass, fail or skip, never dropped), a stored failing entry made with --inject replays to the
// same verdict and the same ratios to the bit, compare's exit codes follow --fail-on, and two
// runs merge into one file that replays and compares like one run of both.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "e2e_util.h"

using nlohmann::json;

namespace {
json read_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}
void write_json(const std::string& path, const json& j) { std::ofstream(path) << j.dump(1); }
std::string tmp(const std::string& name) { return ::testing::TempDir() + "/sweep_replay_" + name; }
const char* kQuick = "-q run --rows int1 --package det --saved full --cache none ";

std::map<std::string, json> by_id(const json& doc) {
  std::map<std::string, json> m;
  for (const auto& e : doc["entries"]) m[e["id"].get<std::string>()] = e;
  return m;
}
}  // namespace

TEST(Sweep, OneEntryPerRequestedPWithThePlannedPBesideIt) {
  const std::string out = tmp("a1.json");
  auto r = run_kcpbench(std::string(kQuick) + "--row A1 --sweep-P 1,2,3,4,6,8,12,16 --json " + out);
  ASSERT_TRUE(r.code == 0 || r.code == 1) << r.out;
  const json doc = read_json(out);
  ASSERT_EQ(doc["entries"].size(), 9u) << "8 forced P plus the planned P";
  std::set<int> forced;
  int planned = 0;
  for (const auto& e : doc["entries"]) {
    EXPECT_EQ(e["sweep"], true);
    EXPECT_EQ(e["planned_P"], json::array({4, 4})) << "A1 plans P = 4 on both ranks (class cpu)";
    const std::string status = e["status"];
    EXPECT_TRUE(status == "pass" || status == "fail" || status == "skip") << e["id"];
    if (e["form"]["P"] == "planned") {
      ++planned;
      EXPECT_EQ(status, "pass");
      continue;
    }
    const int P = e["form"]["P"];
    EXPECT_TRUE(forced.insert(P).second) << "P = " << P << " twice";
    EXPECT_EQ(e["id"], "A1/det/full/P=" + std::to_string(P));
    if (P > 8) {  // each rank of A1 holds 8 chunks
      EXPECT_EQ(status, "skip") << P;
      EXPECT_NE(e["reason"].get<std::string>().find("cannot take forced P = " + std::to_string(P)), std::string::npos)
          << e["reason"];
    } else {
      EXPECT_NE(status, "skip") << P << ": " << e.value("reason", "");
      EXPECT_EQ(e["plan"]["P"], json::array({P, P}));
      EXPECT_TRUE(e["tensors"].contains("o"));
      EXPECT_GT(e["timings_ms"]["total"]["median"].get<double>(), 0.0);
    }
  }
  EXPECT_EQ(planned, 1);
  EXPECT_EQ(forced, (std::set<int>{1, 2, 3, 4, 6, 8, 12, 16}));
}

TEST(Sweep, ForcedRuleDoesNotApplyAndAutoGoesUpToTheLargestPAnyRankTakes) {
  // C1's forced_rule is all_ranks_plan_p1 (a plain run skips its forced forms); its ranks hold
  // 9, 2 and 4 chunks and plan P = 4, 1, 2.
  const std::string out = tmp("c1_auto.json");
  auto r = run_kcpbench(std::string(kQuick) + "--row C1 --sweep-P auto --json " + out);
  ASSERT_TRUE(r.code == 0 || r.code == 1) << r.out;
  const auto m = by_id(read_json(out));
  std::set<std::string> ids;
  for (const auto& [id, e] : m) ids.insert(id);
  EXPECT_EQ(ids, (std::set<std::string>{"C1/det/full/planned", "C1/det/full/P=1", "C1/det/full/P=2", "C1/det/full/P=4",
                                        "C1/det/full/P=8"}));
  EXPECT_NE(m.at("C1/det/full/P=2").at("status"), "skip") << m.at("C1/det/full/P=2").dump(1);
  for (const char* id : {"C1/det/full/P=4", "C1/det/full/P=8"}) {
    EXPECT_EQ(m.at(id).at("status"), "skip") << id;
    EXPECT_NE(m.at(id).at("reason").get<std::string>().find("rank 1 cannot take forced P"), std::string::npos) << id;
  }
}

TEST(Sweep, RangeAndBadLists) {
  const std::string out = tmp("range.json");
  auto r = run_kcpbench(std::string(kQuick) + "--row A1 --sweep-P 1:64:pow2 --json " + out);
  ASSERT_TRUE(r.code == 0 || r.code == 1) << r.out;
  const json doc = read_json(out);
  std::vector<json> ps;
  for (const auto& e : doc["entries"]) ps.push_back(e["form"]["P"]);
  EXPECT_EQ(json(ps), json::parse(R"(["planned", 1, 2, 4, 8, 16, 32, 64])"));
  for (const char* bad : {"0", "65", "4:2", "x", "auto,2", "1:8:zero", "2:"})
    EXPECT_EQ(run_kcpbench(std::string(kQuick) + "--row A1 --sweep-P " + bad).code, 2) << bad;
  EXPECT_EQ(run_kcpbench(std::string(kQuick) + "--row A1 --P 2 --sweep-P 4").code, 2);
}

TEST(Replay, AStoredFailingInjectedEntryGivesTheSameVerdictAndRatiosToTheBit) {
  const std::string out = tmp("inject.json"), again = tmp("inject_replay.json");
  auto r = run_kcpbench(std::string(kQuick) + "--row A1 --sweep-P 2 --inject drop-segment-entry --json " + out);
  ASSERT_EQ(r.code, 1) << r.out;
  const auto stored = by_id(read_json(out));
  const json& s = stored.at("A1/det/full/P=2");
  ASSERT_EQ(s["status"], "fail");
  ASSERT_EQ(s["fault"], "drop-segment-entry");
  ASSERT_TRUE(s.contains("fault_at"));

  auto p = run_kcpbench("replay " + out + " --entry A1/det/full/P=2 --cache none --json " + again);
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("identical"), std::string::npos) << p.out;
  const json n = read_json(again)["entries"][0];
  EXPECT_EQ(n["id"], s["id"]);
  EXPECT_EQ(n["status"], "fail");
  EXPECT_EQ(n["reason"], s["reason"]);
  EXPECT_EQ(n["fault_at"], s["fault_at"]);
  EXPECT_EQ(n["worst"], s["worst"]);
  ASSERT_EQ(n["tensors"].size(), s["tensors"].size());
  for (auto it = s["tensors"].begin(); it != s["tensors"].end(); ++it)
    for (const char* k : {"ratio_max", "rms_ratio", "max_abs", "rel_rms", "nonfinite"}) {
      const json& a = (*it)[k];
      const json& b = n["tensors"][it.key()][k];
      EXPECT_EQ(a, b) << it.key() << "." << k;  // JSON doubles round-trip exactly: equal means the same bits
    }
  // The replayed file compares clean against the stored one (same device, same entry).
  EXPECT_EQ(run_kcpbench("compare " + out + " " + again + " --fail-on accuracy").code, 0);
}

TEST(Replay, LightAndSkippedEntriesAndWhatCannotBeReplayed) {
  const std::string out = tmp("light.json");
  auto r = run_kcpbench(
      "-q run --rows int1 --row A1 --package det --saved full,light --cache none --sweep-P 12 --json " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  auto light = run_kcpbench("replay " + out + " --entry A1/det/light/planned --cache none");
  EXPECT_EQ(light.code, 0) << light.out;
  EXPECT_NE(light.out.find("identical"), std::string::npos) << light.out;
  auto skip = run_kcpbench("replay " + out + " --entry A1/det/full/P=12 --cache none");
  EXPECT_EQ(skip.code, 0) << skip.out;

  // A stored ratio that the code does not reproduce: exit 1, naming it.
  json doc = read_json(out);
  for (auto& e : doc["entries"])
    if (e["id"] == "A1/det/full/planned") e["tensors"]["o"]["ratio_max"] = 0.123;
  const std::string tampered = tmp("tampered.json");
  write_json(tampered, doc);
  auto d = run_kcpbench("replay " + tampered + " --entry A1/det/full/planned --cache none");
  EXPECT_EQ(d.code, 1) << d.out;
  EXPECT_NE(d.out.find("o.ratio_max"), std::string::npos) << d.out;

  // The row changed (its config no longer has the recorded digest): exit 2.
  doc = read_json(out);
  for (auto& e : doc["entries"]) e["row_config"]["seed"] = 99;
  const std::string changed = tmp("changed.json");
  write_json(changed, doc);
  auto c = run_kcpbench("replay " + changed + " --entry A1/det/full/planned --cache none");
  EXPECT_EQ(c.code, 2) << c.out;
  EXPECT_NE(c.out.find("the row changed"), std::string::npos) << c.out;

  auto u = run_kcpbench("replay " + out + " --entry A1/det/full/P=99");
  EXPECT_EQ(u.code, 2) << u.out;
  EXPECT_NE(u.out.find("A1/det/full/planned"), std::string::npos) << "lists the ids it has: " << u.out;
}

TEST(Compare, ExitCodesFollowTheFailOnPolicy) {
  const std::string base = tmp("cmp_base.json"), now = tmp("cmp_new.json"), md = tmp("cmp.md");
  auto r = run_kcpbench(std::string(kQuick) + "--row A1 --row B1 --json " + base);
  ASSERT_EQ(r.code, 0) << r.out;
  auto same = run_kcpbench("compare " + base + " " + base + " --md " + md);
  EXPECT_EQ(same.code, 0) << same.out;
  std::ifstream m(md);
  std::string text((std::istreambuf_iterator<char>(m)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("no regressions"), std::string::npos) << text;

  json doc = read_json(base);
  doc["entries"][0]["status"] = "fail";
  doc["entries"][0]["reason"] = "o: ratio_max 1.5";
  doc["entries"].erase(doc["entries"].size() - 1);
  write_json(now, doc);
  auto bad = run_kcpbench("compare " + base + " " + now + " --md " + md);
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find("pass_to_fail"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("missing"), std::string::npos) << bad.out;
  EXPECT_EQ(run_kcpbench("compare " + base + " " + now + " --fail-on accuracy").code, 1);
  EXPECT_EQ(run_kcpbench("compare " + base + " " + now + " --fail-on missing").code, 1);
  EXPECT_EQ(run_kcpbench("compare " + base + " " + now + " --fail-on time").code, 0);
  EXPECT_EQ(run_kcpbench("compare " + base + " " + now + " --fail-on none").code, 0);
  EXPECT_EQ(run_kcpbench("compare " + base + " " + now + " --fail-on speed").code, 2);

  doc = read_json(base);
  doc["context"]["backend"] = "cuda";
  write_json(now, doc);
  auto dev = run_kcpbench("compare " + base + " " + now);
  EXPECT_EQ(dev.code, 2) << dev.out;
  EXPECT_NE(dev.out.find("--allow-device-mismatch"), std::string::npos) << dev.out;
  EXPECT_EQ(run_kcpbench("compare " + base + " " + now + " --allow-device-mismatch").code, 0);
  EXPECT_EQ(run_kcpbench("compare " + base + " " + tmp("no_such.json")).code, 2);
}

TEST(Merge, TwoRunsMergeIntoOneThatReplaysAndComparesLikeOneRunOfBoth) {
  const std::string a = tmp("merge_a.json"), b = tmp("merge_b.json"), m = tmp("merge_m.json"),
                    both = tmp("merge_ab.json");
  // B1's entry is a skip that only its own run's --inject-rank 7 explains (no fault_at): replay
  // must read that flag from the entry's source run, not from merge's command line.
  const std::string b1 = "--row B1 --inject drop-segment-entry --inject-rank 7 --json ";
  ASSERT_EQ(run_kcpbench(std::string(kQuick) + "--row A1 --sweep-P 2 --inject drop-segment-entry --json " + a).code, 1);
  ASSERT_EQ(run_kcpbench(std::string(kQuick) + b1 + b).code, 0);
  const json da = read_json(a), db = read_json(b);
  // The build under test may have uncommitted changes (a developer's tree): then merge asks for
  // --allow-dirty, and says why.
  const std::string dirty = da["context"]["build"]["git_dirty"].get<bool>() ? " --allow-dirty" : "";
  if (!dirty.empty()) {
    auto refused = run_kcpbench("merge " + a + " " + b + " --json " + m);
    EXPECT_EQ(refused.code, 2) << refused.out;
    EXPECT_NE(refused.out.find("uncommitted changes"), std::string::npos) << refused.out;
  }
  auto r = run_kcpbench("merge " + a + " " + b + " --json " + m + dirty);
  ASSERT_EQ(r.code, 0) << r.out;
  const json doc = read_json(m);
  ASSERT_EQ(doc["entries"].size(), da["entries"].size() + db["entries"].size());
  ASSERT_EQ(doc["context"]["merged_from"].size(), 2u);
  EXPECT_EQ(doc["context"]["merged_from"][0]["command_line"], da["context"]["command_line"]);
  EXPECT_EQ(doc["context"]["merged_from"][1]["file"], b);
  EXPECT_EQ(doc["entries"].back()["source"], 1);
  EXPECT_EQ(doc["entries"].back()["status"], "skip");
  EXPECT_EQ(doc["summary"]["skipped"], db["summary"]["skipped"]);
  EXPECT_EQ(doc["summary"]["failed"], da["summary"]["failed"]);

  // Both entries replay to the same verdict from the merged file.
  auto p = run_kcpbench("replay " + m + " --entry A1/det/full/P=2 --cache none");
  EXPECT_EQ(p.code, 0) << p.out;
  auto q = run_kcpbench("replay " + m + " --entry B1/det/full/planned --cache none");
  EXPECT_EQ(q.code, 0) << q.out;
  // Against the two runs' entries in one file: nothing missing, nothing new.
  ASSERT_EQ(run_kcpbench(std::string(kQuick) + "--row A1 --sweep-P 2 --inject drop-segment-entry --json " + both).code,
            1);
  json ab = read_json(both);
  ASSERT_EQ(run_kcpbench(std::string(kQuick) + b1 + tmp("merge_b2.json")).code, 0);
  const json b2 = read_json(tmp("merge_b2.json"));
  for (const auto& e : b2["entries"]) ab["entries"].push_back(e);
  write_json(both, ab);
  auto c = run_kcpbench("compare " + both + " " + m + " --fail-on missing");
  EXPECT_EQ(c.code, 0) << c.out;
  EXPECT_EQ(c.out.find("new_entry"), std::string::npos) << c.out;

  // Refused: the same run twice (every entry twice), another build, one file, a file that is not there.
  auto twice = run_kcpbench("merge " + a + " " + a + " --json " + tmp("merge_x.json") + dirty);
  EXPECT_EQ(twice.code, 2) << twice.out;
  EXPECT_NE(twice.out.find("a merged file holds each once"), std::string::npos) << twice.out;
  json other = db;
  other["context"]["build"]["git_sha"] = "0123456789ab";
  write_json(tmp("merge_other.json"), other);
  auto build = run_kcpbench("merge " + a + " " + tmp("merge_other.json") + " --json " + tmp("merge_x.json") + dirty);
  EXPECT_EQ(build.code, 2) << build.out;
  EXPECT_NE(build.out.find("context.build differs"), std::string::npos) << build.out;
  auto one = run_kcpbench("merge " + a + " --json " + tmp("merge_x.json"));
  EXPECT_EQ(one.code, 2) << one.out;
  auto junk = run_kcpbench("merge " + a + " " + tmp("no_such.json") + " --json " + tmp("merge_x.json"));
  EXPECT_EQ(junk.code, 2) << junk.out;
  EXPECT_NE(junk.out.find("no_such.json"), std::string::npos) << junk.out;
  EXPECT_EQ(junk.out.find("not a results file"), std::string::npos) << "a missing file is not a bad one: " << junk.out;
}
