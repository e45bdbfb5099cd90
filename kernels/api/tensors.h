// Tensor sets of one rank: the caller's inputs and outputs, the saved set (what forward keeps for
// backward) and the workspace (scratch), as named pointers, plus their sizing and carving.
//
// Memory space: every pointer lives where the backend computes (host for the CPU twin, device
// for CUDA). Tensors documented as "fp32" hold full fp32 values (float*). Tensors documented as
// "dtype" hold values already rounded to the input dtype (bf16 or fp16), as DtypeTensor
// (dtype_tensor.h), read only through the accessor of their storage, except the KDA-only Aqk
// (float*):
//  * the eight caller tensors q, k, v, dO (inputs) and o, dq, dk, dv (outputs) are stored as
//    Backend::caller_storage(): Storage::Packed16, one raw 16-bit dtype pattern per element (2
//    bytes; CUDA and the CPU twin alike), except in the calibration's exact-storage twin
//    (CpuStorage::Exact, docs/design.md 6), which keeps them F32 like every other dtype point;
//  * the eleven saved / workspace tensors (saved q, k, Phi; W, U, kg, h, v_new, dv_local, dh, dv2) are
//    stored as Backend::dtype_storage() (F32 for the CPU twin, Packed16 for CUDA).
// All layouts are row-major, token-major ("BTHD"), with the shapes given beside each field;
// T = layout.T, NT = layout.n_chunks, S = layout.n_segments, N = layout.n_pieces,
// gw = problem.gate_width() (1 for GDN, K for KDA), C = 64.
//
// Saved set and workspace are carved from one caller-owned float arena each (bind_saved,
// bind_workspace). Every tensor starts on a 64-float (256-byte) boundary. The tag (package,
// op, saved kind, fingerprint of problem + layout) travels with the saved set and the
// workspace (a workspace is sized for one saved kind: light's holds what full's saved set keeps); check_saved_set /
// check_workspace refuse a mismatch before any tensor is read, naming both sides (docs/design.md 5).
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/api/dtype_tensor.h"
#include "kernels/api/layout.h"
#include "kernels/api/problem.h"

