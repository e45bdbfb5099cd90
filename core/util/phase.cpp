#include "core/util/phase.h"

#include <map>
#include <mutex>

#include "core/util/error.h"

namespace kcp {
namespace {
std::mutex g_mutex;
std::map<int, RankPhase> g_phases;
}  // namespace

void set_row(const std::string& row) {
  std::lock_guard<std::mutex> lock(g_mutex);
  RankPhase& p = g_phases[thread_rank()];
  p.rank = thread_rank();
  p.row = row;
  p.phase = "start";
  p.row_started = p.since = std::chrono::steady_clock::now();
}

void set_phase(const std::string& phase) {
  std::lock_guard<std::mutex> lock(g_mutex);
  RankPhase& p = g_phases[thread_rank()];
  p.phase = phase;
  p.since = std::chrono::steady_clock::now();
}

void clear_phase() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_phases.erase(thread_rank());
}

std::vector<RankPhase> rank_phases() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<RankPhase> v;
  for (const auto& [r, p] : g_phases) v.push_back(p);
  return v;
}

}  // namespace kcp
