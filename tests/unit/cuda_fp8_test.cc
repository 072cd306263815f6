// FP8 GEMMs through cuBLASLt on GPUs with fp8 (compute capability 8.9+), against an fp32 host
// product with the error bound of the formats: each operand is rounded to e4m3 (3 mantissa bits:
// relative error at most 2^-4) or e5m2 (2 bits: 2^-3) after scaling, so every term of the sum is
// off by at most about (1 + e_a)(1 + e_b) - 1 of its magnitude. Skips without such a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "src/device/cuda/cuda_device.h"
#include "tests/unit/cuda_test_util.h"

namespace autopar::device {
namespace {

using cuda_test::Random;

float RelativeError(Fp8Operand f) { return f == Fp8Operand::kE5M2 ? 0.125f : 0.0625f; }

class CudaFp8Gemm : public cuda_test::CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    if (!dev().SupportsFp8()) GTEST_SKIP() << dev().name() << " has no fp8";
  }

  // C = alpha op(A) op(B) + beta C on the device in fp8 and on the host in fp32, compared with
  // the fp8 bound plus the output's rounding.
  // `weight`: b is a weight (GemmDesc::fp8_b_is_weight), its copy kept by the device.
  void Check(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
             Fp8Operand fa, Fp8Operand fb, DType c_dtype, float beta, bool weight = false) {
    const std::vector<float> a = Random(11, m * k, 2.0f, -1.0f);
    const std::vector<float> b = Random(12, k * n, 2.0f, -1.0f);
    const std::vector<float> c0 = Random(13, m * n, 2.0f, -1.0f);
    const std::vector<float> a_s = cuda_test::Stored(DType::kBF16, a);
    const std::vector<float> b_s = cuda_test::Stored(DType::kBF16, b);
    const std::vector<float> c_s = cuda_test::Stored(c_dtype, c0);
    GemmDesc d;
    d.trans_a = trans_a;
    d.trans_b = trans_b;
    d.m = m;
    d.n = n;
    d.k = k;
    d.beta = beta;
    d.fp8_a = fa;
    d.fp8_b = fb;
    d.fp8_b_is_weight = weight;
    const Tensor ta = Put(DType::kBF16, a), tb = Put(DType::kBF16, b), tc = Put(c_dtype, c0);
    const Status s = dev().Gemm(d, ta, tb, tc);
    ASSERT_TRUE(s.ok()) << s.ToString();
    const std::vector<float> got = Get(tc);
    const float term_error = (1 + RelativeError(fa)) * (1 + RelativeError(fb)) - 1;
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double want = beta * c_s[i * n + j], magnitude = 0;
        for (std::int64_t p = 0; p < k; ++p) {
          const float av = trans_a ? a_s[p * m + i] : a_s[i * k + p];
          const float bv = trans_b ? b_s[j * k + p] : b_s[p * n + j];
          want += double{av} * bv;
          magnitude += std::fabs(double{av} * bv);
        }
        const double out_rounding = c_dtype == DType::kBF16 ? std::fabs(want) / 256 : 0;
        const double bound = term_error * magnitude + out_rounding + 1e-5;
        ASSERT_NEAR(got[i * n + j], want, bound) << "at (" << i << ", " << j << ")";
      }
    }
  }
};

TEST_F(CudaFp8Gemm, LinearForwardInE4M3) {
  Check(false, true, 64, 48, 32, Fp8Operand::kE4M3, Fp8Operand::kE4M3, DType::kBF16, 0.0f);
  Check(false, true, 64, 48, 32, Fp8Operand::kE4M3, Fp8Operand::kE4M3, DType::kBF16, 0.0f, true);
}

TEST_F(CudaFp8Gemm, InputGradientWithE5M2Gradients) {
  Check(false, false, 64, 32, 48, Fp8Operand::kE5M2, Fp8Operand::kE4M3, DType::kBF16, 0.0f);
  Check(false, false, 64, 32, 48, Fp8Operand::kE5M2, Fp8Operand::kE4M3, DType::kBF16, 0.0f, true);
}

