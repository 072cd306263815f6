// Shared pieces of the CUDA platform tests: a host bf16 rounding that matches the device's, a
// fixture that skips without a GPU, typed uploads and downloads, and tolerance checks.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "autopar/device/cuda_platform.h"
#include "kernels/init.h"

namespace autopar::device {

// Test names read "f32" / "bf16" instead of the enum's bytes.
inline void PrintTo(DType dtype, std::ostream* os) { *os << DTypeName(dtype); }

}  // namespace autopar::device

namespace autopar::device::cuda_test {

// float -> bf16 bits, rounding to nearest even like __float2bfloat16_rn; NaN stays a quiet NaN.
inline std::uint16_t ToBf16Bits(float value) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>(bits >> 16);
}

inline float FromBf16Bits(std::uint16_t half) {
  const std::uint32_t bits = std::uint32_t{half} << 16;
  float value = 0.0f;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline float RoundBf16(float value) { return FromBf16Bits(ToBf16Bits(value)); }

// The values a tensor of `dtype` holds after storing `v`.
inline std::vector<float> Stored(DType dtype, std::vector<float> v) {
  if (dtype == DType::kBF16) {
    for (float& x : v) x = RoundBf16(x);
  }
  return v;
}

inline std::vector<float> Random(std::uint64_t seed, std::int64_t n, float scale = 1.0f,
                                 float shift = 0.0f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = shift + scale * kernels::ref::HashUniform(seed, i);
  }
  return v;
}

template <typename T>
std::vector<double> ToDouble(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// |actual - expected| <= rtol * |expected| + atol * max|expected| elementwise; infinities must
// match exactly and NaN expects NaN. Reports the first failing element.
inline ::testing::AssertionResult Close(const std::vector<float>& actual,
                                        const std::vector<double>& expected, double rtol,
                                        double atol) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " vs expected " << expected.size();
  }
  double scale = 0.0;
  for (double e : expected) {
    if (std::isfinite(e)) scale = std::max(scale, std::abs(e));
  }
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i];
    const double e = expected[i];
    const bool ok = std::isnan(e)   ? std::isnan(a)
                    : std::isinf(e) ? a == e
                                    : std::abs(a - e) <= rtol * std::abs(e) + atol * scale;
    if (!ok) {
      return ::testing::AssertionFailure() << "element " << i << ": " << a << " vs expected " << e
                                           << " (max |expected| " << scale << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// Tolerances by storage: f32 checks the index math tightly (float vs double accumulation only);
// bf16 allows the rounding of inputs already applied on both sides plus the output's.
struct Tolerance {
  double rtol;
  double atol;
};
inline Tolerance TolFor(DType dtype, double f32 = 2e-5, double bf16 = 2e-2) {
  return dtype == DType::kBF16 ? Tolerance{bf16, bf16} : Tolerance{f32, f32};
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
    CudaPlatformOptions options;
    options.device_index = 0;
    options.memory_budget_bytes = kBudgetBytes;
    options.timeout_s = 60.0;
    StatusOr<std::unique_ptr<Platform>> platform = MakeCudaPlatform(options);
    ASSERT_TRUE(platform.ok()) << platform.status().ToString();
    platform_ = std::move(platform).value();
  }
  void TearDown() override {
    buffers_.clear();  // before the device that owns them
    platform_.reset();
  }

  Device& dev() { return platform_->device(); }

  // A device tensor of `dtype` (f32 or bf16) holding `host`, rounded when bf16.
  Tensor Put(DType dtype, const std::vector<float>& host) {
    StatusOr<Buffer> buf = dev().Allocate(static_cast<std::int64_t>(host.size()), dtype);
    EXPECT_TRUE(buf.ok()) << buf.status().ToString();
    if (!buf.ok()) return Tensor{};
    buffers_.push_back(std::move(buf).value());
    const Tensor t = buffers_.back().tensor();
    if (dtype == DType::kBF16) {
      std::vector<std::uint16_t> bits(host.size());
      for (std::size_t i = 0; i < host.size(); ++i) bits[i] = ToBf16Bits(host[i]);
      EXPECT_TRUE(dev().CopyFromHost(t, bits.data(), bits.size() * 2).ok());
    } else {
      EXPECT_TRUE(dev().Upload(t, host).ok());
    }
    return t;
  }
  Tensor PutI32(const std::vector<std::int32_t>& host) {
    StatusOr<Buffer> buf = dev().Allocate(static_cast<std::int64_t>(host.size()), DType::kI32);
    EXPECT_TRUE(buf.ok());
    if (!buf.ok()) return Tensor{};
    buffers_.push_back(std::move(buf).value());
    EXPECT_TRUE(dev().Upload(buffers_.back().tensor(), host).ok());
    return buffers_.back().tensor();
  }
  Tensor Zeros(DType dtype, std::int64_t n) {
    return Put(dtype, std::vector<float>(static_cast<std::size_t>(n), 0.0f));
  }
  // Contents of an f32 or bf16 tensor as floats.
  std::vector<float> Get(Tensor t) {
    std::vector<float> host(static_cast<std::size_t>(t.numel));
    if (t.dtype == DType::kBF16) {
      std::vector<std::uint16_t> bits(host.size());
      const Status s = dev().CopyToHost(bits.data(), t, bits.size() * 2);
      EXPECT_TRUE(s.ok()) << s.ToString();
      for (std::size_t i = 0; i < host.size(); ++i) host[i] = FromBf16Bits(bits[i]);
    } else {
      const Status s = dev().CopyToHost(host.data(), t, host.size() * sizeof(float));
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    return host;
  }

  static constexpr std::size_t kBudgetBytes = std::size_t{4} << 30;
  std::unique_ptr<Platform> platform_;
  std::vector<Buffer> buffers_;
};

// Runs a TEST_P once per storage type.
class CudaTypedTest : public CudaTest, public ::testing::WithParamInterface<DType> {};

inline std::string DTypeParamName(const ::testing::TestParamInfo<DType>& param_info) {
  return DTypeName(param_info.param);
}

}  // namespace autopar::device::cuda_test
