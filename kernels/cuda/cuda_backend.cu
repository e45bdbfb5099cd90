// CudaBackend: the kernels/api/backend.h interface on an NVIDIA GPU, GDN and KDA, head dims K
// and V each 64 or 128 (the pairs of SupportedHeadDims, dispatch.h), bf16 / fp16. Host code: Args
// checks (kernels/api/args_check.h, shared with the CPU twin), the device copies of the layout
// tables, dispatch to the launchers of cuda_launch.h by problem.op (GDN: gdn_*.cu, tensor-core
// kernels tuned in docs/perf-notes.md; KDA: kda_*.cu, a first plain fp32 port of the twin,
// correct first, see kda_common.cuh; fold and the q/k parts of prep and finalize are shared),
// memory helpers and timers.
//
// Layout tables arrive in host memory (LayoutView). They are uploaded once per distinct layout
// into a device buffer owned by the backend (a small cache keyed by the table contents, guarded
// by a mutex because one backend may serve several rank threads), so a phase call does no
// transfer and never synchronises.
// Determinism: every kernel reduces in a fixed order (no atomics), so the det and nondet
// packages run the same kernels and both are bitwise reproducible; full and light saved sets
// give the same bits because the light backward recomputes what full keeps with the same kernels.
//
// 16-bit storage (measured in docs/perf-notes.md). dtype_storage() is Storage::Packed16: the
// "dtype" tensors of the saved set and the workspace (DtypeTensor, kernels/api/dtype_tensor.h)
// are stored as raw 16-bit dtype values (bf16 or fp16, the problem's dtype), element e at byte
// 2 e of the tensor's region, i.e. in the first half of the floats that kernels/api/tensors.h
// carves for it; Backend::bind_saved_for / bind_workspace_for tag them so, and every phase
// refuses one tagged otherwise (args_check.h). The launchers take them with packed16():
//   saved q, k  [T, H, K]        written by prep; read by every later phase
//   saved Phi   [T, HV, 64]      written by prep; read by wy and bwd_grads
//   W, U        [T, HV, K|V]     written by wy; read by the state walks
//   kg          [T, HV, K]       KDA: written by wy; read by the state walks
//   h, dh       [NT, HV, K, V]   written by fwd_states / bwd_states; read by fwd_output, bwd_grads
//   v_new, dv2  [T, HV, V]       written by fwd_states / bwd_states; read by fwd_output, bwd_grads
//   dv_local    [T, HV, V]       written by bwd_local_dv; read by the backward walks
// and bwd_grads passes dW [T, HV, K] in 16-bit storage between its kernels through the backend's
// scratch (extra_workspace_floats; KDA also dAqk and dAkk, fp32, and the backward walks' qs,
// 16-bit). The KDA-only Aqk is a float* holding dtype values, as tensors.h says. The values were
// already rounded to the dtype before they were stored, so the conversion is exact and every
// output is the same as with fp32 storage. caller_storage() is Packed16 too (tensors.h): the
// kernels read q, k (prep), v (wy, bwd_grads) and dO (bwd_local_dv, the backward walks,
// bwd_grads) as 16-bit patterns and write o (fwd_output), dv (bwd_grads), dq and dk
// (bwd_finalize) as 16-bit patterns, rounded at the same points as before (a 16-bit store of the
// value that was rounded to dtype and stored as a float). Every other tensor (g, beta, h0, dht,
// ht, dg, dbeta, dA_log, ddt_bias, dh0, rstd, gcum, incoming, dq_hv / dk_hv / dlam, the fp32
// seg_* tensors) is float as tensors.h says. A caller that reads a 16-bit tensor back takes
// packed16() and converts (tests/kcp/twin_harness.h, unpack16; core/kcp/device_array.h,
// DtypeArray); one that supplies them packs.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/api/args_check.h"
#include "kernels/cuda/cuda_launch.h"
#include "kernels/cuda/dispatch.h"