// A weight is quantized once per orientation and the copy reused until WeightsChanged, as
// Transformer Engine reuses a step's first micro-batch's FP8 weights: a GEMM after the weight
// changed without it still sees the old copy; after it, the new weight.
TEST_F(CudaFp8Gemm, AWeightIsQuantizedOncePerStep) {
  auto& cuda = static_cast<CudaDevice&>(dev());
  const std::int64_t m = 64, n = 48, k = 32;
  const std::vector<float> x = Random(21, m * k, 2.0f, -1.0f), w = Random(22, n * k, 2.0f, -1.0f);
  const Tensor tx = Put(DType::kBF16, x), tw = Put(DType::kBF16, w);
  const Tensor ty = Zeros(DType::kBF16, m * n);
  GemmDesc fwd;  // y = x W^T
  fwd.trans_b = true;
  fwd.m = m;
  fwd.n = n;
  fwd.k = k;
  fwd.fp8_a = fwd.fp8_b = Fp8Operand::kE4M3;
  fwd.fp8_b_is_weight = true;
  ASSERT_TRUE(dev().Gemm(fwd, tx, tw, ty).ok());
  const std::vector<float> first = Get(ty);
  EXPECT_EQ(cuda.fp8_weight_copies(), 1u);

  ASSERT_TRUE(dev().Scale(tw, 2.0f).ok());  // exact in bf16
  ASSERT_TRUE(dev().Gemm(fwd, tx, tw, ty).ok());
  EXPECT_EQ(Get(ty), first) << "the step's copy, made before the weight changed";
  EXPECT_EQ(cuda.fp8_weight_copies(), 1u);

  GemmDesc dgrad = fwd;  // the input gradient's view of the same weight: its transpose
  dgrad.trans_b = false;
  dgrad.n = k;
  dgrad.k = n;
  dgrad.fp8_fast_accumulate = false;
  const Tensor tdy = Put(DType::kBF16, Random(23, m * n, 2.0f, -1.0f));
  const Tensor tdx = Zeros(DType::kBF16, m * k);
  ASSERT_TRUE(dev().Gemm(dgrad, tdy, tw, tdx).ok());
  EXPECT_EQ(cuda.fp8_weight_copies(), 2u) << "one copy per orientation";

  dev().WeightsChanged();
  EXPECT_EQ(cuda.fp8_weight_copies(), 0u);
  ASSERT_TRUE(dev().Gemm(fwd, tx, tw, ty).ok());
  // Twice the weight: twice the amax, half the scale, the same fp8 codes: exactly twice.
  const std::vector<float> second = Get(ty);
  for (std::size_t i = 0; i < first.size(); ++i) ASSERT_EQ(second[i], 2 * first[i]) << i;
  ASSERT_TRUE(dev().ReleaseCachedMemory().ok());
  EXPECT_EQ(cuda.fp8_weight_copies(), 0u);
}

TEST_F(CudaFp8Gemm, WeightGradientAccumulatesIntoF32) {
  Check(true, false, 48, 32, 64, Fp8Operand::kE5M2, Fp8Operand::kE4M3, DType::kF32, 1.0f);
}

// The quantized operands and cuBLASLt's workspace are one device buffer of the budget (TE's are
// PyTorch tensors), kept between GEMMs and freed between trials.
TEST_F(CudaFp8Gemm, WorkspaceIsInTheBudgetUntilReleased) {
  const std::size_t before = dev().bytes_in_use();
  Check(false, true, 64, 48, 32, Fp8Operand::kE4M3, Fp8Operand::kE4M3, DType::kBF16, 0.0f);
  const std::size_t with_workspace = dev().bytes_in_use();
  // The three operands Check put on the device, then at least cuBLASLt's 32 MiB.
  const std::size_t operands = std::size_t{64 * 32 + 48 * 32 + 64 * 48} * 2;
  EXPECT_GE(with_workspace, before + operands + (std::size_t{32} << 20));
  const Status released = dev().ReleaseCachedMemory();
  ASSERT_TRUE(released.ok()) << released.ToString();
  EXPECT_EQ(dev().bytes_in_use(), before + operands);
}

TEST_F(CudaFp8Gemm, RefusesShapesCublasLtCannotRun) {
  GemmDesc d;
  d.trans_b = true;
  d.m = 64;
  d.n = 48;
  d.k = 40;  // not a multiple of 16
  d.fp8_a = d.fp8_b = Fp8Operand::kE4M3;
  const Tensor a = Zeros(DType::kBF16, std::int64_t{64} * 40),
               b = Zeros(DType::kBF16, std::int64_t{48} * 40);
  const Tensor c = Zeros(DType::kBF16, std::int64_t{64} * 48);
  const Status s = dev().Gemm(d, a, b, c);
  EXPECT_EQ(s.outcome(), Outcome::kInvalid) << s.ToString();
  EXPECT_NE(s.message().find("--fp8-format"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace autopar::device
