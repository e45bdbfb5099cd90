// Device-side helpers shared by every CUDA kernel of the GDN backend: dtype traits (bf16 / fp16
// rounding and packing), warp-level tensor-core products (mma.sync m16n8k16, 16-bit operands,
// fp32 accumulation) over shared-memory tiles, warp tilings of a block, and small reductions.
// Included only by kernels/cuda/*.cu (through the *_kernel.cuh files).
//
// Numerical contract (docs/algorithm.md 2.1; kernels/cpu mirrors it):
//  * every operand of a tensor-core product holds a value already rounded to the input dtype,
//    so converting it to the 16-bit mma operand is exact; products accumulate in fp32. The GPU
//    and the CPU twin then differ only by the order of fp32 accumulation.
//  * the fp32 M chain (docs/algorithm.md 7.2) uses split operands x = hi + lo (both dtype values), two
//    products per fp32 operand, about 16 significant bits instead of 8 (bf16); fp16 splits a tile
//    scaled by a power of two into fp16's normal range first (SplitScale, gdn_chunk_state_kernel.cuh).
//
// Shared-memory tiles are row-major with a leading dimension `ld`. An operand view says which
// index is contiguous: for A (m x k) KC = true means A[m * ld + k]; for B (k x n) KC = true means
// B[n * ld + k] (so B = X^T of a row-major X). 16-bit tiles use ld = cols + 8 elements, which
// makes both access patterns of the fragment loads free of bank conflicts; fp32 tiles use
// ld = cols + 4 (k-strided) or cols + 8 (k-contiguous).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_launch.h"
#include "kernels/cuda/dispatch.h"

namespace kcp::kernels::cuda {

inline constexpr int kC = 64;         // chunk size
inline constexpr int kThreads = 256;  // threads of every tensor-core kernel (8 warps)
inline constexpr int kWarps = kThreads / 32;

// ---------------------------------------------------------------------------------------------
// dtype traits. raw(): the 16-bit pattern of the rounded value; rnd(): round to the dtype.
struct Bf16 {
  static __device__ __forceinline__ float rnd(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
  static __device__ __forceinline__ uint16_t raw(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
  static __device__ __forceinline__ float from_raw(uint16_t u) { return __bfloat162float(__ushort_as_bfloat16(u)); }
  // One paired conversion (cvt.rn.bf16x2.f32), the same bits as two raw() calls.
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};
struct Fp16 {
  static __device__ __forceinline__ float rnd(float x) { return __half2float(__float2half_rn(x)); }
  static __device__ __forceinline__ uint16_t raw(float x) { return __half_as_ushort(__float2half_rn(x)); }
  static __device__ __forceinline__ float from_raw(uint16_t u) { return __half2float(__ushort_as_half(u)); }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);  // .x (low half) = lo
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  static __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// ---------------------------------------------------------------------------------------------
// Operand views over shared memory. T = float (dtype-exact fp32 values, converted on load) or
// uint16_t (raw dtype bits). pair(): the two 16-bit operands (x, x + 1 along k) packed.
template <class DT, class T>
struct Pair;
template <class DT>
struct Pair<DT, float> {
  static __device__ __forceinline__ uint32_t contiguous(const float* p) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    return DT::pack(v.x, v.y);
  }
  static __device__ __forceinline__ uint32_t strided(const float* p, int stride) { return DT::pack(p[0], p[stride]); }
};
template <class DT>
struct Pair<DT, uint16_t> {
  static __device__ __forceinline__ uint32_t contiguous(const uint16_t* p) {
    return *reinterpret_cast<const uint32_t*>(p);
  }
  static __device__ __forceinline__ uint32_t strided(const uint16_t* p, int stride) {
    return uint32_t(p[0]) | (uint32_t(p[stride]) << 16);
  }
};

// A (m x k): KC ? p[m * ld + k] : p[k * ld + m].
template <class T_, bool KC>
struct AView {
  using T = T_;
  static constexpr bool kKC = KC;
  const T* p;
  int ld;
  template <class DT>
  __device__ __forceinline__ uint32_t pair(int m, int k) const {
    if constexpr (KC)
      return Pair<DT, T>::contiguous(p + m * ld + k);
    else
      return Pair<DT, T>::strided(p + k * ld + m, ld);
  }
};
// B (k x n): KC ? p[n * ld + k] : p[k * ld + n].
template <class T_, bool KC>
struct BView {
  using T = T_;
  static constexpr bool kKC = KC;
  const T* p;
  int ld;
  template <class DT>
  __device__ __forceinline__ uint32_t pair(int k, int n) const {
    if constexpr (KC)
      return Pair<DT, T>::contiguous(p + n * ld + k);
    else
      return Pair<DT, T>::strided(p + k * ld + n, ld);
  }
};

__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }
__device__ __forceinline__ int warp_id() { return threadIdx.x >> 5; }

// ldmatrix: four 8 x 8 16-bit matrices, lanes 8 i .. 8 i + 7 give the row addresses of matrix i;
// register i of lane l holds (row l / 4, cols 2 (l % 4), +1) of matrix i, or with .trans
// (rows 2 (l % 4), +1, col l / 4), the lower index in the lower half. Row addresses are
// 16-byte aligned (ld = cols + 8 elements keeps rows 16-byte aligned and conflict-free).
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
template <bool TRANS>
__device__ __forceinline__ void ldsm_x4(uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3, const uint16_t* p) {
  if constexpr (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p))
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(smem_addr(p))
                 : "memory");
}

