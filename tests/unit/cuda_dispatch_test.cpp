// The CUDA launchers' dispatch (kernels/cuda/dispatch.h, host-only): every (dtype, K, V) of the
// one supported list (K and V each 64 or 128) reaches the launcher template with those parameters,
// and anything else throws naming the supported list, without calling the launcher.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include "kernels/cuda/dispatch.h"

namespace kk = kcp::kernels;
namespace kc = kcp::kernels::cuda;

namespace {

struct TagBf16 {};
struct TagFp16 {};

kk::Problem problem(kk::DType dt, int K, int V) {
  kk::Problem p;
  p.dtype = dt;
  p.K = K;
  p.V = V;
  return p;
}

// The instantiation dispatch_dtype_dims picks, as "bf16/64/128" (dtype/K/V); "" when it throws.
std::string picked(const kk::Problem& p, std::string* error = nullptr) {
  std::string got;
  try {
    kc::dispatch_dtype_dims<TagBf16, TagFp16>(p, [&](auto dt, auto k, auto v) {
      using DT = typename decltype(dt)::type;
      got = std::string(std::is_same_v<DT, TagBf16> ? "bf16" : "fp16") + "/" + std::to_string(decltype(k)::value) +
            "/" + std::to_string(decltype(v)::value);
    });
  } catch (const std::invalid_argument& e) {
    if (error) *error = e.what();
    return got.empty() ? "" : "called before throwing";
  }
  return got;
}

TEST(CudaDispatch, EverySupportedPairReachesItsInstantiation) {
  for (const char* dt : {"bf16", "fp16"}) {
    const kk::DType d = std::string(dt) == "bf16" ? kk::DType::BF16 : kk::DType::FP16;
    for (int K : {64, 128})
      for (int V : {64, 128})
        EXPECT_EQ(picked(problem(d, K, V)), std::string(dt) + "/" + std::to_string(K) + "/" + std::to_string(V));
  }
}

TEST(CudaDispatch, UnsupportedHeadDimsThrowNamingTheList) {
  const std::string list = "(supported (K, V): (64, 64), (64, 128), (128, 64), (128, 128))";
  std::string err;
  EXPECT_EQ(picked(problem(kk::DType::BF16, 96, 96), &err), "");
  EXPECT_EQ(err, "kcp kernels: cuda: unsupported head dims K=96, V=96 " + list);
  EXPECT_EQ(picked(problem(kk::DType::FP16, 256, 256), &err), "");
  EXPECT_EQ(err, "kcp kernels: cuda: unsupported head dims K=256, V=256 " + list);
  EXPECT_EQ(picked(problem(kk::DType::BF16, 96, 64), &err), "");  // K outside, V inside
  EXPECT_EQ(err, "kcp kernels: cuda: unsupported head dims K=96, V=64 " + list);
  EXPECT_EQ(picked(problem(kk::DType::FP16, 128, 32), &err), "");  // K inside, V outside
  EXPECT_EQ(err, "kcp kernels: cuda: unsupported head dims K=128, V=32 " + list);
}

TEST(CudaDispatch, TheListIsOneList) {
  EXPECT_EQ(kc::SupportedHeadDims::text(), "(64, 64), (64, 128), (128, 64), (128, 128)");
  EXPECT_EQ(kc::SupportedHeadDims::size, 4);
  for (int K : {64, 128})
    for (int V : {64, 128}) EXPECT_TRUE(kc::SupportedHeadDims::contains(K, V)) << K << " " << V;
  EXPECT_FALSE(kc::SupportedHeadDims::contains(96, 96));
  EXPECT_FALSE(kc::SupportedHeadDims::contains(64, 96));
  EXPECT_FALSE(kc::SupportedHeadDims::contains(256, 128));
}

}  // namespace
