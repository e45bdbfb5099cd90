// GDN prep kernels (docs/algorithm.md 1.2, 1.3, F0-F2). Included only by gdn_prep.cu.
//
// prep_qk_kernel: grid (ceil(T*H / 8), 2): one warp per (token, q/k head) row, blockIdx.y picks
//   q or k, read as 16-bit patterns (caller storage). L2 norm in fp32 (sum of squares by a warp
//   reduction), stored rounded to dtype in the CUDA-internal 16-bit storage (cuda_backend.cu),
//   rstd fp32; without L2 norm a plain copy.
// gdn_intra_kernel: grid NT * HV, block (chunk n, value head j) = (b / HV, b % HV), 256 threads.
//   Gate activation in fp32, chunk-local inclusive cumsum by one thread in token order (the
//   twin's order), times kRcpLn2; K K^T on tensor cores (dtype k, fp32 accumulation); Pi gated
//   in fp32 with masked entries selected as 0 (docs/algorithm.md 7.1); Phi = (I + Pi)^-1 by the 16x16
//   block method of F2 in fp32 (diagonal blocks by forward substitution, a half-warp per block
//   column; then the block merges, 2 x 2 elements per thread); Phi stored rounded to dtype
//   (16-bit storage) with zeros above the diagonal and beyond the chunk. Each Phi element sums
//   the twin's terms in the twin's order, whichever thread computes it (the same bits).
//   Shared memory: k 64 x (K+8) 16-bit (by cp.async, in flight with the gate loads: one memory
//   round trip), Pi and Phi 64 x 65 fp32 (Phi over the k tile, which is dead by then), merge
//   scratch 3 x 16 x 16, activations / cumsum / beta 64 fp32 each.
#pragma once

#include "kernels/cuda/cuda_common.cuh"

namespace kcp::kernels::cuda {

struct PrepQkParams {
  const uint16_t* x[2];  // q, k: [T, H, K] dtype, 16-bit (caller storage)
  uint16_t* y[2];        // q_out, k_out: [T, H, K] dtype, 16-bit storage
  float* rstd[2];        // [T, H] fp32 (l2norm only)
  int64_t rows;          // T * H
  int l2norm;
};

template <class DT, int K>
__global__ void __launch_bounds__(256) prep_qk_kernel(PrepQkParams p) {
  const int64_t row = int64_t(blockIdx.x) * 8 + warp_id();
  if (row >= p.rows) return;
  const bool kside = blockIdx.y != 0;  // (selects, not indexes, the parameter arrays)
  const uint16_t* x = (kside ? p.x[1] : p.x[0]) + row * K;
  uint16_t* y = (kside ? p.y[1] : p.y[0]) + row * K;
  constexpr int E = K / 32;  // 2 or 4 values per lane
  float v[E];
  if constexpr (E == 4) {
    const uint2 f = __ldg(reinterpret_cast<const uint2*>(x) + lane_id());
    v[0] = DT::from_raw(uint16_t(f.x & 0xffffu));
    v[1] = DT::from_raw(uint16_t(f.x >> 16));
    v[2] = DT::from_raw(uint16_t(f.y & 0xffffu));
    v[3] = DT::from_raw(uint16_t(f.y >> 16));
  } else {
    const uint32_t f = __ldg(reinterpret_cast<const unsigned int*>(x) + lane_id());
    v[0] = DT::from_raw(uint16_t(f & 0xffffu));
    v[1] = DT::from_raw(uint16_t(f >> 16));
  }
  if (p.l2norm) {
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) ss += v[e] * v[e];
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss + kL2NormEps);
#pragma unroll
    for (int e = 0; e < E; ++e) v[e] = DT::rnd(v[e] * r);
    if (lane_id() == 0) (kside ? p.rstd[1] : p.rstd[0])[row] = r;
  }
  if constexpr (E == 4)
    reinterpret_cast<uint2*>(y)[lane_id()] = make_uint2(DT::pack(v[0], v[1]), DT::pack(v[2], v[3]));
  else
    reinterpret_cast<uint32_t*>(y)[lane_id()] = DT::pack(v[0], v[1]);
}

