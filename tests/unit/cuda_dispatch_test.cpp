// The CUDA launchers' dispatch (kernels/cuda/dispatch.h, host-only): every (dtype, K) of the one
// supported list reaches the launcher template with those parameters, and anything else throws
// naming the supported list, without calling the launcher.
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

// The instantiation dispatch_dtype_kdim picks, as "bf16/64" etc.; "" when it throws.
std::string picked(const kk::Problem& p, std::string* error = nullptr) {
  std::string got;
  try {
    kc::dispatch_dtype_kdim<TagBf16, TagFp16>(p, [&](auto dt, auto kdim) {
      using DT = typename decltype(dt)::type;
      got = std::string(std::is_same_v<DT, TagBf16> ? "bf16" : "fp16") + "/" + std::to_string(decltype(kdim)::value);
    });
  } catch (const std::invalid_argument& e) {
    if (error) *error = e.what();
    return got.empty() ? "" : "called before throwing";
  }
  return got;
}

TEST(CudaDispatch, EverySupportedPairReachesItsInstantiation) {
  EXPECT_EQ(picked(problem(kk::DType::BF16, 64, 64)), "bf16/64");
  EXPECT_EQ(picked(problem(kk::DType::BF16, 128, 128)), "bf16/128");
  EXPECT_EQ(picked(problem(kk::DType::FP16, 64, 64)), "fp16/64");
  EXPECT_EQ(picked(problem(kk::DType::FP16, 128, 128)), "fp16/128");
}

TEST(CudaDispatch, UnsupportedHeadDimThrowsNamingTheList) {
  std::string err;
  EXPECT_EQ(picked(problem(kk::DType::BF16, 96, 96), &err), "");
  EXPECT_EQ(err, "kcp kernels: cuda: unsupported head dim K=96 (supported: 64, 128)");
  EXPECT_EQ(picked(problem(kk::DType::FP16, 256, 256), &err), "");
  EXPECT_EQ(err, "kcp kernels: cuda: unsupported head dim K=256 (supported: 64, 128)");
  EXPECT_EQ(picked(problem(kk::DType::BF16, 64, 128), &err), "");
  EXPECT_EQ(err, "kcp kernels: cuda: unsupported head dims K=64, V=128 (the kernels need K = V)");
}

TEST(CudaDispatch, TheListIsOneList) {
  EXPECT_EQ(kc::SupportedHeadDims::text(), "64, 128");
  EXPECT_EQ(kc::SupportedHeadDims::size, 2);
  EXPECT_TRUE(kc::SupportedHeadDims::contains(64));
  EXPECT_TRUE(kc::SupportedHeadDims::contains(128));
  EXPECT_FALSE(kc::SupportedHeadDims::contains(96));
}

}  // namespace
