#include "app/run_guard.h"

#include "core/util/error.h"
#include "core/util/log.h"

namespace kcp::app {

namespace {

void check_hang(const RunOptions& opt, const RunGuard& guard) {
  if (opt.fault.kind != FaultKind::Hang) return;
  KCP_REQUIRE(guard.deadline > 0,
              "--inject hang needs a finite --deadline: the injected hang lasts until the deadline aborts the run, and "
              "--deadline {} sets none (give one, e.g. --deadline 30)",
              guard.deadline);
  log::warn("--inject hang: one rank hangs until the deadline of {} s{} aborts the run with exit code 5", guard.deadline,
            guard.deadline_given ? "" : " (the default; --deadline SECONDS shortens it)");
}

}  // namespace

void check_before_run(const RunOptions& opt, const RunGuard& guard) { check_hang(opt, guard); }

}  // namespace kcp::app
