// Launchers of the wgmma + TMA state walks (gdn_walk_wgmma.cuh: forward and backward, GDN and
// KDA) and the choice between them and the mma.sync walks (walk_select.h). The tensor maps are
// encoded per launch on the host (five to seven cuTensorMapEncodeTiled calls, microseconds) and
// passed as __grid_constant__ parameters.
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "kernels/cuda/gdn_walk_wgmma.cuh"
#include "kernels/cuda/gdn_walk_wgmma.h"

namespace kcp::kernels::cuda {

namespace {

std::atomic<int> g_fwd_choice{int(WalkChoice::Auto)}, g_bwd_choice{int(WalkChoice::Auto)};

// The device runs the sm_90a code of this build (a 9.0 device; another one would JIT the
// compute_90 PTX, in which the wgmma kernel is a trap).
bool device_is_sm90() {
  int d = 0, major = 0, minor = 0;
  KCP_CUDA_CHECK(cudaGetDevice(&d));
  KCP_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d));
  KCP_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d));
  return major == 9 && minor == 0;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// A map of a 16-bit tensor {d0 (contiguous), d1, d2}, box {64, b1, b2}, 128-byte swizzle.
CUtensorMap map16(const char* what, bool fp16, const uint16_t* ptr, int64_t d0, int64_t d1, int64_t d2, int b1,
                  int b2) {
  CUtensorMap m{};
  const CUresult r = hopper::make_map_16bit(
      &m, fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, const_cast<uint16_t*>(ptr),
      uint64_t(d0), uint64_t(d1), uint64_t(d2), uint32_t(walk_wg::kTileV), uint32_t(b1), uint32_t(b2));
  if (r != CUDA_SUCCESS)
    throw std::runtime_error(std::string("kcp kernels: cuda: cuTensorMapEncodeTiled failed for ") + what +
                             " (CUresult " + std::to_string(int(r)) + ")");
  return m;
}

