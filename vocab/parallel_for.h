// The one loop over threads that every layer uses (the FP64 reference, the CPU twin, the input
// draws), defined once. Header-only, C++17, the standard library only; a target that includes it
// links Threads::Threads itself (kcp_vocab does not, so nvcc code never sees -pthread).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace kcp {

// Runs f(0..n-1) on up to `threads` threads, the caller's included. Items are claimed in
// increasing order from one atomic counter, so an item is claimed only after every item before
// it (the FP64 reference's chained items wait on earlier ones). After an item throws, no further
// item is claimed and on_error(i) runs for it (the reference releases the items waiting on it);
// the first exception is rethrown once every thread has joined. A thread that cannot start
// leaves its share to the threads that did (the caller's loop takes whatever is left). Which
// thread runs an item never changes what the item computes.
template <class F, class E>
void parallel_for(int64_t n, int threads, F&& f, E&& on_error) {
  std::exception_ptr error;
  std::mutex error_mutex;
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (;;) {
      const int64_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        f(i);
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(error_mutex);
          if (!error) error = std::current_exception();
        }
        next.store(n);
        on_error(i);
        return;
      }
    }
  };
  const int64_t nt = std::min<int64_t>(std::max(threads, 1), n);
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(nt > 1 ? nt - 1 : 0));  // growing it cannot throw with threads running
  try {
    for (int64_t t = 1; t < nt; ++t) pool.emplace_back(worker);
  } catch (const std::system_error&) {  // fewer threads: the others take the items
  }
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

template <class F>
void parallel_for(int64_t n, int threads, F&& f) {
  parallel_for(n, threads, std::forward<F>(f), [](int64_t) {});
}

}  // namespace kcp