namespace kcp::kernels {

namespace cuda {

void raise_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  (void)cudaGetLastError();  // clear the sticky error of a failed runtime call
  const char* f = std::strstr(file, "kernels/cuda/");
  throw std::runtime_error(std::string("CUDA ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ") at " +
                           (f ? f : file) + ":" + std::to_string(line) + " in '" + expr + "'");
}

}  // namespace cuda

namespace {

using cuda::DevLayout;

Status support(const Problem& p) {
  try {
    validate_problem(p);
  } catch (const std::invalid_argument& e) {
    return Status::fail(e.what());
  }
  if (!cuda::SupportedHeadDims::contains(p.K, p.V))
    return Status::fail("unsupported head dims K=" + std::to_string(p.K) + ", V=" + std::to_string(p.V) +
                        " on CUDA (supported (K, V): " + cuda::SupportedHeadDims::text() + ")");
  return Status::success();
}

// The context check of every phase: the shared one (args_check.h), then what CUDA cannot run
// (after it, ctx.problem is GDN or KDA with (K, V) in SupportedHeadDims).
void check_ctx(const PhaseCtx& c, const char* phase) {
  check_problem_layout(c, phase);
  const Status st = support(c.problem);
  if (!st.ok) arg_fail(phase, st.reason);
}

// The phase's name in messages: "gdn prep" or "kda prep".
std::string phase_name(const PhaseCtx& c, const char* phase) {
  return std::string(c.problem.op == Op::Kda ? "kda " : "gdn ") + phase;
}

bool same(const PieceDesc& a, const PieceDesc& b) {
  return a.begin == b.begin && a.end == b.end && a.chunk_begin == b.chunk_begin && a.n_chunks == b.n_chunks &&
         a.seg_begin == b.seg_begin && a.seg_end == b.seg_end && a.starts_sequence == b.starts_sequence &&
         a.ends_sequence == b.ends_sequence;
}
bool same(const SegmentDesc& a, const SegmentDesc& b) {
  return a.piece == b.piece && a.index_in_piece == b.index_in_piece && a.begin == b.begin && a.end == b.end &&
         a.chunk_begin == b.chunk_begin && a.chunk_end == b.chunk_end;
}
bool same(const ChunkDesc& a, const ChunkDesc& b) {
  return a.begin == b.begin && a.len == b.len && a.segment == b.segment && a.piece == b.piece &&
         a.index_in_piece == b.index_in_piece;
}
template <class T>
bool same_table(const std::vector<T>& v, const T* p, int64_t n) {
  if (int64_t(v.size()) != n) return false;
  for (int64_t i = 0; i < n; ++i)
    if (!same(v[size_t(i)], p[i])) return false;
  return true;
}

class CudaTimer final : public PhaseTimer {
 public:
  explicit CudaTimer(int device) : device_(device) {
    KCP_CUDA_CHECK(cudaSetDevice(device_));
    KCP_CUDA_CHECK(cudaEventCreate(&e0_));
    KCP_CUDA_CHECK(cudaEventCreate(&e1_));
  }
  ~CudaTimer() override {
    cudaEventDestroy(e0_);  // no-throw in destructors
    cudaEventDestroy(e1_);
  }
  void start(const Exec& ex) override { KCP_CUDA_CHECK(cudaEventRecord(e0_, static_cast<cudaStream_t>(ex.stream))); }
  void stop(const Exec& ex) override { KCP_CUDA_CHECK(cudaEventRecord(e1_, static_cast<cudaStream_t>(ex.stream))); }
  double elapsed_ms() override {
    KCP_CUDA_CHECK(cudaEventSynchronize(e1_));
    float ms = 0.0f;
    KCP_CUDA_CHECK(cudaEventElapsedTime(&ms, e0_, e1_));
    return ms;
  }

