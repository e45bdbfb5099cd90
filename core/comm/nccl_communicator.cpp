#include "core/comm/nccl_communicator.h"

#include <cstdlib>

#include "core/util/error.h"
#include "core/util/log.h"
#include "kcp/config.h"

#if KCP_ENABLE_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#define KCP_CUDA_RT_CHECK(expr)                                                                                 \
  do {                                                                                                          \
    cudaError_t e_ = (expr);                                                                                    \
    if (e_ != cudaSuccess) {                                                                                    \
      (void)cudaGetLastError();                                                                                 \
      ::kcp::raise_api_error("CUDA", #expr, e_,                                                                 \
                             std::string(cudaGetErrorName(e_)) + " (" + cudaGetErrorString(e_) + ")", __FILE__, \
                             __LINE__);                                                                         \
    }                                                                                                           \
  } while (0)
#define KCP_NCCL_CHECK(comm, expr)                                                                                     \
  do {                                                                                                                 \
    ncclResult_t r_ = (expr);                                                                                          \
    if (r_ != ncclSuccess) {                                                                                           \
      const char* last_ = (comm) ? ncclGetLastError(comm) : "";                                                        \
      ::kcp::raise_api_error("NCCL", #expr, r_,                                                                        \
                             std::string(ncclGetErrorString(r_)) + (last_ && *last_ ? std::string("; ") + last_ : ""), \
                             __FILE__, __LINE__);                                                                      \
    }                                                                                                                  \
  } while (0)
#endif

namespace kcp {

#if KCP_ENABLE_NCCL
namespace {
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Communicator& host, int device) : host_(host), device_(device) {
    setenv("NCCL_NVLS_ENABLE", "0", 0);  // no NVLink multicast (overwrite = 0: the user's choice wins)
    KCP_CUDA_RT_CHECK(cudaSetDevice(device_));
    ncclUniqueId id;
    if (host_.rank() == 0) KCP_NCCL_CHECK(nullptr, ncclGetUniqueId(&id));
    host_.broadcast(&id, sizeof(id), 0);
    KCP_NCCL_CHECK(nullptr, ncclCommInitRank(&comm_, host_.size(), id, host_.rank()));
  }
  ~NcclCommunicator() override {
    if (comm_) {
      const ncclResult_t r = ncclCommDestroy(comm_);
      if (r != ncclSuccess) log::warn("ncclCommDestroy failed: {}", ncclGetErrorString(r));
    }
  }
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  std::string name() const override { return "nccl"; }
  void allgather(const float* s, float* r, size_t n) override { host_.allgather(s, r, n); }
  void allgather(const double* s, double* r, size_t n) override { host_.allgather(s, r, n); }
  void allreduce(double* b, size_t n, ReduceOp op) override { host_.allreduce(b, n, op); }
  void allreduce(int64_t* b, size_t n, ReduceOp op) override { host_.allreduce(b, n, op); }
  void broadcast(void* buf, size_t bytes, int root) override { host_.broadcast(buf, bytes, root); }
  void barrier() override { host_.barrier(); }
  bool has_device_allgather() const override { return true; }
  void allgather_device(const float* send, float* recv, size_t count, void* stream) override {
    KCP_NCCL_CHECK(comm_, ncclAllGather(send, recv, count, ncclFloat32, comm_, static_cast<cudaStream_t>(stream)));
    KCP_CUDA_RT_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
  }

 private:
  Communicator& host_;
  int device_;
  ncclComm_t comm_ = nullptr;
};
}  // namespace

bool nccl_available() { return true; }
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, int device) {
  return std::make_unique<NcclCommunicator>(host, device);
}
#else
bool nccl_available() { return false; }
std::unique_ptr<Communicator> make_nccl_communicator(Communicator&, int) {
  KCP_THROW(ConfigError, "--comm nccl: this kcpbench was built without NCCL (KCP_ENABLE_NCCL=OFF)");
}
#endif

}  // namespace kcp