// A map of a 16-bit tensor {d0 (contiguous), d1, d2}, box {16, b1, b2}, unswizzled (a warp's 16
// columns of a state tile's h or v_new, gdn_walk_rs.cuh).
CUtensorMap map16_narrow(const char* what, bool fp16, const uint16_t* ptr, int64_t d0, int64_t d1, int64_t d2, int b1,
                         int b2) {
  CUtensorMap m{};
  const CUresult r = hopper::make_map_16bit(
      &m, fp16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, const_cast<uint16_t*>(ptr),
      uint64_t(d0), uint64_t(d1), uint64_t(d2), 16u, uint32_t(b1), uint32_t(b2), CU_TENSOR_MAP_SWIZZLE_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error(std::string("kcp kernels: cuda: cuTensorMapEncodeTiled failed for ") + what +
                             " (CUresult " + std::to_string(int(r)) + ")");
  return m;
}

// W, U, v_new [T, HV, K]; k [T, H, K] (GDN) or kg [T, HV, K] (KDA); h [NT * HV, K, V]: boxes of
// 64 tokens (64 keys for h); hs, vns: h and v_new in boxes of 16 values (all K keys, 64 tokens);
// with the output in the walk (p.o) q [T, H, K] as k, and os: o [T, HV, V] as vns.
walk_wg::Maps make_maps(const FwdWalkParams& p, bool states, bool kda) {
  const Shape& s = p.sh;
  walk_wg::Maps m{};
  m.W = map16("W", s.fp16, p.W, s.K, s.HV, s.T, 1, kC);
  m.k = kda ? map16("kg", s.fp16, p.kg, s.K, s.HV, s.T, 1, kC) : map16("k", s.fp16, p.k, s.K, s.H, s.T, 1, kC);
  m.U = map16("U", s.fp16, p.U, s.V, s.HV, s.T, 1, kC);
  if (states) {
    m.h = map16("h", s.fp16, p.h, s.V, s.K, s.NT * s.HV, s.K, 1);
    m.vn = map16("v_new", s.fp16, p.v_new, s.V, s.HV, s.T, 1, kC);
    m.hs = map16_narrow("h", s.fp16, p.h, s.V, s.K, s.NT * s.HV, s.K, 1);
    m.vns = map16_narrow("v_new", s.fp16, p.v_new, s.V, s.HV, s.T, 1, kC);
  }
  if (states && p.o) {
    m.q = map16("q", s.fp16, p.q, s.K, s.H, s.T, 1, kC);
    m.os = map16_narrow("o", s.fp16, p.o, s.V, s.HV, s.T, 1, kC);
  }
  return m;
}

// The backward walk's maps: k, q [T, H, K] (KDA: kg, qs [T, HV, K] for k, q); W [T, HV, K]; dO,
// dv_local, dv2 [T, HV, V]; dh [NT * HV, K, V].
walk_wg::BwdMaps make_bwd_maps(const BwdWalkParams& p, bool states, bool kda) {
  const Shape& s = p.sh;
  walk_wg::BwdMaps m{};
  m.k = kda ? map16("kg", s.fp16, p.kg, s.K, s.HV, s.T, 1, kC) : map16("k", s.fp16, p.k, s.K, s.H, s.T, 1, kC);
  m.q = kda ? map16("qs", s.fp16, p.qs, s.K, s.HV, s.T, 1, kC) : map16("q", s.fp16, p.q, s.K, s.H, s.T, 1, kC);
  m.W = map16("W", s.fp16, p.W, s.K, s.HV, s.T, 1, kC);
  m.dO = map16("dO", s.fp16, p.dO, s.V, s.HV, s.T, 1, kC);
  m.dl = map16("dv_local", s.fp16, p.dv_local, s.V, s.HV, s.T, 1, kC);
  if (states) {
    m.dh = map16("dh", s.fp16, p.dh, s.V, s.K, s.NT * s.HV, s.K, 1);
    m.dv2 = map16("dv2", s.fp16, p.dv2, s.V, s.HV, s.T, 1, kC);
    m.dhs = map16_narrow("dh", s.fp16, p.dh, s.V, s.K, s.NT * s.HV, s.K, 1);
    m.dv2s = map16_narrow("dv2", s.fp16, p.dv2, s.V, s.HV, s.T, 1, kC);
  }
  return m;
}

// Every tensor a TMA map (or a 16-byte load) reads or writes starts on 16 bytes (null: a tensor
// the mode does not use); every coordinate fits an int.
bool tensors_fit(const Shape& s, std::initializer_list<const void*> tensors) {
  for (const void* t : tensors)
    if (!aligned16(t)) return false;
  return s.T < (int64_t(1) << 31) && s.NT * s.HV < (int64_t(1) << 31);
}

// One wgmma walk kernel over S * HV * tiles blocks.
template <class Kernel, class Maps, class Params>
void launch(Kernel kernel, size_t smem, int tiles, const Maps& m, const Params& p, cudaStream_t st,
            int threads = walk_wg::kWgThreads) {
  allow_smem(kernel, smem);
  kernel<<<unsigned(int64_t(p.sh.S) * p.sh.HV * tiles), threads, smem, st>>>(m, p);
  KCP_CUDA_LAUNCH_CHECK(st);
}

template <class DT, int K, bool STATES, bool KDA, bool OUT = false>
void run(const walk_wg::Maps& m, const FwdWalkParams& p, cudaStream_t st) {
  launch(walk_wg::fwd_walk_wgmma_kernel<DT, K, STATES, KDA, OUT>, walk_wg::Smem<K, OUT>::bytes,
         (STATES ? 1 : 2) * (K / walk_wg::kTileV), m, p, st, OUT ? walk_wg::kOutThreads : walk_wg::kWgThreads);
}

template <class DT, int K, bool STATES, bool KDA>
void run_bwd(const walk_wg::BwdMaps& m, const BwdWalkParams& p, cudaStream_t st) {
  launch(walk_wg::bwd_walk_wgmma_kernel<DT, K, STATES, KDA>, walk_wg::BwdSmem<K>::bytes, K / walk_wg::kTileV, m, p, st);
}

// The walks' common admission: K = V in {64, 128}, bf16 / fp16, an sm_90 device, an sm_90a build
// and a driver with the tensor-map encoder.
bool wgmma_walk_runs(const Problem& p) {
#if defined(KCP_HAVE_SM90A)
  if (p.K != p.V || (p.K != 64 && p.K != 128)) return false;
  if (p.dtype != DType::BF16 && p.dtype != DType::FP16) return false;
  return device_is_sm90() && hopper::tensor_map_encoder() != nullptr;
#else
  (void)p;
  return false;
#endif
}

// Calls f(DT tag, K constant) for the problem's dtype and K (K = V: the walks' admission).
template <class F>
void dispatch_walk(const Problem& pb, F&& f) {
  dispatch_dtype_dims<Bf16, Fp16>(pb, [&](auto dt, auto kdim, auto vdim) {
    if constexpr (decltype(kdim)::value == decltype(vdim)::value) f(dt, kdim);
  });
}

}  // namespace

