// Forward phases of the chunked GDN / KDA algorithm with segments (docs/algorithm.md 2 and 4.2;
// docs/design.md 4). One Args POD per phase; the same Args serve GDN and KDA (ctx.problem.op).
// Phase order on one rank:
//   prep -> wy -> fwd_summaries -> [folds: segment summaries -> rank summary of the last piece;
//   exchange; incoming state -> entry state of every segment] -> fwd_states -> fwd_output
// (the driver passes fwd_output's Args to fwd_states, which then writes o as well: one call).
// Every pointer is in the backend's memory space; shapes as in tensors.h (T, NT, S, N, gw, C).
// "dtype" = a value rounded to problem.dtype: a float for the KDA-only Aqk, a DtypeTensor
// (dtype_tensor.h) for the rest: the caller tensors q, k, v, dO, o, dq, dk, dv stored as the
// backend's caller_storage() (16-bit patterns), the saved q, k, Phi, W, U, kg (W, U, kg in the
// workspace with a light saved set) and the workspace h, v_new, dv_local, dh, dv2 as its
// dtype_storage() (tensors.h); "fp32" = full fp32.
//
// Units: gcum holds the chunk-local inclusive cumsum of the natural-log decay a, multiplied by
// kRcpLn2 (log2 units, fp32); kernels use exp2 of differences, every exponent <= 0.
#pragma once

#include <cstdint>

#include "kernels/api/dtype_tensor.h"
#include "kernels/api/layout.h"
#include "kernels/api/problem.h"

