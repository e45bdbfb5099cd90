// The one list of head dims (K, V) the CUDA kernels are instantiated for, and the one dispatch
// from a Problem's (dtype, K, V) to a launcher template. Every launcher of kernels/cuda/*.cu runs
//   dispatch_dtype_dims<Bf16, Fp16>(problem, [&](auto dt, auto k, auto v) {
//     run<typename decltype(dt)::type, decltype(k)::value, decltype(v)::value>(...);
//   });
// (a launcher whose kernels read no value-sized tensor ignores v), and CudaBackend::can_implement
// reads the same list (SupportedHeadDims), so a (K, V) pair is either instantiated and accepted or
// refused by both, never silently run with other head dims.
// Host-only C++17 without CUDA types (the dtype tags are template parameters), so tests/unit can
// include it without nvcc.
#pragma once

#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/api/problem.h"

namespace kcp::kernels::cuda {

// One instantiated pair of head dims: q, k [T, H, K], v [T, HV, V], state [HV, K, V].
template <int K_, int V_>
struct HeadDims {
  static constexpr int K = K_, V = V_;
};

// The instantiated pairs, one entry each.
template <class... Pairs>
struct HeadDimList {
  static constexpr int size = int(sizeof...(Pairs));
  static constexpr bool contains(int k, int v) { return ((k == Pairs::K && v == Pairs::V) || ...); }
  static constexpr int max_k() {
    int m = 0;
    ((m = Pairs::K > m ? Pairs::K : m), ...);
    return m;
  }
  // "(64, 64), (64, 128)"
  static std::string text() {
    std::string s;
    auto add = [&s](int k, int v) {
      s += s.empty() ? "(" : ", (";
      s += std::to_string(k);
      s += ", ";
      s += std::to_string(v);
      s += ")";
    };
    (add(Pairs::K, Pairs::V), ...);
    return s;
  }
};
// K and V each 64 or 128, independently.
using SupportedHeadDims = HeadDimList<HeadDims<64, 64>, HeadDims<64, 128>, HeadDims<128, 64>, HeadDims<128, 128>>;

template <class T>
struct TypeTag {
  using type = T;
};

namespace detail {
template <class DT, class F, class P0, class... Ps>
void dispatch_dims(int K, int V, F& f, HeadDimList<P0, Ps...>) {
  if (K == P0::K && V == P0::V) {
    f(TypeTag<DT>{}, std::integral_constant<int, P0::K>{}, std::integral_constant<int, P0::V>{});
  } else if constexpr (sizeof...(Ps) > 0) {
    dispatch_dims<DT>(K, V, f, HeadDimList<Ps...>{});
  } else {
    throw std::invalid_argument("kcp kernels: cuda: unsupported head dims K=" + std::to_string(K) +
                                ", V=" + std::to_string(V) + " (supported (K, V): " + SupportedHeadDims::text() + ")");
  }
}
}  // namespace detail

// f(TypeTag<DT>, std::integral_constant<int, K>, std::integral_constant<int, V>) for the
// problem's dtype (BF16 -> BF16T, FP16 -> FP16T) and head dims. Throws std::invalid_argument
// "... unsupported head dims K=96, V=64 (supported (K, V): (64, 64), ...)" for a pair outside the
// list. Nothing is launched on a throw.
template <class BF16T, class FP16T, class F>
void dispatch_dtype_dims(const Problem& p, F&& f) {
  if (p.dtype == DType::FP16)
    detail::dispatch_dims<FP16T>(p.K, p.V, f, SupportedHeadDims{});
  else if (p.dtype == DType::BF16)
    detail::dispatch_dims<BF16T>(p.K, p.V, f, SupportedHeadDims{});
  else
    throw std::invalid_argument("kcp kernels: cuda: unsupported dtype " + std::to_string(int(p.dtype)));
}

}  // namespace kcp::kernels::cuda
