// The parameters of the gate part of bwd_finalize (docs/algorithm.md B6, 3.2 step 6): the GDN
// kernels' (gdn_finalize_kernel.cuh) and, extended, the KDA kernels' (kda_finalize_kernel.cuh).
// A header of its own because the GDN finalize kernels are not templates: a second translation
// unit that included their header would define them twice.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace kcp::kernels::cuda {

struct FinalizeGateParams {
  const ChunkDesc* chunks;
  int64_t NT;
  int HV, gate;
  const float* dlam;     // [T, HV] fp32 (KDA [T, HV, K])
  const float* g;        // [T, HV] raw gate (KDA [T, HV, K])
  const float* A_log;    // [HV] or null
  const float* dt_bias;  // [HV] (KDA [HV, K]) or null
  float* dg;             // [T, HV] fp32 (KDA [T, HV, K])
  float* partials;       // [NT, HV, 2]: dA_log, ddt_bias partial sums of the chunk (KDA [NT, HV, K + 1])
  float* dA_log;         // [HV] or null
  float* ddt_bias;       // [HV] (KDA [HV, K]) or null
};

// The parameters from the phase's Args (host); the KDA gate kernels' extend them
// (kda_finalize_kernel.cuh).
inline FinalizeGateParams gate_params(const BwdFinalizeArgs& a, const DevLayout& L, float* partials) {
  const Problem& pb = a.ctx.problem;
  FinalizeGateParams g{};
  g.chunks = L.chunks;
  g.NT = L.n_chunks;
  g.HV = pb.HV;
  g.gate = int(pb.gate);
  g.dlam = a.dlam;
  g.g = a.g;
  g.A_log = pb.has_A_log ? a.A_log : nullptr;
  g.dt_bias = pb.has_dt_bias ? a.dt_bias : nullptr;
  g.dg = a.dg;
  g.partials = partials;
  g.dA_log = pb.has_A_log ? a.dA_log : nullptr;
  g.ddt_bias = pb.has_dt_bias ? a.ddt_bias : nullptr;
  return g;
}

}  // namespace kcp::kernels::cuda
