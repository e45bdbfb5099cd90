// Chunk-local helpers shared by the GDN and KDA backward of the CPU twin (B4 inter part and the
// WY backward B5), working on one (chunk, value head). Internal to kernels/cpu.
#pragma once

#include <vector>

#include "kernels/cpu/cpu_common.h"

namespace kcp::kernels::cpu {

// Row-major L x N scratch matrix.
struct Mat {
  int32_t rows = 0, cols = 0;
  std::vector<float> v;
  Mat(int32_t r, int32_t c) : rows(r), cols(c), v(size_t(r) * c, 0.0f) {}
  float& operator()(int32_t r, int32_t c) { return v[size_t(r) * cols + c]; }
  float operator()(int32_t r, int32_t c) const { return v[size_t(r) * cols + c]; }
};

// dPhi = dW Xb^T + dv2 Yb^T, strictly lower (fp32; the sum over K, then over V, in increasing
// order). dv2(r): row r of dv2 (V floats).
template <class Dv2>
void dphi_lower(const Mat& dW, const Mat& Xb, const Mat& Yb, Dv2&& dv2, int32_t L, Mat& dPhi) {
  const int32_t K = dW.cols, V = Yb.cols;
  for (int32_t r = 0; r < L; ++r)
    for (int32_t s = 0; s < r; ++s) {
      float acc = 0.0f;
      for (int32_t x = 0; x < K; ++x) acc += dW(r, x) * Xb(s, x);
      for (int32_t e = 0; e < V; ++e) acc += dv2(r)[e] * Yb(s, e);
      dPhi(r, s) = acc;
    }
}

// dPi (pre-gate gradient w.r.t. Pi, strictly lower, fp32) from dPhi (fp32, only its strictly
// lower part is used) and Phi (dtype), docs/algorithm.md B5:
//   dPi = -stril(Phi^T dtype(stril(dPhi)) ... ) as two dtype-operand products:
//   T1 = dtype(stril(dPhi)) Phi^T (fp32 accumulation), T2 = Phi^T dtype(T1), dPi = -stril(T2).
inline void phi_backward(const Dims& d, const Mat& Phi, const Mat& dPhi, int32_t L, Mat& dPi) {
  Mat dPhib(L, L), T1b(L, L);
  for (int32_t r = 0; r < L; ++r)
    for (int32_t s = 0; s < r; ++s) dPhib(r, s) = d.rnd(dPhi(r, s));
  for (int32_t m = 0; m < L; ++m)
    for (int32_t s = 0; s < m; ++s) {  // only the strictly lower part of T1 reaches stril(T2)
      float acc = 0.0f;
      for (int32_t x = 0; x < m && x <= s; ++x) acc += dPhib(m, x) * Phi(s, x);
      T1b(m, s) = d.rnd(acc);
    }
  for (int32_t r = 0; r < L; ++r)
    for (int32_t s = 0; s < L; ++s) {
      if (s >= r) {
        dPi(r, s) = 0.0f;
        continue;
      }
      float acc = 0.0f;
      for (int32_t m = r; m < L; ++m) acc += Phi(m, r) * T1b(m, s);
      dPi(r, s) = -acc;
    }
}

}  // namespace kcp::kernels::cpu
