// GPU test harness (tests/gpu): comparison helpers and the CUDA backend's 16-bit storage. Case,
// Data, the FP64 reference adapter, the public thresholds, Buf and run_backend (the W-rank
// emulation on any backend) come from tests/kcp/twin_harness.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/api/backend.h"
#include "twin_harness.h"

namespace kcp::test {

// Closeness of two float tensors: rel-RMS and max|a - b| / max|b|; NaN anywhere counts as inf.
struct Diff {
  double rel_rms = 0.0, rel_max = 0.0;
  int64_t bad = 0;  // non-finite in a but finite in b
};
Diff diff(const std::vector<float>& a, const std::vector<float>& b);
// Bitwise equality (NaN patterns included); returns the first differing index or -1.
int64_t first_bit_difference(const std::vector<float>& a, const std::vector<float>& b);

// The "dtype" tensors of a workspace / saved set (DtypeTensor, kernels/api/dtype_tensor.h): the
// CUDA backend stores them as Storage::Packed16 (raw dtype bits, element e at byte 2 e of the
// tensor's region), the twin as Storage::F32. A test that supplies twin values to a CUDA phase
// packs them; one that reads CUDA values back takes packed16() and unpacks them.
struct Region16 {
  const char* name;
  kk::DtypeTensor t;  // the tensor in the workspace / saved set, in the binding backend's storage
  int64_t n;          // elements (Packed16 uses the first ceil(n / 2) floats of the region)
};
std::vector<Region16> cuda_16bit_tensors(const kk::WorkspaceTensors& w, const kk::Problem& p, const kk::LayoutView& L);
std::vector<Region16> cuda_16bit_tensors(const kk::SavedTensors& s, const kk::Problem& p, const kk::LayoutView& L);
// pack16 / unpack16 (twin_harness.h) convert between floats and raw 16-bit dtype values.

// Unit roundoff of the case's dtype (2^-8 bf16, 2^-11 fp16): one ulp at 1.0 is 2u.
double unit_roundoff(const Case& c);

}  // namespace kcp::test
