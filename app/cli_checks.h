// Checks of option values shared by the subcommands (CLI11 validators): a bad value is refused
// while the command line is parsed, so main() exits 2 with "--flag: ... got VALUE". Bounds are
// shown in each option's --help.
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <string>

#include "core/config/row_loader.h"

namespace kcp::app {

inline constexpr int kMaxThreads = 1024;  // --threads: CPU twin threads per rank
inline constexpr int kMaxSmCount = 4096;  // --sm-count

// A finite number of seconds >= 0 (nan, inf and negative values refused); 0 keeps its meaning
// given in the option's help (e.g. no deadline).
inline CLI::Validator seconds_at_least_zero() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        double v = 0;
        if (CLI::detail::lexical_cast(s, v) && std::isfinite(v) && v >= 0) return "";
        return "expected a finite number of seconds >= 0, got \"" + s + "\"";
      },
      "SECONDS>=0");
}

// A comma list without empty elements ("1,,2", ",2" and "2," are refused, not read as "1,2").
inline CLI::Validator comma_list() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (!s.empty() && s.front() != ',' && s.back() != ',' && s.find(",,") == std::string::npos) return "";
        return "empty element in the comma list \"" + s + "\"";
      },
      "LIST");
}

}  // namespace kcp::app