namespace kcp::kernels {

// ---------------------------------------------------------------------------------------------
// Caller tensors. q, k, v, dO arrive as dtype tensors in Backend::caller_storage() (16-bit
// patterns); gates, A_log, dt_bias and beta as floats (any fp32 value; the harness rounds them
// to the dtype too). o, dq, dk, dv leave as dtype tensors in the same storage. The backward
// reads the same inputs again (v, beta, g, A_log, dt_bias, h0): they must be unchanged since
// the forward.
struct InputTensors {
  ConstDtypeTensor q;              // [T, H, K] dtype
  ConstDtypeTensor k;              // [T, H, K] dtype
  ConstDtypeTensor v;              // [T, HV, V] dtype
  const float* g = nullptr;        // GDN [T, HV], KDA [T, HV, K]: direct log-decay or raw gate
  const float* beta = nullptr;     // [T, HV]
  const float* A_log = nullptr;    // [HV]            (problem.has_A_log)
  const float* dt_bias = nullptr;  // GDN [HV], KDA [HV, K] (problem.has_dt_bias)
  const float* h0 = nullptr;       // [N, HV, K, V] fp32, read for pieces with starts_sequence
                                   // (problem.has_h0)
  ConstDtypeTensor dO;             // [T, HV, V] dtype, backward only
  const float* dht = nullptr;      // [N, HV, K, V] fp32, backward only, read for pieces with
                                   // ends_sequence (problem.has_dht)
};

struct OutputTensors {
  DtypeTensor o;        // [T, HV, V] dtype
  float* ht = nullptr;  // [N, HV, K, V] fp32, state at every piece end (meaningful as
                        // a final state for pieces with ends_sequence); may be null
};

struct GradTensors {
  DtypeTensor dq;             // [T, H, K] dtype (summed over the G value heads of a group)
  DtypeTensor dk;             // [T, H, K] dtype
  DtypeTensor dv;             // [T, HV, V] dtype
  float* dg = nullptr;        // shape of g, fp32 (gradient w.r.t. the gate input as given)
  float* dbeta = nullptr;     // [T, HV] fp32
  float* dA_log = nullptr;    // [HV] fp32, this rank's partial sum (engine all-reduces)
  float* ddt_bias = nullptr;  // GDN [HV], KDA [HV, K] fp32, this rank's partial sum
  float* dh0 = nullptr;       // [N, HV, K, V] fp32: gradient w.r.t. every piece's entry
                              // state (dh0 proper for pieces with starts_sequence); may be null
};

// ---------------------------------------------------------------------------------------------
// Saved set and workspace.
struct SavedTag {
  Package package = Package::Det;
  Op op = Op::Gdn;
  SavedKind kind = SavedKind::Full;
  uint64_t fingerprint = 0;  // layout_fingerprint(problem, layout)
};

struct SavedTensors {
  SavedTag tag;
  DtypeTensor q;               // [T, H, K] dtype: q after prep (L2-normalized when qk_l2norm)
  DtypeTensor k;               // [T, H, K] dtype: k after prep
  float* rstd_q = nullptr;     // [T, H] fp32 (qk_l2norm only, else null)
  float* rstd_k = nullptr;     // [T, H] fp32 (qk_l2norm only, else null)
  float* gcum = nullptr;       // [T, HV, gw] fp32: chunk-local inclusive cumsum of a, log2 units
  DtypeTensor Phi;             // [T, HV, C] dtype: row r of (I + Pi)^-1 of its chunk, column
                               // s local to the chunk (zero for s > r and s >= chunk length)
  float* Aqk = nullptr;        // [T, HV, C] dtype, KDA only: scale * masked gated q k^T
  float* incoming = nullptr;   // [HV, K, V] fp32: entry state of piece 0 when it continues
                               // from earlier ranks (zeros otherwise)
  float* seg_Mt = nullptr;     // [S, HV, K, K] fp32, full only: M_seg^T (transfer planes)
  float* seg_entry = nullptr;  // [S, HV, K, V] fp32, full only: segment entry states
  DtypeTensor W;               // [T, HV, K] dtype, full only: the forward's WY factors (the
  DtypeTensor U;               // [T, HV, V]  workspace's W, U, kg in light), which the backward
  DtypeTensor kg;              // [T, HV, K]  reads instead of recomputing them; kg KDA only
};

struct WorkspaceTensors {
  Package package = Package::Det;
  SavedKind kind = SavedKind::Full;  // the saved kind it was sized for
  uint64_t fingerprint = 0;
  DtypeTensor W;                // [T, HV, K] dtype, light only: Phi diag(beta) (K o gam)
  DtypeTensor U;                // [T, HV, V] dtype, light only: Phi diag(beta) V
  DtypeTensor kg;               // [T, HV, K] dtype, KDA light only: k o exp(lambda_last - lambda)
  float* seg_h_ext = nullptr;   // [S, HV, K, V] fp32: segment h_ext from a zero state
  float* seg_Mt = nullptr;      // [S, HV, K, K] fp32, light only: M_seg^T
  float* seg_entry = nullptr;   // [S, HV, K, V] fp32, light only: segment entry states
  DtypeTensor h;                // [NT, HV, K, V] dtype: state at every chunk start
  DtypeTensor v_new;            // [T, HV, V] dtype: U - W S
  DtypeTensor dv_local;         // [T, HV, V] dtype: P^T dO (intra-chunk part of dv_new)
  float* seg_dh_ext = nullptr;  // [S, HV, K, V] fp32: segment dh_ext from a zero exit gradient
  float* seg_exit = nullptr;    // [S, HV, K, V] fp32: exit gradient of every segment
  DtypeTensor dh;               // [NT, HV, K, V] dtype: gradient w.r.t. every chunk-end state
  DtypeTensor dv2;              // [T, HV, V] dtype: full gradient w.r.t. v_new
  float* dq_hv = nullptr;       // [T, HV, K] fp32: dq per value head, before GVA / L2 bwd
  float* dk_hv = nullptr;       // [T, HV, K] fp32
  float* dlam = nullptr;        // [T, HV, gw] fp32: gradient w.r.t. the natural-log cumsum
  float* scratch = nullptr;     // backend-private floats (Backend::extra_workspace_floats)
  int64_t scratch_floats = 0;
};

inline constexpr int64_t kTensorAlignFloats = 64;
inline int64_t align_floats(int64_t n) {
  return (n + kTensorAlignFloats - 1) / kTensorAlignFloats * kTensorAlignFloats;
}

// Element counts of every saved / workspace tensor (0 = absent for this problem / kind).
struct SavedSizes {
  int64_t q = 0, k = 0, rstd_q = 0, rstd_k = 0, gcum = 0, Phi = 0, Aqk = 0, incoming = 0, seg_Mt = 0, seg_entry = 0,
          W = 0, U = 0, kg = 0;
  int64_t total_floats() const {
    return align_floats(q) + align_floats(k) + align_floats(rstd_q) + align_floats(rstd_k) + align_floats(gcum) +
           align_floats(Phi) + align_floats(Aqk) + align_floats(incoming) + align_floats(seg_Mt) +
           align_floats(seg_entry) + align_floats(W) + align_floats(U) + align_floats(kg);
  }
};
struct WorkspaceSizes {
  int64_t W = 0, U = 0, kg = 0, seg_h_ext = 0, seg_Mt = 0, seg_entry = 0, h = 0, v_new = 0, dv_local = 0,
          seg_dh_ext = 0, seg_exit = 0, dh = 0, dv2 = 0, dq_hv = 0, dk_hv = 0, dlam = 0, scratch = 0;
  int64_t total_floats() const {
    return align_floats(W) + align_floats(U) + align_floats(kg) + align_floats(seg_h_ext) + align_floats(seg_Mt) +
           align_floats(seg_entry) + align_floats(h) + align_floats(v_new) + align_floats(dv_local) +
           align_floats(seg_dh_ext) + align_floats(seg_exit) + align_floats(dh) + align_floats(dv2) +
           align_floats(dq_hv) + align_floats(dk_hv) + align_floats(dlam) + align_floats(scratch);
  }
};

inline SavedSizes saved_sizes(const Problem& p, const LayoutView& L, SavedKind kind) {
  SavedSizes s;
  const int64_t T = L.T, S = L.n_segments;
  s.q = s.k = T * p.H * p.K;
  if (p.qk_l2norm) s.rstd_q = s.rstd_k = T * p.H;
  s.gcum = T * p.HV * p.gate_width();
  s.Phi = T * p.HV * p.chunk;
  if (p.op == Op::Kda) s.Aqk = T * p.HV * p.chunk;
  s.incoming = int64_t(p.HV) * p.K * p.V;
  if (kind == SavedKind::Full) {
    s.seg_Mt = S * p.HV * p.K * p.K;
    s.seg_entry = S * p.HV * p.K * p.V;
    s.W = T * p.HV * p.K;
    s.U = T * p.HV * p.V;
    if (p.op == Op::Kda) s.kg = T * p.HV * p.K;
  }
  return s;
}

// The workspace of a run with the given saved kind: W, U, kg, seg_Mt and seg_entry only for light
// (a full saved set keeps them).
inline WorkspaceSizes workspace_sizes(const Problem& p, const LayoutView& L, SavedKind kind, int64_t extra_floats = 0) {
  WorkspaceSizes w;
  const int64_t T = L.T, S = L.n_segments, NT = L.n_chunks;
  const int64_t HV = p.HV, K = p.K, V = p.V;
  if (kind == SavedKind::Light) {
    w.W = T * HV * K;
    w.U = T * HV * V;
    if (p.op == Op::Kda) w.kg = T * HV * K;
    w.seg_Mt = S * HV * K * K;
    w.seg_entry = S * HV * K * V;
  }
  w.seg_h_ext = S * HV * K * V;
  w.h = NT * HV * K * V;
  w.v_new = T * HV * V;
  w.dv_local = T * HV * V;
  w.seg_dh_ext = S * HV * K * V;
  w.seg_exit = S * HV * K * V;
  w.dh = NT * HV * K * V;
  w.dv2 = T * HV * V;
  w.dq_hv = T * HV * K;
  w.dk_hv = T * HV * K;
  w.dlam = T * HV * p.gate_width();
  w.scratch = extra_floats;
  return w;
}

// FNV-1a over the problem fields and the layout tables: identifies "the same plan" for tags.
inline uint64_t layout_fingerprint(const Problem& p, const LayoutView& L) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* data, size_t n) {
    const unsigned char* b = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 1099511628211ull;
    }
  };
  const int32_t ints[] = {
      int32_t(p.op),    p.H,         p.HV,        p.K,           p.V,      p.chunk,  int32_t(p.gate),
      int32_t(p.dtype), p.qk_l2norm, p.has_A_log, p.has_dt_bias, p.has_h0, p.has_dht};
  mix(ints, sizeof(ints));
  mix(&p.scale, sizeof(float));
  mix(&p.lower_bound, sizeof(float));
  mix(&L.T, sizeof(L.T));
  for (int32_t i = 0; i < L.n_pieces; ++i) {
    const PieceDesc& d = L.pieces[i];
    const int64_t f[] = {d.begin, d.end, d.starts_sequence, d.ends_sequence};
    mix(f, sizeof(f));
  }
  for (int32_t i = 0; i < L.n_segments; ++i) {
    const SegmentDesc& d = L.segments[i];
    const int64_t f[] = {d.piece, d.begin, d.end};
    mix(f, sizeof(f));
  }
  return h;
}

