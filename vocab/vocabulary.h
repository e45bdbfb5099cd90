// The words of kcpbench that every layer shares (docs/design.md 1), defined once: the operator,
// the gate form, the input dtype, the package and the saved set. Each enum has one name table;
// to_string() and the row loader's parser read it, so a name is spelled in one place only.
// Header-only, C++17 (nvcc compiles it), no dependencies: reference/, kernels/ and core/ all
// include it (target kcp_vocab); beside it only vocab/parallel_for.h, the one thread loop of every
// layer.
#pragma once

#include <cstdint>
#include <cstring>
#include <utility>

namespace kcp {

enum class Op : int32_t { Gdn = 0, Kda = 1 };

// How the per-token natural-log decay a_t (<= 0) is formed from the gate input g
// (docs/algorithm.md 1.2):
//   Direct:     a = g
//   Softplus:   a = -exp(A_log[j]) * softplus(g + dt_bias)   (GDN dt_bias[j]; KDA dt_bias[j, d])
//   LowerBound: a = lb * sigmoid(exp(A_log[j]) * (g + dt_bias)), or lb * sigmoid(g + dt_bias)
//               without A_log (KDA only)
// dt_bias is optional (zero when absent) for both raw forms.
enum class GateForm : int32_t { Direct = 0, Softplus = 1, LowerBound = 2 };

// Input dtype: every input tensor holds values of this type; every tensor the kernels "store in
// the input dtype" (normalized q/k, Phi, W, U, h, v_new, dh, dv2, o, dq/dk/dv) is rounded to it.
enum class DType : int32_t { BF16 = 0, FP16 = 1 };

// det: fixed-order reductions, bitwise reproducible. nondet: reductions may use atomics.
enum class Package : int32_t { Det = 0, Nondet = 1 };

// full: the forward also keeps each segment's transfer plane M_seg^T and segment entry states.
// light: only prep outputs and the first piece's incoming state; the backward recomputes.
enum class SavedKind : int32_t { Full = 0, Light = 1 };

template <class E>
using NameTable = std::pair<const char*, E>;

inline constexpr NameTable<Op> kOpNames[] = {{"gdn", Op::Gdn}, {"kda", Op::Kda}};
inline constexpr NameTable<GateForm> kGateFormNames[] = {
    {"direct", GateForm::Direct}, {"softplus", GateForm::Softplus}, {"lower_bound", GateForm::LowerBound}};
inline constexpr NameTable<DType> kDTypeNames[] = {{"bf16", DType::BF16}, {"fp16", DType::FP16}};
inline constexpr NameTable<Package> kPackageNames[] = {{"det", Package::Det}, {"nondet", Package::Nondet}};
inline constexpr NameTable<SavedKind> kSavedKindNames[] = {{"full", SavedKind::Full}, {"light", SavedKind::Light}};

// The name of v in its table ("?" for a value outside the enum's list).
template <class E, size_t N>
const char* name_in(const NameTable<E> (&table)[N], E v) {
  for (const auto& [name, value] : table)
    if (value == v) return name;
  return "?";
}
// The value named `name` in the table; false when there is none.
template <class E, size_t N>
bool value_in(const NameTable<E> (&table)[N], const char* name, E& out) {
  for (const auto& [n, value] : table)
    if (std::strcmp(n, name) == 0) {
      out = value;
      return true;
    }
  return false;
}

inline const char* to_string(Op v) { return name_in(kOpNames, v); }
inline const char* to_string(GateForm v) { return name_in(kGateFormNames, v); }
inline const char* to_string(DType v) { return name_in(kDTypeNames, v); }
inline const char* to_string(Package v) { return name_in(kPackageNames, v); }
inline const char* to_string(SavedKind v) { return name_in(kSavedKindNames, v); }

}  // namespace kcp
