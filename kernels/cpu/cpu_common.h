// Internal helpers of the CPU twin: dimensions, indexing, the deterministic parallel loop, the
// chunk inverse, and the phase entry points implemented per file. The argument checks are the
// ones every backend shares (kernels/api/args_check.h).
// Not part of the kernel API (include only from kernels/cpu/*.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/api/args_check.h"  // arg_fail, need, forbid, check_<phase>_args
#include "kernels/api/backend.h"
#include "kernels/api/numeric.h"
#include "vocab/parallel_for.h"

namespace kcp::kernels::cpu {

// Shapes of one phase call.
struct Dims {
  int64_t T, NT, S, N;
  int32_t H, HV, K, V, G, gw, C;
  float scale;
  RoundTo rt;
  bool exact;  // PhaseCtx::exact_storage: no rounding at all
  explicit Dims(const PhaseCtx& c)
      : T(c.layout.T),
        NT(c.layout.n_chunks),
        S(c.layout.n_segments),
        N(c.layout.n_pieces),
        H(c.problem.H),
        HV(c.problem.HV),
        K(c.problem.K),
        V(c.problem.V),
        G(c.problem.group()),
        gw(c.problem.gate_width()),
        C(c.problem.chunk),
        scale(c.problem.resolved_scale()),
        rt(rounding_of(c.problem.dtype)),
        exact(c.exact_storage) {}
  // Round to the input dtype (every "stored in dtype" point and every bf16 tensor-core operand),
  // or keep fp32 in the exact-storage twin.
  float rnd(float x) const { return exact ? x : round_to(x, rt); }
  // Offsets.
  int64_t qk(int64_t t, int32_t i) const { return (t * H + i) * K; }                // [T, H, K]
  int64_t vv(int64_t t, int32_t j) const { return (t * HV + j) * V; }               // [T, HV, V]
  int64_t hk(int64_t t, int32_t j) const { return (t * HV + j) * K; }               // [T, HV, K]
  int64_t th(int64_t t, int32_t j) const { return t * HV + j; }                     // [T, HV]
  int64_t gg(int64_t t, int32_t j) const { return (t * HV + j) * gw; }              // [T, HV, gw]
  int64_t cc(int64_t t, int32_t j) const { return (t * HV + j) * C; }               // [T, HV, C]
  int64_t kv(int64_t n, int32_t j) const { return (n * HV + j) * int64_t(K) * V; }  // [*, HV, K, V]
  int64_t kk(int64_t n, int32_t j) const { return (n * HV + j) * int64_t(K) * K; }  // [*, HV, K, K]
};

// The twin's storages (CpuBackend::dtype_storage / caller_storage): saved set and workspace in
// fp32; caller tensors as 16-bit patterns, or fp32 in the exact-storage twin.
inline PhaseStorage twin_storage(const PhaseCtx& c) {
  return {Storage::F32, c.exact_storage ? Storage::F32 : Storage::Packed16};
}

// A caller input (q, k, v, dO; tensors.h) as floats for one phase: its first n elements,
// decoded from their 16-bit patterns once (F32 storage: the tensor itself, no copy).
class CallerIn {
 public:
  CallerIn(ConstDtypeTensor t, int64_t n, const Dims& d);
  const float* get() const { return p_; }

 private:
  std::vector<float> decoded_;
  const float* p_ = nullptr;
};
// A caller output (o, dq, dk, dv) written as floats by one phase: a buffer of its first n
// elements as they are (what the phase leaves unwritten, e.g. NaN poison, stays so), encoded
// back to 16-bit patterns by store() (F32 storage: the tensor itself; store() does nothing).
// The phase writes values already rounded by Dims::rnd, so the encoding is exact.
class CallerOut {
 public:
  CallerOut(DtypeTensor t, int64_t n, const Dims& d);
  float* get() { return p_; }
  void store() const;

 private:
  DtypeTensor t_;
  RoundTo rt_;
  std::vector<float> buf_;
  float* p_ = nullptr;
};

// parallel_for(n, threads, fn): vocab/parallel_for.h. Every i writes disjoint memory, so results
// never depend on the thread count.
using kcp::parallel_for;

// Phi = (I + Pi)^-1 of one chunk (docs/algorithm.md F2): Pi is 64 x 64 strictly lower (zero outside the
// chunk's L x L part); Phi receives the full unit-lower inverse, fp32. 16 x 16 diagonal blocks
// by row-wise forward substitution, then the block merge X10, X21, X32, X20, X31, X30.
void tril_inverse_64(const float* Pi, float* Phi);

inline float exp2f_(float x) { return std::exp2(x); }
inline float sigmoidf_(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// Softplus as in the kernels: identity above 20, else ln(1 + e^x) (no log1p).
inline float softplusf_(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }

// Phase implementations (one file per group).
void prep(const PrepArgs& a);                 // prep.cpp (+ gdn_/kda_chunk_fwd.cpp intra parts)
void gdn_intra(const PrepArgs& a);            // gdn_chunk_fwd.cpp: Pi, Phi
void kda_intra(const PrepArgs& a);            // kda_chunk_fwd.cpp: Pi, Aqk, Phi
void wy(const WyArgs& a);                     // wy.cpp
void fwd_summaries(const FwdSummaryArgs& a);  // chunk_state.cpp
void fwd_states(const FwdStateArgs& a);       // chunk_state.cpp
void gdn_output(const FwdOutputArgs& a);      // gdn_chunk_fwd.cpp
void kda_output(const FwdOutputArgs& a);      // kda_chunk_fwd.cpp
void fold(const FoldArgs& a);                 // fold.cpp
void bwd_local_dv(const BwdLocalDvArgs& a);   // chunk_state.cpp
void bwd_summaries(const BwdSummaryArgs& a);  // chunk_state.cpp
void bwd_states(const BwdStateArgs& a);       // chunk_state.cpp
void gdn_bwd_grads(const BwdGradArgs& a);     // gdn_chunk_bwd.cpp
void kda_bwd_grads(const BwdGradArgs& a);     // kda_chunk_bwd.cpp
void bwd_finalize(const BwdFinalizeArgs& a);  // finalize.cpp

}  // namespace kcp::kernels::cpu
