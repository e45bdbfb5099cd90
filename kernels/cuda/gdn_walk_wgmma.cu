// Launcher of the wgmma + TMA forward walk of GDN and KDA (gdn_walk_wgmma.cuh) and the choice
// between it and the mma.sync walk (walk_select.h). The tensor maps are encoded per launch on the host (five
// cuTensorMapEncodeTiled calls, microseconds) and passed as __grid_constant__ parameters.
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/gdn_walk_wgmma.cuh"
#include "kernels/cuda/gdn_walk_wgmma.h"

namespace kcp::kernels::cuda {

namespace {

std::atomic<int> g_choice{int(FwdWalkChoice::Auto)};

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

// W, U, v_new [T, HV, K]; k [T, H, K] (GDN) or kg [T, HV, K] (KDA); h [NT * HV, K, V]: boxes of
// 64 tokens (64 keys for h).
walk_wg::Maps make_maps(const FwdWalkParams& p, bool states, bool kda) {
  const Shape& s = p.sh;
  walk_wg::Maps m{};
  m.W = map16("W", s.fp16, p.W, s.K, s.HV, s.T, 1, kC);
  m.k = kda ? map16("kg", s.fp16, p.kg, s.K, s.HV, s.T, 1, kC) : map16("k", s.fp16, p.k, s.K, s.H, s.T, 1, kC);
  m.U = map16("U", s.fp16, p.U, s.V, s.HV, s.T, 1, kC);
  if (states) {
    m.h = map16("h", s.fp16, p.h, s.V, s.K, s.NT * s.HV, s.K, 1);
    m.vn = map16("v_new", s.fp16, p.v_new, s.V, s.HV, s.T, 1, kC);
  }
  return m;
}

// Every 16-bit tensor a TMA map reads or writes starts on 16 bytes; every coordinate fits an int.
bool tensors_fit(const FwdWalkParams& p, bool states, bool kda) {
  const bool al = aligned16(p.W) && aligned16(kda ? p.kg : p.k) && aligned16(p.U) &&
                  (!states || (aligned16(p.h) && aligned16(p.v_new)));
  return al && p.sh.T < (int64_t(1) << 31) && p.sh.NT * p.sh.HV < (int64_t(1) << 31);
}

template <class DT, int K, bool STATES, bool KDA>
void run(const walk_wg::Maps& m, const FwdWalkParams& p, cudaStream_t st) {
  const auto kernel = walk_wg::fwd_walk_wgmma_kernel<DT, K, STATES, KDA>;
  const size_t smem = walk_wg::Smem<K>::bytes;
  const int tiles = (STATES ? 1 : 2) * (K / walk_wg::kTileV);
  allow_smem(kernel, smem);
  kernel<<<unsigned(int64_t(p.sh.S) * p.sh.HV * tiles), walk_wg::kWgThreads, smem, st>>>(m, p);
  KCP_CUDA_LAUNCH_CHECK(st);
}

}  // namespace

void set_fwd_walk_choice(FwdWalkChoice c) { g_choice.store(int(c)); }
FwdWalkChoice fwd_walk_choice() { return FwdWalkChoice(g_choice.load()); }

bool fwd_walk_uses_wgmma(const Problem& p) {
#if defined(KCP_HAVE_SM90A)
  if (fwd_walk_choice() != FwdWalkChoice::Auto || p.K != p.V || (p.K != 64 && p.K != 128)) return false;
  if (p.dtype != DType::BF16 && p.dtype != DType::FP16) return false;
  return device_is_sm90() && hopper::tensor_map_encoder() != nullptr;
#else
  (void)p;
  return false;
#endif
}

bool launch_fwd_walk_wgmma(const Problem& pb, const FwdWalkParams& p, bool states, cudaStream_t st) {
  const bool kda = pb.op == Op::Kda;
  if (!fwd_walk_uses_wgmma(pb) || !tensors_fit(p, states, kda)) return false;
  if (p.sh.S == 0) return true;
  const walk_wg::Maps m = make_maps(p, states, kda);
  dispatch_dtype_dims<Bf16, Fp16>(pb, [&](auto dt, auto kdim, auto vdim) {
    using DT = typename decltype(dt)::type;
    constexpr int K = decltype(kdim)::value;
    if constexpr (K == decltype(vdim)::value) {  // fwd_walk_uses_wgmma admits K = V only
      if (states)
        kda ? run<DT, K, true, true>(m, p, st) : run<DT, K, true, false>(m, p, st);
      else
        kda ? run<DT, K, false, true>(m, p, st) : run<DT, K, false, false>(m, p, st);
    }
  });
  return true;
}

}  // namespace kcp::kernels::cuda
