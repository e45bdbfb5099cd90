// Hopper (sm_90a) building blocks shared by the wgmma + TMA kernels (gdn_walk_wgmma.cuh) and the
// walk-step microbenchmark (tests/gpu/walk_step_bench.cu): mbarrier and bulk-copy (TMA) PTX
// wrappers, wgmma m64n64k16 with shared-memory descriptors for 128-byte-swizzled tiles, the
// accumulator fragment map, and the host-side tensor-map encoder. Standalone: no other kcp header.
//
// Tiles: 64 columns of 16-bit values = 128-byte rows, stored with the 128-byte swizzle (the
// 16-byte chunk index XOR the row within its group of 8 rows), which is the layout TMA writes and
// wgmma reads; a tile of R rows is R * 128 bytes, 1024-byte aligned.
//
// Only sm_90a has wgmma: device code that calls wgmma_64x64x16 must be compiled only where
// __CUDA_ARCH_FEAT_SM90_ALL is defined (the kernels guard their bodies), so the compute_90 PTX of
// the library holds no wgmma instruction.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace kcp::hopper {

// ---- mbarriers -------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
// Makes the initialised barriers visible to the async proxy (TMA) and the other threads (then a
// block barrier).
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
// Arrives and adds `bytes` to the transaction count of the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Adds `bytes` to the transaction count without arriving.
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
// Arrives (release: this thread's earlier writes are visible to a thread whose wait completes).
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Waits until the phase of the given parity has completed (acquire).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred P1;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n"
      "@P1 bra DONE_%=;\nbra WAIT_%=;\nDONE_%=:\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Named barrier `id` over `threads` threads (a multiple of 32; id 0 is __syncthreads).
__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- bulk copies (TMA) -----------------------------------------------------------------------
// A 3-d box of `map` at coordinates (c0 innermost, c1, c2) into shared memory at dst, completing
// on the mbarrier `bar`. Elements outside the tensor arrive as zeros (and count as bytes).
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1,
                                            int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], "
      "[%2];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
// `bytes` (a multiple of 16) contiguous bytes from global src into shared dst, completing on bar.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// Shared src -> the 3-d box of `map` at (c0, c1, c2), as one bulk group (elements outside the
// tensor are not written). The writers of src ran fence_proxy_async() and a barrier before.
__device__ __forceinline__ void tma_store_3d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
// The issuing thread's stores have read their shared memory (it may be overwritten).
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
// The issuing thread's stores are complete.
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Orders this thread's generic shared-memory writes before later async-proxy accesses (wgmma
// operand reads, TMA stores) of the same memory.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// ---- thread block clusters (a launch with cudaLaunchAttributeClusterDimension) ----
// All threads of every block of the cluster: the writes (shared memory included) before it are
// visible to the reads after it anywhere in the cluster.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// This block's rank in its cluster.
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// The shared::cluster address of this block's shared address `addr` in the block of rank `rank`.
__device__ __forceinline__ uint32_t cluster_map(uint32_t addr, uint32_t rank) {
  uint32_t d;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(d) : "r"(addr), "r"(rank));
  return d;
}
// 16 bytes (four floats) at a shared::cluster address (cluster_map).
__device__ __forceinline__ float4 ld_cluster_f32x4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

// ---- wgmma -----------------------------------------------------------------------------------
// Shared-memory matrix descriptor with the 128-byte swizzle (PTX ISA "matrix descriptor").
__device__ __forceinline__ uint64_t gmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}
// K-major tile (rows of 64 values = 128 bytes along K), k16 step kk inside one 64-wide atom.
__device__ __forceinline__ uint64_t desc_k(uint32_t tile, int kk) { return gmma_desc(tile + kk * 32, 16, 1024); }
// MN-major tile (rows of 64 values along M or N, one row per K index), k16 step kk = 16 rows.
__device__ __forceinline__ uint64_t desc_mn(uint32_t tile, int kk) { return gmma_desc(tile + kk * 2048, 8192, 1024); }

// Keeps the compiler from moving accumulator reads / writes across a wgmma boundary.
__device__ __forceinline__ void fence_acc(float (&d)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D (64 x 64 fp32) = [D +] A B, 16-bit operands (FP16: f16, else bf16) from shared memory;
// kTransA / kTransB: the operand is MN-major (see desc_mn). accumulate == 0: D = A B.
template <bool FP16, int kTransA, int kTransB>
__device__ __forceinline__ void wgmma_64x64x16(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
#define KCP_WGMMA_64x64x16(TY)                                                                                      \
  asm volatile(                                                                                                     \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                                  \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                                       \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                    \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                           \
      "%32, %33, p, 1, 1, %35, %36;\n}\n"                                                                           \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),      \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),     \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                   \
      : "l"(da), "l"(db), "r"(accumulate), "n"(kTransA), "n"(kTransB))
  if constexpr (FP16)
    KCP_WGMMA_64x64x16("f16");
  else
    KCP_WGMMA_64x64x16("bf16");
