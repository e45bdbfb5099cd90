// Runs the built kcpbench binary and captures its output and exit code (whole-program tests).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

struct CmdResult {
  int code = -1;
  std::string out;  // stdout and stderr together
};

inline CmdResult run_command(const std::string& command) {
  const std::string cmd = command + " 2>&1";
  CmdResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

inline CmdResult run_kcpbench(const std::string& args) { return run_command(std::string(KCPBENCH_EXE) + " " + args); }