struct IntraParams {
  Shape sh;
  const ChunkDesc* chunks;
  const uint16_t* k;     // [T, H, K] dtype: k after prep, 16-bit storage
  const float* g;        // GDN [T, HV], KDA [T, HV, K] gate input
  const float* beta;     // [T, HV]
  const float* A_log;    // [HV] or null
  const float* dt_bias;  // GDN [HV], KDA [HV, K], or null
  int gate;              // GateForm
  float* gcum;           // GDN [T, HV], KDA [T, HV, K] fp32, log2 units
  uint16_t* Phi;         // [T, HV, 64] dtype, 16-bit storage
};

// The parameters from the phase's Args (host); the KDA intra kernel's extend them
// (kda_prep_kernel.cuh).
inline IntraParams intra_params(const PrepArgs& a, const DevLayout& L) {
  const Problem& pb = a.ctx.problem;
  IntraParams p{};
  p.sh = shape_of(pb, L);
  p.chunks = L.chunks;
  p.k = a.k_out.packed16();
  p.g = a.g;
  p.beta = a.beta;
  p.A_log = pb.has_A_log ? a.A_log : nullptr;
  p.dt_bias = pb.has_dt_bias ? a.dt_bias : nullptr;
  p.gate = int(pb.gate);
  p.gcum = a.gcum;
  p.Phi = a.Phi.packed16();
  return p;
}

// Natural-log decay of one gate element (docs/algorithm.md 1.2), fp32, GDN forms.
__device__ __forceinline__ float gdn_activate(int gate, float graw, float A_log, float bias) {
  if (gate == int(GateForm::Softplus)) return -expf(A_log) * softplus_f(graw + bias);
  return graw;
}

inline constexpr int kPiLd = 65;  // row stride of the fp32 Pi / Phi tiles of the inverse

// Phi (fp32) reuses the k tile's bytes: k is read only by K K^T, which every warp finishes before
// the barrier ahead of Pi, and Phi is first written by chunk_inverse_64 after the next one. So the
// block needs 37,888 bytes at K = 128 (54,528 with a tile of its own): six blocks per SM (with the
// 1 KB each reserves, the SM's whole 228 KB; registers capped at 40 by the launch bounds), not four.
template <int K>
struct IntraSmem {
  static constexpr int kLd = K + 8;   // 16-bit k tile
  static constexpr int kPld = kPiLd;  // fp32 Pi / Phi
  static constexpr size_t kKBytes = size_t(kC) * kLd * 2, kPiBytes = size_t(kC) * kPld * 4;
  static constexpr size_t bytes = (kKBytes > kPiBytes ? kKBytes : kPiBytes) + kPiBytes + 3 * 256 * 4 + 3 * kC * 4;
  static_assert(kKBytes % 16 == 0 && kPiBytes % 16 == 0, "16-byte aligned regions");
};

// Rows {0, 8} x columns {0, 8} of a 16-deep product sum_x a[row][x] b[x][col] (fp32, x
// ascending): each loaded value feeds two products (shared-memory reads bound the inverse).
struct Block2x2 {
  float v[2][2];
};
__device__ __forceinline__ Block2x2 product16_2x2(const float* a, int lda, const float* b, int ldb) {
  Block2x2 acc = {{{0.0f, 0.0f}, {0.0f, 0.0f}}};
#pragma unroll
  for (int x = 0; x < 16; ++x) {
    const float a0 = a[x], a1 = a[8 * lda + x], b0 = b[x * ldb], b1 = b[x * ldb + 8];
    acc.v[0][0] += a0 * b0;
    acc.v[0][1] += a0 * b1;
    acc.v[1][0] += a1 * b0;
    acc.v[1][1] += a1 * b1;
  }
  return acc;
}