namespace detail {
// Arenas start on a 16-byte boundary: the tensors are carved at 256-byte offsets from it, and the
// CUDA kernels read them with 16-byte vector loads.
inline void check_arena(const float* arena, const char* who) {
  if (!arena) throw std::invalid_argument(std::string("kcp kernels: ") + who + ": arena is null");
  if (reinterpret_cast<uintptr_t>(arena) % 16 != 0)
    throw std::invalid_argument(std::string("kcp kernels: ") + who + ": arena is not 16-byte aligned");
}
inline float* carve(float*& cur, int64_t n) {
  if (n == 0) return nullptr;
  float* r = cur;
  cur += align_floats(n);
  return r;
}
// A "dtype" tensor: the same float region as carve() (so sizes do not depend on the storage),
// tagged with the storage the binding backend writes; Packed16 uses the region's first half.
inline DtypeTensor carve_dtype(float*& cur, int64_t n, Storage storage) { return DtypeTensor(carve(cur, n), storage); }
}  // namespace detail

// Carves a float arena of at least saved_sizes(p, L, kind).total_floats() floats. Throws
// std::invalid_argument when the arena is null, not 16-byte aligned or too small. dtype_storage:
// how the backend that will run the phases stores the "dtype" tensors (Backend::dtype_storage();
// Backend::bind_saved_for passes it). The default, F32, is the CPU twin's.
inline SavedTensors bind_saved(float* arena, int64_t arena_floats, const Problem& p, const LayoutView& L,
                               SavedKind kind, Package package, Storage dtype_storage = Storage::F32) {
  const SavedSizes s = saved_sizes(p, L, kind);
  detail::check_arena(arena, "bind_saved");
  if (arena_floats < s.total_floats())
    throw std::invalid_argument("kcp kernels: bind_saved: arena holds " + std::to_string(arena_floats) +
                                " floats, the " + to_string(kind) + " saved set needs " +
                                std::to_string(s.total_floats()));
  SavedTensors t;
  t.tag = {package, p.op, kind, layout_fingerprint(p, L)};
  float* c = arena;
  t.q = detail::carve_dtype(c, s.q, dtype_storage);
  t.k = detail::carve_dtype(c, s.k, dtype_storage);
  t.rstd_q = detail::carve(c, s.rstd_q);
  t.rstd_k = detail::carve(c, s.rstd_k);
  t.gcum = detail::carve(c, s.gcum);
  t.Phi = detail::carve_dtype(c, s.Phi, dtype_storage);
  t.Aqk = detail::carve(c, s.Aqk);
  t.incoming = detail::carve(c, s.incoming);
  t.seg_Mt = detail::carve(c, s.seg_Mt);
  t.seg_entry = detail::carve(c, s.seg_entry);
  t.W = detail::carve_dtype(c, s.W, dtype_storage);
  t.U = detail::carve_dtype(c, s.U, dtype_storage);
  t.kg = detail::carve_dtype(c, s.kg, dtype_storage);
  return t;
}

