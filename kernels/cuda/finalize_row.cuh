// A row of the GVA + L2-norm backward of dq / dk (docs/algorithm.md B6, rounding point [F1] of the
// CPU twin, kernels/cpu/finalize.cpp), one warp per row: the lane's vector accesses (LaneVec) and
// the row's end (finish_row). Included by gdn_finalize_kernel.cuh (finalize_qk_kernel) and
// gdn_bwd_wy_wgmma.cuh (the dk it finalizes on chip), so both round the same expressions.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace kcp::kernels::cuda {

// A lane's E = K / 32 consecutive channels (E = 2 or 4): fp32 values by one 8- or 16-byte load,
// 16-bit patterns by one 4- or 8-byte load or store.
template <int E>
struct LaneVec {
  static_assert(E == 2 || E == 4, "K = 64 or 128");
  static __device__ __forceinline__ void load(const float* src, float (&x)[E]) {
    if constexpr (E == 4) {
      const float4 v = *reinterpret_cast<const float4*>(src);
      x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    } else {
      const float2 v = *reinterpret_cast<const float2*>(src);
      x[0] = v.x, x[1] = v.y;
    }
  }
  // u[e / 2] holds channels e (low half) and e + 1 (high half).
  static __device__ __forceinline__ void load16(const uint16_t* src, uint32_t (&u)[E / 2]) {
    if constexpr (E == 4) {
      const uint2 v = *reinterpret_cast<const uint2*>(src);
      u[0] = v.x, u[1] = v.y;
    } else {
      u[0] = *reinterpret_cast<const uint32_t*>(src);
    }
  }
  // E = 4 by PTX st.global.v2 (as CUTLASS's global_store): a uint2 store through reinterpret_cast
  // became two 4-byte stores.
  static __device__ __forceinline__ void store16(uint16_t* dst, const uint32_t (&u)[E / 2]) {
    if constexpr (E == 4)
      asm volatile("st.global.v2.u32 [%0], {%1, %2};\n" ::"l"(dst), "r"(u[0]), "r"(u[1]));
    else
      *reinterpret_cast<uint32_t*>(dst) = u[0];
  }
};

// A row's end (finalize_qk_kernel, and the dk that gdn_bwd_wy_wgmma.cuh finalizes on chip): the
// lane's E channels of the heads' sum, the L2-norm backward dx = r (dy - (dy . y) y) (y: the
// lane's saved 16-bit words yu, r the row's rstd; the dot a warp sum), one rounding to dtype, one
// store at o. Every lane of the warp calls it (warp_sum).
template <class DT, int E>
__device__ __forceinline__ void finish_row(const float (&sum)[E], const uint32_t (&yu)[E / 2], float r, int l2norm,
                                           uint16_t* o) {
  uint32_t ou[E / 2];
  if (l2norm) {
    float y[E];
#pragma unroll
    for (int e = 0; e < E; e += 2) {
      y[e] = DT::from_raw(uint16_t(yu[e / 2] & 0xffffu));
      y[e + 1] = DT::from_raw(uint16_t(yu[e / 2] >> 16));
    }
    float dot = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) dot += sum[e] * y[e];
    dot = warp_sum(dot);
#pragma unroll
    for (int e = 0; e < E; e += 2) ou[e / 2] = DT::pack(r * (sum[e] - dot * y[e]), r * (sum[e + 1] - dot * y[e + 1]));
  } else {
#pragma unroll
    for (int e = 0; e < E; e += 2) ou[e / 2] = DT::pack(sum[e], sum[e + 1]);
  }
  LaneVec<E>::store16(o, ou);
}

}  // namespace kcp::kernels::cuda