#undef KCP_WGMMA_64x64x16
}
// D (64 x 64 fp32) = [D +] A B with A from registers: the thread's four 32-bit words of the
// 64 x 16 A slice in the accumulator's fragment order (a[0]: row frag_row(t, 0), cols 2 (t % 4)
// +0/1; a[1]: that row + 8; a[2], a[3]: the same rows, cols + 8; the lower column in the lower
// half), so an m64nN accumulator's k16 column slice converts to it element by element (the
// registers must not change until the wgmma has completed). B from shared memory as above.
template <bool FP16, int kTransB>
__device__ __forceinline__ void wgmma_64x64x16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int accumulate) {
#define KCP_WGMMA_64x64x16_RS(TY)                                                                                   \
  asm volatile(                                                                                                     \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                                  \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                                       \
      " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                                    \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "                           \
      "{%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"                                                               \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),      \
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),     \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                   \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate), "n"(kTransB))
  if constexpr (FP16)
    KCP_WGMMA_64x64x16_RS("f16");
  else
    KCP_WGMMA_64x64x16_RS("bf16");
#undef KCP_WGMMA_64x64x16_RS
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// Waits until at most N committed groups are pending (the older ones are complete).
template <int N>
__device__ __forceinline__ void wgmma_wait_n() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// Byte offset of element (r, c), c < 64, in a tile of 128-byte rows with the 128-byte swizzle.
__device__ __forceinline__ uint32_t swz(int r, int c) {
  return uint32_t(r * 128 + ((((c >> 3) ^ (r & 7))) << 4) + (c & 7) * 2);
}

// One atom: 64 rows of 64 16-bit values (128-byte rows, swizzled), 8 KiB; a wider tile is atoms
// side by side (columns [64 a, 64 a + 64) in atom a).
inline constexpr int kAtomBytes = 64 * 128;

// The 32-bit word of values (c, c + 1), c even and >= 0, of row r of a tile of atoms.
__device__ __forceinline__ uint32_t* swz_word(unsigned char* tile, int r, int c) {
  return reinterpret_cast<uint32_t*>(tile + (c >> 6) * kAtomBytes + swz(r, c & 63));
}

// Four 8 x 8 16-bit matrices, transposed, between shared memory and the fragment order: lanes
// 8 i .. 8 i + 7 give the 16-byte row addresses of stored matrix i; register i of lane l holds
// the stored (rows 2 (l % 4) and +1, column l / 4), the lower row in the lower half, i.e. the
// transposed matrix's (row l / 4, columns 2 (l % 4), +1): an accumulator pair of the transpose.
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void stsm_x4_trans(uint32_t addr, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r[0]),
               "r"(r[1]), "r"(r[2]), "r"(r[3])
               : "memory");
}

// Accumulator fragment of m64nN (thread t of the warpgroup): element e sits at (row, col).
__device__ __forceinline__ int frag_row(int t, int e) { return 16 * (t / 32) + (t % 32) / 4 + 8 * ((e >> 1) & 1); }
__device__ __forceinline__ int frag_col(int t, int e) { return 8 * (e >> 2) + 2 * (t % 4) + (e & 1); }

// ---- host: tensor maps -----------------------------------------------------------------------
// cuTensorMapEncodeTiled through the runtime's driver entry point (no libcuda link); null when
// the driver has none.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A 16-bit tensor of dims {d0 (contiguous), d1, d2} (no padding) and a box {b0, b1, b2}, with the
// 128-byte swizzle (b0 = 64) or another (SWIZZLE_NONE: the box packed row after row). Returns the driver's result; the
// map is written on success.
inline CUresult make_map_16bit(CUtensorMap* m, CUtensorMapDataType dt, void* ptr, uint64_t d0, uint64_t d1, uint64_t d2,
                               uint32_t b0, uint32_t b1, uint32_t b2,
                               CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return CUDA_ERROR_NOT_SUPPORTED;
  const cuuint64_t dims[3] = {d0, d1, d2};
  const cuuint64_t strides[2] = {d0 * 2, d0 * d1 * 2};
  const cuuint32_t box[3] = {b0, b1, b2}, es[3] = {1, 1, 1};
  return encode(m, dt, 3, ptr, dims, strides, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

}  // namespace kcp::hopper