inline WorkspaceTensors bind_workspace(float* arena, int64_t arena_floats, const Problem& p, const LayoutView& L,
                                       SavedKind kind, Package package, int64_t extra_floats = 0,
                                       Storage dtype_storage = Storage::F32) {
  const WorkspaceSizes s = workspace_sizes(p, L, kind, extra_floats);
  detail::check_arena(arena, "bind_workspace");
  if (arena_floats < s.total_floats())
    throw std::invalid_argument("kcp kernels: bind_workspace: arena holds " + std::to_string(arena_floats) +
                                " floats, the workspace of a " + to_string(kind) + " run needs " +
                                std::to_string(s.total_floats()));
  WorkspaceTensors t;
  t.package = package;
  t.kind = kind;
  t.fingerprint = layout_fingerprint(p, L);
  float* c = arena;
  t.W = detail::carve_dtype(c, s.W, dtype_storage);
  t.U = detail::carve_dtype(c, s.U, dtype_storage);
  t.kg = detail::carve_dtype(c, s.kg, dtype_storage);
  t.seg_h_ext = detail::carve(c, s.seg_h_ext);
  t.seg_Mt = detail::carve(c, s.seg_Mt);
  t.seg_entry = detail::carve(c, s.seg_entry);
  t.h = detail::carve_dtype(c, s.h, dtype_storage);
  t.v_new = detail::carve_dtype(c, s.v_new, dtype_storage);
  t.dv_local = detail::carve_dtype(c, s.dv_local, dtype_storage);
  t.seg_dh_ext = detail::carve(c, s.seg_dh_ext);
  t.seg_exit = detail::carve(c, s.seg_exit);
  t.dh = detail::carve_dtype(c, s.dh, dtype_storage);
  t.dv2 = detail::carve_dtype(c, s.dv2, dtype_storage);
  t.dq_hv = detail::carve(c, s.dq_hv);
  t.dk_hv = detail::carve(c, s.dk_hv);
  t.dlam = detail::carve(c, s.dlam);
  t.scratch = detail::carve(c, s.scratch);
  t.scratch_floats = s.scratch;
  return t;
}

