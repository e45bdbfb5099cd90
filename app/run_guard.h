// What `kcpbench run` checks before any row runs (ConfigError, exit 2): an injected hang needs a
// finite deadline (and the run says how long it will hang).
#pragma once

#include "core/kcp/row_runner.h"

namespace kcp::app {

struct RunGuard {
  double deadline = 0;          // seconds; <= 0: none
  bool deadline_given = false;  // --deadline on the command line (else the default)
};

void check_before_run(const RunOptions& opt, const RunGuard& guard);

}  // namespace kcp::app
