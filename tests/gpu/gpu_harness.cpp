#include "gpu_harness.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

namespace kcp::test {

namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace

namespace {

uint16_t f32_to_16(float x, kk::DType dt) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (dt == kk::DType::BF16) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // NaN stays NaN
    const uint32_t r = u + 0x7fffu + ((u >> 16) & 1u);                          // round to nearest even
    return uint16_t(r >> 16);
  }
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const int exp = int((u >> 23) & 0xffu);
  const uint32_t man = u & 0x7fffffu;
  if (exp == 0xff) return uint16_t(sign | 0x7c00u | (man ? 0x200u : 0u));
  if (exp == 0) return sign;  // fp32 zero / subnormal: far below fp16's range
  const int e = exp - 127;
  if (e > 15) return uint16_t(sign | 0x7c00u);
  uint32_t full = man | 0x800000u;  // 1.m as a 24-bit integer
  int shift;                        // bits to drop from full
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
  uint32_t q = keep + ((rem > halfw || (rem == halfw && (keep & 1u))) ? 1u : 0u);
  return uint16_t(sign | (base + q));  // a carry out of the mantissa moves into the exponent
}

float f16_to_32(uint16_t h, kk::DType dt) {
  uint32_t u;
  if (dt == kk::DType::BF16) {
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

}  // namespace

std::vector<Region16> cuda_16bit_tensors(const kk::WorkspaceTensors& w, const kk::Problem& p, const kk::LayoutView& L) {
  const int64_t T = L.T, NT = L.n_chunks, HV = p.HV, K = p.K, V = p.V;
  return {{"W", w.W, T * HV * K},
          {"U", w.U, T * HV * V},
          {"h", w.h, NT * HV * K * V},
          {"v_new", w.v_new, T * HV * V},
          {"dh", w.dh, NT * HV * K * V},
          {"dv2", w.dv2, T * HV * V},
          {"dv_local", w.dv_local, T * HV * V}};
}
std::vector<Region16> cuda_16bit_tensors(const kk::SavedTensors& s, const kk::Problem& p, const kk::LayoutView& L) {
  const int64_t T = L.T;
  return {{"q", s.q, T * p.H * p.K}, {"k", s.k, T * p.H * p.K}, {"Phi", s.Phi, T * p.HV * p.chunk}};
}

std::vector<uint16_t> pack16(const float* x, int64_t n, kk::DType dt) {
  std::vector<uint16_t> out(static_cast<size_t>(n), 0);
  uint16_t* o = out.data();
  for (int64_t e = 0; e < n; ++e) {
    const uint16_t h = f32_to_16(x[e], dt);
    const float back = f16_to_32(h, dt);
    if (!(std::isnan(x[e]) && std::isnan(back)) && std::memcmp(&back, &x[e], 4) != 0)
      throw std::logic_error("pack16: element " + std::to_string(e) + " (" + std::to_string(x[e]) +
                             ") is not exactly representable in the dtype");
    o[e] = h;
  }
  return out;
}

std::vector<float> unpack16(const uint16_t* packed, int64_t n, kk::DType dt) {
  const uint16_t* s = packed;
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) out[size_t(e)] = f16_to_32(s[e], dt);
  return out;
}

float poison16() {
  const uint32_t u = 0xffffffffu;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

Diff diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) throw std::runtime_error("diff: size mismatch");
  Diff d;
  double se = 0.0, sb = 0.0, me = 0.0, mb = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) && std::isfinite(b[i])) {
      ++d.bad;
      continue;
    }
    if (!std::isfinite(b[i])) continue;
    const double e = double(a[i]) - double(b[i]);
    se += e * e;
    sb += double(b[i]) * b[i];
    me = std::max(me, std::fabs(e));
    mb = std::max(mb, std::fabs(double(b[i])));
  }
  if (d.bad > 0) {
    d.rel_rms = d.rel_max = std::numeric_limits<double>::infinity();
    return d;
  }
  d.rel_rms = sb > 0 ? std::sqrt(se / sb) : std::sqrt(se);
  d.rel_max = mb > 0 ? me / mb : me;
  return d;
}

int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return int64_t(i);
  return -1;
}

double unit_roundoff(const Case& c) { return c.dtype == kk::DType::BF16 ? 1.0 / 256.0 : 1.0 / 2048.0; }

}  // namespace kcp::test
