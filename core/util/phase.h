// Where each rank is: the row and phase it works on, published for the deadline watchdog
// (app/deadline_watchdog.cpp) so a hang is reported as "rank 3, row A4, phase forward exchange"
// instead of a silent wait. Cheap: one mutex-protected slot per rank, set a few times per form.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace kcp {

struct RankPhase {
  int rank = 0;
  std::string row, phase;
  std::chrono::steady_clock::time_point row_started, since;
};

// Called by the engine on the calling rank's thread (thread_rank()).
void set_row(const std::string& row);
void set_phase(const std::string& phase);
void clear_phase();                    // the rank is between rows (no deadline applies)
std::vector<RankPhase> rank_phases();  // snapshot of every rank of this process

}  // namespace kcp