namespace kcp::kernels {

// Shared by every phase call.
struct PhaseCtx {
  Problem problem;
  LayoutView layout;
  Exec exec;
  // Backend-private workspace (WorkspaceTensors::scratch, Backend::extra_workspace_floats()):
  // e.g. a device backend's copy of the layout tables and the det package's partial buffers.
  // Null / 0 when the backend asks for none (the CPU twin). Added after the first API commit.
  float* scratch = nullptr;
  int64_t scratch_floats = 0;
  // CPU twin only, set by the twin itself (make_cpu_backend(CpuStorage::Exact)), never by a
  // caller: keep every "stored in dtype" point in fp32. `calibrate` holds this exact-storage twin
  // to fp32-level limits against FP64, so a broken twin is told apart from 16-bit rounding
  // (docs/design.md 6).
  bool exact_storage = false;
};

// Phase 1: local prep, chunk-local, no state. Writes the prep part of the saved set.
//   q/k L2 norm (fp32, stored in dtype, fp32 rstd) or a plain copy; gate activation (direct /
//   softplus / lower bound) and chunk-local cumsum (fp32, log2 units); Pi (strictly lower, beta
//   rows, gated) and Phi = (I + Pi)^-1 (fp32 16x16-block inverse, stored in dtype); KDA: Aqk.
struct PrepArgs {
  PhaseCtx ctx;
  ConstDtypeTensor q;              // [T, H, K] dtype (input, caller storage)
  ConstDtypeTensor k;              // [T, H, K] dtype (input, caller storage)
  const float* g = nullptr;        // [T, HV, gw] gate input
  const float* beta = nullptr;     // [T, HV]
  const float* A_log = nullptr;    // [HV] (has_A_log)
  const float* dt_bias = nullptr;  // [HV, gw] (has_dt_bias)
  DtypeTensor q_out;               // [T, H, K] dtype: saved.q
  DtypeTensor k_out;               // [T, H, K] dtype: saved.k
  float* rstd_q = nullptr;         // [T, H] fp32 (qk_l2norm only)
  float* rstd_k = nullptr;         // [T, H] fp32 (qk_l2norm only)
  float* gcum = nullptr;           // [T, HV, gw] fp32
  DtypeTensor Phi;                 // [T, HV, C] dtype
  float* Aqk = nullptr;            // [T, HV, C] dtype (KDA only, else must be null)
};

// Phase 1b (also the first step of the light backward's recompute): the WY factors from the saved set.
//   W = Phi diag(beta) (K o gam), U = Phi diag(beta) V, KDA kg = K o (Gam / gam); all dtype.
struct WyArgs {
  PhaseCtx ctx;
  ConstDtypeTensor k;           // [T, H, K] dtype: saved.k
  ConstDtypeTensor v;           // [T, HV, V] dtype (input, caller storage)
  const float* beta = nullptr;  // [T, HV]
  const float* gcum = nullptr;  // [T, HV, gw] fp32
  ConstDtypeTensor Phi;         // [T, HV, C] dtype
  DtypeTensor W;                // [T, HV, K] dtype
  DtypeTensor U;                // [T, HV, V] dtype
  DtypeTensor kg;               // [T, HV, K] dtype (KDA only, else must be null)
};

// Phase 2: segment summaries, every segment independently from a zero state (docs/algorithm.md 4.2):
//   seg_h_ext[s] = the state after the segment's chunks from S = 0 (same roundings as F4),
//   seg_Mt[s]    = (M_last ... M_first)^T with M_c = Diag(Gam_c) - Kt_c^T W_c; chain in fp32.
// A segment maps an entry state X to M X + h_ext. Summaries that no fold result anybody stores
// can read (kernels/api/summary_needs.h: from the layout, has_h0 and has_dht) are written as
// zeros without walking the segment.
struct FwdSummaryArgs {
  PhaseCtx ctx;
  ConstDtypeTensor k;           // [T, H, K] dtype: saved.k (GDN)
  const float* gcum = nullptr;  // [T, HV, gw] fp32
  ConstDtypeTensor W;           // [T, HV, K] dtype
  ConstDtypeTensor U;           // [T, HV, V] dtype
  ConstDtypeTensor kg;          // [T, HV, K] dtype (KDA)
  float* seg_h_ext = nullptr;   // [S, HV, K, V] fp32
  float* seg_Mt = nullptr;      // [S, HV, K, K] fp32 (M^T: row a, col b holds M[b][a])
};

struct FwdOutputArgs;

// Phase 4: the state recurrence of every segment from its entry state (F4), then per chunk:
//   h[n] = dtype(S at chunk start); v_new = dtype(U - W dtype(S)); S <- Diag(Gam) S + Kt^T v_new.
// ht[p] (fp32) = S after the last chunk of piece p, for every non-empty piece (null: skipped).
// output (optional): phase 4b in the same call: o as fwd_output(*output) writes it, from this
// call's h and v_new (output->h and output->v_new must be this call's h and v_new). h is then
// left unspecified: a backend may form o where h is still on chip and never store h (the
// backward's recompute writes its own). Every backend accepts it (one that cannot fuse runs the
// two phases in turn).
struct FwdStateArgs {
  PhaseCtx ctx;
  ConstDtypeTensor k;                // [T, H, K] dtype: saved.k (GDN)
  const float* gcum = nullptr;       // [T, HV, gw] fp32
  ConstDtypeTensor W;                // [T, HV, K] dtype
  ConstDtypeTensor U;                // [T, HV, V] dtype
  ConstDtypeTensor kg;               // [T, HV, K] dtype (KDA)
  const float* seg_entry = nullptr;  // [S, HV, K, V] fp32
  DtypeTensor h;                     // [NT, HV, K, V] dtype
  DtypeTensor v_new;                 // [T, HV, V] dtype
  float* ht = nullptr;               // [N, HV, K, V] fp32 or null
  const FwdOutputArgs* output = nullptr;
};

// Phase 4b: the output (F5): o = scale (Q o gam) h + P v_new (GDN, P on the fly) or
// scale dtype(Q o gam) h + Aqk v_new (KDA); rounded to dtype.
struct FwdOutputArgs {
  PhaseCtx ctx;
  ConstDtypeTensor q;           // [T, H, K] dtype: saved.q
  ConstDtypeTensor k;           // [T, H, K] dtype: saved.k (GDN)
  const float* gcum = nullptr;  // [T, HV, gw] fp32
  const float* Aqk = nullptr;   // [T, HV, C] dtype (KDA)
  ConstDtypeTensor h;           // [NT, HV, K, V] dtype
  ConstDtypeTensor v_new;       // [T, HV, V] dtype
  DtypeTensor o;                // [T, HV, V] dtype (output, caller storage)
};

}  // namespace kcp::kernels
