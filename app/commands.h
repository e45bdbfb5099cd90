// The subcommands of kcpbench. Each registers its options on a CLI11 subcommand and runs
// when selected; main() owns exit codes and error printing.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace kcp::app {

struct Globals {
  std::vector<std::string> argv;
  std::string configs_dir;
  int verbosity = 1;
};

// Each returns the action to run when its subcommand was selected (returns the exit code).
std::function<int()> add_list_command(CLI::App& app, Globals& g);
std::function<int()> add_plan_command(CLI::App& app, Globals& g);

std::string version_text();

}  // namespace kcp::app