// acc[MT][NT] += A[m0 : m0 + 16 MT, kb : ke] * B[kb : ke, n0 : n0 + 8 NT]; (ke - kb) % 16 == 0.
// 16-bit tiles use ldmatrix (one instruction per A fragment and per two B fragments); other
// tiles (fp32 values converted on load) use scalar loads.
template <class DT, int MT, int NT, class AV, class BV>
__device__ __forceinline__ void warp_mma(float (&acc)[MT][NT][4], const AV& A, const BV& B, int m0, int n0, int kb,
                                         int ke) {
#if !defined(KCP_NO_LDMATRIX)
  if constexpr (sizeof(typename AV::T) == 2 && sizeof(typename BV::T) == 2 && NT % 2 == 0) {
    const int l = lane_id(), rr = l & 7, mi = l >> 3;
    // Per-lane row pointers at k = 0 (advanced by k0 below).
    const uint16_t* pa[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int m = m0 + mt * 16;
      if constexpr (AV::kKC)
        pa[mt] = A.p + (m + rr + (mi & 1) * 8) * A.ld + (mi >> 1) * 8;
      else
        pa[mt] = A.p + (rr + (mi >> 1) * 8) * A.ld + m + (mi & 1) * 8;
    }
    const uint16_t* pb[NT / 2];
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      const int n = n0 + np * 16;
      if constexpr (BV::kKC)
        pb[np] = B.p + (n + rr + (mi >> 1) * 8) * B.ld + (mi & 1) * 8;
      else
        pb[np] = B.p + (rr + (mi & 1) * 8) * B.ld + n + (mi >> 1) * 8;
    }
#pragma unroll 2
    for (int k0 = kb; k0 < ke; k0 += 16) {
      uint32_t a[MT][4], b[NT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldsm_x4<!AV::kKC>(a[mt][0], a[mt][1], a[mt][2], a[mt][3], pa[mt] + (AV::kKC ? k0 : k0 * A.ld));
#pragma unroll
      for (int np = 0; np < NT / 2; ++np)
        ldsm_x4<!BV::kKC>(b[2 * np][0], b[2 * np][1], b[2 * np + 1][0], b[2 * np + 1][1],
                          pb[np] + (BV::kKC ? k0 : k0 * B.ld));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) DT::mma(acc[mt][nt], a[mt], b[nt]);
    }
    return;
  }
#endif
  const int g = lane_id() >> 2, t = lane_id() & 3;
#pragma unroll 2
  for (int k0 = kb; k0 < ke; k0 += 16) {
    uint32_t a[MT][4], b[NT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int m = m0 + mt * 16 + g;
      a[mt][0] = A.template pair<DT>(m, k0 + 2 * t);
      a[mt][1] = A.template pair<DT>(m + 8, k0 + 2 * t);
      a[mt][2] = A.template pair<DT>(m, k0 + 2 * t + 8);
      a[mt][3] = A.template pair<DT>(m + 8, k0 + 2 * t + 8);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int n = n0 + nt * 8 + g;
      b[nt][0] = B.template pair<DT>(k0 + 2 * t, n);
      b[nt][1] = B.template pair<DT>(k0 + 2 * t + 8, n);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) DT::mma(acc[mt][nt], a[mt], b[nt]);
  }
}

