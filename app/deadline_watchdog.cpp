#include "app/deadline_watchdog.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "core/comm/mpi_communicator.h"
#include "core/util/error.h"
#include "core/util/phase.h"

namespace kcp::app {

DeadlineWatchdog::DeadlineWatchdog(double seconds) : seconds_(seconds) {
  if (seconds_ <= 0) return;
  // Poll every 200 ms, or four times per deadline when it is shorter, so that a deadline below
  // the poll period fires close to when it passes (at least 1 ms between polls).
  const auto poll = std::chrono::duration<double>(std::clamp(seconds_ / 4, 1e-3, 0.2));
  thread_ = std::thread([this, poll] {
    while (!stop_.load()) {
      std::this_thread::sleep_for(poll);
      const auto now = std::chrono::steady_clock::now();
      const std::vector<RankPhase> phases = rank_phases();
      bool expired = false;
      for (const RankPhase& p : phases)
        expired = expired || std::chrono::duration<double>(now - p.row_started).count() > seconds_;
      if (!expired) continue;
      // Every rank of this process says where it is: the one stuck elsewhere is the culprit.
      for (const RankPhase& p : phases)
        std::fprintf(
            stderr, "kcpbench: error: [r%d] deadline of %g s passed: row %s has run %.1f s; in phase '%s' for %.1f s\n",
            p.rank, seconds_, p.row.c_str(), std::chrono::duration<double>(now - p.row_started).count(),
            p.phase.c_str(), std::chrono::duration<double>(now - p.since).count());
      {
        std::lock_guard<std::mutex> lock(note_mutex_);
        if (!note_.empty()) std::fprintf(stderr, "kcpbench: error: %s\n", note_.c_str());
      }
      std::fprintf(stderr, "kcpbench: error: aborting the communicators (exit code 5)\n");
      std::fflush(stderr);
      mpi_abort(5);   // under mpirun: every process ends
      std::_Exit(5);  // threads mode: ranks blocked in a collective cannot unwind
    }
  });
}

void DeadlineWatchdog::set_note(std::string note) {
  std::lock_guard<std::mutex> lock(note_mutex_);
  note_ = std::move(note);
}

DeadlineWatchdog::~DeadlineWatchdog() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

}  // namespace kcp::app
