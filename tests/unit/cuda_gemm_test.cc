// cuBLAS GEMMs of the CUDA device against a naive row-major product: every transpose, padded
// leading dimensions, strided batches, beta (including beta = 0 over NaN garbage), k = 0, and C
// in f32 or the input storage. Skipped without a GPU.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "tests/unit/cuda_test_util.h"

namespace autopar::device {
namespace {

using cuda_test::Close;
using cuda_test::CudaTypedTest;
using cuda_test::Random;
using cuda_test::Stored;

std::vector<double> NaiveGemm(const GemmDesc& d, const std::vector<float>& a,
                              const std::vector<float>& b, const std::vector<float>& c0) {
  std::vector<double> c(c0.begin(), c0.end());
  for (std::int64_t bt = 0; bt < d.batch; ++bt) {
    for (std::int64_t i = 0; i < d.m; ++i) {
      for (std::int64_t j = 0; j < d.n; ++j) {
        double acc = 0.0;
        for (std::int64_t l = 0; l < d.k; ++l) {
          const double av =
              d.trans_a ? a[bt * d.stride_a + l * d.lda + i] : a[bt * d.stride_a + i * d.lda + l];
          const double bv =
              d.trans_b ? b[bt * d.stride_b + j * d.ldb + l] : b[bt * d.stride_b + l * d.ldb + j];
          acc += av * bv;
        }
        double& out = c[bt * d.stride_c + i * d.ldc + j];
        out = d.alpha * acc + (d.beta == 0.0f ? 0.0 : d.beta * out);
      }
    }
  }
  return c;
}

class CudaGemm : public CudaTypedTest {
 protected:
  // Runs one GEMM with explicit leading dimensions and strides; C starts as `c_init`.
  void Check(GemmDesc d, DType c_dtype, float c_init_nan, const std::string& what) {
    const DType dt = GetParam();
    const std::int64_t a_rows = d.trans_a ? d.k : d.m, a_cols = d.trans_a ? d.m : d.k;
    const std::int64_t b_rows = d.trans_b ? d.n : d.k, b_cols = d.trans_b ? d.k : d.n;
    d.lda = a_cols + 3;
    d.ldb = b_cols + 1;
    d.ldc = d.n + 2;
    d.stride_a = a_rows * d.lda + 5;
    d.stride_b = b_rows * d.ldb + 7;
    d.stride_c = d.m * d.ldc + 1;
    const std::vector<float> a = Stored(dt, Random(1, d.stride_a * d.batch));
    const std::vector<float> b = Stored(dt, Random(2, d.stride_b * d.batch));
    std::vector<float> c0 = Stored(c_dtype, Random(3, d.stride_c * d.batch));
    if (std::isnan(c_init_nan)) c0.assign(c0.size(), c_init_nan);
    const Tensor ta = Put(dt, a), tb = Put(dt, b), tc = Put(c_dtype, c0);
    const Status s = dev().Gemm(d, ta, tb, tc);
    ASSERT_TRUE(s.ok()) << what << ": " << s.ToString();
    std::vector<float> c_for_ref = c0;
    if (d.beta == 0.0f) c_for_ref.assign(c0.size(), 0.0f);  // not read
    std::vector<double> want = NaiveGemm(d, a, b, c_for_ref);
    // Elements between the rows and batches are not C's: they must be untouched.
    for (std::size_t i = 0; i < want.size(); ++i) {
      const std::int64_t in_batch = static_cast<std::int64_t>(i) % d.stride_c;
      const bool inside = in_batch < d.m * d.ldc && in_batch % d.ldc < d.n;
      if (!inside) want[i] = c0[i];
    }
    const double tol = c_dtype == DType::kBF16 ? 1e-2 : 3e-5;
    EXPECT_TRUE(Close(Get(tc), want, tol, tol)) << what;
  }
};

TEST_P(CudaGemm, AllTransposesPaddingBatchesAndBetas) {
  for (const DType c_dtype : {DType::kF32, GetParam()}) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        for (const std::int64_t batch : {1, 3}) {
          GemmDesc d;
          d.trans_a = ta;
          d.trans_b = tb;
          d.m = 37;
          d.n = 45;
          d.k = 70;
          d.batch = batch;
          d.alpha = 0.75f;
          d.beta = 1.5f;
          const std::string what = std::string("c=") + DTypeName(c_dtype) +
                                   " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                                   " batch=" + std::to_string(batch);
          Check(d, c_dtype, 0.0f, what + " beta=1.5");
          d.beta = 0.0f;
          Check(d, c_dtype, std::numeric_limits<float>::quiet_NaN(), what + " beta=0 over NaN");
        }
      }
    }
  }
}

TEST_P(CudaGemm, EmptyInnerDimensionScalesC) {
  GemmDesc d;
  d.m = 4;
  d.n = 6;
  d.k = 0;
  d.beta = 0.5f;
  d.batch = 2;
  Check(d, DType::kF32, 0.0f, "k=0 beta=0.5");
  d.beta = 0.0f;
  Check(d, DType::kF32, std::numeric_limits<float>::quiet_NaN(), "k=0 beta=0 over NaN");
}

TEST_P(CudaGemm, RejectsMismatchedViews) {
  const DType dt = GetParam();
  GemmDesc d;
  d.m = 8;
  d.n = 8;
  d.k = 8;
  const Tensor a = Zeros(dt, 64), small = Zeros(dt, 63), c = Zeros(DType::kF32, 64);
  EXPECT_EQ(dev().Gemm(d, a, small, c).outcome(), Outcome::kInvalid);
  const Tensor ints = PutI32(std::vector<std::int32_t>(64, 0));
  EXPECT_EQ(dev().Gemm(d, a, ints, c).outcome(), Outcome::kInvalid);
  EXPECT_EQ(dev().Gemm(d, ints, ints, c).outcome(), Outcome::kInvalid);
}

// A wait still pending at the device's deadline (the trial's, Device::SetDeadline) gives up as
// kTimeout however long its own bound; with the deadline lifted the same wait completes.
using CudaDeadline = cuda_test::CudaTest;
TEST_F(CudaDeadline, AWaitEndsAtTheTrialsDeadline) {
  GemmDesc d;
  d.m = d.n = d.k = 4096;  // ~0.14 TFLOP: milliseconds of work still queued when the wait starts
  const Tensor a = Zeros(DType::kBF16, std::int64_t{4096} * 4096);
  const Tensor b = Zeros(DType::kBF16, std::int64_t{4096} * 4096);
  const Tensor c = Zeros(DType::kBF16, std::int64_t{4096} * 4096);
  ASSERT_TRUE(dev().Synchronize().ok());
  dev().SetDeadline(std::chrono::steady_clock::now() - std::chrono::seconds(1));
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(dev().Gemm(d, a, b, c).ok());
  const Status late = dev().Synchronize();
  EXPECT_EQ(late.outcome(), Outcome::kTimeout) << late.ToString();
  EXPECT_NE(late.message().find("trial's deadline"), std::string::npos) << late.ToString();
  dev().SetDeadline(std::chrono::steady_clock::time_point::max());
  const Status done = dev().Synchronize();
  EXPECT_TRUE(done.ok()) << done.ToString();
}

INSTANTIATE_TEST_SUITE_P(Storage, CudaGemm, ::testing::Values(DType::kF32, DType::kBF16),
                         cuda_test::DTypeParamName);

}  // namespace
}  // namespace autopar::device
