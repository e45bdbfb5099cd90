// The device's exp2f of n floats (device_exp2.h): compiled as the kernels are (nvcc, no fast
// math), so the values are those kernels/cuda multiplies by.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "device_exp2.h"

namespace kcp::test {

namespace {

__global__ void exp2_kernel(const float* x, float* y, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = exp2f(x[i]);
}

}  // namespace

void device_exp2(const float* x, float* y, int64_t n) {
  if (n == 0) return;
  exp2_kernel<<<unsigned((n + 255) / 256), 256>>>(x, y, n);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaStreamSynchronize(nullptr);
  if (e != cudaSuccess) throw std::runtime_error(std::string("device_exp2: ") + cudaGetErrorString(e));
}

}  // namespace kcp::test
