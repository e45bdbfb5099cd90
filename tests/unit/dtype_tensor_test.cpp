// The typed "dtype" tensors of the saved set and the workspace (kernels/api/dtype_tensor.h,
// tensors.h): the accessor of the other storage throws, null is null in every storage, at()
// steps by the storage's element size, and bind_saved / bind_workspace tag every dtype tensor
// with the storage they are given (and only those ten) without moving any tensor. The caller
// tensors' 16-bit patterns: exact conversions and DtypeArray.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/kcp/device_array.h"
#include "kernels/api/dtype_tensor.h"
#include "kernels/api/layout.h"
#include "kernels/api/numeric.h"
#include "kernels/api/tensors.h"
#include "kernels/cpu/cpu_backend.h"

namespace kk = kcp::kernels;

namespace {

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no std::invalid_argument)";
}

TEST(DtypeTensor, ReadingPacked16AsF32Throws) {
  uint16_t raw[4] = {0x3f80, 0x4000, 0, 0};
  const kk::DtypeTensor t = kk::DtypeTensor::of_packed16(raw);
  EXPECT_EQ(t.storage(), kk::Storage::Packed16);
  EXPECT_EQ(t.packed16(), raw);
  EXPECT_EQ(message_of([&] { (void)t.f32(); }), "kcp kernels: dtype tensor stored as packed16 read as f32");
  const kk::ConstDtypeTensor c = t;  // the read-only view keeps the storage
  EXPECT_EQ(c.storage(), kk::Storage::Packed16);
  EXPECT_THROW((void)c.f32(), std::invalid_argument);
}

TEST(DtypeTensor, ReadingF32AsPacked16Throws) {
  float x[2] = {1.0f, 2.0f};
  const kk::DtypeTensor t = kk::DtypeTensor::of_f32(x);
  EXPECT_EQ(t.f32(), x);
  EXPECT_EQ(message_of([&] { (void)t.packed16(); }), "kcp kernels: dtype tensor stored as f32 read as packed16");
}

TEST(DtypeTensor, NullIsNullInEveryStorage) {
  const kk::DtypeTensor a;  // default: null, F32
  EXPECT_FALSE(a);
  EXPECT_EQ(a.f32(), nullptr);
  EXPECT_EQ(a.packed16(), nullptr);
  const kk::DtypeTensor b(nullptr, kk::Storage::Packed16);
  EXPECT_EQ(b.f32(), nullptr);
  EXPECT_FALSE(b.at(100));
}

TEST(DtypeTensor, AtStepsByTheStorageElement) {
  std::vector<float> f(8);
  EXPECT_EQ(kk::DtypeTensor::of_f32(f.data()).at(3).f32(), f.data() + 3);
  std::vector<uint16_t> h(8);
  const kk::ConstDtypeTensor c = kk::ConstDtypeTensor::of_packed16(h.data());
  EXPECT_EQ(c.at(5).packed16(), h.data() + 5);
  EXPECT_EQ(c.at(5).storage(), kk::Storage::Packed16);
}

// H = 2, HV = 4, K = 64, the given V.
kk::Problem small_problem(kk::Op op, int V) {
  kk::Problem p;
  p.op = op;
  p.H = 2;
  p.HV = 4;
  p.K = 64;
  p.V = V;
  return p;
}

// What a full saved set keeps (W, U, kg, seg_Mt, seg_entry) is in the workspace of a light run
// instead: each kind's saved set and workspace together hold the same floats.
TEST(DtypeTensor, FullKeepsInItsSavedSetWhatLightKeepsInItsWorkspace) {
  for (kk::Op op : {kk::Op::Gdn, kk::Op::Kda}) {
    const kk::Problem p = small_problem(op, 128);
    const kk::RankLayout L = kk::RankLayout::even({200}, 2);
    const kk::LayoutView lv = L.view();
    const kk::SavedSizes sf = kk::saved_sizes(p, lv, kk::SavedKind::Full),
                         sl = kk::saved_sizes(p, lv, kk::SavedKind::Light);
    const kk::WorkspaceSizes wf = kk::workspace_sizes(p, lv, kk::SavedKind::Full),
                             wl = kk::workspace_sizes(p, lv, kk::SavedKind::Light);
    EXPECT_EQ(sf.W, 200 * 4 * 64);
    EXPECT_EQ(sf.U, 200 * 4 * 128);
    EXPECT_EQ(sf.kg, op == kk::Op::Kda ? 200 * 4 * 64 : 0);
    EXPECT_EQ(sl.W + sl.U + sl.kg + sl.seg_Mt + sl.seg_entry, 0);
    EXPECT_EQ(wf.W + wf.U + wf.kg + wf.seg_Mt + wf.seg_entry, 0);
    EXPECT_EQ(wl.W, sf.W);
    EXPECT_EQ(wl.U, sf.U);
    EXPECT_EQ(wl.kg, sf.kg);
    EXPECT_EQ(wl.seg_Mt, sf.seg_Mt);
    EXPECT_EQ(wl.seg_entry, sf.seg_entry);
    EXPECT_EQ(sf.total_floats() + wf.total_floats(), sl.total_floats() + wl.total_floats());
  }
}

