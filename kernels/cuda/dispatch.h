// The one list of head dims the CUDA kernels are instantiated for, and the one dispatch from a
// Problem's (dtype, K, V) to a launcher template. Every launcher of kernels/cuda/gdn_*.cu runs
//   dispatch_dtype_kdim<Bf16, Fp16>(problem, [&](auto dt, auto kdim) {
//     run<typename decltype(dt)::type, decltype(kdim)::value>(...);
//   });
// and CudaBackend::can_implement reads the same list (SupportedHeadDims), so a head dim is
// either instantiated and accepted or refused by both, never silently run with another K.
// Host-only C++17 without CUDA types (the dtype tags are template parameters), so tests/unit can
// include it without nvcc.
#pragma once

#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/api/problem.h"

namespace kcp::kernels::cuda {

// K = V for every kernel; one entry per instantiated head dim, ascending.
template <int... Ks>
struct HeadDimList {
  static constexpr int size = int(sizeof...(Ks));
  static constexpr bool contains(int k) { return ((k == Ks) || ...); }
  // "64, 128"
  static std::string text() {
    std::string s;
    ((s += (s.empty() ? "" : ", ") + std::to_string(Ks)), ...);
    return s;
  }
};
using SupportedHeadDims = HeadDimList<64, 128>;

template <class T>
struct TypeTag {
  using type = T;
};

namespace detail {
template <class DT, class F, int K0, int... Ks>
void dispatch_kdim(int K, F& f, HeadDimList<K0, Ks...>) {
  if (K == K0) {
    f(TypeTag<DT>{}, std::integral_constant<int, K0>{});
  } else if constexpr (sizeof...(Ks) > 0) {
    dispatch_kdim<DT>(K, f, HeadDimList<Ks...>{});
  } else {
    throw std::invalid_argument("kcp kernels: cuda: unsupported head dim K=" + std::to_string(K) +
                                " (supported: " + SupportedHeadDims::text() + ")");
  }
}
}  // namespace detail

// f(TypeTag<DT>, std::integral_constant<int, K>) for the problem's dtype (BF16 -> BF16T, FP16 ->
// FP16T) and K. Throws std::invalid_argument "... unsupported head dim K=96 (supported: 64, 128)"
// for a K outside the list and "... unsupported head dims K=64, V=128 (the kernels need K = V)"
// when V differs from K. Nothing is launched on a throw.
template <class BF16T, class FP16T, class F>
void dispatch_dtype_kdim(const Problem& p, F&& f) {
  if (p.V != p.K)
    throw std::invalid_argument("kcp kernels: cuda: unsupported head dims K=" + std::to_string(p.K) +
                                ", V=" + std::to_string(p.V) + " (the kernels need K = V)");
  if (p.dtype == DType::FP16)
    detail::dispatch_kdim<FP16T>(p.K, f, SupportedHeadDims{});
  else if (p.dtype == DType::BF16)
    detail::dispatch_kdim<BF16T>(p.K, f, SupportedHeadDims{});
  else
    throw std::invalid_argument("kcp kernels: cuda: unsupported dtype " + std::to_string(int(p.dtype)));
}

}  // namespace kcp::kernels::cuda
