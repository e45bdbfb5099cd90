// Launchers of the fold chain and of the fill.
#include <algorithm>

#include "kernels/cuda/fold_kernel.cuh"

namespace kcp::kernels::cuda {

void launch_fold(const FoldArgs& a, cudaStream_t st) {
  FoldParams p{};
  p.HV = a.HV;
  p.K = a.K;
  p.V = a.V;
  p.n = a.n;
  p.A = a.A;
  p.A_stride = a.A_stride;
  p.transpose_A = a.transpose_A ? 1 : 0;
  p.b = a.b;
  p.b_stride = a.b_stride;
  p.x0 = a.x0;
  p.states_before = a.states_before;
  p.states_stride = a.states_stride;
  p.x_final = a.x_final;
  p.composed = a.composed;
  p.xtiles = (a.x_final || (a.states_before && a.n > 0)) ? a.V / 32 : 0;
  const int tiles = p.xtiles + (a.composed ? a.K / 32 : 0);
  if (tiles == 0) return;
  const size_t smem = (size_t(a.K) * (a.K + 1) + 2 * size_t(a.K) * 33) * sizeof(float);
  allow_smem(fold_kernel, smem);
  fold_kernel<<<unsigned(a.HV * tiles), 256, smem, st>>>(p);
  KCP_CUDA_LAUNCH_CHECK(st);
}

namespace {
template <class T>
void fill(T* dst, T value, int64_t n, cudaStream_t st) {
  if (n <= 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 4096);
  fill_kernel<T><<<unsigned(blocks), 256, 0, st>>>(dst, value, n);
  KCP_CUDA_LAUNCH_CHECK(st);
}
}  // namespace

void launch_fill(float* dst, float value, int64_t n, cudaStream_t st) { fill(dst, value, n, st); }
void launch_fill(uint16_t* dst, uint16_t value, int64_t n, cudaStream_t st) { fill(dst, value, n, st); }

}  // namespace kcp::kernels::cuda
