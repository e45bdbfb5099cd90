// Whole-program tests of forms run by groups of heads (core/kcp/head_group_run.h, run --head-group):
// the same metrics, verdicts and det checks as every head at once, the plan unchanged, a fault of
// one head still caught, and the estimate with groups still bounding the measured peak.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "e2e_util.h"

namespace {

std::string tmp(const std::string& name) { return ::testing::TempDir() + "/" + name; }

// j[key], or null when j is no object or lacks it.
nlohmann::json field(const nlohmann::json& j, const char* key) {
  return j.is_object() && j.contains(key) ? j[key] : nlohmann::json();
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

// Every tensor's metrics of two entries: equal, but rel_rms / rms_ratio (sums in another order)
// within 1e-12 relative.
void expect_same_tensors(const nlohmann::json& a, const nlohmann::json& b, const std::string& id) {
  ASSERT_EQ(a.size(), b.size()) << id;
  for (const auto& [name, m] : a.items()) {
    ASSERT_TRUE(b.contains(name)) << id << " " << name;
    for (const auto& [field, v] : m.items()) {
      const nlohmann::json& w = b[name][field];
      if ((field == "rel_rms" || field == "rms_ratio") && v.is_number() && w.is_number()) {
        const double x = v.get<double>(), y = w.get<double>();
        EXPECT_LE(std::fabs(x - y), 1e-12 * std::fabs(x)) << id << " " << name << "." << field;
      } else {
        EXPECT_EQ(v, w) << id << " " << name << "." << field;
      }
    }
  }
}

}  // namespace

// Every int1 row run by groups of one q/k head (--head-group 0: rows with H = 2 run two groups,
// grouped value heads G1 / KG1, raw gates E1 / KA1 / KE1 / KG1 / KV1 (dA_log, ddt_bias), h0 and
// dht D1 / H1 / V1, K != V V1 / KV1, several ranks and sequences, forced schedules) against every
// head at once: the same entries, statuses, plans and det checks, max_abs and the worst elements
// identical, rel-RMS equal to 1e-12. The table says how the row runs.
TEST(HeadGroups, FormsByGroupsOfHeadsJudgeExactlyAsEveryHeadAtOnce) {
  const std::string whole = tmp("heads_whole.json"), groups = tmp("heads_groups.json");
  const std::string run = "-q run --rows int1 --cache none --json ";
  const CmdResult a = run_kcpbench(run + whole + " --head-group never");
  ASSERT_EQ(a.code, 0) << a.out;
  const CmdResult b = run_kcpbench("run --rows int1 --cache none --json " + groups + " --head-group 0");
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_NE(b.out.find("row KG1: its forms run in 2 groups of heads (1 q/k head each)"), std::string::npos) << b.out;
  const nlohmann::json ja = read_json(whole), jb = read_json(groups);
  ASSERT_GT(ja["entries"].size(), 100u);
  ASSERT_EQ(ja["entries"].size(), jb["entries"].size());
  int det_checked = 0;
  for (size_t i = 0; i < ja["entries"].size(); ++i) {
    const nlohmann::json &x = ja["entries"][i], &y = jb["entries"][i];
    const std::string id = x["id"];
    EXPECT_EQ(x["id"], y["id"]);
    EXPECT_EQ(x["status"], y["status"]) << id;
    EXPECT_EQ(field(x, "plan"), field(y, "plan")) << id;
    EXPECT_EQ(field(x, "planned_P"), field(y, "planned_P")) << id;
    EXPECT_EQ(field(x, "determinism"), field(y, "determinism")) << id;
    const nlohmann::json wx = field(x, "worst"), wy = field(y, "worst");
    EXPECT_EQ(field(wx, "ratio_max"), field(wy, "ratio_max")) << id;
    EXPECT_EQ(field(wx, "ratio_max_tensor"), field(wy, "ratio_max_tensor")) << id;
    expect_same_tensors(field(x, "tensors"), field(y, "tensors"), id);
    const nlohmann::json det = field(y, "determinism");
    det_checked += field(det, "rerun_identical") == true ? 1 : 0;
  }
  EXPECT_GT(det_checked, 20);
}

// A fault confined to one head (value head 0) is caught as it is without groups: skip-output-tile
// fails o at the same element; nondeterministic-rerun breaks the det contract (exit 4); a fault of
// every head (drop-segment-entry) fails as before.
TEST(HeadGroups, AFaultOfOneHeadIsStillCaught) {
  for (const char* fault : {"skip-output-tile", "drop-segment-entry"}) {
    const std::string whole = tmp(std::string("heads_fault_whole_") + fault + ".json"),
                      groups = tmp(std::string("heads_fault_groups_") + fault + ".json");
    const std::string run = std::string(
                                "-q run --rows int1 --row A2 --row KG1 --package det --saved full --cache none "
                                "--inject ") +
                            fault + " --json ";
    const CmdResult a = run_kcpbench(run + whole + " --head-group never");
    const CmdResult b = run_kcpbench(run + groups + " --head-group 0");
    EXPECT_EQ(a.code, 1) << a.out;
    EXPECT_EQ(b.code, 1) << b.out;
    const nlohmann::json ja = read_json(whole), jb = read_json(groups);
    ASSERT_EQ(ja["entries"].size(), jb["entries"].size());
    for (size_t i = 0; i < ja["entries"].size(); ++i) {
      const nlohmann::json &x = ja["entries"][i], &y = jb["entries"][i];
      const std::string id = std::string(fault) + " " + x["id"].get<std::string>();
      EXPECT_EQ(y["status"], "fail") << id;
      EXPECT_EQ(field(x, "fault_at"), field(y, "fault_at")) << id;
      expect_same_tensors(field(x, "tensors"), field(y, "tensors"), id);
    }
  }
  const CmdResult nd = run_kcpbench(
      "-q run --rows int1 --row A2 --package det --cache none --inject nondeterministic-rerun --head-group 0");
  EXPECT_EQ(nd.code, 4) << nd.out;
  EXPECT_NE(nd.out.find("det package: a rerun differs in o"), std::string::npos) << nd.out;
}

// --head-group is checked (a byte count, auto or never), and --dump, which writes whole tensors,
// refuses groups of heads.
TEST(HeadGroups, TheFlagIsCheckedAndDumpNeedsEveryHead) {
  const CmdResult bad = run_kcpbench("-q run --rows int1 --row A2 --head-group lots");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("--head-group: expected a byte count"), std::string::npos) << bad.out;
  const CmdResult dump =
      run_kcpbench("-q run --rows int1 --row A2 --head-group 0 --cache none --dump " + tmp("heads_dump"));
  EXPECT_EQ(dump.code, 2) << dump.out;
  EXPECT_NE(dump.out.find("--dump writes whole tensors"), std::string::npos) << dump.out;
}

