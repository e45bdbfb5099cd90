// The kernel backend interface: one virtual method per phase of the chunked GDN / KDA forward
// and backward with segments (docs/design.md 4; docs/algorithm.md 2-4), implemented by the fp32 CPU twin
// (kernels/cpu, CpuBackend) and by the CUDA backend (kernels/cuda) with the same Args.
//
// Contract:
//  * every phase validates its Args first and throws std::invalid_argument naming the field
//    ("kcp kernels: gdn fwd_states: args.seg_entry is null"); runtime faults throw
//    std::runtime_error. Nothing is written before validation passes.
//  * phases are stateless and const: one backend object may serve several ranks (threads).
//  * pointers live in the backend's memory space (host for "cpu", device for "cuda"); layout
//    tables (LayoutView) are always host memory.
//  * the det package is bitwise reproducible run to run, and full and light saved sets give the
//    same bits (the light backward recomputes W, U, the segment summaries and entry states with
//    exactly the forward's phases; full keeps the forward's). The CPU twin is deterministic in both packages.
//  * CUDA calls are asynchronous on exec.stream; synchronize() waits.
// Life cycle (CUTLASS style): can_implement(problem) -> saved_floats / workspace_floats ->
// caller allocates and poisons -> bind_saved_for / bind_workspace_for (tensors.h) -> phases.
// core/kcp/rank_driver.h chains the phases for one rank; the KCP engine calls them directly
// around its exchanges.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/api/chunk_bwd.h"
#include "kernels/api/chunk_fwd.h"
#include "kernels/api/fold.h"
#include "kernels/api/layout.h"
#include "kernels/api/phases.h"
#include "kernels/api/problem.h"
#include "kernels/api/tensors.h"

namespace kcp::kernels {

// Times work issued between start() and stop() on one stream; elapsed_ms() waits for it.
class PhaseTimer {
 public:
  virtual ~PhaseTimer() = default;
  virtual void start(const Exec& exec) = 0;
  virtual void stop(const Exec& exec) = 0;
  virtual double elapsed_ms() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu" or "cuda".
  virtual const char* name() const = 0;
  // Whether this backend can run the problem at all (shape, options); the reason otherwise.
  // Never throws for a well-formed Problem; a malformed one gives ok = false with the
  // validate_problem message.
  virtual Status can_implement(const Problem& problem) const = 0;

  // Sizing. saved_floats / workspace_floats are what bind_saved / bind_workspace need, including
  // extra_workspace_floats() of backend-private scratch at WorkspaceTensors::scratch. The phases of
  // one workspace run one after another on its stream: a backend may keep different phases'
  // temporaries at the same scratch offsets (CUDA: KDA's qs of the backward walks at bwd_grads'
  // dAqk), so two phases must never run at once on one workspace.
  virtual int64_t extra_workspace_floats(const Problem& problem, const LayoutView& layout) const {
    (void)problem;
    (void)layout;
    return 0;
  }
  int64_t saved_floats(const Problem& problem, const LayoutView& layout, SavedKind kind) const {
    return saved_sizes(problem, layout, kind).total_floats();
  }
  int64_t workspace_floats(const Problem& problem, const LayoutView& layout, SavedKind kind) const {
    return workspace_sizes(problem, layout, kind, extra_workspace_floats(problem, layout)).total_floats();
  }
  // How this backend stores the "dtype" saved / workspace tensors (dtype_tensor.h): F32 for
  // the CPU twin, Packed16 for CUDA. Every phase refuses a DtypeTensor of another storage.
  virtual Storage dtype_storage() const = 0;
  // How this backend takes the eight caller tensors (q, k, v, dO in; o, dq, dk, dv out;
  // tensors.h): Packed16, one raw 16-bit dtype pattern per element, for CUDA and the CPU twin;
  // F32 only for the calibration's exact-storage twin (CpuStorage::Exact), which keeps every
  // dtype point in fp32. Every phase refuses a caller tensor of another storage.
  virtual Storage caller_storage() const = 0;
  // Both, for the Args checks (args_check.h).
  PhaseStorage phase_storage() const { return {dtype_storage(), caller_storage()}; }
  // bind_saved / bind_workspace (tensors.h) with this backend's storage and scratch: the way to
  // bind a saved set or a workspace that this backend's phases will read.
  SavedTensors bind_saved_for(float* arena, int64_t arena_floats, const Problem& problem, const LayoutView& layout,
                              SavedKind kind, Package package) const {
    return bind_saved(arena, arena_floats, problem, layout, kind, package, dtype_storage());
  }
  WorkspaceTensors bind_workspace_for(float* arena, int64_t arena_floats, const Problem& problem,
                                      const LayoutView& layout, SavedKind kind, Package package) const {
    return bind_workspace(arena, arena_floats, problem, layout, kind, package, extra_workspace_floats(problem, layout),
                          dtype_storage());
  }

