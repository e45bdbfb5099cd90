// vocab/parallel_for.h, the thread loop of the FP64 reference, the CPU twin and the input draws:
// every item runs once, items are claimed in order, an error stops new claims, runs on_error for
// the item that threw and comes back to the caller.
#include "vocab/parallel_for.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

TEST(ParallelFor, EveryItemOnceForAnyThreadCount) {
  for (int threads : {0, 1, 3, 64})
    for (int64_t n : {0, 1, 5, 1000}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
      kcp::parallel_for(n, threads, [&](int64_t i) { runs[size_t(i)].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(runs[size_t(i)].load(), 1) << "n " << n << " threads " << threads;
    }
}

TEST(ParallelFor, AnItemIsClaimedOnlyAfterEveryEarlierOne) {
  // Item i waits until item i - 1 has started: with claims in increasing order every wait ends at
  // once; with any other order (a thread holding a later item while the earlier one is unclaimed)
  // some wait would last forever, so each gives up after 10 s and the test fails instead of hanging.
  const int64_t n = 400;
  std::vector<std::atomic<bool>> started(static_cast<size_t>(n));
  std::atomic<int> gave_up{0};
  kcp::parallel_for(n, 4, [&](int64_t i) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    if (i > 0)
      while (!started[size_t(i - 1)].load())
        if (std::chrono::steady_clock::now() > until) {
          gave_up.fetch_add(1);
          break;
        } else {
          std::this_thread::yield();
        }
    started[size_t(i)].store(true);
  });
  EXPECT_EQ(gave_up.load(), 0);
  for (int64_t i = 0; i < n; ++i) EXPECT_TRUE(started[size_t(i)].load());
}

TEST(ParallelFor, AnErrorStopsNewClaimsRunsOnErrorAndIsRethrown) {
  // One thread: exactly the items up to the one that threw. Four: the items after it take 100 us
  // each, so were claims to go on, all 20000 would run (about half a second); they stop.
  for (int threads : {1, 4}) {
    const int64_t n = 20000;
    std::atomic<int64_t> ran{0}, failed_at{-1};
    EXPECT_THROW(kcp::parallel_for(
                     n, threads,
                     [&](int64_t i) {
                       ran.fetch_add(1);
                       if (i == 10) throw std::runtime_error("item 10");
                       if (i > 10) std::this_thread::sleep_for(std::chrono::microseconds(100));
                     },
                     [&](int64_t i) { failed_at.store(i); }),
                 std::runtime_error);
    EXPECT_EQ(failed_at.load(), 10);
    if (threads == 1)
      EXPECT_EQ(ran.load(), 11);
    else
      EXPECT_LT(ran.load(), n) << "every item was claimed after the error";
  }
  try {
    kcp::parallel_for(8, 1, [](int64_t i) {
      if (i >= 3) throw std::runtime_error("first " + std::to_string(i));
    });
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "first 3");
  }
}