// How 8 warps cover an R x N output: WM warps along rows, WN along columns, each warp MT x NT
// fragments of 16 x 8.
template <int R, int N>
struct Tiling {
  static constexpr int WM = (R / 16) >= kWarps ? kWarps : R / 16;
  static constexpr int WN = kWarps / WM;
  static constexpr int MT = R / 16 / WM;
  static constexpr int NT = N / 8 / WN;
  static_assert(R % 16 == 0 && N % (8 * WN) == 0 && MT >= 1 && NT >= 1, "bad tiling");
  using Acc = float[MT][NT][4];
  static __device__ __forceinline__ int m0() { return (warp_id() % WM) * MT * 16; }
  static __device__ __forceinline__ int n0() { return (warp_id() / WM) * NT * 8; }
  static __device__ __forceinline__ void zero(Acc& acc) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
  }
  template <class DT, class AV, class BV>
  static __device__ __forceinline__ void mma(Acc& acc, const AV& A, const BV& B, int kb, int ke) {
    warp_mma<DT, MT, NT>(acc, A, B, m0(), n0(), kb, ke);
  }
  // f(row, col, value&) for every accumulator element this thread holds.
  template <class F>
  static __device__ __forceinline__ void each(Acc& acc, F&& f) {
    const int g = lane_id() >> 2, t = lane_id() & 3, r0 = m0(), c0 = n0();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          f(r0 + mt * 16 + g + (e >= 2 ? 8 : 0), c0 + nt * 8 + 2 * t + (e & 1), acc[mt][nt][e]);
  }
  // f(row, col, a0&, a1&, b0&, b1&): the same element pairs of two accumulators.
  template <class F>
  static __device__ __forceinline__ void zip_pairs(Acc& a, Acc& b, F&& f) {
    const int g = lane_id() >> 2, t = lane_id() & 3, r0 = m0(), c0 = n0();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          f(r0 + mt * 16 + g + 8 * h, c0 + nt * 8 + 2 * t, a[mt][nt][2 * h], a[mt][nt][2 * h + 1], b[mt][nt][2 * h],
            b[mt][nt][2 * h + 1]);
  }
  // f(row, col, v0&, v1&) for the element pairs (row, col), (row, col + 1), col even.
  template <class F>
  static __device__ __forceinline__ void pairs(Acc& acc, F&& f) {
    const int g = lane_id() >> 2, t = lane_id() & 3, r0 = m0(), c0 = n0();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          f(r0 + mt * 16 + g + 8 * h, c0 + nt * 8 + 2 * t, acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
  }
};

// ---------------------------------------------------------------------------------------------
// Global -> shared staging of a ROWS x COLS row tile through registers. load() issues every
// 16-byte load of the tile at once (ITERS per thread, so a tile costs one memory round trip, not
// ITERS of them) and can run one chunk ahead of the compute; store() converts to 16-bit dtype
// values in shared memory (row-major, ld). Rows [rows_valid, ROWS) become zeros and are never
// read from memory (they may be poison or another chunk). COLS % 4 == 0, rows 16-byte aligned.
template <int ROWS, int COLS>
struct Tile {
  static_assert(COLS % 4 == 0, "16-byte loads of 4 floats");
  static constexpr int V4 = COLS / 4, TOTAL = ROWS * V4, ITERS = (TOTAL + kThreads - 1) / kThreads;
  float4 v[ITERS];
  __device__ __forceinline__ void load(const float* src, int64_t src_stride, int rows_valid) {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = threadIdx.x + i * kThreads, r = e / V4, c = (e % V4) * 4;
      v[i] = (e < TOTAL && r < rows_valid) ? __ldg(reinterpret_cast<const float4*>(src + r * src_stride + c))
                                           : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  // f(r, x) -> the value stored for element x of row r, rounded to dtype by the store (zero
  // rows stay zero).
  template <class DT, class F>
  __device__ __forceinline__ void store(uint16_t* dst, int ld, F&& f) const {
    store_rc<DT>(dst, ld, [&](int r, int, float x) { return f(r, x); });
  }
  // f(r, c, x): as above, with the element's column c (masks: kda_chunk_fwd_kernel.cuh's Aqk).
  template <class DT, class F>
  __device__ __forceinline__ void store_rc(uint16_t* dst, int ld, F&& f) const {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = threadIdx.x + i * kThreads, r = e / V4, c = (e % V4) * 4;
      if (e >= TOTAL) continue;
      uint32_t* d = reinterpret_cast<uint32_t*>(dst + r * ld + c);
      d[0] = DT::pack(f(r, c, v[i].x), f(r, c + 1, v[i].y));
      d[1] = DT::pack(f(r, c + 2, v[i].z), f(r, c + 3, v[i].w));
    }
  }
  template <class DT>
  __device__ __forceinline__ void store(uint16_t* dst, int ld) const {
    store<DT>(dst, ld, [](int, float x) { return x; });
  }
};

