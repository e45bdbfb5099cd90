// Bad inputs a demanding user tried (docs/reliability.md lists each with its exit code and
// message): every one is refused with exit 2 and a message naming the flag or JSON path and the
// value as given, never truncated, wrapped or silently accepted.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "e2e_util.h"

using nlohmann::json;

namespace {
std::string tmp(const std::string& name) { return ::testing::TempDir() + "/rel_" + name; }

// Writes a row file holding `rows_text` (the rows array's elements, as JSON text).
std::string rows_file(const std::string& name, const std::string& rows_text) {
  const std::string path = tmp(name);
  std::ofstream(path) << R"({"schema": "kcpbench.rows/1", "name": "r", "defaults": {"plan_device": "cpu"}, "rows": [)"
                      << rows_text << "]}";
  return path;
}

// A row file with one row A1 (W = 2, 1024 tokens) where `row_fields` (JSON members) replace or
// add fields; the text written has each key once.
std::string row_file(const std::string& name, const std::string& row_fields) {
  json row = {{"name", "A1"}, {"op", "gdn"}, {"K", 64}, {"V", 64}, {"world", 2}, {"seqlens", {1024}}};
  row.update(json::parse("{" + row_fields + "}"));
  return rows_file(name, row.dump());
}

struct Bad {
  std::string args;
  std::string expect;  // must appear in the output
};

void expect_exit_two(const std::vector<Bad>& cases) {
  for (const Bad& c : cases) {
    const CmdResult r = run_kcpbench(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.args << ": expected \"" << c.expect << "\" in\n" << r.out;
  }
}
}  // namespace

// 4294967298 = 2^32 + 2 used to load as 2 (list, plan and run took H = 2 and passed).
TEST(Reliability, IntegersPast32BitsAreRefusedAsWritten) {
  const std::string h = row_file("h.json", R"("H": 4294967298, "HV": 4294967298)");
  const std::string w = row_file("w.json", R"("H": 2, "HV": 2, "world": 4294967298)");
  const std::string w40 = row_file("w40.json", R"("H": 2, "HV": 2, "world": 1099511627776)");
  const std::string sum =
      row_file("sum.json", R"("H": 2, "HV": 2, "seqlens": [9223372036854775807, 9223372036854775807, 2])");
  const std::string big =
      row_file("big.json", R"("H": 1024, "HV": 1024, "K": 128, "V": 128, "world": 1, "seqlens": [17592186044416])");
  expect_exit_two({
      {"list --rows " + h, h + ": 2 problems"},
      {"list --rows " + h, h + ": rows[0].H: must be in [1, 1024], got 4294967298"},
      {"plan --rows " + h, h + ": rows[0].HV: must be in [1, 1024], got 4294967298"},
      {"run --rows " + h + " --cache none", h + ": rows[0].H: must be in [1, 1024], got 4294967298"},
      {"plan --rows " + w, w + ": 1 problem"},
      {"plan --rows " + w, w + ": rows[0].world: must be in [1, 4096], got 4294967298"},
      {"plan --rows " + w40, w40 + ": rows[0].world: must be in [1, 4096], got 1099511627776"},
      {"plan --rows " + sum, sum + ": rows[0].seqlens: the lengths add up past 9223372036854775807 (64-bit overflow)"},
      {"plan --rows " + big,
       big + ": rows[0] (A1): T x HV x K x V = 17592186044416 x 1024 x 128 x 128 overflows 64-bit sizes"},
  });
}

TEST(Reliability, BadRowFilesExitTwoNamingTheProblem) {
  const std::string empty = tmp("empty.json");
  std::ofstream(empty) << R"({"schema": "kcpbench.rows/1", "name": "e", "rows": []})";
  const std::string dup =
      rows_file("dup.json", R"({"name": "A1", "op": "gdn", "H": 2, "HV": 2, "H": 4, "K": 64, "V": 64,
                                                   "seqlens": [1024]})");
  const std::string two = row_file("two.json", R"("H": "two", "HV": 2, "K": 96)");
  const std::string dir = tmp("rowdir");
  std::filesystem::create_directories(dir);
  expect_exit_two({
      {"plan --rows " + empty, empty + ": rows: the row set holds no rows"},
      {"run --rows " + empty + " --cache none", empty + ": rows: the row set holds no rows"},
      {"plan --rows " + dup, dup + ": 2 problems"},
      {"plan --rows " + dup, dup + ": rows[0].H: duplicate key \"H\""},
      {"plan --rows " + two, two + ": 2 problems"},
      {"plan --rows " + two, two + ": rows[0].H: expected an integer, got string \"two\""},
      {"plan --rows " + two, two + ": rows[0].K: unsupported head dim (supported: 64, 128), got 96"},
      {"list --rows " + dir, dir + ": is a directory, not a row file"},
  });
}