  // ---- phases, one virtual per row of KCP_BACKEND_PHASES (phases.h), e.g.
  //   virtual void prep(const PrepArgs& args) const = 0;
  // forward: prep, wy, fwd_summaries, fold, fwd_states, fwd_output (chunk_fwd.h, fold.h);
  // backward: bwd_local_dv, bwd_summaries, bwd_states, bwd_grads, bwd_finalize (chunk_bwd.h); the
  // backward also uses wy, fwd_summaries, fold and fwd_states to recompute ----
#define KCP_DECLARE_PHASE(name, Args) virtual void name(const Args& args) const = 0;
  KCP_BACKEND_PHASES(KCP_DECLARE_PHASE)
#undef KCP_DECLARE_PHASE

  // ---- memory helpers in the backend's space (the driver saves the incoming state with them) ----
  virtual void copy_floats(float* dst, const float* src, int64_t n, const Exec& exec) const = 0;
  virtual void fill_floats(float* dst, float value, int64_t n, const Exec& exec) const = 0;
  // n 16-bit elements set to `bits` (a raw dtype pattern: the NaN poison of a Packed16 tensor).
  virtual void fill_16(uint16_t* dst, uint16_t bits, int64_t n, const Exec& exec) const = 0;
  virtual void synchronize(const Exec& exec) const { (void)exec; }

  // ---- allocations and host transfers (used by the engine outside timed regions) ----
  // alloc_floats: n floats in the backend's space (host for cpu, device for cuda), never null
  // (throws std::runtime_error on failure); free_floats(nullptr) is a no-op.
  virtual float* alloc_floats(int64_t n) const = 0;
  virtual void free_floats(float* p) const = 0;
  // Copies between host memory and the backend's space; complete when they return. The _16
  // forms copy n 16-bit elements (Packed16 tensors, allocated as ceil(n / 2) floats).
  virtual void upload(float* dst, const float* host_src, int64_t n, const Exec& exec) const = 0;
  virtual void download(float* host_dst, const float* src, int64_t n, const Exec& exec) const = 0;
  virtual void upload_16(uint16_t* dst, const uint16_t* host_src, int64_t n, const Exec& exec) const = 0;
  virtual void download_16(uint16_t* host_dst, const uint16_t* src, int64_t n, const Exec& exec) const = 0;
  // A timer of work issued on exec's stream (CUDA events on the GPU; the host clock on the CPU).
  virtual std::unique_ptr<PhaseTimer> make_timer() const = 0;
  // Human-readable device description ("cpu (2 threads)", "NVIDIA H200 (132 SMs)").
  virtual std::string device_name() const = 0;
  // Bytes of memory of the device the backend computes on, for the memory check before a run
  // (core/plan/memory_estimate.h); 0 = unknown or not a device (the CPU twin computes in host memory).
  virtual int64_t device_memory_bytes() const { return 0; }
};

}  // namespace kcp::kernels