// The "dtype" saved / workspace tensors reach the kernels as uint16_t* (Storage::Packed16 of
// kernels/api/dtype_tensor.h; cuda_backend.cu, header): raw dtype bits, element e at byte 2 e.
// Stores the dtype values (lo, hi) as two adjacent 16-bit elements (index even).
template <class DT>
__device__ __forceinline__ void st16x2(uint16_t* dst, float lo, float hi) {
  *reinterpret_cast<uint32_t*>(dst) = DT::pack(lo, hi);
}

// Tile of a tensor held in 16-bit storage: load() issues 16-byte loads of 8 elements; store()
// copies the raw bits to shared memory (no conversion). Same contract as Tile otherwise;
// COLS % 8 == 0, source rows and the destination rows 16-byte aligned.
template <int ROWS, int COLS>
struct Tile16 {
  static_assert(COLS % 8 == 0, "16-byte loads of 8 16-bit values");
  static constexpr int V8 = COLS / 8, TOTAL = ROWS * V8, ITERS = (TOTAL + kThreads - 1) / kThreads;
  uint4 v[ITERS];
  __device__ __forceinline__ void load(const uint16_t* src, int64_t src_stride, int rows_valid) {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = threadIdx.x + i * kThreads, r = e / V8, c = (e % V8) * 8;
      v[i] = (e < TOTAL && r < rows_valid) ? __ldg(reinterpret_cast<const uint4*>(src + r * src_stride + c))
                                           : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  template <class DT>
  __device__ __forceinline__ void store(uint16_t* dst, int ld) const {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = threadIdx.x + i * kThreads, r = e / V8, c = (e % V8) * 8;
      if (e >= TOTAL) continue;
      *reinterpret_cast<uint4*>(dst + r * ld + c) = v[i];
    }
  }
  // f(r, x) -> the value stored for element x of row r, rounded to dtype by the store (zero
  // rows hold f(r, 0)).
  template <class DT, class F>
  __device__ __forceinline__ void store(uint16_t* dst, int ld, F&& f) const {
    store_by_iter<DT>(dst, ld, [&](int, int r, float x) { return f(r, x); });
  }
  // The row this thread's i-th 16-byte load covers (for per-row factors fetched with the tile).
  static __device__ __forceinline__ int row_of(int i) { return int(threadIdx.x + i * kThreads) / V8; }
  // f(i, r, x): as above, with the load index i (a compile-time constant after unrolling, so a
  // per-row factor can live in a register array indexed by i).
  template <class DT, class F>
  __device__ __forceinline__ void store_by_iter(uint16_t* dst, int ld, F&& f) const {
    store_by_elem<DT>(dst, ld, [&](int i, int r, int, float x) { return f(i, r, x); });
  }
  // f(i, r, u, x): as above, with u in [0, 8) the element's place in the i-th 16-byte load (for
  // per-element factors fetched with the tile: GateTile16).
  template <class DT, class F>
  __device__ __forceinline__ void store_by_elem(uint16_t* dst, int ld, F&& f) const {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = threadIdx.x + i * kThreads, r = e / V8, c = (e % V8) * 8;
      if (e >= TOTAL) continue;
      const uint32_t w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
      uint32_t o[4];
#pragma unroll
      for (int u = 0; u < 4; ++u)
        o[u] = DT::pack(f(i, r, 2 * u, DT::from_raw(uint16_t(w[u] & 0xffffu))),
                        f(i, r, 2 * u + 1, DT::from_raw(uint16_t(w[u] >> 16))));
      *reinterpret_cast<uint4*>(dst + r * ld + c) = make_uint4(o[0], o[1], o[2], o[3]);
    }
  }
};

