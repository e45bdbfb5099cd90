// `kcpbench compare BASE.json NEW.json`: accuracy, coverage and time regressions between two
// results files (docs/design.md 8); the logic is core/report/results_compare.h.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "app/commands.h"
#include "core/report/results_compare.h"
#include "core/util/error.h"
#include "core/util/log.h"

namespace kcp::app {

std::function<int()> add_compare_command(CLI::App& app, Globals&) {
  auto* sub = app.add_subcommand(
      "compare",
      "Compare two results JSON files: entries matched by row digest, form and device class; reports pass -> fail, "
      "ratio rises, new non-finite values, missing or new entries, and time changes judged against the repeat "
      "spread. Exit 0 clean, 1 regression (per --fail-on), 2 bad input or different devices");
  struct Opts {
    std::string base, now, md, fail_on = "accuracy,time,missing";
    double ratio_threshold = 0.05, time_threshold = 0.10;
    bool allow_device_mismatch = false;
  };
  auto o = std::make_shared<Opts>();
  sub->add_option("BASE", o->base, "Baseline results JSON")->required();
  sub->add_option("NEW", o->now, "New results JSON")->required();
  sub->add_option("--ratio-threshold", o->ratio_threshold,
                  "A tensor's ratio_max or rms ratio that rises by more than this (absolute, in units of its budget) "
                  "is a regression")
      ->capture_default_str();
  sub->add_option("--time-threshold", o->time_threshold,
                  "Relative time change that counts as slower / faster; a repeat spread (max-min)/median above it, "
                  "or fewer than 3 repeats, is 'noisy' (never fails)")
      ->capture_default_str();
  sub->add_option("--fail-on", o->fail_on,
                  "Which regressions set exit code 1: a comma list of accuracy (pass -> fail, ratio rise, new "
                  "non-finite), time (slower), missing (entries or tensors gone, or now skipped); 'all' or 'none'. "
                  "A speedup never fails")
      ->capture_default_str();
  sub->add_flag("--allow-device-mismatch", o->allow_device_mismatch,
                "Compare files from different backends / devices / device classes (refused otherwise)");
  sub->add_option("--md", o->md, "Also write a short markdown summary (for a pull-request comment) to this path");
  return [sub, o]() -> int {
    if (!sub->parsed()) return -1;
    KCP_REQUIRE(o->ratio_threshold >= 0 && o->time_threshold >= 0,
                "--ratio-threshold and --time-threshold must be >= 0, got {} and {}", o->ratio_threshold,
                o->time_threshold);
    CompareOptions opt;
    opt.ratio_threshold = o->ratio_threshold;
    opt.time_threshold = o->time_threshold;
    opt.allow_device_mismatch = o->allow_device_mismatch;
    opt.fail_on = parse_fail_on(o->fail_on);
    const CompareReport rep = compare_results(read_results_file(o->base), read_results_file(o->now), opt);
    std::fputs(render_text(rep).c_str(), stdout);
    std::fflush(stdout);
    if (!o->md.empty()) {
      const std::string tmp = o->md + ".tmp";
      {
        std::ofstream f(tmp);
        f << render_markdown(rep, o->base, o->now);
        if (!f) raise_api_error("I/O", "write", errno, std::strerror(errno) + (": " + tmp), __FILE__, __LINE__);
      }
      if (std::rename(tmp.c_str(), o->md.c_str()) != 0)
        raise_api_error("I/O", "rename", errno, std::strerror(errno) + (": " + o->md), __FILE__, __LINE__);
      log::info0("wrote {}", o->md);
    }
    return rep.exit_code();
  };
}

}  // namespace kcp::app
