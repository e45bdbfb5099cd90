// Backward phases of the chunked GDN / KDA algorithm with segments (docs/algorithm.md 3 and 4.3).
// Loss convention: L = sum(o * dO) + sum(ht * dht). Phase order on one rank:
//   wy (recompute) -> [light: fwd_summaries + folds -> segment entry states] -> fwd_states
//   (recompute h, v_new; ht null) -> bwd_local_dv -> bwd_summaries -> [folds: backward rank
//   summary of the first piece; exchange; exit gradient -> exit gradient of every segment]
//   -> bwd_states -> bwd_grads -> bwd_finalize
// (the driver passes bwd_finalize's Args to bwd_grads, which then finalizes as well: one call).
// Shapes and units as in tensors.h / chunk_fwd.h.
#pragma once

#include "kernels/api/chunk_fwd.h"

namespace kcp::kernels {

// B2: intra-chunk part of the gradient w.r.t. v_new: dv_local = P^T dO (GDN: P recomputed with
// scale, rounded to dtype; KDA: Aqk^T dO), fp32 accumulation, stored in dtype.
struct BwdLocalDvArgs {
  PhaseCtx ctx;
  ConstDtypeTensor q;           // [T, H, K] dtype: saved.q (GDN)
  ConstDtypeTensor k;           // [T, H, K] dtype: saved.k (GDN)
  const float* gcum = nullptr;  // [T, HV, gw] fp32 (GDN)
  const float* Aqk = nullptr;   // [T, HV, C] dtype (KDA)
  ConstDtypeTensor dO;          // [T, HV, V] dtype (input, caller storage)
  DtypeTensor dv_local;         // [T, HV, V] dtype
};

// Reverse summaries (docs/algorithm.md 4.3): every segment independently, B3 run from a zero exit
// gradient over the segment's chunks, last to first: seg_dh_ext[s] = dS after the first chunk.
// The transfer part of the reverse summary is M_seg^T from the forward summary (saved in the
// full set, recomputed by fwd_summaries in the light one): Y_entry = M_seg^T Y_exit + dh_ext.
// A dh_ext nobody reads (kernels/api/summary_needs.h) is written as zeros without a walk.
struct BwdSummaryArgs {
  PhaseCtx ctx;
  ConstDtypeTensor q;           // [T, H, K] dtype: saved.q
  ConstDtypeTensor k;           // [T, H, K] dtype: saved.k (GDN)
  const float* gcum = nullptr;  // [T, HV, gw] fp32
  ConstDtypeTensor W;           // [T, HV, K] dtype
  ConstDtypeTensor kg;          // [T, HV, K] dtype (KDA)
  ConstDtypeTensor dO;          // [T, HV, V] dtype (input, caller storage)
  ConstDtypeTensor dv_local;    // [T, HV, V] dtype
  float* seg_dh_ext = nullptr;  // [S, HV, K, V] fp32
};

// B3 per segment from its exit gradient, chunks last to first:
//   dh[n] = dtype(dS) (gradient w.r.t. the chunk-END state); dv2 = dtype(Kt dtype(dS) + dv_local);
//   dS <- Diag(Gam) dS + scale (Q o gam)^T dO - W^T dv2.
// dh0[p] (fp32) = dS after the first chunk of piece p (gradient w.r.t. the piece entry state),
// for every non-empty piece (null: skipped).
struct BwdStateArgs {
  PhaseCtx ctx;
  ConstDtypeTensor q;               // [T, H, K] dtype: saved.q
  ConstDtypeTensor k;               // [T, H, K] dtype: saved.k (GDN)
  const float* gcum = nullptr;      // [T, HV, gw] fp32
  ConstDtypeTensor W;               // [T, HV, K] dtype
  ConstDtypeTensor kg;              // [T, HV, K] dtype (KDA)
  ConstDtypeTensor dO;              // [T, HV, V] dtype (input, caller storage)
  ConstDtypeTensor dv_local;        // [T, HV, V] dtype
  const float* seg_exit = nullptr;  // [S, HV, K, V] fp32: gradient w.r.t. each segment's exit state
  DtypeTensor dh;                   // [NT, HV, K, V] dtype
  DtypeTensor dv2;                  // [T, HV, V] dtype
  float* dh0 = nullptr;             // [N, HV, K, V] fp32 or null
};

struct BwdFinalizeArgs;

// B4 + B5 (GDN) / KDA 3.2 steps 4-5, chunk-local given h, dh, v_new, dv2: per value head
// dq, dk (fp32, before the GVA reduction and the L2-norm backward), dv and dbeta (final), and
// dlam, the gradient w.r.t. the natural-log chunk-local cumsum (fp32).
// finalize (optional): B6/B7 in the same call, as bwd_finalize(*finalize) writes them, from this
// call's dq_hv, dk_hv and dlam (finalize->dq_hv, dk_hv, dlam must be this call's). dq_hv and
// dk_hv are then left unspecified: a backend may reduce and finalize dq / dk where they are still
// on chip and never store them. Every backend accepts it (one that cannot fuse runs the two
// phases in turn).
struct BwdGradArgs {
  PhaseCtx ctx;
  ConstDtypeTensor q;           // [T, H, K] dtype: saved.q
  ConstDtypeTensor k;           // [T, H, K] dtype: saved.k
  ConstDtypeTensor v;           // [T, HV, V] dtype (input, caller storage)
  const float* beta = nullptr;  // [T, HV] (input)
  const float* gcum = nullptr;  // [T, HV, gw] fp32
  ConstDtypeTensor Phi;         // [T, HV, C] dtype
  const float* Aqk = nullptr;   // [T, HV, C] dtype (KDA)
  ConstDtypeTensor h;           // [NT, HV, K, V] dtype
  ConstDtypeTensor v_new;       // [T, HV, V] dtype
  ConstDtypeTensor dh;          // [NT, HV, K, V] dtype
  ConstDtypeTensor dv2;         // [T, HV, V] dtype
  ConstDtypeTensor dO;          // [T, HV, V] dtype (input, caller storage)
  float* dq_hv = nullptr;       // [T, HV, K] fp32
  float* dk_hv = nullptr;       // [T, HV, K] fp32
  DtypeTensor dv;               // [T, HV, V] dtype (final; caller storage)
  float* dbeta = nullptr;       // [T, HV] fp32 (final)
  float* dlam = nullptr;        // [T, HV, gw] fp32
  const BwdFinalizeArgs* finalize = nullptr;
};

// B6/B7: GVA reduction of dq/dk over the G value heads of a group (fixed order j = i*G ..
// i*G+G-1), L2-norm backward (when qk_l2norm), rounding to dtype; chunk-local reverse cumsum of
// dlam -> dA; raw-gate backward: dg (shape of g, fp32), dA_log [HV] and ddt_bias [HV, gw]
// partial sums over this rank's tokens (fixed order: t ascending, then channel).
struct BwdFinalizeArgs {
  PhaseCtx ctx;
  const float* dq_hv = nullptr;    // [T, HV, K] fp32
  const float* dk_hv = nullptr;    // [T, HV, K] fp32
  const float* dlam = nullptr;     // [T, HV, gw] fp32
  ConstDtypeTensor q;              // [T, H, K] dtype: saved.q (normalized y, for the L2 bwd)
  ConstDtypeTensor k;              // [T, H, K] dtype: saved.k
  const float* rstd_q = nullptr;   // [T, H] fp32 (qk_l2norm)
  const float* rstd_k = nullptr;   // [T, H] fp32 (qk_l2norm)
  const float* g = nullptr;        // [T, HV, gw] gate input (raw forms)
  const float* A_log = nullptr;    // [HV]
  const float* dt_bias = nullptr;  // [HV, gw]
  DtypeTensor dq;                  // [T, H, K] dtype (caller storage)
  DtypeTensor dk;                  // [T, H, K] dtype (caller storage)
  float* dg = nullptr;             // [T, HV, gw] fp32
  float* dA_log = nullptr;         // [HV] fp32 (has_A_log, else must be null)
  float* ddt_bias = nullptr;       // [HV, gw] fp32 (has_dt_bias, else must be null)
};

}  // namespace kcp::kernels
