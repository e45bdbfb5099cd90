// The subcommands of kcpbench. Each registers its options on a CLI11 subcommand and runs
// when selected; main() owns exit codes and error printing.
#pragma once

#include <CLI/CLI.hpp>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "core/config/row_loader.h"
#include "core/kcp/row_runner.h"
#include "core/report/report.h"

namespace kcp::app {

struct Globals {
  std::vector<std::string> argv;
  std::string configs_dir;
  int verbosity = 1;
};

// Each returns the action to run when its subcommand was selected (returns the exit code).
std::function<int()> add_list_command(CLI::App& app, Globals& g);
std::function<int()> add_plan_command(CLI::App& app, Globals& g);
std::function<int()> add_run_command(CLI::App& app, Globals& g);

std::function<int()> add_calibrate_command(CLI::App& app, Globals& g);
std::function<int()> add_compare_command(CLI::App& app, Globals& g);
std::function<int()> add_merge_command(CLI::App& app, Globals& g);
std::function<int()> add_replay_command(CLI::App& app, Globals& g);

std::string version_text();

// Shared by run and calibrate (cmd_run.cpp).
std::vector<SelectedRow> selected_rows(const RowSet& set, const std::vector<std::string>& patterns);
// comm_kind: "local", "mpi" or "nccl" (the communicator the ranks use). shared_refs: the FP64
// references to use in a local world (calibrate passes one store to both of its twins); null:
// a store of this call's own.
RunOutcome run_in_world(const std::vector<SelectedRow>& rows, RunOptions opt, const std::string& comm_kind,
                        int threads_flag, const kernels::Backend& backend, RunContext& ctx,
                        const std::function<void(const RunOutcome&)>& after_row = {},
                        ReferenceStore* shared_refs = nullptr);
// The rows at another seed: copies of `rows` (same digest, row JSON and memory choices: the row is the same,
// its inputs are drawn at `seed`) kept alive in `store`. Entries record the seed they used.
std::vector<SelectedRow> rows_at_seed(const std::vector<SelectedRow>& rows, uint64_t seed,
                                      std::deque<RowConfig>& store);
int gpu_count();  // CUDA devices visible (0 without a CUDA build or a driver); backend_select.cpp
std::string default_cache_dir();
std::unique_ptr<kernels::Backend> select_backend(const std::string& name);  // backend_select.cpp
// --backend exec:COMMAND -> COMMAND (refused when empty); "" for the built-in backends
// (backend_select.cpp).
std::string external_command(const std::string& backend);

}  // namespace kcp::app
