// Helpers of the whole-program tests that read kcpbench's JSON: a results file, and a path in the
// test's temporary folder.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}
inline std::string tmp(const std::string& name) { return ::testing::TempDir() + "/" + name; }
