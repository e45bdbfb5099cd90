// Test helper (tests/gpu, device_exp2.cu): the device's exp2f, as the CUDA kernels call it.
#pragma once

#include <cstdint>

namespace kcp::test {

// y[i] = exp2f(x[i]) for i < n on the current device (device pointers; default stream, waits).
void device_exp2(const float* x, float* y, int64_t n);

}  // namespace kcp::test
