// The one table of the backend phases (kernels/api/phases.h) and the names the engine reports
// from it (core/kcp/phase_timing_backend.h): the order and the strings are part of the JSON
// output, so they are pinned here.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/kcp/phase_timing_backend.h"
#include "kernels/api/phases.h"

namespace {

const std::vector<std::string> kWant = {"prep",       "wy",         "fwd_summaries", "fold",
                                        "fwd_states", "fwd_output", "bwd_local_dv",  "bwd_summaries",
                                        "bwd_states", "bwd_grads",  "bwd_finalize"};

TEST(PhaseTable, NamesInTheAlgorithmOrder) {
  const std::vector<std::string>& want = kWant;
  ASSERT_EQ(kcp::kernels::kPhaseCount, int(want.size()));
  for (int i = 0; i < kcp::kernels::kPhaseCount; ++i) EXPECT_EQ(kcp::kernels::kPhaseNames[i], want[size_t(i)]);
}

TEST(PhaseTable, EnginePhaseNamesAreTheReportedStrings) {
  std::vector<std::string> want;
  for (const char* section : {"forward", "backward"}) {
    for (const std::string& p : kWant) want.push_back(std::string(section) + "." + p);
    want.push_back(std::string(section) + ".copy/fill");
  }
  EXPECT_EQ(kcp::engine_phase_names(), want);
  EXPECT_EQ(kcp::engine_phase_names().front(), "forward.prep");
  EXPECT_EQ(kcp::engine_phase_names().back(), "backward.copy/fill");
}

}  // namespace