TEST(Reliability, BadOptionValuesExitTwoNamingFlagAndValue) {
  const std::string run = "run --rows int1 --row A1 --cache none ";
  expect_exit_two({
      {"plan --rows int1 --row A1 --sm-count 0", "--sm-count: Value 0 not in range 1 to 4096"},
      {"plan --rows int1 --row A1 --sm-count -1", "--sm-count: Value -1 not in range 1 to 4096"},
      {run + "--sm-count 0", "--sm-count: Value 0 not in range 1 to 4096"},
      {run + "--deadline -1", "--deadline: expected a finite number of seconds >= 0, got \"-1\""},
      {run + "--deadline nan", "--deadline: expected a finite number of seconds >= 0, got \"nan\""},
      {run + "--deadline inf", "--deadline: expected a finite number of seconds >= 0, got \"inf\""},
      {run + "--threads 0", "--threads: Value 0 not in range 1 to 1024"},
      {run + "--threads 100000", "--threads: Value 100000 not in range 1 to 1024"},
      {"calibrate --rows int1 --row A1 --threads 0", "--threads: Value 0 not in range 1 to 1024"},
      {"plan --rows int1 --row A1 --world 0", "--world: Value 0 not in range 1 to 4096"},
      {"plan --rows int1 --row A1 --P 0", "--P: Value 0 not in range 1 to 64"},
      {run + "--inject-rank 1", "--inject-rank requires --inject"},
      {run + "--inject hang --inject-rank -2", "--inject-rank: Value -2 not in range 0 to 4095"},
      {run + "--sweep-P 1,,2", "--sweep-P: empty element in the comma list \"1,,2\""},
      {run + "--P planned,", "--P: empty element in the comma list \"planned,\""},
      {run + "--package ,det", "--package: empty element in the comma list \",det\""},
      {"-q -v list", "--quiet excludes --verbose"},
      {"list -q -v", "--quiet excludes --verbose"},
  });
}

// -q and -v belong to kcpbench but may also be written after the subcommand.
TEST(Reliability, QuietWorksAfterTheSubcommand) {
  const std::string out = tmp("quiet.json");
  const CmdResult r =
      run_kcpbench("run --rows int1 --row A2 --package det --saved full --P planned --cache none -q --json " + out);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("wrote " + out), std::string::npos) << "-q after run must silence info lines:\n" << r.out;
  EXPECT_EQ(run_kcpbench("plan --rows int1 --row A1 -v").code, 0);
}

// --deadline 0.05 used to be reported as "deadline of 0 s"; a deadline below the watchdog's
// 200 ms poll must still fire, and soon.
TEST(Reliability, ASmallDeadlineFiresAndIsReportedAsGiven) {
  const auto t0 = std::chrono::steady_clock::now();
  const CmdResult r = run_kcpbench(
      "-q run --rows int1 --row A1 --package det --saved full --P planned --cache none "
      "--inject hang --deadline 0.05");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.code, 5) << r.out;
  EXPECT_NE(r.out.find("deadline of 0.05 s passed: row A1"), std::string::npos) << r.out;
  EXPECT_LT(s, 30.0);
}

