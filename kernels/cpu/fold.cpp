// The fold of the CPU twin (kernels/api/fold.h): X_{i+1} = op(A_i) X_i + b_i per value head,
// all fp32 (docs/algorithm.md 4.5, 7.2: chains are never rounded to bf16). Products accumulate over the
// inner index in increasing order, then b is added; the composed transfer likewise.
#include <vector>

#include "kernels/cpu/cpu_common.h"

namespace kcp::kernels::cpu {

void fold(const FoldArgs& a) {
  check_fold_args(a, "fold");
  const int32_t K = a.K, V = a.V;
  const int64_t KV = int64_t(K) * V, KK = int64_t(K) * K;
  parallel_for(a.HV, a.exec.threads, [&](int64_t j) {
    std::vector<float> X(KV, 0.0f), Xn(KV), Cm, Cn;
    if (a.x0) std::copy(a.x0 + j * KV, a.x0 + (j + 1) * KV, X.begin());
    if (a.composed) {
      Cm.assign(KK, 0.0f);
      Cn.resize(KK);
      for (int32_t x = 0; x < K; ++x) Cm[size_t(x) * K + x] = 1.0f;
    }
    // Work nobody reads is skipped (fold.h): X after the last item when neither x_final nor
    // composed is wanted, and op(A_0) X_0 when X_0 is zero (x0 null): X_1 = 0 + b_0, the bits the
    // full product gives (+0 + sum of zero products, then + b).
    const bool x_final_needed = a.x_final || a.composed;
    for (int32_t it = 0; it < a.n; ++it) {
      if (a.states_before) std::copy(X.begin(), X.end(), a.states_before + it * a.states_stride + j * KV);
      if (!x_final_needed && it + 1 == a.n) break;
      const float* A = a.A + it * a.A_stride + j * KK;
      const float* b = a.b + it * a.b_stride + j * KV;
      if (!a.x0 && it == 0 && !a.composed) {
        for (int64_t e = 0; e < KV; ++e) X[size_t(e)] = 0.0f + b[e];
        continue;
      }
      auto opA = [&](int32_t r, int32_t c) { return a.transpose_A ? A[size_t(c) * K + r] : A[size_t(r) * K + c]; };
      for (int32_t r = 0; r < K; ++r) {
        float* out = Xn.data() + size_t(r) * V;
        std::fill(out, out + V, 0.0f);
        for (int32_t m = 0; m < K; ++m) {
          const float am = opA(r, m);
          const float* xm = X.data() + size_t(m) * V;
          for (int32_t e = 0; e < V; ++e) out[e] += am * xm[e];
        }
        const float* br = b + size_t(r) * V;
        for (int32_t e = 0; e < V; ++e) out[e] += br[e];
      }
      X.swap(Xn);
      if (a.composed) {
        for (int32_t r = 0; r < K; ++r) {
          float* out = Cn.data() + size_t(r) * K;
          std::fill(out, out + K, 0.0f);
          for (int32_t m = 0; m < K; ++m) {
            const float am = opA(r, m);
            const float* cm = Cm.data() + size_t(m) * K;
            for (int32_t e = 0; e < K; ++e) out[e] += am * cm[e];
          }
        }
        Cm.swap(Cn);
      }
    }
    if (a.x_final) std::copy(X.begin(), X.end(), a.x_final + j * KV);
    if (a.composed) std::copy(Cm.begin(), Cm.end(), a.composed + j * KK);
  });
}

}  // namespace kcp::kernels::cpu
