// Runs one external command for the external backend (docs/external.md): `/bin/sh -c "COMMAND
// 'FOLDER'"` in a process group of its own, stdout and stderr into a log file, with a time limit
// after which the whole group is killed (SIGKILL), so a hung adapter and its children never
// outlive the run. The only place kcpbench forks.
#pragma once

#include <string>

namespace kcp {

struct ProcessOutcome {
  bool started = false;    // false: fork failed (error says why)
  bool timed_out = false;  // killed at the time limit
  bool signaled = false;   // ended by a signal (signal holds it)
  int exit_status = -1;    // the exit status when it exited normally
  int signal = 0;
  double seconds = 0;  // wall time from start to end
  std::string error;
};

// Runs `command` with `arg` appended as its last argument (single-quoted for the shell), stdout
// and stderr appended to `log_path`. limit_s <= 0: no time limit.
ProcessOutcome run_process(const std::string& command, const std::string& arg, const std::string& log_path,
                           double limit_s);

// "exit status 3", "killed by signal 11 (SIGSEGV)", "killed at the time limit of 2 s", ...
std::string describe(const ProcessOutcome& p, double limit_s);

// The last `max_lines` lines of a text file, at most `max_bytes` in all ("" when it cannot be
// read). A carriage return ends a line too (a progress bar's redraws are lines), and only the
// file's last kTailWindowBytes are read, so a log of any size costs the same.
inline constexpr size_t kTailWindowBytes = 64 * 1024;
std::string file_tail(const std::string& path, int max_lines, size_t max_bytes);

}  // namespace kcp