void set_fwd_walk_choice(WalkChoice c) { g_fwd_choice.store(int(c)); }
WalkChoice fwd_walk_choice() { return WalkChoice(g_fwd_choice.load()); }
void set_bwd_walk_choice(WalkChoice c) { g_bwd_choice.store(int(c)); }
WalkChoice bwd_walk_choice() { return WalkChoice(g_bwd_choice.load()); }

bool fwd_walk_uses_wgmma(const Problem& p) { return fwd_walk_choice() != WalkChoice::Mma && wgmma_walk_runs(p); }

bool bwd_walk_uses_wgmma(const Problem& p) { return bwd_walk_choice() != WalkChoice::Mma && wgmma_walk_runs(p); }

bool bwd_grads_use_wgmma() {
#if defined(KCP_HAVE_SM90A)
  return bwd_walk_choice() != WalkChoice::Mma && device_is_sm90();
#else
  return false;
#endif
}

bool launch_fwd_walk_wgmma(const Problem& pb, const FwdWalkParams& p, bool states, cudaStream_t st) {
  const bool kda = pb.op == Op::Kda, out = p.o != nullptr;
  if (out && (kda || !states))
    throw std::logic_error("kcp kernels: cuda: the output is formed only in GDN's forward states walk");
  if (!fwd_walk_uses_wgmma(pb) || !tensors_fit(p.sh, {p.W, kda ? p.kg : p.k, p.U, states ? p.h : nullptr,
                                                      states ? p.v_new : nullptr, out ? p.q : nullptr, p.o}))
    return false;
  if (p.sh.S == 0) return true;
  const walk_wg::Maps m = make_maps(p, states, kda);
  dispatch_walk(pb, [&](auto dt, auto kdim) {
    using DT = typename decltype(dt)::type;
    constexpr int K = decltype(kdim)::value;
    if (out) {
      if constexpr (K == 128)  // launch_fwd_states_output (gdn_chunk_state.cu) asks for K = 128 only
        run<DT, K, true, false, true>(m, p, st);
      else
        throw std::logic_error("kcp kernels: cuda: the output is formed in the walk at K = 128 only");
    } else if (states)
      kda ? run<DT, K, true, true>(m, p, st) : run<DT, K, true, false>(m, p, st);
    else
      kda ? run<DT, K, false, true>(m, p, st) : run<DT, K, false, false>(m, p, st);
  });
  return true;
}

bool launch_bwd_walk_wgmma(const Problem& pb, const BwdWalkParams& p, bool states, cudaStream_t st,
                           const QsRows* qs_rows) {
  const bool kda = pb.op == Op::Kda;
  // KDA: also the scratch qs and gcum (kda_qs_kernel reads q and gcum by 16-byte loads).
  if (!bwd_walk_uses_wgmma(pb) || (kda && !p.qs) ||
      !tensors_fit(p.sh, {kda ? p.kg : p.k, p.q, p.W, p.dO, p.dv_local, states ? p.dh : nullptr,
                          states ? p.dv2 : nullptr, kda ? p.gcum : nullptr, kda ? p.qs : nullptr}))
    return false;
  if (p.sh.S == 0) return true;
  // The walk's q tiles: qs of the tokens it reads (every token, or bwd_summaries' read segments).
  if (kda) launch_kda_qs(p.sh, qs_rows ? *qs_rows : qs_rows_all(p.sh.T), p.q, p.gcum, p.qs, st);
  const walk_wg::BwdMaps m = make_bwd_maps(p, states, kda);
  dispatch_walk(pb, [&](auto dt, auto kdim) {
    using DT = typename decltype(dt)::type;
    constexpr int K = decltype(kdim)::value;
    if (states)
      kda ? run_bwd<DT, K, true, true>(m, p, st) : run_bwd<DT, K, true, false>(m, p, st);
    else
      kda ? run_bwd<DT, K, false, true>(m, p, st) : run_bwd<DT, K, false, false>(m, p, st);
  });
  return true;
}

}  // namespace kcp::kernels::cuda
