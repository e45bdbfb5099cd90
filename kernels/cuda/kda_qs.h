// Test hook of KDA's qs prepass (kda_qs.cu). Host-only, no CUDA types: the GPU tests include it.
#pragma once

#include <cstdint>

#include "kernels/api/problem.h"

namespace kcp::kernels::cuda {

// qs [T, HV, K] = dtype((q[t, j / G, c] scale) exp2(gcum[t, j, c])) (16-bit storage) of a KDA
// problem `p` for T tokens, from the saved q [T, H, K] (16-bit storage) and gcum [T, HV, K]
// (fp32), all device pointers of the current device; runs on the default stream and waits for it.
void run_kda_qs(const Problem& p, int64_t T, const uint16_t* q, const float* gcum, uint16_t* qs);

}  // namespace kcp::kernels::cuda
