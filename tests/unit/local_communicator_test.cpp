#include "core/comm/local_communicator.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "core/util/error.h"

using namespace kcp;

TEST(LocalCommunicator, AllgatherAllreduceBroadcast) {
  for (int W : {1, 2, 3, 5}) {
    std::atomic<int> ok{0};
    run_local_world(W, [&](Communicator& c) {
      ASSERT_EQ(c.size(), W);
      std::vector<float> send = {float(c.rank()), float(10 * c.rank())};
      std::vector<float> recv(2 * W);
      c.allgather(send.data(), recv.data(), 2);
      for (int r = 0; r < W; ++r) {
        EXPECT_EQ(recv[2 * r], float(r));
        EXPECT_EQ(recv[2 * r + 1], float(10 * r));
      }
      double v[2] = {double(c.rank() + 1), double(-c.rank())};
      c.allreduce(v, 1, ReduceOp::Sum);
      c.allreduce(v + 1, 1, ReduceOp::Min);
      EXPECT_EQ(v[0], W * (W + 1) / 2.0);
      EXPECT_EQ(v[1], -(W - 1));
      int64_t m = c.rank();
      c.allreduce(&m, 1, ReduceOp::Max);
      EXPECT_EQ(m, W - 1);
      int b = c.rank() == W - 1 ? 42 : 0;
      c.broadcast(&b, sizeof(b), W - 1);
      EXPECT_EQ(b, 42);
      c.barrier();
      ++ok;
    });
    EXPECT_EQ(ok.load(), W);
  }
}

TEST(LocalCommunicator, OneRankThrowingDoesNotHangTheOthers) {
  // Rank 1 fails before the collective; the others must unwind, and the root cause comes back.
  try {
    run_local_world(3, [&](Communicator& c) {
      if (c.rank() == 1) throw ConfigError("rank one failed on purpose");
      c.barrier();
      c.barrier();
    });
    FAIL() << "expected an exception";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("rank one failed on purpose"), std::string::npos);
  }
}
