// The per-row deadline (docs/design.md 7): a watchdog thread that, when any rank of this process has
// spent longer than the deadline on one row, prints which rank, row and phase, and ends the run
// with exit code 5 (MPI_Abort under mpirun, so the other processes end too; a communicator stuck
// in a collective cannot be unwound, so the process cannot return through main).
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>

namespace kcp::app {

class DeadlineWatchdog {
 public:
  // <= 0: no watchdog. Any positive deadline fires (polled every min(200 ms, seconds / 4), at
  // least 1 ms apart) and is printed as given (%g: "deadline of 0.05 s").
  explicit DeadlineWatchdog(double seconds);
  ~DeadlineWatchdog();
  // A line printed after the abort message (where the rows finished so far were written).
  void set_note(std::string note);

 private:
  double seconds_;
  std::mutex note_mutex_;
  std::string note_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kcp::app
