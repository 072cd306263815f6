// CPU GEMM against a naive triple loop: transposes, leading dimensions, batches, beta semantics.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "autopar/device/platform.h"
#include "kernels/init.h"
#include "tests/unit/device_test_util.h"

namespace autopar::device {
namespace {

using DeviceGemm = test_util::CpuDeviceTest;

std::vector<float> Random(std::uint64_t seed, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = kernels::ref::HashUniform(seed, i);
  return v;
}

// The definition of GemmDesc, one element at a time, in double.
std::vector<float> NaiveGemm(const GemmDesc& d, const std::vector<float>& a,
                             const std::vector<float>& b, std::vector<float> c) {
  for (std::int64_t p = 0; p < d.batch; ++p) {
    for (std::int64_t i = 0; i < d.m; ++i) {
      for (std::int64_t j = 0; j < d.n; ++j) {
        double acc = 0.0;
        for (std::int64_t l = 0; l < d.k; ++l) {
          const float av =
              d.trans_a ? a[p * d.stride_a + l * d.lda + i] : a[p * d.stride_a + i * d.lda + l];
          const float bv =
              d.trans_b ? b[p * d.stride_b + j * d.ldb + l] : b[p * d.stride_b + l * d.ldb + j];
          acc += double{av} * double{bv};
        }
        float& cv = c[p * d.stride_c + i * d.ldc + j];
        cv = static_cast<float>(d.alpha * acc + (d.beta == 0.0f ? 0.0 : d.beta * double{cv}));
      }
    }
  }
  return c;
}

TEST_F(DeviceGemm, AllTransposesWithPaddedLeadingDimensionsAndBatches) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      GemmDesc d;
      d.trans_a = ta;
      d.trans_b = tb;
      d.m = 5;
      d.n = 7;
      d.k = 3;
      d.alpha = 0.5f;
      d.beta = 2.0f;
      d.lda = (ta ? d.m : d.k) + 2;
      d.ldb = (tb ? d.k : d.n) + 1;
      d.ldc = d.n + 3;
      d.batch = 3;
      d.stride_a = (ta ? d.k : d.m) * d.lda + 4;
      d.stride_b = (tb ? d.n : d.k) * d.ldb;
      d.stride_c = d.m * d.ldc + 1;
      const std::vector<float> a = Random(1, d.batch * d.stride_a);
      const std::vector<float> b = Random(2, d.batch * d.stride_b);
      const std::vector<float> c = Random(3, d.batch * d.stride_c);
      const Tensor ta_dev = Put(a), tb_dev = Put(b), tc_dev = Put(c);
      ASSERT_TRUE(dev().Gemm(d, ta_dev, tb_dev, tc_dev).ok());
      const std::vector<float> expected = NaiveGemm(d, a, b, c);
      const std::vector<float> actual = Get(tc_dev);
      for (std::size_t i = 0; i < expected.size(); ++i) {
        ASSERT_NEAR(actual[i], expected[i], 1e-5) << "ta=" << ta << " tb=" << tb << " i=" << i;
      }
    }
  }
}

TEST_F(DeviceGemm, BetaZeroIgnoresGarbageInC) {
  GemmDesc d;
  d.m = 2;
  d.n = 2;
  d.k = 2;
  const Tensor a = Put({1, 2, 3, 4}), b = Put({1, 0, 0, 1});
  const Tensor c = Put(std::vector<float>(4, std::numeric_limits<float>::quiet_NaN()));
  ASSERT_TRUE(dev().Gemm(d, a, b, c).ok());
  EXPECT_EQ(Get(c), (std::vector<float>{1, 2, 3, 4}));
}

TEST_F(DeviceGemm, RejectsViewsTooSmallAndWrongDtypes) {
  GemmDesc d;
  d.m = 4;
  d.n = 4;
  d.k = 4;
  const Tensor a = Put(std::vector<float>(16)), b = Put(std::vector<float>(15));
  const Tensor c = Put(std::vector<float>(16));
  const Status small = dev().Gemm(d, a, b, c);
  EXPECT_EQ(small.outcome(), Outcome::kInvalid);
  EXPECT_NE(small.message().find("`b` has 15 elements, needs 16"), std::string::npos)
      << small.message();
  Tensor as_int = a;
  as_int.dtype = DType::kI32;
  EXPECT_EQ(dev().Gemm(d, as_int, a, c).outcome(), Outcome::kInvalid);
  d.lda = 2;  // shorter than a row of A
  EXPECT_EQ(dev().Gemm(d, a, a, c).outcome(), Outcome::kInvalid);
}

}  // namespace
}  // namespace autopar::device
