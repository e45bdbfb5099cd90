// Argument checks of the backend phases (backend.h), shared by every backend: the CPU twin
// (kernels/cpu) and the CUDA backend (kernels/cuda) call these, so both reject the same bad input
// with the same words, in the same order (tests match the messages; a user who moves a row from
// one backend to the other sees the same error). Written once here, a rule cannot drift between
// the backends.
//
// Errors: std::invalid_argument "kcp kernels: <phase>: <what>", e.g.
// "kcp kernels: gdn fwd_states: args.seg_entry is null" (backend.h contract). The phase name is
// the caller's ("gdn prep", "kda prep", "fold").
//
// Use, per phase call: the backend's context check first (check_problem_layout, then whatever the
// backend itself cannot run, e.g. the CUDA backend's head dims), then check_<phase>_args, then
// anything only that backend needs (a device backend's scratch). check_<phase>_args checks the
// pointer fields only, with the backend-independent rules: which tensors the operator reads and
// writes, and which must be null (GDN has no Aqk and no kg; dA_log / ddt_bias only with the
// problem's A_log / dt_bias). It reads ctx.problem, so the context must have been checked.
// `st` holds the calling backend's storages (PhaseStorage): every non-null DtypeTensor field
// (dtype_tensor.h) of the saved set or workspace must be stored as st.dtype
// (Backend::dtype_storage()), every caller tensor (q, k, v, dO in; o, dq, dk, dv out) as
// st.caller (Backend::caller_storage()), so a kernel never reads 16-bit patterns as floats or
// the reverse; a saved set or workspace bound for another backend, or caller tensors allocated
// for one, are refused here, before any tensor is read or written.
// Host-only, header-only (kcp_kernels_api is an INTERFACE target); C++17, since nvcc compiles
// the CUDA backend's host code with it.
#pragma once

#include <initializer_list>
#include <stdexcept>
#include <string>

#include "kernels/api/chunk_bwd.h"
#include "kernels/api/chunk_fwd.h"
#include "kernels/api/dtype_tensor.h"
#include "kernels/api/fold.h"
#include "kernels/api/layout.h"
#include "kernels/api/problem.h"

