// --backend cpu|cuda|auto: which kernels run. auto picks CUDA when this build has it and the
// runtime sees a GPU; "no driver" counts as no GPU (docs/design.md 10), not as an error.
#include <cstdlib>

#include "app/commands.h"
#include "core/comm/mpi_communicator.h"
#include "core/util/error.h"
#include "kcp/config.h"
#include "kernels/cpu/cpu_backend.h"
#if KCP_ENABLE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace kcp::app {

int gpu_count() {
#if KCP_ENABLE_CUDA
  return kernels::cuda_device_count();
#else
  return 0;
#endif
}

std::string external_command(const std::string& backend) {
  if (backend.rfind("exec:", 0) != 0) return "";
  const std::string cmd = backend.substr(5);
  KCP_REQUIRE(
      cmd.find_first_not_of(" \t") != std::string::npos,
      "--backend exec:COMMAND: the command is empty (e.g. --backend \"exec:python3 scripts/adapters/numpy_ref.py\")");
  return cmd;
}

std::unique_ptr<kernels::Backend> select_backend(const std::string& name) {
  KCP_REQUIRE(name == "auto" || name == "cpu" || name == "cuda",
              "--backend: expected cpu, cuda, auto or exec:COMMAND, got \"{}\"", name);
  if (name == "cpu") return kernels::make_cpu_backend();
#if KCP_ENABLE_CUDA
  const int n = kernels::cuda_device_count();
  if (n > 0) {
    // One GPU per local rank under mpirun; threads of one process share device 0.
    const int local = local_rank();
    try {
      return kernels::make_cuda_backend(local % n);
    } catch (const std::exception& e) {
      KCP_THROW(ApiError, "--backend {}: cannot start the CUDA backend on device {}: {}", name, local % n, e.what());
    }
  }
  KCP_REQUIRE(name != "cuda",
              "--backend cuda: no CUDA device is visible (the CPU twin runs with --backend cpu or auto)");
#else
  KCP_REQUIRE(name != "cuda", "--backend cuda: this kcpbench was built without the CUDA backend (KCP_ENABLE_CUDA=OFF)");
#endif
  return kernels::make_cpu_backend();
}

}  // namespace kcp::app
