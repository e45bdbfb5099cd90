// kcpbench entry point: parses the command line, runs one subcommand, and is the only place
// that turns errors into exit codes (docs/design.md 8): 0 pass, 1 budget breach, 2 bad command line or
// row file, 3 runtime error, 4 determinism contract broken, 5 deadline.
#include <malloc.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <functional>
#include <vector>

#include "app/commands.h"
#include "core/comm/mpi_communicator.h"
#include "core/config/row_loader.h"
#include "core/util/error.h"
#include "core/util/log.h"
#include "kcp/config.h"

namespace {

// kcpbench's own options; written before or after the subcommand.
struct TopFlags {
  bool version = false;
  int quiet = 0, verbose = 0;
};

void add_top_options(CLI::App& cli, kcp::app::Globals& g, TopFlags& f) {
  // Options of kcpbench itself (-q, -v, --configs) may also be written after the subcommand
  // ("kcpbench run -q"): a subcommand hands options it does not know to kcpbench. Set before
  // the subcommands are added (they inherit it).
  cli.fallthrough();
  cli.add_flag("--version", f.version, "Print the version, git sha, build options and CUDA/NCCL/MPI availability");
  cli.add_option("--configs", g.configs_dir, "Folder holding rows/<set>.json (default: the source tree's configs/)");
  // -q with -v is checked after parsing, not with CLI11's excludes(): CLI11 2.4 (Ubuntu 24.04)
  // reports "--quiet excludes --verbose" for a lone -q of this fallthrough flag.
  cli.add_flag("-q,--quiet", f.quiet,
               "Print only the failing table lines (FAIL, CONTRACT BROKEN, a skip for an "
               "error), the summary and errors (before or after the subcommand)");
  cli.add_flag("-v,--verbose", f.verbose,
               "Print debug lines (per-phase details; before or after the "
               "subcommand)");
}

// Parses the command line. Returns the exit code when parsing ends the run (help: 0; a parse
// error or -q with -v: 2, the message printed), else -1.
int parse_command_line(CLI::App& cli, int argc, char** argv, const TopFlags& f) {
  try {
    cli.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return cli.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return cli.exit(e);
  } catch (const CLI::ParseError& e) {
    cli.exit(e);
    return 2;
  }
  if (f.quiet > 0 && f.verbose > 0) {
    std::fprintf(stderr,
                 "--quiet excludes --verbose (give -q or -v, not both)\nRun with --help for more information.\n");
    return 2;
  }
  return -1;
}

// The parsed command: --version, the help without a subcommand, or the one subcommand's action
// (each action returns -1 unless its own subcommand was parsed). Returns the exit code.
int run_parsed(CLI::App& cli, const TopFlags& f, const std::vector<std::function<int()>>& actions) {
  kcp::log::set_level(f.quiet ? kcp::log::Level::Quiet : f.verbose ? kcp::log::Level::Debug : kcp::log::Level::Info);
  if (f.version) {
    std::fputs(kcp::app::version_text().c_str(), stdout);
    return 0;
  }
  if (cli.get_subcommands().empty()) {
    std::fputs(cli.help().c_str(), stdout);
    return 0;
  }
  int code = 0;
  for (const auto& act : actions) {
    const int rc = act();
    if (rc >= 0) code = rc;
  }
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kcp;
  // Every array of 1 MiB or more is its own mapping, returned to the system when freed: glibc's
  // default threshold grows (to 32 MiB) as large blocks are freed, after which freed arrays stay
  // resident in the heap and the peak exceeds the memory estimate that `run` and `calibrate` check
  // (core/plan/memory_estimate.h; Guard.TheEstimateBoundsTheMeasuredPeakClosely).
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  app::Globals g;
  g.argv.assign(argv, argv + argc);
  g.configs_dir = default_configs_dir();
  const bool use_mpi = mpi_available() && mpi_launched();
  int code = 0;
  try {
    if (use_mpi) mpi_init(&argc, &argv);
    CLI::App cli{
        "kcpbench: benchmark and validation harness for context-parallel (KCP) GDN and KDA training "
        "kernels.\nRows come from JSON row sets (configs/rows/*.json); see README.md."};
    cli.require_subcommand(0, 1);
    TopFlags flags;
    add_top_options(cli, g, flags);
    std::vector<std::function<int()>> actions;
    actions.push_back(app::add_list_command(cli, g));
    actions.push_back(app::add_plan_command(cli, g));
    actions.push_back(app::add_run_command(cli, g));
    actions.push_back(app::add_calibrate_command(cli, g));
    actions.push_back(app::add_compare_command(cli, g));
    actions.push_back(app::add_merge_command(cli, g));
    actions.push_back(app::add_replay_command(cli, g));
    code = parse_command_line(cli, argc, argv, flags);
    if (code < 0) code = run_parsed(cli, flags, actions);
  } catch (const Error& e) {
    std::fprintf(stderr, "kcpbench: error: %s\n", e.what());
    code = e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kcpbench: error: %s %s\n", rank_prefix().c_str(), e.what());
    code = 3;
  }
  if (use_mpi) {
    if (code == 2 || code == 3 || code == 5) mpi_abort(code);  // a rank may be stuck in a collective
    mpi_finalize();
  }
  return code;
}
