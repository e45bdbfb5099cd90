// Whole-program tests of `kcpbench list / plan / --version` and of its exit codes.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "e2e_util.h"

using nlohmann::json;

TEST(Cli, VersionAndHelp) {
  auto v = run_kcpbench("--version");
  EXPECT_EQ(v.code, 0);
  EXPECT_NE(v.out.find("kcpbench "), std::string::npos);
  EXPECT_NE(v.out.find("MPI: "), std::string::npos);
  for (const char* sub : {"list", "plan"}) {
    auto h = run_kcpbench(std::string(sub) + " --help");
    EXPECT_EQ(h.code, 0);
    EXPECT_NE(h.out.find("--rows"), std::string::npos) << sub;
  }
  EXPECT_EQ(run_kcpbench("--no-such-flag").code, 2);
  EXPECT_EQ(run_kcpbench("plan --P notanumber").code, 2);
}

TEST(Cli, ListJsonHasEveryRowSet) {
  auto r = run_kcpbench("list --json");
  ASSERT_EQ(r.code, 0) << r.out;
  json j = json::parse(r.out);
  ASSERT_EQ(j.size(), 4u);  // ext1, int1, int3, int4
  for (const auto& set : j) {
    EXPECT_EQ(set["digest"].get<std::string>().size(), 64u);
    EXPECT_GT(set["rows"].size(), 3u);
    for (const auto& row : set["rows"]) EXPECT_EQ(row["digest"].get<std::string>().size(), 64u);
  }
}

TEST(Cli, PlanDependsOnTheDeviceClass) {
  auto h = run_kcpbench("plan --rows int3 --device h200 --json");
  auto b = run_kcpbench("plan --rows int3 --device b200 --json");
  ASSERT_EQ(h.code, 0) << h.out;
  ASSERT_EQ(b.code, 0) << b.out;
  json jh = json::parse(h.out), jb = json::parse(b.out);
  ASSERT_EQ(jh.size(), jb.size());
  int differ = 0;
  for (size_t i = 0; i < jh.size(); ++i) {
    EXPECT_EQ(jh[i]["P"].size(), 8u) << "per-rank P for every int3 row";
    differ += jh[i]["P"] != jb[i]["P"];
  }
  EXPECT_GE(differ, 1) << "at least one int3 row must plan differently on 132 and 148 SMs";
  auto one = run_kcpbench("plan --rows int1 --row A1 --world 1 --P 3 --json --segments");
  ASSERT_EQ(one.code, 0) << one.out;
  json j1 = json::parse(one.out);
  EXPECT_EQ(j1[0]["P"], json::array({3}));
  EXPECT_EQ(j1[0]["ranks"][0]["segments"].size(), 3u);
}

TEST(Cli, BrokenRowFileExitsTwoNamingFilePathExpectedAndFound) {
  const std::string path = ::testing::TempDir() + "/broken_rows.json";
  std::ofstream(path) << R"({"schema": "kcpbench.rows/1", "name": "b", "rows": [
      {"name": "A1", "op": "gdn", "H": 2, "HV": 3, "K": 64, "V": 64, "seqlens": [128], "world": 2}]})";
  auto r = run_kcpbench("plan --rows " + path);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find(path + ": rows[0].HV: must be a multiple of H (2), got 3"), std::string::npos) << r.out;
  auto missing = run_kcpbench("plan --rows int9");
  EXPECT_EQ(missing.code, 2);
  EXPECT_NE(missing.out.find("unknown row set \"int9\""), std::string::npos) << missing.out;
  auto norow = run_kcpbench("plan --rows int1 --row Q7");
  EXPECT_EQ(norow.code, 2);
  EXPECT_NE(norow.out.find("--row Q7: no row"), std::string::npos) << norow.out;
}