// Element u in [0, 8) of 8 consecutive floats loaded as two float4 (u a compile-time constant
// after unrolling: no local memory).
__device__ __forceinline__ float at8(const float4& lo, const float4& hi, int u) {
  const float4& q = u < 4 ? lo : hi;
  switch (u & 3) {
    case 0:
      return q.x;
    case 1:
      return q.y;
    case 2:
      return q.z;
    default:
      return q.w;
  }
}

// fp32 values of a ROWS x COLS row tile held by the same threads as the elements of a
// Tile16<ROWS, COLS> (two 16-byte loads per 16-bit load): per-element factors (the KDA gates)
// applied while that tile is stored (Tile16::store_by_elem). Rows [rows_valid, ROWS) are zeros,
// never read from memory.
template <int ROWS, int COLS>
struct GateTile16 {
  using T16 = Tile16<ROWS, COLS>;
  static constexpr int ITERS = T16::ITERS;
  float4 lo[ITERS], hi[ITERS];
  __device__ __forceinline__ void load(const float* src, int64_t src_stride, int rows_valid) {
#pragma unroll
    for (int i = 0; i < ITERS; ++i) {
      const int e = threadIdx.x + i * kThreads, r = e / T16::V8, c = (e % T16::V8) * 8;
      const bool ok = e < T16::TOTAL && r < rows_valid;
      const float4* s = reinterpret_cast<const float4*>(src + r * src_stride + c);
      lo[i] = ok ? __ldg(s) : make_float4(0.f, 0.f, 0.f, 0.f);
      hi[i] = ok ? __ldg(s + 1) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  // Element u in [0, 8) of load i (both compile-time constants after unrolling).
  __device__ __forceinline__ float at(int i, int u) const { return at8(lo[i], hi[i], u); }
};

// Asynchronous global -> shared copies (cp.async, 16 bytes, no registers held while in flight)
// of a ROWS x COLS row tile (fp32, or 16-bit raw bits) into shared memory of the same type (row
// stride ld, rows 16-byte aligned).
// Rows [rows_valid, ROWS) are zero-filled, never read. Then cp_async_commit(); before reading:
// cp_async_wait_all() and a block barrier.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are pending (groups complete in commit
// order), so a kernel can start on the first groups' tiles while later ones are in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
template <class T, int ROWS, int COLS>
__device__ __forceinline__ void cp_async_rows(T* dst, int ld, const T* src, int64_t src_stride, int rows_valid) {
  constexpr int E = 16 / int(sizeof(T)), V4 = COLS / E;  // elements per copy, copies per row
  static_assert(COLS % E == 0, "16-byte copies");
  for (int e = threadIdx.x; e < ROWS * V4; e += kThreads) {
    const int r = e / V4, c = (e % V4) * E;
    const bool ok = r < rows_valid;
    cp_async16(dst + r * ld + c, ok ? src + r * src_stride + c : src, ok);
  }
}
// cp_async_rows unrolled at compile time, for tiles whose 16-byte copies are a whole number per
// thread: every copy of the thread is issued straight, without the loop's trip count and
// remainder code (about a hundred SASS instructions per tile in gdn_bwd_dqk_kernel).
template <class T, int ROWS, int COLS>
__device__ __forceinline__ void cp_async_tile(T* dst, int ld, const T* src, int64_t src_stride, int rows_valid) {
  constexpr int E = 16 / int(sizeof(T)), V4 = COLS / E, ITERS = ROWS * V4 / kThreads;
  static_assert(COLS % E == 0 && ROWS * V4 % kThreads == 0, "whole 16-byte copies per thread");
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int e = threadIdx.x + it * kThreads, r = e / V4, c = (e % V4) * E;
    const bool ok = r < rows_valid;
    cp_async16(dst + r * ld + c, ok ? src + r * src_stride + c : src, ok);
  }
}
template <class DT, int ROWS, int COLS>
__device__ __forceinline__ void stage_rows16(uint16_t* dst, int ld, const uint16_t* src, int64_t src_stride,
                                             int rows_valid) {
  Tile16<ROWS, COLS> t;
  t.load(src, src_stride, rows_valid);
  t.template store<DT>(dst, ld);
}

// Shared -> global copy of the first `rows` rows (COLS wide) of a 16-bit tile, 16 bytes per
// store, XOR-ed with `flip` (0x80008000u negates every value: the sign bit of bf16 and fp16).
// Tiles written from mma fragments go out through shared memory this way: a fragment row holds
// 4 bytes per lane, so direct stores touch half sectors. Rows 16-byte aligned on both sides.
template <int COLS>
__device__ __forceinline__ void store_rows16(uint16_t* dst, int64_t dst_stride, const uint16_t* src, int ld, int rows,
                                             uint32_t flip = 0u) {
  static_assert(COLS % 8 == 0, "16-byte stores of 8 16-bit values");
  constexpr int V8 = COLS / 8;
  for (int e = threadIdx.x; e < rows * V8; e += blockDim.x) {
    const int r = e / V8, c = (e % V8) * 8;
    uint4 v = *reinterpret_cast<const uint4*>(src + r * ld + c);
    v.x ^= flip;
    v.y ^= flip;
    v.z ^= flip;
    v.w ^= flip;
    *reinterpret_cast<uint4*>(dst + r * dst_stride + c) = v;
  }
}

// One-shot staging (load, then store) of a tile into 16-bit shared memory.
template <class DT, int ROWS, int COLS>
__device__ __forceinline__ void stage_rows(uint16_t* dst, int ld, const float* src, int64_t src_stride,
                                           int rows_valid) {
  Tile<ROWS, COLS> t;
  t.load(src, src_stride, rows_valid);
  t.template store<DT>(dst, ld);
}

// dst = f(r, src) over the first `rows` rows (COLS wide) of two 16-bit tiles with the same ld
// (f's value is rounded to dtype by the store); dst may be src (an in-place map).
template <class DT, int COLS, class F>
__device__ __forceinline__ void map_rows_to(uint16_t* dst, const uint16_t* src, int ld, int rows, F&& f) {
  for (int e = threadIdx.x; e < rows * (COLS / 2); e += blockDim.x) {
    const int r = e / (COLS / 2), c = (e % (COLS / 2)) * 2;
    const uint32_t u = *reinterpret_cast<const uint32_t*>(src + r * ld + c);
    *reinterpret_cast<uint32_t*>(dst + r * ld + c) =
        DT::pack(f(r, DT::from_raw(uint16_t(u & 0xffffu))), f(r, DT::from_raw(uint16_t(u >> 16))));
  }
}
template <class DT, int COLS, class F>
__device__ __forceinline__ void map_rows(uint16_t* t, int ld, int rows, F&& f) {
  map_rows_to<DT, COLS>(t, t, ld, rows, f);
}

// ---------------------------------------------------------------------------------------------
// Caller tensors (kernels/api/tensors.h): the KDA kernels read the inputs q, k, v, dO and write
// the outputs o, dq, dk, dv ONLY through CallerIn / CallerOut, load_caller and store_caller, so a
// change of their storage (raw 16-bit dtype patterns, Backend::caller_storage() Packed16) touches
// this block alone. load_caller: element e as a float (a dtype value); store_caller: x rounded to
// the dtype, stored as its 16-bit pattern.
using CallerIn = const uint16_t*;
using CallerOut = uint16_t*;
template <class DT>
__device__ __forceinline__ float load_caller(CallerIn p, int64_t e) {
  return DT::from_raw(p[e]);
}
template <class DT>
__device__ __forceinline__ void store_caller(CallerOut p, int64_t e, float x) {
  p[e] = DT::raw(x);
}

// Gate activations (docs/algorithm.md 1.2, 7.14): softplus is x above 20, else ln(1 + e^x)
// without log1p; the CPU twin's softplusf_ / sigmoidf_.
__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

// Sum over the 4 lanes of a quad (the lanes holding one accumulator row).
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}
// Sum over the 8 row groups of a warp (lanes with the same lane % 4).
__device__ __forceinline__ float column_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  v += __shfl_xor_sync(0xffffffffu, v, 16);
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Block-wide sum in a fixed order (warp sums, then warp 0 adds the warp partials in order);
// every thread gets the result. red: kWarps floats of shared memory. It starts with a barrier,
// which callers rely on (gdn_bwd_dqk_kernel reuses a tile every warp has finished reading).
__device__ __forceinline__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  __syncthreads();
  if (lane_id() == 0) red[warp_id()] = v;
  __syncthreads();
  float s = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) s += red[w];
  return s;
}

}  // namespace kcp::kernels::cuda
