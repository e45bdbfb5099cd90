// The element type of the "dtype" tensors: a pointer that says how its elements are stored, so
// nobody reads 16-bit patterns through a float*.
//
// Eleven tensors of the saved set and the workspace hold values already rounded to problem.dtype
// (bf16 or fp16): saved q, k, Phi; workspace W, U, kg (KDA), h, dh, v_new, dv2, dv_local. A backend
// chooses how it stores them (Backend::dtype_storage()). The eight caller tensors q, k, v, dO,
// o, dq, dk, dv (tensors.h) are dtype tensors too, stored as Backend::caller_storage(): Packed16
// on every backend but the calibration's exact-storage twin (F32). The storages:
//   Storage::F32       one float per element (the CPU twin's saved set and workspace): the float
//                      value of the dtype number;
//   Storage::Packed16  one raw 16-bit dtype pattern per element, element e at byte 2 e of the
//                      tensor's region (the CUDA backend; docs/perf-notes.md v5, v6; every
//                      backend's caller tensors). A carved region is still the one tensors.h
//                      carves in floats; the tensor uses its first half.
// bind_saved / bind_workspace record the storage in every DtypeTensor they carve; the typed
// accessors refuse the other storage: f32() of a Packed16 tensor and packed16() of an F32 one
// throw std::invalid_argument. A null tensor is null in every storage (both accessors give
// nullptr). The Args checks (args_check.h) refuse a tensor of another storage than the
// backend's before any phase runs.
// Host-only, header-only, C++17 (nvcc compiles the CUDA backend's host code with it).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace kcp::kernels {

enum class Storage : int32_t { F32 = 0, Packed16 = 1 };
inline const char* to_string(Storage s) { return s == Storage::F32 ? "f32" : "packed16"; }
inline constexpr int64_t storage_bytes(Storage s) { return s == Storage::F32 ? 4 : 2; }
// The storages of a backend's phases: `dtype` of the eleven saved / workspace dtype tensors
// (Backend::dtype_storage()), `caller` of the eight caller tensors (Backend::caller_storage()).
struct PhaseStorage {
  Storage dtype;
  Storage caller;
};

template <bool kConst>
class BasicDtypeTensor {
 public:
  using Bytes = std::conditional_t<kConst, const void, void>;
  using F32 = std::conditional_t<kConst, const float, float>;
  using U16 = std::conditional_t<kConst, const uint16_t, uint16_t>;

  BasicDtypeTensor() = default;
  BasicDtypeTensor(Bytes* address, Storage storage) : address_(address), storage_(storage) {}
  // A mutable tensor passes where a read-only one is expected (e.g. saved.k into WyArgs::k).
  template <bool C = kConst, class = std::enable_if_t<C>>
  BasicDtypeTensor(const BasicDtypeTensor<false>& o) : address_(o.address()), storage_(o.storage()) {}

  static BasicDtypeTensor of_f32(F32* p) { return BasicDtypeTensor(p, Storage::F32); }
  static BasicDtypeTensor of_packed16(U16* p) { return BasicDtypeTensor(p, Storage::Packed16); }

  Storage storage() const { return storage_; }
  // The start of the region, untyped (null checks, byte copies); never an element pointer.
  Bytes* address() const { return address_; }
  explicit operator bool() const { return address_ != nullptr; }

  // The elements as floats; throws std::invalid_argument when they are stored as 16-bit.
  F32* f32() const {
    if (address_ && storage_ != Storage::F32) refuse("f32");
    return static_cast<F32*>(address_);
  }
  // The elements as raw 16-bit dtype patterns; throws std::invalid_argument when stored as f32.
  U16* packed16() const {
    if (address_ && storage_ != Storage::Packed16) refuse("packed16");
    return static_cast<U16*>(address_);
  }
  // The tensor starting `elements` elements further on, in the same storage (null stays null).
  BasicDtypeTensor at(int64_t elements) const {
    if (!address_) return *this;
    using Byte = std::conditional_t<kConst, const char, char>;
    return BasicDtypeTensor(static_cast<Byte*>(address_) + elements * storage_bytes(storage_), storage_);
  }

 private:
  [[noreturn]] void refuse(const char* want) const {
    throw std::invalid_argument(std::string("kcp kernels: dtype tensor stored as ") + to_string(storage_) +
                                " read as " + want);
  }
  Bytes* address_ = nullptr;
  Storage storage_ = Storage::F32;
};

using DtypeTensor = BasicDtypeTensor<false>;      // written by a phase
using ConstDtypeTensor = BasicDtypeTensor<true>;  // read by a phase

}  // namespace kcp::kernels