 private:
  int device_;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    KCP_CUDA_CHECK(cudaSetDevice(device_));
    cudaDeviceProp prop{};
    KCP_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    name_ = std::string(prop.name) + " (" + std::to_string(prop.multiProcessorCount) + " SMs, sm_" +
            std::to_string(prop.major) + std::to_string(prop.minor) + ")";
    if (prop.major < 8)
      throw std::runtime_error("kcp kernels: CUDA device " + std::to_string(device_) + " (" + name_ +
                               ") is older than sm_80; the kernels need bf16 tensor cores");
  }
  ~CudaBackend() override {
    for (auto& e : cache_) cudaFree(e.dev);
  }

  const char* name() const override { return "cuda"; }
  Status can_implement(const Problem& problem) const override { return support(problem); }
  // The "dtype" saved / workspace tensors and the eight caller tensors are raw 16-bit dtype
  // values (see the top).
  static constexpr PhaseStorage kStorage{Storage::Packed16, Storage::Packed16};
  Storage dtype_storage() const override { return kStorage.dtype; }
  Storage caller_storage() const override { return kStorage.caller; }

  // Scratch (backend-private workspace floats, each part 256-byte aligned):
  //   [NT, HV, 2] fp32   per-chunk gate partials of finalize;
  //   [T, HV] fp32       dlam_hi (K > 64): the second K slice's gate part, written by
  //                      gdn_bwd_dqk_kernel and added by gdn_bwd_wy_kernel;
  //   [T, HV, K] 16-bit  dW between the two bwd_grads kernels.
  // dW has its own scratch rather than passing through the dv output (since dv is 16-bit too, a
  // block's dv rows are where its own dW rows would lie; a possible saving, not measured).
  struct ScratchParts {
    int64_t partials = 0, dlam_hi = 0, dW16 = 0, total = 0;  // offsets in floats; total size
  };
  static ScratchParts scratch_parts(const Problem& p, const LayoutView& l) {
    ScratchParts s;
    s.dlam_hi = align_floats(l.n_chunks * int64_t(p.HV) * 2);
    s.dW16 = s.dlam_hi + align_floats(p.K > 64 ? l.T * int64_t(p.HV) : 0);
    s.total = s.dW16 + align_floats((l.T * int64_t(p.HV) * p.K + 1) / 2);
    return s;
  }
  // KDA scratch (each part 256-byte aligned):
  //   [NT, HV, K + 1] fp32   per-chunk gate partials of finalize (ddt_bias per channel, dA_log);
  //   [T, HV, K] 16-bit      dW between the bwd_grads kernels;
  //   [T, HV, 64] fp32 x 2   dAqk and dAkk between the bwd_grads kernels;
  //   [T, HV, K] 16-bit      qs (kda_qs.cu) inside a backward walk phase (bwd_summaries,
  //                          bwd_states; the wgmma walk), at dAqk's offset: T HV K / 2 <= T HV 64
  //                          floats (K <= 128), and no phase needs both (dAqk lives inside
  //                          bwd_grads only, qs inside one walk phase only).
  struct KdaScratchParts {
    int64_t partials = 0, dW16 = 0, dAqk = 0, dAkk = 0, qs = 0, total = 0;  // offsets in floats; total size
  };
  static KdaScratchParts kda_scratch_parts(const Problem& p, const LayoutView& l) {
    static_assert(cuda::SupportedHeadDims::max_k() <= 2 * kChunk, "qs [T, HV, K] 16-bit fits dAqk's floats");
    KdaScratchParts s;
    const int64_t T = l.T, HV = p.HV;
    s.dW16 = align_floats(l.n_chunks * HV * (p.K + 1));
    s.dAqk = s.dW16 + align_floats((T * HV * p.K + 1) / 2);
    s.dAkk = s.dAqk + align_floats(T * HV * kChunk);
    s.total = s.dAkk + align_floats(T * HV * kChunk);
    s.qs = s.dAqk;
    return s;
  }
  // KDA's backward walks: qs in the scratch (bound: the phase refuses a missing one).
  uint16_t* kda_qs(const PhaseCtx& c, const char* ph) const {
    need_scratch(c, ph);
    return reinterpret_cast<uint16_t*>(c.scratch + kda_scratch_parts(c.problem, c.layout).qs);  // 16-bit storage
  }
  int64_t extra_workspace_floats(const Problem& problem, const LayoutView& layout) const override {
    return problem.op == Op::Kda ? kda_scratch_parts(problem, layout).total : scratch_parts(problem, layout).total;
  }
  // The scratch this phase reads or writes must have been bound (Backend::bind_workspace_for).
  void need_scratch(const PhaseCtx& c, const char* ph) const {
    const int64_t want = extra_workspace_floats(c.problem, c.layout);
    if (want > 0 && (!c.scratch || c.scratch_floats < want))
      arg_fail(ph, "ctx.scratch holds " + std::to_string(c.scratch_floats) + " floats, the backend needs " +
                       std::to_string(want) + " (bind the workspace with Backend::bind_workspace_for)");
  }

