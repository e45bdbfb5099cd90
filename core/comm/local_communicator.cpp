// Threads-as-ranks collectives: every collective publishes each rank's pointer, meets at a
// barrier, reads the others' data in rank order (so reductions are deterministic), and meets
// again so no rank reuses its buffer while another still reads it.
#include "core/comm/local_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "core/util/error.h"

namespace kcp {

class LocalGroup {
 public:
  explicit LocalGroup(int n) : size(n), slots(n, nullptr) {}
  const int size;
  std::vector<const void*> slots;

  void barrier() {
    std::unique_lock<std::mutex> lock(mutex_);
    if (aborted_) throw InvariantError(rank_prefix() + " local communicator aborted by another rank");
    const uint64_t gen = generation_;
    if (++arrived_ == size) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
    if (generation_ == gen) throw InvariantError(rank_prefix() + " local communicator aborted by another rank");
  }
  void abort() {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
};

LocalCommunicator::LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank)
    : group_(std::move(group)), rank_(rank) {}
int LocalCommunicator::size() const { return group_->size; }
void LocalCommunicator::barrier() { group_->barrier(); }

namespace {
template <class T>
void gather_impl(LocalGroup& g, int rank, const T* send, T* recv, size_t count) {
  g.slots[rank] = send;
  g.barrier();
  for (int r = 0; r < g.size; ++r) std::memcpy(recv + r * count, static_cast<const T*>(g.slots[r]), count * sizeof(T));
  g.barrier();
}
template <class T>
void reduce_impl(LocalGroup& g, int rank, T* buf, size_t count, ReduceOp op) {
  g.slots[rank] = buf;
  g.barrier();
  std::vector<T> acc(static_cast<const T*>(g.slots[0]), static_cast<const T*>(g.slots[0]) + count);
  for (int r = 1; r < g.size; ++r) {
    const T* src = static_cast<const T*>(g.slots[r]);
    for (size_t i = 0; i < count; ++i) {
      if (op == ReduceOp::Sum)
        acc[i] += src[i];
      else if (op == ReduceOp::Max)
        acc[i] = std::max(acc[i], src[i]);
      else
        acc[i] = std::min(acc[i], src[i]);
    }
  }
  g.barrier();  // everyone has read every buffer: now it is safe to overwrite
  std::copy(acc.begin(), acc.end(), buf);
}
}  // namespace

void LocalCommunicator::allgather(const float* s, float* r, size_t n) { gather_impl(*group_, rank_, s, r, n); }
void LocalCommunicator::allgather(const double* s, double* r, size_t n) { gather_impl(*group_, rank_, s, r, n); }
void LocalCommunicator::allreduce(double* b, size_t n, ReduceOp op) { reduce_impl(*group_, rank_, b, n, op); }
void LocalCommunicator::allreduce(int64_t* b, size_t n, ReduceOp op) { reduce_impl(*group_, rank_, b, n, op); }

void LocalCommunicator::broadcast(void* buf, size_t bytes, int root) {
  group_->slots[rank_] = buf;
  group_->barrier();
  if (rank_ != root) std::memcpy(buf, group_->slots[root], bytes);
  group_->barrier();
}

void run_local_world(int world, const std::function<void(Communicator&)>& fn) {
  KCP_REQUIRE(world >= 1, "world size must be >= 1, got {}", world);
  auto group = std::make_shared<LocalGroup>(world);
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      set_thread_rank(r, world);
      LocalCommunicator comm(group, r);
      try {
        fn(comm);
      } catch (...) {
        errors[r] = std::current_exception();
        group->abort();
      }
    });
  }
  for (auto& t : threads) t.join();
  // Prefer the root cause over the "aborted by another rank" echoes of the other ranks.
  for (auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const InvariantError& ie) {
      if (std::string(ie.what()).find("aborted by another rank") != std::string::npos) continue;
      throw;
    }
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace kcp
