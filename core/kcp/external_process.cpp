#include "core/kcp/external_process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <thread>

namespace kcp {

namespace {

// 'x' for /bin/sh: every ' becomes '\''.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// In the child, between fork and exec: only async-signal-safe calls.
[[noreturn]] void exec_child(const char* shell_line, const char* log_path) {
  setpgid(0, 0);  // a group of its own: the time limit kills the adapter and its children
  const int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
  }
  const int devnull = open("/dev/null", O_RDONLY);
  if (devnull >= 0) dup2(devnull, 0);
  execl("/bin/sh", "sh", "-c", shell_line, static_cast<char*>(nullptr));
  _exit(127);
}

}  // namespace

ProcessOutcome run_process(const std::string& command, const std::string& arg, const std::string& log_path,
                           double limit_s) {
  ProcessOutcome out;
  const std::string line = command + " " + shell_quote(arg);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    out.error = fmt::format("fork failed: {}", std::strerror(errno));
    return out;
  }
  if (pid == 0) exec_child(line.c_str(), log_path.c_str());
  setpgid(pid, pid);  // also from the parent, so the group exists before a kill
  out.started = true;
  int status = 0;
  for (;;) {
    const pid_t r = waitpid(pid, &status, WNOHANG);
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r == pid) break;
    if (r < 0 && errno != EINTR) {
      out.error = fmt::format("waitpid failed: {}", std::strerror(errno));
      return out;
    }
    if (limit_s > 0 && out.seconds > limit_s) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      out.timed_out = true;
      return out;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(out.seconds < 1 ? 2 : 20));
  }
  kill(-pid, SIGKILL);  // children the adapter left behind in its group end with it
  if (WIFEXITED(status)) out.exit_status = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) {
    out.signaled = true;
    out.signal = WTERMSIG(status);
  }
  return out;
}

std::string describe(const ProcessOutcome& p, double limit_s) {
  if (!p.started) return p.error;
  if (p.timed_out)
    return fmt::format("still running at the time limit of {:g} s (the row deadline): killed with its process group",
                       limit_s);
  if (p.signaled) return fmt::format("killed by signal {} ({})", p.signal, strsignal(p.signal));
  if (!p.error.empty()) return p.error;
  // The command runs under /bin/sh -c, and a shell that does not exec it reports a child's fatal
  // signal N as exit status 128 + N.
  if (p.exit_status > 128 && p.exit_status < 128 + NSIG)
    return fmt::format("exit status {} (a shell's report of signal {}, {}, unless the adapter chose that status)",
                       p.exit_status, p.exit_status - 128, strsignal(p.exit_status - 128));
  return fmt::format("exit status {}", p.exit_status);
}

std::string file_tail(const std::string& path, int max_lines, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return "";
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - std::streamoff(kTailWindowBytes));
  std::string window(size_t(size - from), '\0');
  in.seekg(from);
  in.read(window.data(), std::streamsize(window.size()));
  window.resize(size_t(in.gcount()));
  std::deque<std::string> lines;
  size_t a = 0;
  for (size_t b = 0; b <= window.size(); ++b) {
    if (b < window.size() && window[b] != '\n' && window[b] != '\r') continue;
    if (b > a) lines.push_back(window.substr(a, b - a));
    if (static_cast<int>(lines.size()) > max_lines) lines.pop_front();
    a = b + 1;
  }
  std::string out;
  for (const auto& x : lines) out += x + "\n";
  if (out.size() > max_bytes) out = "..." + out.substr(out.size() - max_bytes);
  return out;
}

}  // namespace kcp