  // Runs the phase's launcher of the problem's operator (gdn_*.cu or kda_*.cu).
  template <class Args>
  void by_op(const Args& a, void (*gdn)(const Args&, const DevLayout&, cudaStream_t),
             void (*kda)(const Args&, const DevLayout&, cudaStream_t)) const {
    (a.ctx.problem.op == Op::Kda ? kda : gdn)(a, layout(a.ctx), stream(a.ctx.exec));
  }

  void prep(const PrepArgs& a) const override {
    const std::string name = phase_name(a.ctx, "prep");
    const char* ph = name.c_str();
    check_ctx(a.ctx, ph);
    check_prep_args(a, ph, kStorage);
    by_op(a, cuda::launch_prep, cuda::launch_kda_prep);
  }

  void wy(const WyArgs& a) const override {
    const std::string name = phase_name(a.ctx, "wy");
    const char* ph = name.c_str();
    check_ctx(a.ctx, ph);
    check_wy_args(a, ph, kStorage);
    by_op(a, cuda::launch_wy, cuda::launch_kda_wy);
  }

  void fwd_summaries(const FwdSummaryArgs& a) const override {
    const std::string name = phase_name(a.ctx, "fwd_summaries");
    const char* ph = name.c_str();
    check_ctx(a.ctx, ph);
    check_fwd_summaries_args(a, ph, kStorage);
    by_op(a, cuda::launch_fwd_summaries, cuda::launch_kda_fwd_summaries);
  }

  void fold(const FoldArgs& a) const override {
    check_fold_args(a, "fold", [](const FoldArgs& f, const char* ph) {
      if (f.K % 32 != 0 || f.V % 32 != 0 || f.K > 128)
        arg_fail(ph, "args.K/V (" + std::to_string(f.K) + ", " + std::to_string(f.V) +
                         ") unsupported on CUDA (multiples of 32, K <= 128)");
    });
    bind();
    cuda::launch_fold(a, stream(a.exec));
  }

  void fwd_states(const FwdStateArgs& a) const override {
    const std::string name = phase_name(a.ctx, "fwd_states");
    const char* ph = name.c_str();
    check_ctx(a.ctx, ph);
    check_fwd_states_args(a, ph, kStorage);
    if (a.output) {  // GDN on the Hopper walk: the output formed in the walk; else the phases in turn
      const std::string oname = phase_name(a.output->ctx, "fwd_output");
      check_ctx(a.output->ctx, oname.c_str());
      check_fwd_output_args(*a.output, oname.c_str(), kStorage);
      if (a.ctx.problem.op == Op::Gdn && cuda::launch_fwd_states_output(a, layout(a.ctx), stream(a.ctx.exec))) return;
    }
    by_op(a, cuda::launch_fwd_states, cuda::launch_kda_fwd_states);
    if (a.output) by_op(*a.output, cuda::launch_fwd_output, cuda::launch_kda_fwd_output);  // checked above
  }