// plan states the groups; a row too large for the memory given runs in the fewest groups that fit
// (auto), and run, with the same limit, runs it so.
TEST(HeadGroups, PlanAndRunChooseTheFewestGroupsThatFit) {
  const CmdResult plan = run_kcpbench("plan --rows int3 --row KE4 --max-host-mem 22.5G --json");
  ASSERT_EQ(plan.code, 0) << plan.out;
  const nlohmann::json mem = nlohmann::json::parse(plan.out)[0]["memory"];
  EXPECT_GT(mem["head_groups"].get<int>(), 1) << mem.dump();
  EXPECT_TRUE(mem["fits"].get<bool>()) << mem.dump();
  EXPECT_LE(mem["host_bytes"].get<int64_t>(), int64_t(22.5 * (1 << 30))) << mem.dump();
  const CmdResult one = run_kcpbench("plan --rows int3 --row KE4 --head-group never --max-host-mem 22.5G --json");
  const nlohmann::json mem1 = nlohmann::json::parse(one.out)[0]["memory"];
  EXPECT_EQ(mem1["head_groups"].get<int>(), 1);
  EXPECT_FALSE(mem1["fits"].get<bool>()) << mem1.dump();
  // int1 KG1 needs 140 MiB with every head at once, 132 MiB in two groups: with 136 MiB given it
  // runs in two groups and passes.
  const CmdResult small = run_kcpbench("run --rows int1 --row KG1 --cache none --max-host-mem 136M");
  EXPECT_EQ(small.code, 0) << small.out;
  EXPECT_NE(small.out.find("row KG1: its forms run in 2 groups of heads"), std::string::npos) << small.out;
}
