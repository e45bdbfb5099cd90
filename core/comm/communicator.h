// The CP group's communicator (docs/design.md section 7). One small interface, three back-ends:
//   local: W logical ranks as threads of one process (always available; unit tests, laptops);
//   mpi:   one process per rank, host memory;
//   nccl:  one GPU per rank; the summaries' all-gather in device memory through NCCL, the host
//          collectives (metrics, barriers) through MPI (or trivially for one rank).
// All calls are collective: every rank of the group must make the same calls in the same order.
// Buffers are host memory for local and mpi. Reductions are deterministic: the same inputs give
// the same bits for any back-end (sums are taken in rank order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace kcp {

enum class ReduceOp { Sum, Max, Min };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "local", "mpi", "nccl"

  // recv holds size() * count elements, rank r's block at [r * count, (r + 1) * count).
  virtual void allgather(const float* send, float* recv, size_t count) = 0;
  virtual void allgather(const double* send, double* recv, size_t count) = 0;
  // In place; result identical on every rank, reduced in rank order.
  virtual void allreduce(double* buf, size_t count, ReduceOp op) = 0;
  virtual void allreduce(int64_t* buf, size_t count, ReduceOp op) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  virtual void barrier() = 0;

  // Device-buffer all-gather (the nccl back-end): send and recv in GPU memory, ordered on
  // `stream` (a cudaStream_t). Back-ends without it exchange through host buffers.
  virtual bool has_device_allgather() const { return false; }
  virtual void allgather_device(const float* send, float* recv, size_t count, void* stream);
};

}  // namespace kcp