// bind_saved / bind_workspace: the dtype tensors carry the declared storage at the same
// addresses in both storages (sizes do not depend on it).
TEST(DtypeTensor, BindGivesTheDeclaredStorage) {
  const kk::Problem p = small_problem(kk::Op::Gdn, 64);
  const kk::RankLayout L = kk::RankLayout::even({200}, 1);
  const kk::LayoutView lv = L.view();
  const int64_t sn = kk::saved_sizes(p, lv, kk::SavedKind::Full).total_floats();
  const int64_t wn = kk::workspace_sizes(p, lv, kk::SavedKind::Light).total_floats();
  std::vector<float> sa(size_t(sn) + 16), wa(size_t(wn) + 16);
  for (kk::Storage st : {kk::Storage::F32, kk::Storage::Packed16}) {
    const kk::SavedTensors s = kk::bind_saved(sa.data(), sn, p, lv, kk::SavedKind::Full, kk::Package::Det, st);
    const kk::SavedTensors s32 = kk::bind_saved(sa.data(), sn, p, lv, kk::SavedKind::Full, kk::Package::Det);
    for (const kk::DtypeTensor* t : {&s.q, &s.k, &s.Phi, &s.W, &s.U}) {
      ASSERT_TRUE(*t);
      EXPECT_EQ(t->storage(), st);
    }
    EXPECT_EQ(s.Phi.address(), s32.Phi.address());
    EXPECT_EQ(s32.Phi.storage(), kk::Storage::F32);  // the default is the CPU twin's
    const kk::WorkspaceTensors w =
        kk::bind_workspace(wa.data(), wn, p, lv, kk::SavedKind::Light, kk::Package::Det, 0, st);
    for (const kk::DtypeTensor* t : {&w.W, &w.U, &w.h, &w.v_new, &w.dv_local, &w.dh, &w.dv2}) {
      ASSERT_TRUE(*t);
      EXPECT_EQ(t->storage(), st);
    }
    if (st == kk::Storage::Packed16) {
      EXPECT_THROW((void)w.h.f32(), std::invalid_argument);
      EXPECT_NE(w.h.packed16(), nullptr);
    }
  }
}

}  // namespace

// ---- 16-bit patterns of the caller tensors (kernels/api/numeric.h, core/kcp/device_array.h) ----

// Every pattern decodes to a value that encodes back to the same pattern (NaN to a NaN), and the
// pattern of a float is the pattern of its round_to value: the conversions the twin and
// FormBuffers use are exact on dtype values and round like the twin.
TEST(Dtype16, PatternsRoundTripAndRoundLikeRoundTo) {
  for (kcp::RoundTo rt : {kcp::RoundTo::BF16, kcp::RoundTo::FP16}) {
    for (uint32_t b = 0; b < 0x10000u; ++b) {
      const float x = kcp::dtype16_value(uint16_t(b), rt);
      if (x != x) {
        const float y = kcp::dtype16_value(kcp::dtype16_bits(x, rt), rt);
        EXPECT_NE(y, y) << std::hex << b;
        continue;
      }
      EXPECT_EQ(kcp::dtype16_bits(x, rt), b) << std::hex << b;
    }
    uint32_t s = 12345u;
    for (int i = 0; i < 100000; ++i) {
      s = s * 1664525u + 1013904223u;
      float x;
      const uint32_t u = (s & 0x8fffffffu) | 0x30000000u;  // magnitudes around 2^-31 .. 2^33
      std::memcpy(&x, &u, 4);
      const float r = kcp::round_to(x, rt), back = kcp::dtype16_value(kcp::dtype16_bits(x, rt), rt);
      EXPECT_EQ(std::memcmp(&r, &back, 4), 0) << x;
    }
    const float nan = kcp::dtype16_value(kcp::nan16(rt), rt);
    EXPECT_NE(nan, nan);
  }
  EXPECT_EQ(kcp::kNaNBf16, 0x7FC0u);
  EXPECT_EQ(kcp::kNaNFp16, 0x7E00u);
}

// A caller tensor in the twin's memory: 16-bit patterns in half the bytes, values kept exactly,
// NaN poison as the dtype's NaN pattern; the exact-storage twin keeps floats; a value the dtype
// cannot hold is refused on upload.
TEST(Dtype16, DtypeArrayHoldsCallerTensorsAs16Bit) {
  const auto twin = kk::make_cpu_backend();
  const auto exact = kk::make_cpu_backend(kk::CpuStorage::Exact);
  EXPECT_EQ(twin->caller_storage(), kk::Storage::Packed16);
  EXPECT_EQ(exact->caller_storage(), kk::Storage::F32);
  const std::vector<float> x = {1.0f, -2.5f, 0.0f, 65504.0f, 3.0e-5f, 0.09375f, -0.0f};
  for (kk::DType dt : {kk::DType::BF16, kk::DType::FP16}) {
    std::vector<float> v(x.size());
    for (size_t i = 0; i < x.size(); ++i) v[i] = kcp::round_to(x[i], kk::rounding_of(dt));
    const kcp::DtypeArray a(*twin, v, dt), f(*exact, v, dt);
    EXPECT_EQ(a.tensor().storage(), kk::Storage::Packed16);
    EXPECT_EQ(f.tensor().storage(), kk::Storage::F32);
    EXPECT_EQ(a.bytes(), 16) << "7 16-bit elements in 4 floats";
    EXPECT_EQ(f.bytes(), 28);
    const std::vector<float> back = a.to_host(), fb = f.to_host();
    EXPECT_EQ(std::memcmp(back.data(), v.data(), v.size() * 4), 0);
    EXPECT_EQ(std::memcmp(fb.data(), v.data(), v.size() * 4), 0);
    a.poison();
    EXPECT_EQ(a.tensor().packed16()[3], kcp::nan16(kk::rounding_of(dt)));
    for (float y : a.to_host()) EXPECT_NE(y, y);
  }
  EXPECT_NE(message_of([&] {
              kcp::DtypeArray(*twin, std::vector<float>{1.0f, 1.0f + 1.0f / 4096}, kk::DType::BF16);
            }).find("element 1"),
            std::string::npos);
}