namespace kcp::kernels {

// ---- primitives: every message names the phase and the field ----

[[noreturn]] inline void arg_fail(const char* phase, const std::string& what) {
  throw std::invalid_argument(std::string("kcp kernels: ") + phase + ": " + what);
}
inline void need(const void* p, const char* phase, const char* field) {
  if (!p) arg_fail(phase, std::string("args.") + field + " is null");
}
inline void forbid(const void* p, const char* phase, const char* field, const char* why) {
  if (p) arg_fail(phase, std::string("args.") + field + " must be null (" + why + ")");
}
// need() of each field in turn: the first null one is reported.
struct NeedField {
  NeedField(const void* ptr, const char* field) : p(ptr), name(field) {}
  NeedField(ConstDtypeTensor t, const char* field) : p(t.address()), name(field) {}
  const void* p;
  const char* name;
};
inline void need_all(const char* phase, std::initializer_list<NeedField> fields) {
  for (const NeedField& f : fields) need(f.p, phase, f.name);
}

// Every non-null dtype tensor among `fields` is stored as `want` (the backend's storage).
struct StorageField {
  ConstDtypeTensor t;
  const char* name;
};
namespace detail {
inline void need_stored_as(const char* phase, Storage want, std::initializer_list<StorageField> fields,
                           const char* which, const char* how) {
  for (const StorageField& f : fields)
    if (f.t && f.t.storage() != want)
      arg_fail(phase, std::string("args.") + f.name + " is stored as " + to_string(f.t.storage()) + ", this backend " +
                          which + " as " + to_string(want) + " (" + how + ")");
}
}  // namespace detail
// The saved set's / workspace's dtype tensors among `fields`.
inline void need_storage(const char* phase, Storage want, std::initializer_list<StorageField> fields) {
  detail::need_stored_as(phase, want, fields, "stores dtype tensors",
                         "bind the saved set and the workspace with Backend::bind_saved_for / bind_workspace_for");
}
// The caller tensors among `fields`.
inline void need_caller_storage(const char* phase, Storage want, std::initializer_list<StorageField> fields) {
  detail::need_stored_as(phase, want, fields, "takes caller tensors", "allocate them as Backend::caller_storage()");
}

// validate_problem and validate_layout of a phase context, their message prefixed with the phase.
inline void check_problem_layout(const PhaseCtx& c, const char* phase) {
  try {
    validate_problem(c.problem);
    validate_layout(c.layout, c.problem.chunk);
  } catch (const std::invalid_argument& e) {
    arg_fail(phase, e.what());
  }
}

namespace detail {

// The state walks read k (GDN) or the gated kg (KDA).
template <class Args>
void check_walk_keys(const Args& a, const char* ph) {
  if (a.ctx.problem.op == Op::Gdn)
    need(a.k.address(), ph, "k");
  else
    need(a.kg.address(), ph, "kg");
}
// The inputs every forward walk needs (fwd_summaries, fwd_states).
template <class Args>
void check_fwd_walk_args(const Args& a, const char* ph, PhaseStorage st) {
  check_walk_keys(a, ph);
  need_all(ph, {{a.gcum, "gcum"}, {a.W, "W"}, {a.U, "U"}});
  need_storage(ph, st.dtype, {{a.k, "k"}, {a.kg, "kg"}, {a.W, "W"}, {a.U, "U"}});
}
// The inputs every backward walk needs (bwd_summaries, bwd_states).
template <class Args>
void check_bwd_walk_args(const Args& a, const char* ph, PhaseStorage st) {
  need(a.q.address(), ph, "q");
  check_walk_keys(a, ph);
  need_all(ph, {{a.gcum, "gcum"}, {a.W, "W"}, {a.dO, "dO"}, {a.dv_local, "dv_local"}});
  need_storage(ph, st.dtype, {{a.q, "q"}, {a.k, "k"}, {a.kg, "kg"}, {a.W, "W"}, {a.dv_local, "dv_local"}});
  need_caller_storage(ph, st.caller, {{a.dO, "dO"}});
}

}  // namespace detail

// ---- forward phases (chunk_fwd.h) ----

inline void check_prep_args(const PrepArgs& a, const char* ph, PhaseStorage st) {
  const Problem& p = a.ctx.problem;
  need_all(ph, {{a.q, "q"}, {a.k, "k"}, {a.g, "g"}, {a.beta, "beta"}});
  if (p.has_A_log) need(a.A_log, ph, "A_log");
  if (p.has_dt_bias) need(a.dt_bias, ph, "dt_bias");
  need_all(ph, {{a.q_out, "q_out"}, {a.k_out, "k_out"}, {a.gcum, "gcum"}, {a.Phi, "Phi"}});
  if (p.qk_l2norm) need_all(ph, {{a.rstd_q, "rstd_q"}, {a.rstd_k, "rstd_k"}});
  if (p.op == Op::Kda)
    need(a.Aqk, ph, "Aqk");
  else
    forbid(a.Aqk, ph, "Aqk", "GDN computes P on the fly");
  need_storage(ph, st.dtype, {{a.q_out, "q_out"}, {a.k_out, "k_out"}, {a.Phi, "Phi"}});
  need_caller_storage(ph, st.caller, {{a.q, "q"}, {a.k, "k"}});
}

inline void check_wy_args(const WyArgs& a, const char* ph, PhaseStorage st) {
  need_all(ph, {{a.k, "k"}, {a.v, "v"}, {a.beta, "beta"}, {a.gcum, "gcum"}, {a.Phi, "Phi"}, {a.W, "W"}, {a.U, "U"}});
  if (a.ctx.problem.op == Op::Kda)
    need(a.kg.address(), ph, "kg");
  else
    forbid(a.kg.address(), ph, "kg", "GDN gates k inside the state kernels");
  need_storage(ph, st.dtype, {{a.k, "k"}, {a.kg, "kg"}, {a.Phi, "Phi"}, {a.W, "W"}, {a.U, "U"}});
  need_caller_storage(ph, st.caller, {{a.v, "v"}});
}

inline void check_fwd_summaries_args(const FwdSummaryArgs& a, const char* ph, PhaseStorage st) {
  detail::check_fwd_walk_args(a, ph, st);
  need_all(ph, {{a.seg_h_ext, "seg_h_ext"}, {a.seg_Mt, "seg_Mt"}});
}

// backend_dims(a, phase): the backend's own limits on the sizes (the CUDA fold's K / V tiles). It
// runs after the generic "must be >= 1" check, so a size below 1 gets the same words everywhere.
template <class BackendDims>
void check_fold_args(const FoldArgs& a, const char* ph, BackendDims&& backend_dims) {
  if (a.HV < 1 || a.K < 1 || a.V < 1)
    arg_fail(ph, "args.HV/K/V (" + std::to_string(a.HV) + ", " + std::to_string(a.K) + ", " + std::to_string(a.V) +
                     ") must be >= 1");
  backend_dims(a, ph);
  if (a.n < 0) arg_fail(ph, "args.n (" + std::to_string(a.n) + ") must be >= 0");
  if (a.n > 0) need_all(ph, {{a.A, "A"}, {a.b, "b"}});
}
inline void check_fold_args(const FoldArgs& a, const char* ph) {
  check_fold_args(a, ph, [](const FoldArgs&, const char*) {});
}

inline void check_fwd_states_args(const FwdStateArgs& a, const char* ph, PhaseStorage st) {
  detail::check_fwd_walk_args(a, ph, st);
  need_all(ph, {{a.seg_entry, "seg_entry"}, {a.h, "h"}, {a.v_new, "v_new"}});
  need_storage(ph, st.dtype, {{a.h, "h"}, {a.v_new, "v_new"}});
  // The output's own fields are checked where it runs (as fwd_output's args).
  if (a.output && (a.output->h.address() != a.h.address() || a.output->v_new.address() != a.v_new.address()))
    arg_fail(ph, "args.output->h / v_new are not this call's h / v_new (the output reads what the walk writes)");
}

inline void check_fwd_output_args(const FwdOutputArgs& a, const char* ph, PhaseStorage st) {
  need_all(ph, {{a.q, "q"}, {a.gcum, "gcum"}, {a.h, "h"}, {a.v_new, "v_new"}, {a.o, "o"}});
  if (a.ctx.problem.op == Op::Kda) {
    need(a.Aqk, ph, "Aqk");
  } else {
    need(a.k.address(), ph, "k");
    forbid(a.Aqk, ph, "Aqk", "GDN computes P on the fly");
  }
  need_storage(ph, st.dtype, {{a.q, "q"}, {a.k, "k"}, {a.h, "h"}, {a.v_new, "v_new"}});
  need_caller_storage(ph, st.caller, {{a.o, "o"}});
}

// ---- backward phases (chunk_bwd.h) ----

inline void check_bwd_local_dv_args(const BwdLocalDvArgs& a, const char* ph, PhaseStorage st) {
  if (a.ctx.problem.op == Op::Kda)
    need(a.Aqk, ph, "Aqk");
  else
    need_all(ph, {{a.q, "q"}, {a.k, "k"}, {a.gcum, "gcum"}});
  need_all(ph, {{a.dO, "dO"}, {a.dv_local, "dv_local"}});
  need_storage(ph, st.dtype, {{a.q, "q"}, {a.k, "k"}, {a.dv_local, "dv_local"}});
  need_caller_storage(ph, st.caller, {{a.dO, "dO"}});
}

inline void check_bwd_summaries_args(const BwdSummaryArgs& a, const char* ph, PhaseStorage st) {
  detail::check_bwd_walk_args(a, ph, st);
  need(a.seg_dh_ext, ph, "seg_dh_ext");
}

inline void check_bwd_states_args(const BwdStateArgs& a, const char* ph, PhaseStorage st) {
  detail::check_bwd_walk_args(a, ph, st);
  need_all(ph, {{a.seg_exit, "seg_exit"}, {a.dh, "dh"}, {a.dv2, "dv2"}});
  need_storage(ph, st.dtype, {{a.dh, "dh"}, {a.dv2, "dv2"}});
}

inline void check_bwd_grads_args(const BwdGradArgs& a, const char* ph, PhaseStorage st) {
  need_all(ph, {{a.q, "q"},
                {a.k, "k"},
                {a.v, "v"},
                {a.beta, "beta"},
                {a.gcum, "gcum"},
                {a.Phi, "Phi"},
                {a.h, "h"},
                {a.v_new, "v_new"},
                {a.dh, "dh"},
                {a.dv2, "dv2"},
                {a.dO, "dO"},
                {a.dq_hv, "dq_hv"},
                {a.dk_hv, "dk_hv"},
                {a.dv, "dv"},
                {a.dbeta, "dbeta"},
                {a.dlam, "dlam"}});
  need_storage(ph, st.dtype,
               {{a.q, "q"}, {a.k, "k"}, {a.Phi, "Phi"}, {a.h, "h"}, {a.v_new, "v_new"}, {a.dh, "dh"}, {a.dv2, "dv2"}});
  need_caller_storage(ph, st.caller, {{a.v, "v"}, {a.dO, "dO"}, {a.dv, "dv"}});
  // The finalize's own fields are checked where it runs (as bwd_finalize's args).
  if (a.finalize && (a.finalize->dq_hv != a.dq_hv || a.finalize->dk_hv != a.dk_hv || a.finalize->dlam != a.dlam))
    arg_fail(ph,
             "args.finalize->dq_hv / dk_hv / dlam are not this call's dq_hv / dk_hv / dlam (the finalize reads "
             "what the gradients write)");
}

inline void check_bwd_finalize_args(const BwdFinalizeArgs& a, const char* ph, PhaseStorage st) {
  const Problem& p = a.ctx.problem;
  need_all(ph, {{a.dq_hv, "dq_hv"}, {a.dk_hv, "dk_hv"}, {a.dlam, "dlam"}, {a.dq, "dq"}, {a.dk, "dk"}, {a.dg, "dg"}});
  if (p.qk_l2norm) need_all(ph, {{a.q, "q"}, {a.k, "k"}, {a.rstd_q, "rstd_q"}, {a.rstd_k, "rstd_k"}});
  if (p.gate != GateForm::Direct) need(a.g, ph, "g");
  if (p.has_A_log)
    need_all(ph, {{a.A_log, "A_log"}, {a.dA_log, "dA_log"}});
  else
    forbid(a.dA_log, ph, "dA_log", "problem.has_A_log is false");
  if (p.has_dt_bias)
    need_all(ph, {{a.dt_bias, "dt_bias"}, {a.ddt_bias, "ddt_bias"}});
  else
    forbid(a.ddt_bias, ph, "ddt_bias", "problem.has_dt_bias is false");
  need_storage(ph, st.dtype, {{a.q, "q"}, {a.k, "k"}});
  need_caller_storage(ph, st.caller, {{a.dq, "dq"}, {a.dk, "dk"}});
}

}  // namespace kcp::kernels
