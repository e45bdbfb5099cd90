// The mpi tier: `mpirun -np W kcpbench run` gives the same verdicts and the same metrics, to
// the bit, as the threaded run of the same rows (docs/design.md 7; both reduce in rank order).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../e2e/e2e_util.h"

using nlohmann::json;

namespace {
json read_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

void expect_same(const std::string& row, int W) {
  const std::string a = ::testing::TempDir() + "/mpi_" + row + ".json",
                    b = ::testing::TempDir() + "/thr_" + row + ".json";
  const std::string mpirun =
      std::string(MPIEXEC) + " " + MPIEXEC_FLAGS + " " + MPIEXEC_NP + " " + std::to_string(W) + " ";
  auto m = run_command(mpirun + KCPBENCH_EXE + " -q run --rows int1 --row " + row + " --cache none --json " + a);
  ASSERT_EQ(m.code, 0) << m.out;
  auto t = run_kcpbench("-q run --rows int1 --row " + row + " --cache none --json " + b);
  ASSERT_EQ(t.code, 0) << t.out;
  json jm = read_json(a), jt = read_json(b);
  EXPECT_EQ(jm["context"]["launch_mode"], "mpirun");
  EXPECT_EQ(jm["context"]["world_size"], W);
  EXPECT_EQ(jt["context"]["launch_mode"], "threads");
  ASSERT_EQ(jm["entries"].size(), jt["entries"].size());
  for (size_t i = 0; i < jm["entries"].size(); ++i) {
    const json &x = jm["entries"][i], &y = jt["entries"][i];
    EXPECT_EQ(x["id"], y["id"]);
    EXPECT_EQ(x["status"], y["status"]) << x["id"];
    EXPECT_EQ(x["tensors"], y["tensors"]) << x["id"] << ": metrics differ between mpirun and threads";
    EXPECT_EQ(x["determinism"], y["determinism"]);
  }
}
}  // namespace

TEST(MpiVsThreads, FourRanksVarlen) { expect_same("B1", 4); }
TEST(MpiVsThreads, FourRanksKdaEdges) { expect_same("KF1", 4); }
TEST(MpiVsThreads, TwoRanksGvaStates) { expect_same("D1", 2); }

TEST(MpiDeadline, AHungRankAbortsEveryProcessWithExitFive) {
  const std::string mpirun = std::string(MPIEXEC) + " " + MPIEXEC_FLAGS + " " + MPIEXEC_NP + " 4 ";
  auto m =
      run_command(mpirun + KCPBENCH_EXE +
                  " -q run --rows int1 --row B1 --package det --saved full --cache none --inject hang --inject-rank 1 "
                  "--deadline 2");
  EXPECT_EQ(m.code, 5) << m.out;
  // Each process reports its own rank; the first MPI_Abort may end the others before they print,
  // so any rank's report will do here (the threads-mode test checks every rank's line).
  EXPECT_NE(m.out.find("deadline of 2 s passed: row B1"), std::string::npos) << m.out;
}
