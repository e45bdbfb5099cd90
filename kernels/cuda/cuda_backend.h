// The CUDA backend (kernels/api/backend.h implemented on an NVIDIA GPU). Host-only header: no
// CUDA types, so core/ and app/ include it without nvcc. Built only when KCP_ENABLE_CUDA.
#pragma once

#include <memory>

#include "kernels/api/backend.h"

namespace kcp::kernels {

// Devices visible to the CUDA runtime. "CUDA driver version is insufficient" and "no device"
// both mean no GPU here and give 0 (the CPU twin is then picked), never an error.
int cuda_device_count();

// A backend on `device`; throws std::runtime_error naming the failed CUDA call.
std::unique_ptr<Backend> make_cuda_backend(int device);

}  // namespace kcp::kernels