  void fwd_output(const FwdOutputArgs& a) const override {
    const std::string name = phase_name(a.ctx, "fwd_output");
    const char* ph = name.c_str();
    check_ctx(a.ctx, ph);
    check_fwd_output_args(a, ph, kStorage);
    by_op(a, cuda::launch_fwd_output, cuda::launch_kda_fwd_output);
  }

  void bwd_local_dv(const BwdLocalDvArgs& a) const override {
    const std::string name = phase_name(a.ctx, "bwd_local_dv");
    const char* ph = name.c_str();
    check_ctx(a.ctx, ph);
    check_bwd_local_dv_args(a, ph, kStorage);
    by_op(a, cuda::launch_bwd_local_dv, cuda::launch_kda_bwd_local_dv);
  }

  void bwd_summaries(const BwdSummaryArgs& a) const override {
    const std::string name = phase_name(a.ctx, "bwd_summaries");
    const char* ph = name.c_str();
    check_ctx(a.ctx, ph);
    check_bwd_summaries_args(a, ph, kStorage);
    if (a.ctx.problem.op == Op::Kda)
      cuda::launch_kda_bwd_summaries(a, layout(a.ctx), kda_qs(a.ctx, ph), stream(a.ctx.exec));
    else
      cuda::launch_bwd_summaries(a, layout(a.ctx), stream(a.ctx.exec));
  }

  void bwd_states(const BwdStateArgs& a) const override {
    const std::string name = phase_name(a.ctx, "bwd_states");
    const char* ph = name.c_str();
    check_ctx(a.ctx, ph);
    check_bwd_states_args(a, ph, kStorage);
    if (a.ctx.problem.op == Op::Kda)
      cuda::launch_kda_bwd_states(a, layout(a.ctx), kda_qs(a.ctx, ph), stream(a.ctx.exec));
    else
      cuda::launch_bwd_states(a, layout(a.ctx), stream(a.ctx.exec));
  }

  void bwd_grads(const BwdGradArgs& a) const override {
    const std::string name = phase_name(a.ctx, "bwd_grads");
    const char* ph = name.c_str();
    check_ctx(a.ctx, ph);
    check_bwd_grads_args(a, ph, kStorage);
    need_scratch(a.ctx, ph);
    if (a.finalize) {  // the finalize in the same call: GDN's B5 may finalize dk on chip
      const std::string fname = phase_name(a.finalize->ctx, "bwd_finalize");
      check_ctx(a.finalize->ctx, fname.c_str());
      check_bwd_finalize_args(*a.finalize, fname.c_str(), kStorage);
      need_scratch(a.finalize->ctx, fname.c_str());
    }
    if (a.ctx.problem.op == Op::Kda) {
      const KdaScratchParts kp = kda_scratch_parts(a.ctx.problem, a.ctx.layout);
      cuda::KdaGradScratch ks;
      ks.dW16 = reinterpret_cast<uint16_t*>(a.ctx.scratch + kp.dW16);  // 16-bit storage in scratch
      ks.dAqk = a.ctx.scratch + kp.dAqk;
      ks.dAkk = a.ctx.scratch + kp.dAkk;
      cuda::launch_kda_bwd_grads(a, layout(a.ctx), ks, stream(a.ctx.exec));
      if (a.finalize) finalize(*a.finalize, false);  // checked above
      return;
    }
    const ScratchParts sp = scratch_parts(a.ctx.problem, a.ctx.layout);
    float* dlam_hi = a.ctx.problem.K > 64 ? a.ctx.scratch + sp.dlam_hi : nullptr;
    uint16_t* dW16 = reinterpret_cast<uint16_t*>(a.ctx.scratch + sp.dW16);  // 16-bit storage in scratch
    const bool dk_done = cuda::launch_bwd_grads(a, layout(a.ctx), dlam_hi, dW16, stream(a.ctx.exec));
    if (a.finalize) finalize(*a.finalize, dk_done);  // checked above
  }

