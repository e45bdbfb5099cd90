// `local` communicator: W logical ranks as threads of one process sharing a LocalGroup.
// run_local_world() starts the W rank threads, tags each with its rank (for log and error
// prefixes), and rethrows the first rank's exception after aborting the group so no other rank
// waits forever in a collective.
#pragma once

#include <functional>
#include <memory>

#include "core/comm/communicator.h"

namespace kcp {

class LocalGroup;  // shared state of the W ranks (defined in the .cpp)

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalGroup> group, int rank);
  int rank() const override { return rank_; }
  int size() const override;
  std::string name() const override { return "local"; }
  void allgather(const float* send, float* recv, size_t count) override;
  void allgather(const double* send, double* recv, size_t count) override;
  void allreduce(double* buf, size_t count, ReduceOp op) override;
  void allreduce(int64_t* buf, size_t count, ReduceOp op) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  void barrier() override;

 private:
  std::shared_ptr<LocalGroup> group_;
  int rank_;
};

// Runs fn(comm) on W threads, one per rank. Exceptions: the first one thrown is rethrown here
// after every thread has ended (the others see the group aborted and unwind).
void run_local_world(int world, const std::function<void(Communicator&)>& fn);

}  // namespace kcp