// F2 (docs/algorithm.md) on one chunk: sPhi = (I + Pi)^-1 in fp32 from the strictly lower
// 64 x 64 fp32 tile sPi (zero outside the chunk's L x L part), both with row stride kPiLd; sTmp:
// 3 x 16 x 16 floats of merge scratch. Called by all kThreads threads after a barrier that
// completes sPi; ends with a barrier. Shared by gdn_intra_kernel and kda_intra_kernel.
__device__ __forceinline__ void chunk_inverse_64(const float* sPi, float* sPhi, float* sTmp) {
  const int tid = threadIdx.x;
  // (a) diagonal 16x16 blocks, X[r][c] = -Pi[r][c] + sum_{m=c+1}^{r-1} (-Pi[r][m]) X[m][c], by
  //     columns: lane r of a half-warp owns row r of one block column; at step m the finished
  //     X[m][c] is shuffled to the later rows, which add their term. Every X[r][c] adds the same
  //     terms in the same order (m ascending) as the row-by-row loop of the twin: the same bits.
  //     Thread (warp w, half h) solves the columns c = w, w + 8 of the blocks h and 2 + h; it
  //     writes whole block columns (1 on the diagonal, 0 above), so sPhi needs no zero fill.
  {
    const int r = lane_id() & 15, h = lane_id() >> 4, w = warp_id();
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f}, pic[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int c = w + 8 * (u >> 1), b = 16 * (2 * (u & 1) + h);
      pic[u] = sPi[(b + r) * kPiLd + b + c];
    }
#pragma unroll
    for (int m = 1; m < 15; ++m) {
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int c = w + 8 * (u >> 1), b = 16 * (2 * (u & 1) + h);
        if (m > c) {  // uniform over the warp
          const float xm = __shfl_sync(0xffffffffu, -pic[u] + sum[u], (h << 4) | m);
          if (r > m) sum[u] += -sPi[(b + r) * kPiLd + b + m] * xm;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int c = w + 8 * (u >> 1), b = 16 * (2 * (u & 1) + h);
      sPhi[(b + r) * kPiLd + b + c] = r == c ? 1.0f : (r > c ? -pic[u] + sum[u] : 0.0f);
    }
  }
  __syncthreads();
  // (b) off-diagonal blocks X_ij = -X_ii (sum_{m=j}^{i-1} Pi_im X_mj), stage by stage:
  //     {(1,0), (2,1), (3,2)}, {(2,0), (3,1)}, {(3,0)}. A thread computes rows {r, r + 8} x
  //     columns {c, c + 8} of a block (product16_2x2), every element with the sums and order of
  //     the one-element form.
  for (int d = 1; d <= 3; ++d) {
    const int nb = 4 - d;  // blocks in this stage: (d + q, q) for q < nb
    const int q = tid / 64, r = (tid % 64) / 8, c = tid % 8;
    const int bi = (d + q) * 16, bj = q * 16;
    if (q < nb) {
      float sum[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
      for (int m = q; m < d + q; ++m) {
        const Block2x2 acc2 =
            product16_2x2(sPi + (bi + r) * kPiLd + m * 16, kPiLd, sPhi + m * 16 * kPiLd + bj + c, kPiLd);
#pragma unroll
        for (int y = 0; y < 4; ++y) sum[y >> 1][y & 1] += acc2.v[y >> 1][y & 1];
      }
#pragma unroll
      for (int y = 0; y < 4; ++y) sTmp[q * 256 + (r + 8 * (y >> 1)) * 16 + c + 8 * (y & 1)] = sum[y >> 1][y & 1];
    }
    __syncthreads();
    if (q < nb) {
      const Block2x2 acc2 = product16_2x2(sPhi + (bi + r) * kPiLd + bi, kPiLd, sTmp + q * 256 + c, 16);
#pragma unroll
      for (int y = 0; y < 4; ++y) sPhi[(bi + r + 8 * (y >> 1)) * kPiLd + bj + c + 8 * (y & 1)] = -acc2.v[y >> 1][y & 1];
    }
    __syncthreads();
  }
}

// Phi rounded to dtype into the 16-bit rows [t0, t0 + L) of value head j ([T, HV, 64]); zero above
// the diagonal and beyond the chunk.
template <class DT>
__device__ __forceinline__ void store_phi(const float* sPhi, uint16_t* Phi, int64_t t0, int L, int j, int HV) {
  const int tid = threadIdx.x;
  // Phi rounded to dtype; zero above the diagonal and beyond the chunk. Pairs of columns.
  for (int e = tid; e < L * (kC / 2); e += kThreads) {
    const int r = e / (kC / 2), s = (e % (kC / 2)) * 2;
    const float p0 = (s <= r && s < L) ? sPhi[r * kPiLd + s] : 0.0f;
    const float p1 = (s + 1 <= r && s + 1 < L) ? sPhi[r * kPiLd + s + 1] : 0.0f;
    st16x2<DT>(Phi + ((t0 + r) * HV + j) * kC + s, p0, p1);
  }
}

template <class DT, int K>
__global__ void __launch_bounds__(kThreads, 6) gdn_intra_kernel(IntraParams p) {
  using Sm = IntraSmem<K>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* sk = reinterpret_cast<uint16_t*>(smem_raw);
  float* sPhi = reinterpret_cast<float*>(smem_raw);  // over sk once K K^T is done (IntraSmem)
  float* sPi = reinterpret_cast<float*>(smem_raw + (Sm::kKBytes > Sm::kPiBytes ? Sm::kKBytes : Sm::kPiBytes));
  float* sTmp = sPi + kC * Sm::kPld;  // 3 x 16 x 16
  float* sA = sTmp + 3 * 256;         // activations
  float* sG = sA + kC;                // cumsum, log2 units
  float* sB = sG + kC;                // beta

  const int HV = p.sh.HV;
  const int64_t n = blockIdx.x / HV;
  const int j = blockIdx.x % HV, i = j / p.sh.G;
  const ChunkDesc ch = p.chunks[n];
  const int L = ch.len;
  const int64_t t0 = ch.begin;
  const int tid = threadIdx.x;

  // One memory round trip: k by cp.async (raw bits, rows beyond the chunk zero-filled), the gate
  // inputs and beta loaded (all before their first use) while it is in flight. Gate: activation
  // per token, then the sequential cumsum (the twin's order).
  cp_async_rows<uint16_t, kC, K>(sk, Sm::kLd, p.k + (t0 * p.sh.H + i) * K, int64_t(p.sh.H) * K, L);
  cp_async_commit();
  if (tid < kC) {
    float a = 0.0f, b = 0.0f;
    if (tid < L) {
      const int64_t at = (t0 + tid) * HV + j;
      const float graw = p.g[at];
      b = p.beta[at];
      const float A_log = p.A_log ? p.A_log[j] : 0.0f;
      const float bias = p.dt_bias ? p.dt_bias[j] : 0.0f;
      a = gdn_activate(p.gate, graw, A_log, bias);
    }
    sA[tid] = a;
    sB[tid] = b;
  }
  cp_async_wait_all();
  __syncthreads();

  // K K^T (64 x 64, k = K) on tensor cores; thread 0 forms the cumsum meanwhile (the products do
  // not need the gates). Activations are zero beyond the chunk, so the loop runs to 64 without
  // changing the partial sums of rows < L; 16 loads are issued before their dependent adds.
  using T64 = Tiling<kC, kC>;
  float acc[T64::MT][T64::NT][4];
  if (tid == 0) {
    float run = 0.0f;
#pragma unroll
    for (int r0 = 0; r0 < kC; r0 += 16) {
      float a[16];
#pragma unroll
      for (int u = 0; u < 16; u += 4) {
        const float4 f = *reinterpret_cast<const float4*>(sA + r0 + u);
        a[u] = f.x;
        a[u + 1] = f.y;
        a[u + 2] = f.z;
        a[u + 3] = f.w;
      }
#pragma unroll
      for (int u = 0; u < 16; ++u) {
        run += a[u];
        sG[r0 + u] = r0 + u < L ? run * kRcpLn2 : 0.0f;
      }
    }
  }
  T64::zero(acc);
  T64::template mma<DT>(acc, AView<uint16_t, true>{sk, Sm::kLd}, BView<uint16_t, true>{sk, Sm::kLd}, 0, K);
  __syncthreads();
  if (tid < L) p.gcum[(t0 + tid) * HV + j] = sG[tid];
  // Pi in fp32.
  T64::each(acc, [&](int r, int s, float& v) {
    sPi[r * Sm::kPld + s] = (s < r && r < L) ? (sB[r] * v) * exp2f(sG[r] - sG[s]) : 0.0f;
  });
  __syncthreads();

  chunk_inverse_64(sPi, sPhi, sTmp);
  store_phi<DT>(sPhi, p.Phi, t0, L, j, HV);
}

}  // namespace kcp::kernels::cuda
