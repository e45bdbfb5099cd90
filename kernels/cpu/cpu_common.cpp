// The 16-bit caller arrays and the 64 x 64 unit-lower-triangular inverse of the CPU twin.
#include "kernels/cpu/cpu_common.h"

namespace kcp::kernels::cpu {

namespace {
std::vector<float> decode16(const uint16_t* bits, int64_t n, RoundTo rt) {
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t e = 0; e < n; ++e) out[size_t(e)] = dtype16_value(bits[e], rt);
  return out;
}
}  // namespace

CallerIn::CallerIn(ConstDtypeTensor t, int64_t n, const Dims& d) {
  if (t.storage() == Storage::F32) {
    p_ = t.f32();
    return;
  }
  decoded_ = decode16(t.packed16(), n, d.rt);
  p_ = decoded_.data();
}

CallerOut::CallerOut(DtypeTensor t, int64_t n, const Dims& d) : t_(t), rt_(d.rt) {
  if (t.storage() == Storage::F32) {
    p_ = t.f32();
    return;
  }
  buf_ = decode16(t.packed16(), n, rt_);
  p_ = buf_.data();
}

void CallerOut::store() const {
  if (t_.storage() == Storage::F32) return;
  uint16_t* bits = t_.packed16();
  for (size_t e = 0; e < buf_.size(); ++e) bits[e] = dtype16_bits(buf_[e], rt_);
}

namespace {
constexpr int kB = 16;  // sub-block size of the inverse
constexpr int kN = 64;

// out(16x16) = a(16x16 block at (ra, ca) of an N x N matrix) * b(block (rb, cb)), fp32.
void block_mul(const float* a, int ra, int ca, const float* b, int rb, int cb, float* out) {
  for (int i = 0; i < kB; ++i)
    for (int j = 0; j < kB; ++j) {
      float acc = 0.0f;
      for (int m = 0; m < kB; ++m) acc += a[(ra + i) * kN + ca + m] * b[(rb + m) * kN + cb + j];
      out[i * kB + j] = acc;
    }
}
}  // namespace

// docs/algorithm.md F2. Pi strictly lower, 64 x 64; Phi = (I + Pi)^-1, 64 x 64, fp32 throughout (the GPU
// merges blocks with TF32 or IEEE fp32 dots; the twin is IEEE fp32).
void tril_inverse_64(const float* Pi, float* Phi) {
  for (int i = 0; i < kN * kN; ++i) Phi[i] = 0.0f;
  // (a) diagonal blocks: strictly-lower part X by row-wise forward substitution
  //     X[i,:] = -Pi[i,:] + sum_{m<i} (-Pi[i,m]) X[m,:], then + I.
  for (int b = 0; b < kN; b += kB) {
    for (int i = 1; i < kB; ++i) {
      for (int c = 0; c < i; ++c) {
        float acc = 0.0f;
        for (int m = c + 1; m < i; ++m) acc += -Pi[(b + i) * kN + b + m] * Phi[(b + m) * kN + b + c];
        Phi[(b + i) * kN + b + c] = -Pi[(b + i) * kN + b + c] + acc;
      }
    }
    for (int i = 0; i < kB; ++i) Phi[(b + i) * kN + b + i] = 1.0f;
  }
  // (b) off-diagonal blocks X_ij = -X_ii * (sum_{m=j}^{i-1} Pi_im X_mj), i > j, in the order
  //     (1,0) (2,1) (3,2), (2,0) (3,1), (3,0).
  static const int order[6][2] = {{1, 0}, {2, 1}, {3, 2}, {2, 0}, {3, 1}, {3, 0}};
  float sum[kB * kB], tmp[kB * kB];
  for (const auto& ij : order) {
    const int bi = ij[0] * kB, bj = ij[1] * kB;
    for (int e = 0; e < kB * kB; ++e) sum[e] = 0.0f;
    for (int m = ij[1]; m < ij[0]; ++m) {
      block_mul(Pi, bi, m * kB, Phi, m * kB, bj, tmp);
      for (int e = 0; e < kB * kB; ++e) sum[e] += tmp[e];
    }
    for (int r = 0; r < kB; ++r)
      for (int c = 0; c < kB; ++c) {
        float acc = 0.0f;
        for (int m = 0; m < kB; ++m) acc += Phi[(bi + r) * kN + bi + m] * sum[m * kB + c];
        Phi[(bi + r) * kN + bj + c] = -acc;
      }
  }
}

}  // namespace kcp::kernels::cpu
