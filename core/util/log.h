// One logger with a rank prefix. Library code never prints directly: it calls these.
// info0 prints on rank 0 only (the summary lines); warn/error print on every rank.
#pragma once

#include <fmt/format.h>

#include <string>

namespace kcp::log {

enum class Level { Quiet = 0, Info = 1, Debug = 2 };
void set_level(Level level);
Level level();

void write(bool stderr_stream, const std::string& line);

template <class... A>
void info0(fmt::format_string<A...> f, A&&... a);
std::string prefixed(const std::string& msg);
bool is_rank0();

template <class... A>
void info0(fmt::format_string<A...> f, A&&... a) {
  if (level() >= Level::Info && is_rank0()) write(false, fmt::format(f, std::forward<A>(a)...));
}
// A line -q keeps (a failing table line): rank 0, stdout, at every level.
template <class... A>
void always0(fmt::format_string<A...> f, A&&... a) {
  if (is_rank0()) write(false, fmt::format(f, std::forward<A>(a)...));
}
// Progress of a long step (rank 0, stderr, so the stdout table stays clean; silenced by -q).
template <class... A>
void progress0(fmt::format_string<A...> f, A&&... a) {
  if (level() >= Level::Info && is_rank0()) write(true, fmt::format(f, std::forward<A>(a)...));
}
template <class... A>
void info(fmt::format_string<A...> f, A&&... a) {
  if (level() >= Level::Info) write(false, prefixed(fmt::format(f, std::forward<A>(a)...)));
}
template <class... A>
void debug(fmt::format_string<A...> f, A&&... a) {
  if (level() >= Level::Debug) write(true, prefixed(fmt::format(f, std::forward<A>(a)...)));
}
template <class... A>
void warn(fmt::format_string<A...> f, A&&... a) {
  write(true, prefixed("warning: " + fmt::format(f, std::forward<A>(a)...)));
}

}  // namespace kcp::log