  void bwd_finalize(const BwdFinalizeArgs& a) const override {
    const std::string name = phase_name(a.ctx, "bwd_finalize");
    const char* ph = name.c_str();
    check_ctx(a.ctx, ph);
    check_bwd_finalize_args(a, ph, kStorage);
    need_scratch(a.ctx, ph);
    finalize(a, false);
  }

  void copy_floats(float* dst, const float* src, int64_t n, const Exec& exec) const override {
    if (n < 0) arg_fail("copy_floats", "n (" + std::to_string(n) + ") must be >= 0");
    if (n == 0) return;
    need(dst, "copy_floats", "dst");
    need(src, "copy_floats", "src");
    bind();
    KCP_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, stream(exec)));
  }
  void fill_floats(float* dst, float value, int64_t n, const Exec& exec) const override {
    if (n < 0) arg_fail("fill_floats", "n (" + std::to_string(n) + ") must be >= 0");
    if (n == 0) return;
    need(dst, "fill_floats", "dst");
    bind();
    cuda::launch_fill(dst, value, n, stream(exec));
  }
  void fill_16(uint16_t* dst, uint16_t bits, int64_t n, const Exec& exec) const override {
    if (n < 0) arg_fail("fill_16", "n (" + std::to_string(n) + ") must be >= 0");
    if (n == 0) return;
    need(dst, "fill_16", "dst");
    bind();
    cuda::launch_fill(dst, bits, n, stream(exec));
  }
  void synchronize(const Exec& exec) const override {
    bind();
    KCP_CUDA_CHECK(cudaStreamSynchronize(stream(exec)));
  }

  float* alloc_floats(int64_t n) const override {
    if (n < 0) arg_fail("alloc_floats", "n (" + std::to_string(n) + ") must be >= 0");
    bind();
    void* p = nullptr;
    KCP_CUDA_CHECK(cudaMalloc(&p, size_t(std::max<int64_t>(n, 1)) * sizeof(float)));
    return static_cast<float*>(p);
  }
  void free_floats(float* p) const override {
    if (!p) return;
    bind();
    KCP_CUDA_CHECK(cudaFree(p));
  }
  void upload(float* dst, const float* host_src, int64_t n, const Exec& exec) const override {
    copy_sync(dst, host_src, n * int64_t(sizeof(float)), cudaMemcpyHostToDevice, exec);
  }
  void download(float* host_dst, const float* src, int64_t n, const Exec& exec) const override {
    copy_sync(host_dst, src, n * int64_t(sizeof(float)), cudaMemcpyDeviceToHost, exec);
  }
  void upload_16(uint16_t* dst, const uint16_t* host_src, int64_t n, const Exec& exec) const override {
    copy_sync(dst, host_src, n * int64_t(sizeof(uint16_t)), cudaMemcpyHostToDevice, exec);
  }
  void download_16(uint16_t* host_dst, const uint16_t* src, int64_t n, const Exec& exec) const override {
    copy_sync(host_dst, src, n * int64_t(sizeof(uint16_t)), cudaMemcpyDeviceToHost, exec);
  }
  std::unique_ptr<PhaseTimer> make_timer() const override { return std::make_unique<CudaTimer>(device_); }
  std::string device_name() const override { return name_; }
  int64_t device_memory_bytes() const override {
    bind();
    size_t free_bytes = 0, total_bytes = 0;
    KCP_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return static_cast<int64_t>(total_bytes);
  }

 private:
  struct Entry {
    int64_t T = 0;
    std::vector<PieceDesc> pieces;
    std::vector<SegmentDesc> segments;
    std::vector<ChunkDesc> chunks;
    void* dev = nullptr;
    DevLayout view;
  };
  static constexpr size_t kMaxCached = 64;

  void bind() const { KCP_CUDA_CHECK(cudaSetDevice(device_)); }

  // bwd_finalize's launches on checked Args; dk_done: bwd_grads' B5 finalized dk already (GDN).
  void finalize(const BwdFinalizeArgs& a, bool dk_done) const {
    if (a.ctx.problem.op == Op::Kda)
      cuda::launch_kda_bwd_finalize(a, layout(a.ctx),
                                    a.ctx.scratch + kda_scratch_parts(a.ctx.problem, a.ctx.layout).partials,
                                    stream(a.ctx.exec));
    else
      cuda::launch_bwd_finalize(a, layout(a.ctx), a.ctx.scratch, stream(a.ctx.exec), dk_done);
  }
  // A host <-> device copy of `bytes` bytes on exec's stream, complete when it returns.
  void copy_sync(void* dst, const void* src, int64_t bytes, cudaMemcpyKind kind, const Exec& exec) const {
    if (bytes <= 0) return;
    bind();
    KCP_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(bytes), kind, stream(exec)));
    KCP_CUDA_CHECK(cudaStreamSynchronize(stream(exec)));
  }
  static cudaStream_t stream(const Exec& e) { return static_cast<cudaStream_t>(e.stream); }

  // The device copy of ctx.layout (uploaded on first use, then found by its contents).
  DevLayout layout(const PhaseCtx& ctx) const {
    bind();
    const LayoutView& L = ctx.layout;
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : cache_)
      if (e.T == L.T && same_table(e.pieces, L.pieces, L.n_pieces) &&
          same_table(e.segments, L.segments, L.n_segments) && same_table(e.chunks, L.chunks, L.n_chunks))
        return e.view;
    if (cache_.size() >= kMaxCached) {
      // cudaFree waits for the device, so no kernel still reads the evicted tables.
      KCP_CUDA_CHECK(cudaFree(cache_.front().dev));
      cache_.erase(cache_.begin());
    }
    Entry e;
    e.T = L.T;
    e.pieces.assign(L.pieces, L.pieces + L.n_pieces);
    e.segments.assign(L.segments, L.segments + L.n_segments);
    e.chunks.assign(L.chunks, L.chunks + L.n_chunks);
    const size_t bp = e.pieces.size() * sizeof(PieceDesc), bs = e.segments.size() * sizeof(SegmentDesc),
                 bc = e.chunks.size() * sizeof(ChunkDesc);
    auto up = [](size_t b) { return (b + 255) / 256 * 256; };
    const size_t total = up(bp) + up(bs) + up(bc) + 256;
    KCP_CUDA_CHECK(cudaMalloc(&e.dev, total));
    char* base = static_cast<char*>(e.dev);
    if (bp) KCP_CUDA_CHECK(cudaMemcpy(base, e.pieces.data(), bp, cudaMemcpyHostToDevice));
    if (bs) KCP_CUDA_CHECK(cudaMemcpy(base + up(bp), e.segments.data(), bs, cudaMemcpyHostToDevice));
    if (bc) KCP_CUDA_CHECK(cudaMemcpy(base + up(bp) + up(bs), e.chunks.data(), bc, cudaMemcpyHostToDevice));
    e.view.pieces = reinterpret_cast<const PieceDesc*>(base);
    e.view.segments = reinterpret_cast<const SegmentDesc*>(base + up(bp));
    e.view.chunks = reinterpret_cast<const ChunkDesc*>(base + up(bp) + up(bs));
    e.view.T = L.T;
    e.view.n_chunks = L.n_chunks;
    e.view.n_pieces = L.n_pieces;
    e.view.n_segments = L.n_segments;
    cache_.push_back(std::move(e));
    return cache_.back().view;
  }

  int device_;
  std::string name_;
  mutable std::mutex mu_;
  mutable std::vector<Entry> cache_;
};

}  // namespace

int cuda_device_count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / no device: "no GPU here", not an error
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(int device) {
  const int n = cuda_device_count();
  if (device < 0 || device >= n)
    throw std::runtime_error("kcp kernels: CUDA device " + std::to_string(device) + " requested, " + std::to_string(n) +
                             " visible");
  return std::make_unique<CudaBackend>(device);
}

}  // namespace kcp::kernels
