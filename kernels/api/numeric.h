// Rounding helpers shared by the CPU twin, the input generator and (as __host__ __device__)
// the CUDA kernels: round a float to the nearest bf16 / fp16 value, ties to even, returned as
// float. NaN stays NaN; overflow of fp16 gives +-inf like a hardware conversion.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KCP_HD __host__ __device__ __forceinline__
#else
#define KCP_HD inline
#endif

namespace kcp {

KCP_HD float round_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;  // inf / nan unchanged
  const uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  u &= 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

// fp16: 10 mantissa bits, exponent range [-14, 15], subnormals down to 2^-24.
KCP_HD float round_to_fp16(float x) {
  if (!(x == x) || std::isinf(x)) return x;
  const float ax = std::fabs(x);
  if (ax >= 65520.0f) return x > 0 ? INFINITY : -INFINITY;  // rounds past the largest finite half
  int e;
  std::frexp(ax, &e);                          // ax = m * 2^e, m in [0.5, 1)
  int exp_unbiased = e - 1;                    // ax = 1.xxx * 2^(e-1)
  if (exp_unbiased < -14) exp_unbiased = -14;  // subnormal spacing
  const float ulp = std::ldexp(1.0f, exp_unbiased - 10);
  const float q = std::nearbyint(ax / ulp) * ulp;  // nearbyint: ties to even in the default mode
  return x < 0 ? -q : q;
}

enum class RoundTo { BF16, FP16 };
KCP_HD float round_to(float x, RoundTo r) { return r == RoundTo::BF16 ? round_to_bf16(x) : round_to_fp16(x); }

}  // namespace kcp
