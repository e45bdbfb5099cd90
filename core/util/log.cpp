#include "core/util/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

#include "core/util/error.h"

namespace kcp::log {
namespace {
std::atomic<int> g_level{static_cast<int>(Level::Info)};
std::mutex g_mutex;  // keeps lines of concurrent rank threads whole
}  // namespace

void set_level(Level l) { g_level = static_cast<int>(l); }
Level level() { return static_cast<Level>(g_level.load()); }
bool is_rank0() { return thread_rank() == 0; }
std::string prefixed(const std::string& msg) { return rank_prefix() + " " + msg; }

void write(bool to_stderr, const std::string& line) {
  std::lock_guard<std::mutex> lock(g_mutex);
  FILE* f = to_stderr ? stderr : stdout;
  std::fputs(line.c_str(), f);
  std::fputc('\n', f);
  std::fflush(f);
}

}  // namespace kcp::log