// --inject-rank 7 on a 2-rank row: the entry says that rank does not exist (it used to give a
// fault-specific reason, "needs a rank that cuts a piece").
TEST(Reliability, AnInjectRankTheRowDoesNotHaveIsNamedInTheEntry) {
  const std::string out = tmp("rank7.json");
  const CmdResult r = run_kcpbench(
      "run --rows int1 --row A1 --package det --saved full --P planned --cache none "
      "--inject drop-segment-entry --inject-rank 7 --json " +
      out);
  std::ifstream in(out);
  const json j = json::parse(in);
  ASSERT_EQ(j["entries"].size(), 1u) << r.out;
  EXPECT_EQ(j["entries"][0]["status"], "skip");
  EXPECT_EQ(j["entries"][0]["reason"], "--inject-rank 7 is not a rank of row A1 (W = 2: ranks 0..1)");
  EXPECT_NE(r.out.find("A1 det/full/planned: skipped: --inject-rank 7 is not a rank of row A1"), std::string::npos)
      << r.out;
}

// A forced P that some rank cannot take at all used to be reported by the row's forced rule
// ("runs only where every rank plans P = 1"), as if another rule could run it: the rank and its
// chunk count are said first.
TEST(Reliability, AForcedPARankCannotTakeNamesTheRank) {
  const std::string out = tmp("p64.json");
  const CmdResult r =
      run_kcpbench("run --rows int1 --row A1 --package det --saved full --P 64 --cache none --json " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream in(out);
  const json j = json::parse(in);
  ASSERT_EQ(j["entries"].size(), 1u) << r.out;
  EXPECT_EQ(j["entries"][0]["status"], "skip");
  EXPECT_EQ(j["entries"][0]["reason"], "rank 0 cannot take forced P = 64: its longest piece has only 8 chunk(s)");
}

// --json and --dump used to be checked only when written: a folder that cannot be written, a
// path that is a folder or a parent that cannot be made let the whole run execute, then exit 3
// with every result lost (and a stray .tmp). They are now refused before the first row.
TEST(Reliability, AnUnwritableOutputIsRefusedBeforeTheFirstRow) {
  namespace fs = std::filesystem;
  const std::string run = "run --rows int1 --row A2 --package det --saved full --P planned --cache none ";
  const std::string dir = tmp("json_dir");
  fs::create_directories(dir);
  const std::string file = tmp("a_file");
  std::ofstream(file) << "x";
  // A read-only folder: chmod 0555 (root writes there anyway, so it uses /sys, mounted read-only).
  std::string ro = tmp("ro_dir");
  fs::create_directories(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  if (std::ofstream(ro + "/probe")) {
    fs::remove(ro + "/probe");
    ro = "/sys";
  }
  const std::vector<Bad> cases = {
      {run + "--json " + dir, "--json " + dir + ": is a folder"},
      {run + "--json " + ro + "/out.json", "--json " + ro + "/out.json: cannot write in " + ro + ": "},
      {run + "--json " + file + "/sub/out.json",
       "--json " + file + "/sub/out.json: cannot make the folder " + file + "/sub: " + file + " is not a folder"},
      {run + "--dump " + file, "--dump " + file + ": is not a folder"},
      {run + "--dump " + ro + "/d", "--dump " + ro + "/d: cannot write in " + ro + ": "},
  };
  for (const Bad& c : cases) {
    const CmdResult r = run_kcpbench(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.args << ": expected \"" << c.expect << "\" in\n" << r.out;
    EXPECT_EQ(r.out.find("A2 det/full/planned"), std::string::npos) << "no row may run:\n" << r.out;
  }
  EXPECT_FALSE(fs::exists(dir + ".tmp"));
  fs::permissions(tmp("ro_dir"), fs::perms::owner_all);
  // A missing parent that can be made is made, as before.
  const std::string deep = tmp("new_parent/sub/out.json");
  fs::remove_all(tmp("new_parent"));
  const CmdResult ok = run_kcpbench(run + "-q --json " + deep);
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_TRUE(fs::exists(deep));
}
