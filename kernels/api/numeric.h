// Rounding helpers shared by the CPU twin, the input generator and (as __host__ __device__)
// the CUDA kernels: round a float to the nearest bf16 / fp16 value, ties to even, returned as
// float. NaN stays NaN; overflow of fp16 gives +-inf like a hardware conversion.
// dtype16_bits / dtype16_value convert between a float and the raw 16-bit pattern of a bf16 /
// fp16 value (the storage of the caller tensors and of Storage::Packed16, dtype_tensor.h): the
// pattern of the nearest value (ties to even, the same value as round_to), and back exactly.
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

// The quiet-NaN patterns (poison of 16-bit storage, docs/design.md 5).
inline constexpr uint16_t kNaNBf16 = 0x7FC0u, kNaNFp16 = 0x7E00u;
KCP_HD uint16_t nan16(RoundTo r) { return r == RoundTo::BF16 ? kNaNBf16 : kNaNFp16; }

// The 16-bit pattern of the dtype value nearest to x (ties to even). NaN stays NaN, fp16
// overflow gives +-inf, fp32 subnormals (far below fp16's range) give a signed zero.
KCP_HD uint16_t dtype16_bits(float x, RoundTo r) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (r == RoundTo::BF16) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // NaN stays NaN
    const uint32_t q = u + 0x7fffu + ((u >> 16) & 1u);                          // round to nearest even
    return uint16_t(q >> 16);
  }
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const int exp = int((u >> 23) & 0xffu);
  const uint32_t man = u & 0x7fffffu;
  if (exp == 0xff) return uint16_t(sign | 0x7c00u | (man ? 0x200u : 0u));
  if (exp == 0) return sign;
  const int e = exp - 127;
  if (e > 15) return uint16_t(sign | 0x7c00u);
  const uint32_t full = man | 0x800000u;  // 1.m as a 24-bit integer
  int shift;                              // bits to drop from full
  uint32_t base;
  if (e >= -14) {
    shift = 13;
    base = uint32_t(e + 14) << 10;  // (e + 15 - 1) << 10: the implicit 1 adds one exponent step
  } else {
    shift = -1 - e;  // unit 2^-24: value = full 2^(e - 23)
    base = 0;
    if (shift > 24) return sign;
  }
  const uint32_t keep = full >> shift, rem = full & ((1u << shift) - 1u), halfw = 1u << (shift - 1);
  const uint32_t q = keep + ((rem > halfw || (rem == halfw && (keep & 1u))) ? 1u : 0u);
  return uint16_t(sign | (base + q));  // a carry out of the mantissa moves into the exponent
}

// The float value of a 16-bit dtype pattern (exact).
KCP_HD float dtype16_value(uint16_t h, RoundTo r) {
  uint32_t u;
  if (r == RoundTo::BF16) {
    u = uint32_t(h) << 16;
  } else {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) {
      u = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
      const float v = std::ldexp(float(man), -24);
      std::memcpy(&u, &v, 4);
      u |= sign;
    } else {
      u = sign | ((exp + 112u) << 23) | (man << 13);
    }
  }
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace kcp
