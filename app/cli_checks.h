// Checks of option values shared by the subcommands (CLI11 validators): a bad value is refused
// while the command line is parsed, so main() exits 2 with "--flag: ... got VALUE". Bounds are
// shown in each option's --help.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "core/config/row_loader.h"
#include "core/util/error.h"

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

// Seeds: "S" (one), "A:B" (A to B inclusive, at most kMaxSeeds) or a comma list of those
// ("1:8,13"). Returns the seeds in order, duplicates removed; throws ConfigError naming the flag
// and the text.
inline constexpr int kMaxSeeds = 4096;
inline std::vector<uint64_t> parse_seeds(const std::string& flag, const std::string& text) {
  auto bad = [&](const std::string& why) -> std::vector<uint64_t> {
    KCP_THROW(ConfigError, "{}: {} in \"{}\" (give S, A:B or a comma list such as 1:8,13)", flag, why, text);
  };
  auto number = [&](const std::string& s) {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) bad("\"" + s + "\" is not a seed");
    errno = 0;
    const unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
    if (errno == ERANGE) bad("\"" + s + "\" is past 2^64 - 1");
    return uint64_t(v);
  };
  std::vector<uint64_t> seeds;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ',');) {
    const size_t colon = part.find(':');
    const uint64_t a = number(part.substr(0, colon)),
                   b = colon == std::string::npos ? a : number(part.substr(colon + 1));
    if (b < a) bad(fmt::format("the range {}:{} runs backwards", a, b));
    if (b - a >= uint64_t(kMaxSeeds) || seeds.size() + (b - a) >= size_t(kMaxSeeds))
      bad(fmt::format("more than {} seeds", kMaxSeeds));
    for (uint64_t s = a;; ++s) {
      if (std::find(seeds.begin(), seeds.end(), s) == seeds.end()) seeds.push_back(s);
      if (s == b) break;
    }
  }
  if (seeds.empty() || text.back() == ',') bad("no seed");
  return seeds;
}

}  // namespace kcp::app
