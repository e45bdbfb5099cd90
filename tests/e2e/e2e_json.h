// Helpers of the whole-program tests that read kcpbench's JSON: a results file, and a path in the
// test's temporary folder.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "e2e_util.h"

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}
inline std::string tmp(const std::string& name) { return ::testing::TempDir() + "/" + name; }

// The number of rows of the shipped int1 set, as `kcpbench list --rows int1 --json` reads them (so a
// test that runs all of int1 follows the row file instead of a fixed count).
inline size_t int1_row_count() {
  const auto r = run_kcpbench("list --rows int1 --json");
  EXPECT_EQ(r.code, 0) << r.out;
  return r.code == 0 ? nlohmann::json::parse(r.out).at(0).at("rows").size() : 0;
}
