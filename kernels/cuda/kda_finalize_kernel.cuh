// Backward finalize (docs/algorithm.md 3.2 step 6), KDA gate part, rounding points [F2], [F3] of
// the CPU twin (kernels/cpu/finalize.cpp); the dq / dk part ([F1]) is the operator-independent
// finalize_qk_kernel (launch_finalize_qk, gdn_finalize.cu). Included only by kda_finalize.cu.
//
// kda_finalize_gate_kernel: grid NT * HV, block (chunk n, value head j), K threads, thread c owns
//   channel c: the chunk-local reverse cumsum of dlam in token order (fp32), the raw-gate backward
//   (softplus / lower_bound per channel, direct: dg = dA), dg; the chunk's partial sums: ddt_bias
//   per channel (rows in order) to partials[n, j, c], dA_log (per channel over rows, then the
//   channels in order by thread 0) to partials[n, j, K].
// kda_finalize_params_kernel: one thread per (value head, c in [0, K]) adds the chunk partials in
//   chunk order: ddt_bias[j, c] (c < K), dA_log[j] (c = K).
// Every reduction has a fixed order, so det and nondet give the same bits.
#pragma once

#include "kernels/cuda/finalize_params.cuh"
#include "kernels/cuda/kda_common.cuh"

namespace kcp::kernels::cuda {

// The GDN gate parameters (finalize_params.cuh: dlam, g, dg [T, HV, K] and dt_bias, ddt_bias
// [HV, K] here; partials [NT, HV, K + 1]) plus the shape and the lower bound.
struct KdaFinalizeGateParams : FinalizeGateParams {
  Shape sh;
  float lower_bound;  // lb of GateForm::LowerBound
};

template <int K>
__global__ void __launch_bounds__(K) kda_finalize_gate_kernel(KdaFinalizeGateParams p) {
  __shared__ float sdA[kC][K];  // dA of this thread's channel (column c: one thread's private column)
  __shared__ float sPart[K];
  const KdaIx ix = kda_ix(p.sh);
  const ChunkItem w = chunk_item(p.chunks, p.sh, blockIdx.x);
  const int L = w.L, j = w.j;
  const int64_t t0 = w.t0;
  const int c = threadIdx.x;
  float acc = 0.0f;
  for (int r = L - 1; r >= 0; --r) {  // [F2]
    acc += p.dlam[ix.hk(t0 + r, j) + c];
    sdA[r][c] = acc;
  }
  const float ea = p.A_log ? expf(p.A_log[j]) : 1.0f;
  const float bias = p.dt_bias ? p.dt_bias[int64_t(j) * K + c] : 0.0f;
  float part_A = 0.0f, part_b = 0.0f;
  for (int r = 0; r < L; ++r) {  // [F3]
    const int64_t at = ix.hk(t0 + r, j) + c;
    const float dA = sdA[r][c];
    float dg = dA;
    if (p.gate == int(GateForm::Softplus)) {
      const float x = p.g[at] + bias;
      const float sg = x > 20.0f ? 1.0f : sigmoid_f(x);
      const float av = -ea * softplus_f(x);
      dg = dA * (-ea * sg);
      part_A += dA * av;
    } else if (p.gate == int(GateForm::LowerBound)) {
      const float x = p.g[at] + bias;
      const float z = p.A_log ? ea * x : x;
      const float sg = sigmoid_f(z);
      const float dz = dA * p.lower_bound * sg * (1.0f - sg);
      dg = p.A_log ? dz * ea : dz;
      part_A += dz * z;
    }
    p.dg[at] = dg;
    part_b += dg;
  }
  float* out = p.partials + (w.n * p.sh.HV + j) * (K + 1);
  out[c] = part_b;
  sPart[c] = part_A;
  __syncthreads();
  if (c == 0) {
    float tot = 0.0f;
    for (int x = 0; x < K; ++x) tot += sPart[x];
    out[K] = tot;
  }
}

template <int K>
__global__ void __launch_bounds__(128) kda_finalize_params_kernel(KdaFinalizeGateParams p) {
  const int e = blockIdx.x * 128 + threadIdx.x;
  const int HV = p.sh.HV;
  if (e >= HV * (K + 1)) return;
  const int j = e / (K + 1), c = e % (K + 1);
  float tot = 0.0f;
  for (int64_t n = 0; n < p.sh.NT; ++n) tot += p.partials[(n * HV + j) * (K + 1) + c];
  if (c < K) {
    if (p.ddt_bias) p.ddt_bias[int64_t(j) * K + c] = tot;
  } else if (p.dA_log) {
    p.dA_log[j] = tot;
  }
}

}  // namespace kcp::kernels::cuda
