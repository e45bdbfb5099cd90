// KDA's qs prepass: the backward walks' operand qs = dtype((q scale) exp2(g)) ([B3] of the twin,
// kernels/cpu/chunk_state.cpp), one gate per element, written as a 16-bit tensor [T, HV, K] so
// that the wgmma backward walk (gdn_walk_wgmma.cuh) loads it by TMA as GDN's walk loads q; only
// for the tokens of the given ranges (QsRows, kda_qs.h: bwd_summaries covers only the segments
// whose summary is read, bwd_states every token). Same fp32 expression and conversion as the
// walks' in-place qs (bwd_walk_kernel's QsTile, gdn_chunk_state_kernel.cuh): q's 16-bit value
// times scale, times exp2f(gcum), rounded to the dtype (DT::pack), so the walk's output bits do
// not change.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_launch.h"
#include "kernels/cuda/kda_qs.h"

namespace kcp::kernels::cuda {

namespace {

constexpr int kQsThreads = 256;

// kda_qs_kernel<DT>: one thread per 8 consecutive key channels c of one (token t, value head j),
// e = (u HV + j) K / 8 + c / 8 with u the token's place in the ranges (t = begin[r] + u - at[r]):
// one 16-byte load of q (q/k head j / G), two of gcum, one 16-byte store of qs. Memory-bound; no
// shared memory.
template <class DT>
__global__ void __launch_bounds__(kQsThreads)
    kda_qs_kernel(const Shape sh, const __grid_constant__ QsRows rows, const uint16_t* __restrict__ q,
                  const float* __restrict__ gcum, uint16_t* __restrict__ qs) {
  const int64_t k8 = sh.K / 8, e = int64_t(blockIdx.x) * kQsThreads + threadIdx.x;
  if (e >= rows.at[rows.n] * sh.HV * k8) return;
  const int64_t uj = e / k8, u = uj / sh.HV;
  int r = 0;
  while (r + 1 < rows.n && u >= rows.at[r + 1]) ++r;
  const int c = int(e % k8) * 8, j = int(uj % sh.HV);
  const int64_t t = rows.begin[r] + (u - rows.at[r]), tj = t * sh.HV + j;
  const uint4 x = __ldg(reinterpret_cast<const uint4*>(q + (t * sh.H + j / sh.G) * sh.K + c));
  const float4* g = reinterpret_cast<const float4*>(gcum + tj * sh.K + c);
  const float4 lo = __ldg(g), hi = __ldg(g + 1);
  const uint32_t w[4] = {x.x, x.y, x.z, x.w};
  uint32_t o[4];
#pragma unroll
  for (int h = 0; h < 4; ++h)
    o[h] = DT::pack((DT::from_raw(uint16_t(w[h] & 0xffffu)) * sh.scale) * exp2f(at8(lo, hi, 2 * h)),
                    (DT::from_raw(uint16_t(w[h] >> 16)) * sh.scale) * exp2f(at8(lo, hi, 2 * h + 1)));
  *reinterpret_cast<uint4*>(qs + tj * sh.K + c) = make_uint4(o[0], o[1], o[2], o[3]);
}

}  // namespace

void launch_kda_qs(const Shape& s, const QsRows& rows, const uint16_t* q, const float* gcum, uint16_t* qs,
                   cudaStream_t st) {
  const int64_t n = rows.at[rows.n] * s.HV * (s.K / 8);
  if (n == 0) return;
  const unsigned blocks = unsigned((n + kQsThreads - 1) / kQsThreads);
  if (s.fp16)
    kda_qs_kernel<Fp16><<<blocks, kQsThreads, 0, st>>>(s, rows, q, gcum, qs);
  else
    kda_qs_kernel<Bf16><<<blocks, kQsThreads, 0, st>>>(s, rows, q, gcum, qs);
  KCP_CUDA_LAUNCH_CHECK(st);
}

void run_kda_qs(const Problem& p, const QsRows& rows, const uint16_t* q, const float* gcum, uint16_t* qs) {
  launch_kda_qs(shape_of(p, DevLayout{}), rows, q, gcum, qs, nullptr);
  KCP_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

}  // namespace kcp::kernels::cuda
