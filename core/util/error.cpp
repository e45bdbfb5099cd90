// Rank-tagged error messages. The rank is thread-local because in the threaded launch mode
// every logical rank is a thread of one process.
#include "core/util/error.h"

#include <unistd.h>

#include <cstring>

namespace kcp {
namespace {
thread_local int t_rank = 0;
thread_local int t_world = 1;
thread_local int t_device = -1;

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}
}  // namespace

void set_thread_rank(int rank, int world, int device) {
  t_rank = rank;
  t_world = world;
  t_device = device;
}

int thread_rank() { return t_rank; }

std::string rank_prefix() {
  static const std::string host = host_name();
  if (t_device >= 0) return fmt::format("[r{}/{} {} dev{}]", t_rank, t_world, host, t_device);
  return fmt::format("[r{}/{} {}]", t_rank, t_world, host);
}

const char* short_path(const char* file) {
  // Source files live under one of these top-level folders; cut everything before it.
  static const char* roots[] = {"/app/", "/core/", "/kernels/", "/reference/", "/tests/"};
  const char* best = nullptr;
  for (const char* r : roots) {
    const char* p = std::strstr(file, r);
    if (p && (!best || p > best)) best = p;
  }
  return best ? best + 1 : file;
}

void raise_api_error(const char* kind, const char* expr, long code, const std::string& detail, const char* file,
                     int line) {
  throw ApiError(fmt::format("{} {} error {} ({}) at {}:{} in '{}'", rank_prefix(), kind, code, detail,
                             short_path(file), line, expr));
}

}  // namespace kcp
