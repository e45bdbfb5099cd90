// Internal interface of the CUDA backend: the error path, the device copy of a rank layout, and
// the launchers of every phase (one .cu file per group, each beside its *_kernel.cuh). Host
// code; included by kernels/cuda/*.cu only (CUDA types appear here, never in cuda_backend.h).
//
// Launchers follow the CUTLASS life cycle: the backend has validated the Args
// (null pointers, problem, layout) before calling; a launcher computes the grid and shared
// memory, raises the shared-memory limit when needed, launches on `stream`, and checks
// cudaGetLastError. They never allocate or synchronise.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/api/chunk_bwd.h"
#include "kernels/api/chunk_fwd.h"
#include "kernels/api/fold.h"
#include "kernels/api/layout.h"
#include "kernels/api/problem.h"
#include "kernels/cuda/kda_qs.h"

namespace kcp::kernels::cuda {

// Throws std::runtime_error("CUDA cudaErrorX (description) at file:line in 'expr'") and clears
// the sticky error of the failed runtime call.
[[noreturn]] void raise_cuda_error(cudaError_t err, const char* expr, const char* file, int line);

#define KCP_CUDA_CHECK(expr)                                                            \
  do {                                                                                  \
    const cudaError_t kcp_cuda_err_ = (expr);                                           \
    if (kcp_cuda_err_ != cudaSuccess)                                                   \
      ::kcp::kernels::cuda::raise_cuda_error(kcp_cuda_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// After every launch: the launch error, and under KCP_CUDA_SYNC_CHECK (Debug builds) the
// kernel's own fault, so a fault points at the kernel that caused it.
#if defined(KCP_CUDA_SYNC_CHECK)
#define KCP_CUDA_LAUNCH_CHECK(stream)              \
  do {                                             \
    KCP_CUDA_CHECK(cudaGetLastError());            \
    KCP_CUDA_CHECK(cudaStreamSynchronize(stream)); \
  } while (0)
#else
#define KCP_CUDA_LAUNCH_CHECK(stream) KCP_CUDA_CHECK(cudaGetLastError())
#endif

// Device copies of the layout tables (uploaded once per distinct layout by the backend).
struct DevLayout {
  const PieceDesc* pieces = nullptr;      // [n_pieces]
  const SegmentDesc* segments = nullptr;  // [n_segments]
  const ChunkDesc* chunks = nullptr;      // [n_chunks]
  int64_t T = 0, n_chunks = 0;
  int32_t n_pieces = 0, n_segments = 0;
};

// Shapes shared by every kernel parameter struct (from Problem + layout).
struct Shape {
  int64_t T = 0, NT = 0;
  int32_t S = 0, N = 0, H = 1, HV = 1, G = 1, K = 64, V = 64;
  float scale = 1.0f;
  bool fp16 = false;
};
inline Shape shape_of(const Problem& p, const DevLayout& L) {
  Shape s;
  s.T = L.T;
  s.NT = L.n_chunks;
  s.S = L.n_segments;
  s.N = L.n_pieces;
  s.H = p.H;
  s.HV = p.HV;
  s.G = p.group();
  s.K = p.K;
  s.V = p.V;
  s.scale = p.resolved_scale();
  s.fp16 = p.dtype == DType::FP16;
  return s;
}

// Raises the dynamic shared-memory limit of `kernel` once per process (cheap afterwards).
template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (bytes > 48 * 1024)
    KCP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

// ---- launchers (GDN) ----
// prep: q/k L2 norm or copy; gate activation + chunk cumsum + Pi + Phi (gdn_prep.cu).
void launch_prep(const PrepArgs& a, const DevLayout& L, cudaStream_t st);
// wy: W, U (gdn_wy.cu).
void launch_wy(const WyArgs& a, const DevLayout& L, cudaStream_t st);
// Forward state walks (gdn_chunk_state.cu).
void launch_fwd_summaries(const FwdSummaryArgs& a, const DevLayout& L, cudaStream_t st);
void launch_fwd_states(const FwdStateArgs& a, const DevLayout& L, cudaStream_t st);
// fwd_states with a.output in one kernel where the Hopper walk applies (gdn_walk_out.cuh); false
// (nothing launched) elsewhere.
bool launch_fwd_states_output(const FwdStateArgs& a, const DevLayout& L, cudaStream_t st);
// Backward state walks (gdn_chunk_state.cu).
void launch_bwd_summaries(const BwdSummaryArgs& a, const DevLayout& L, cudaStream_t st);
void launch_bwd_states(const BwdStateArgs& a, const DevLayout& L, cudaStream_t st);
// Output and local dv (gdn_chunk_fwd.cu).
void launch_fwd_output(const FwdOutputArgs& a, const DevLayout& L, cudaStream_t st);
void launch_bwd_local_dv(const BwdLocalDvArgs& a, const DevLayout& L, cudaStream_t st);
// dq/dk/dv/dbeta/dlam per value head (gdn_chunk_bwd.cu). Scratch: dlam_hi [T, HV] fp32 (K > 64,
// else null), dW16 [T, HV, K] 16-bit storage. With a.finalize, B5 may finalize dk itself (the GVA
// sum and L2-norm backward of gdn_bwd_wy_wgmma.cuh's FIN kernel, into a.finalize->dk): returns true
// when it did (dk_hv then holds B4's part only), false when dk_hv holds the value heads' dk.
bool launch_bwd_grads(const BwdGradArgs& a, const DevLayout& L, float* dlam_hi, uint16_t* dW16, cudaStream_t st);
// GVA + L2-norm backward, gate backward; partials: scratch [NT, HV, 2] fp32 (gdn_finalize.cu).
// dk_done: dk is already final (launch_bwd_grads returned true): dq and the gates only.
void launch_bwd_finalize(const BwdFinalizeArgs& a, const DevLayout& L, float* partials, cudaStream_t st,
                         bool dk_done = false);
// The operator-independent parts of prep and finalize, shared by GDN and KDA: q/k L2 norm or copy
// (gdn_prep.cu) and the GVA reduction + L2-norm backward of dq/dk (gdn_finalize.cu).
void launch_prep_qk(const PrepArgs& a, const DevLayout& L, cudaStream_t st);
void launch_finalize_qk(const BwdFinalizeArgs& a, const DevLayout& L, cudaStream_t st, bool dk_done = false);

// ---- launchers (KDA; plain fp32 kernels, docs/algorithm.md 3.2 and kda_common.cuh) ----
// prep: q/k (launch_prep_qk), then per-channel gate cumsum, Pi, Aqk, Phi (kda_prep.cu).
void launch_kda_prep(const PrepArgs& a, const DevLayout& L, cudaStream_t st);
// wy: W, U, kg (kda_wy.cu).
void launch_kda_wy(const WyArgs& a, const DevLayout& L, cudaStream_t st);
// State walks (kda_chunk_state.cu).
void launch_kda_fwd_summaries(const FwdSummaryArgs& a, const DevLayout& L, cudaStream_t st);
void launch_kda_fwd_states(const FwdStateArgs& a, const DevLayout& L, cudaStream_t st);
// The backward walks take qs: [T, HV, K] 16-bit scratch, written there by launch_kda_qs before a
// wgmma walk (bwd_summaries: only the tokens of segments whose summary is read, kda_qs.h; the
// mma.sync walk forms qs itself and leaves it untouched).
void launch_kda_bwd_summaries(const BwdSummaryArgs& a, const DevLayout& L, uint16_t* qs, cudaStream_t st);
void launch_kda_bwd_states(const BwdStateArgs& a, const DevLayout& L, uint16_t* qs, cudaStream_t st);
// qs [T, HV, K] = dtype((q[t, j / G] scale) exp2(gcum[t, j])) per element, the backward walks'
// operand [B3], for the tokens of `rows` (kda_qs.cu, kda_qs.h; q: saved q [T, H, K], qs: 16-bit
// storage; the other rows of qs untouched).
void launch_kda_qs(const Shape& s, const QsRows& rows, const uint16_t* q, const float* gcum, uint16_t* qs,
                   cudaStream_t st);
// Output and local dv (kda_chunk_fwd.cu).
void launch_kda_fwd_output(const FwdOutputArgs& a, const DevLayout& L, cudaStream_t st);
void launch_kda_bwd_local_dv(const BwdLocalDvArgs& a, const DevLayout& L, cudaStream_t st);
// dq/dk/dv/dbeta/dlam per value head (kda_chunk_bwd.cu), three kernels passing through the
// backend's scratch: dW16 [T, HV, K] 16-bit storage, dAqk and dAkk [T, HV, 64] fp32.
struct KdaGradScratch {
  uint16_t* dW16 = nullptr;
  float* dAqk = nullptr;
  float* dAkk = nullptr;
};
void launch_kda_bwd_grads(const BwdGradArgs& a, const DevLayout& L, const KdaGradScratch& s, cudaStream_t st);
// GVA + L2-norm backward (launch_finalize_qk), per-channel gate backward (kda_finalize.cu);
// partials: scratch [NT, HV, K + 1] fp32 (ddt_bias per channel, then dA_log, per chunk).
void launch_kda_bwd_finalize(const BwdFinalizeArgs& a, const DevLayout& L, float* partials, cudaStream_t st);

// The fp32 fold chain (fold.cu).
void launch_fold(const FoldArgs& a, cudaStream_t st);
// dst[0..n) = value (fold.cu); the uint16_t form fills 16-bit dtype patterns.
void launch_fill(float* dst, float value, int64_t n, cudaStream_t st);
void launch_fill(uint16_t* dst, uint16_t value, int64_t n, cudaStream_t st);

}  // namespace kcp::kernels::cuda