// Refuses a saved set from another package / operator / plan, or of another kind than the
// caller expects, before any tensor is read. The message names both sides.
inline void check_saved_set(const SavedTag& have, Package want_package, Op want_op, uint64_t want_fingerprint) {
  if (have.package != want_package)
    throw std::invalid_argument(std::string("kcp kernels: saved set from the ") + to_string(have.package) +
                                " package (deterministic=" + (have.package == Package::Det ? "true" : "false") +
                                ") passed to the " + to_string(want_package) + " backward; run it through the " +
                                to_string(have.package) + " backward");
  if (have.op != want_op)
    throw std::invalid_argument(std::string("kcp kernels: saved set of operator ") + to_string(have.op) +
                                " passed to the " + to_string(want_op) + " backward");
  if (have.fingerprint != want_fingerprint)
    throw std::invalid_argument("kcp kernels: saved set was made for another problem/layout (fingerprint " +
                                std::to_string(have.fingerprint) + ", this backward has " +
                                std::to_string(want_fingerprint) + ")");
}
inline void check_workspace(const WorkspaceTensors& ws, Package want_package, SavedKind want_kind,
                            uint64_t want_fingerprint) {
  if (ws.package != want_package)
    throw std::invalid_argument(std::string("kcp kernels: workspace of the ") + to_string(ws.package) +
                                " package passed to the " + to_string(want_package) + " package");
  if (ws.kind != want_kind)
    throw std::invalid_argument(std::string("kcp kernels: workspace sized for a ") + to_string(ws.kind) +
                                " saved set passed to a " + to_string(want_kind) + " run");
  if (ws.fingerprint != want_fingerprint)
    throw std::invalid_argument("kcp kernels: workspace was sized for another problem/layout (fingerprint " +
                                std::to_string(ws.fingerprint) + ", expected " + std::to_string(want_fingerprint) +
                                ")");
}

}  // namespace kcp::kernels
