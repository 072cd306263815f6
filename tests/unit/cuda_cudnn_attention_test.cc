// cuDNN's fused attention against the naive double reference (kernels/attention.h) and against the
// CUDA-core kernel: causal and full, GQA 8:1 and 4:1, head_dim 64 and 128, fused-QKV strides, a
// context-parallel pair whose keys precede its queries, the accumulate flag, bf16 through the
// device and f16 through CudnnAttention itself; plus the fallback of an unsupported call and its
// note. Skipped without a GPU or without cuDNN in the build.
#include <cublas_v2.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "src/device/cuda/cuda_device.h"
#include "src/device/cuda/cudnn_attention.h"
#include "tests/unit/cuda_test_util.h"
#include "tests/unit/device_test_util.h"

namespace autopar::device {
namespace {

using cuda_test::Close;
using cuda_test::CudaTest;
using cuda_test::Random;
using cuda_test::Stored;
using cuda_test::ToDouble;
using test_util::Desc;
using test_util::ToShape;

// float <-> IEEE half bits, rounding to nearest even (as __float2half_rn).
std::uint16_t ToHalfBits(float value) {
  std::uint32_t x = 0;
  std::memcpy(&x, &value, sizeof(x));
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t biased = (x >> 23) & 0xffu;
  std::uint32_t mant = x & 0x7fffffu;
  if (biased == 0xffu) return static_cast<std::uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  const int exp = static_cast<int>(biased) - 127 + 15;
  if (exp >= 31) return static_cast<std::uint16_t>(sign | 0x7c00u);
  std::uint32_t shift = 13;
  std::uint32_t base = (static_cast<std::uint32_t>(exp) << 10);
  if (exp <= 0) {  // subnormal half: the implicit bit joins the mantissa
    if (exp < -10) return static_cast<std::uint16_t>(sign);
    mant |= 0x800000u;
    shift = static_cast<std::uint32_t>(14 - exp);
    base = 0;
  }
  std::uint32_t half = base | (mant >> shift);
  const std::uint32_t rem = mant & ((1u << shift) - 1u), mid = 1u << (shift - 1u);
  if (rem > mid || (rem == mid && (half & 1u))) ++half;  // a carry moves into the exponent
  return static_cast<std::uint16_t>(sign | half);
}

float FromHalfBits(std::uint16_t h) {
  const float sign = (h & 0x8000u) ? -1.0f : 1.0f;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0) return sign * std::ldexp(static_cast<float>(mant), -24);
  if (exp == 31)
    return mant ? std::numeric_limits<float>::quiet_NaN()
                : sign * std::numeric_limits<float>::infinity();
  return sign * std::ldexp(static_cast<float>(mant + 1024), exp - 25);
}

std::vector<float> RoundHalf(std::vector<float> v) {
  for (float& x : v) x = FromHalfBits(ToHalfBits(x));
  return v;
}

class CudnnAttentionTest : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
#if !(defined(AUTOPAR_HAVE_CUDNN) && AUTOPAR_HAVE_CUDNN)
    GTEST_SKIP() << "built without cuDNN";
#endif
  }
  CudaDevice& cuda() { return static_cast<CudaDevice&>(dev()); }
};

struct Case {
  const char* name;
  AttentionDesc desc;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class CudnnAttentionBf16 : public CudnnAttentionTest, public ::testing::WithParamInterface<Case> {};

// Forward, backward and accumulate on cuDNN (AUTOPAR_ATTENTION=cudnn: a decline would be an
// error), each against the double reference; then the same forward on the CUDA-core kernel.
TEST_P(CudnnAttentionBf16, MatchesReferenceAndKernel) {
  const DType dt = DType::kBF16;
  const AttentionDesc& d = GetParam().desc;
  const kernels::ref::AttentionShape shape = ToShape(d);
  const std::int64_t nq = d.seq_q * d.batch * shape.resolved_q_stride();
  const std::int64_t nkv = d.seq_kv * d.batch * shape.resolved_kv_stride();
  const std::int64_t no = d.seq_q * d.batch * d.heads_q * d.head_dim;
  const std::int64_t nstat = d.seq_q * d.batch * d.heads_q;
  const std::vector<float> q = Stored(dt, Random(1, nq, 2.0f)),
                           k = Stored(dt, Random(2, nkv, 2.0f));
  const std::vector<float> v = Stored(dt, Random(3, nkv)), dout = Stored(dt, Random(4, no));
  const Tensor tq = Put(dt, q), tk = Put(dt, k), tv = Put(dt, v), tdout = Put(dt, dout);
  const Tensor tout = Zeros(dt, no), tlse = Zeros(DType::kF32, nstat);

  // The loaded cuDNN may be one whose fused attention cudnn-frontend declines for this shape
  // (DecideSdpa's version rules): then that direction is the kernel's, and the case says so.
  const std::int64_t version = CudnnAttention::LibraryVersion();
  if (!DecideSdpa(d, dt, SdpaDirection::kForward, true, false, version).use_cudnn) {
    GTEST_SKIP() << "cuDNN " << version << " is declined for this forward";
  }
  cuda().SetAttentionEngine(AttentionEngine::kCudnn);
  const Status fwd = dev().AttentionForward(d, tq, tk, tv, tout, tlse);
  ASSERT_TRUE(fwd.ok()) << fwd.ToString();
  const std::vector<double> qd = ToDouble(q), kd = ToDouble(k), vd = ToDouble(v);
  std::vector<double> out(no), lse(nstat);
  kernels::ref::AttentionForward(shape, qd.data(), kd.data(), vd.data(), out.data(), lse.data());
  EXPECT_TRUE(Close(Get(tout), out, 2e-2, 2e-2)) << "out";
  EXPECT_TRUE(Close(Get(tlse), lse, 1e-4, 1e-5)) << "lse (natural log, [s, b, h])";
  // The forward is checked either way; a declined backward is the kernel's (its own tests).
  if (!DecideSdpa(d, dt, SdpaDirection::kBackward, true, false, version).use_cudnn) {
    GTEST_SKIP() << "cuDNN " << version << " is declined for this backward (s_kv % 128)";
  }

  const std::vector<double> dev_out = ToDouble(Get(tout)), dev_lse = ToDouble(Get(tlse));
  const std::vector<double> doutd = ToDouble(dout);
  std::vector<double> dq(nq), dk(nkv), dv(nkv);
  kernels::ref::AttentionBackward(shape, qd.data(), kd.data(), vd.data(), dev_out.data(),
                                  doutd.data(), dev_lse.data(), dq.data(), dk.data(), dv.data());
  // Pre-filled gradients: cuDNN writes the head slots; the rest of a fused row stays.
  const std::vector<float> old_dq = Stored(dt, Random(9, nq)), old_dk = Stored(dt, Random(10, nkv));
  const std::vector<float> old_dv = Stored(dt, Random(11, nkv));
  const Tensor tdq = Put(dt, old_dq), tdk = Put(dt, old_dk), tdv = Put(dt, old_dv);
  const Status bwd =
      dev().AttentionBackward(d, tq, tk, tv, tout, tdout, tlse, tdq, tdk, tdv, false);
  ASSERT_TRUE(bwd.ok()) << bwd.ToString();
  const std::int64_t q_used = d.heads_q * d.head_dim, kv_used = d.heads_kv * d.head_dim;
  const std::int64_t q_row = shape.resolved_q_stride(), kv_row = shape.resolved_kv_stride();
  for (std::int64_t i = 0; i < nq; ++i) {
    if (i % q_row >= q_used) dq[i] = old_dq[i];
  }
  for (std::int64_t i = 0; i < nkv; ++i) {
    if (i % kv_row >= kv_used) {
      dk[i] = old_dk[i];
      dv[i] = old_dv[i];
    }
  }
  EXPECT_TRUE(Close(Get(tdq), dq, 3e-2, 3e-2)) << "dq";
  EXPECT_TRUE(Close(Get(tdk), dk, 3e-2, 3e-2)) << "dk";
  EXPECT_TRUE(Close(Get(tdv), dv, 3e-2, 3e-2)) << "dv";

  // accumulate adds the same gradients again, and leaves the rest of a fused row as it was.
  const Status acc = dev().AttentionBackward(d, tq, tk, tv, tout, tdout, tlse, tdq, tdk, tdv, true);
  ASSERT_TRUE(acc.ok()) << acc.ToString();
  for (std::int64_t i = 0; i < nq; ++i) {
    if (i % q_row < q_used) dq[i] *= 2;
  }
  for (std::int64_t i = 0; i < nkv; ++i) {
    if (i % kv_row < kv_used) {
      dk[i] *= 2;
      dv[i] *= 2;
    }
  }
  EXPECT_TRUE(Close(Get(tdq), dq, 3e-2, 3e-2)) << "dq accumulated";
  EXPECT_TRUE(Close(Get(tdk), dk, 3e-2, 3e-2)) << "dk accumulated";
  EXPECT_TRUE(Close(Get(tdv), dv, 3e-2, 3e-2)) << "dv accumulated";
  EXPECT_EQ(dev().AttentionEngineNote(), "") << "every call above ran on cuDNN";

  // The CUDA-core kernel on the same inputs: the two engines agree to bf16 accuracy.
  cuda().SetAttentionEngine(AttentionEngine::kKernel);
  const Tensor kout = Zeros(dt, no), klse = Zeros(DType::kF32, nstat);
  ASSERT_TRUE(dev().AttentionForward(d, tq, tk, tv, kout, klse).ok());
  EXPECT_TRUE(Close(Get(tout), ToDouble(Get(kout)), 2e-2, 2e-2)) << "cuDNN vs kernel out";
  EXPECT_TRUE(Close(Get(tlse), ToDouble(Get(klse)), 1e-4, 1e-5)) << "cuDNN vs kernel lse";
  EXPECT_NE(dev().AttentionEngineNote().find("AUTOPAR_ATTENTION=kernel"), std::string::npos)
      << dev().AttentionEngineNote();
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudnnAttentionBf16,
    ::testing::Values(Case{"causal_mha_d64", Desc(2, 4, 4, 64, 128, 128, true)},
                      Case{"causal_gqa8_d128", Desc(1, 16, 2, 128, 96, 96, true, 256, 256)},
                      Case{"full_gqa4_d64", Desc(2, 8, 2, 64, 80, 112, false)},
                      Case{"cp_pair_keys_before_queries_gqa4_d128",
                           Desc(1, 8, 2, 128, 64, 64, true, 64, 0)},
                      Case{"fused_qkv_causal_gqa4_d64", Desc(2, 8, 2, 64, 64, 64, true, 0, 0, 8)},
                      Case{"causal_more_queries_than_keys_d64", Desc(1, 4, 4, 64, 100, 60, true)}),
    [](const ::testing::TestParamInfo<Case>& param_info) {
      return std::string(param_info.param.name);
    });

// f16 runs through CudnnAttention directly (the device's compute types are bf16 and f32).
class CudnnAttentionF16 : public CudnnAttentionTest, public ::testing::WithParamInterface<Case> {};

TEST_P(CudnnAttentionF16, MatchesReference) {
  const AttentionDesc& desc = GetParam().desc;
  AttentionDesc d = desc;
  d.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
  d.q_stride = d.q_stride ? d.q_stride : d.heads_q * d.head_dim;
  d.kv_stride = d.kv_stride ? d.kv_stride : d.heads_kv * d.head_dim;
  const kernels::ref::AttentionShape shape = ToShape(d);
  const std::int64_t nq = d.seq_q * d.batch * d.q_stride, nkv = d.seq_kv * d.batch * d.kv_stride;
  const std::int64_t no = d.seq_q * d.batch * d.heads_q * d.head_dim;
  const std::int64_t nstat = d.seq_q * d.batch * d.heads_q;

  cublasHandle_t cublas = nullptr;
  ASSERT_EQ(cublasCreate(&cublas), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(cublas, cuda().stream()), CUBLAS_STATUS_SUCCESS);
  {
    StatusOr<std::unique_ptr<CudnnAttention>> made = CudnnAttention::Create(
        cuda().stream(), cublas, [this](std::size_t bytes) { return dev().Allocate(bytes); },
        [this] { return dev().Synchronize(); });
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    CudnnAttention& sdpa = *made.value();

    std::vector<Buffer> keep;
    auto put = [&](const std::vector<float>& host) {
      StatusOr<Buffer> buf = dev().Allocate(static_cast<std::int64_t>(host.size()), DType::kF16);
      EXPECT_TRUE(buf.ok());
      std::vector<std::uint16_t> bits(host.size());
      for (std::size_t i = 0; i < host.size(); ++i) bits[i] = ToHalfBits(host[i]);
      keep.push_back(std::move(buf).value());
      EXPECT_TRUE(dev().CopyFromHost(keep.back().tensor(), bits.data(), bits.size() * 2).ok());
      return keep.back().tensor();
    };
    auto get = [&](Tensor t) {
      std::vector<std::uint16_t> bits(static_cast<std::size_t>(t.numel));
      EXPECT_TRUE(dev().CopyToHost(bits.data(), t, bits.size() * 2).ok());
      std::vector<float> host(bits.size());
      for (std::size_t i = 0; i < bits.size(); ++i) host[i] = FromHalfBits(bits[i]);
      return host;
    };
    const std::vector<float> q = RoundHalf(Random(1, nq, 2.0f)),
                             k = RoundHalf(Random(2, nkv, 2.0f));
    const std::vector<float> v = RoundHalf(Random(3, nkv)), dout = RoundHalf(Random(4, no));
    const Tensor tq = put(q), tk = put(k), tv = put(v), tdout = put(dout);
    const Tensor tout = put(std::vector<float>(no, 0.0f));
    const Tensor tlse = Zeros(DType::kF32, nstat);

    const SdpaDecision fwd = DecideSdpa(d, DType::kF16, SdpaDirection::kForward, true);
    ASSERT_TRUE(fwd.use_cudnn) << fwd.reason;
    StatusOr<CudnnAttention::Attempt> ran =
        sdpa.Forward(fwd.key, d.scale, tq.data, tk.data, tv.data, tout.data, tlse.as<float>());
    ASSERT_TRUE(ran.ok()) << ran.status().ToString();
    ASSERT_TRUE(ran.value().ran) << ran.value().why_not;
    const std::vector<double> qd = ToDouble(q), kd = ToDouble(k), vd = ToDouble(v);
    std::vector<double> out(no), lse(nstat);
    kernels::ref::AttentionForward(shape, qd.data(), kd.data(), vd.data(), out.data(), lse.data());
    EXPECT_TRUE(Close(get(tout), out, 1e-2, 1e-2)) << "out";
    EXPECT_TRUE(Close(Get(tlse), lse, 1e-4, 1e-5)) << "lse";

    const std::vector<double> dev_out = ToDouble(get(tout)), dev_lse = ToDouble(Get(tlse));
    const std::vector<double> doutd = ToDouble(dout);
    std::vector<double> dq(nq), dk(nkv), dv(nkv);
    kernels::ref::AttentionBackward(shape, qd.data(), kd.data(), vd.data(), dev_out.data(),
                                    doutd.data(), dev_lse.data(), dq.data(), dk.data(), dv.data());
    const Tensor tdq = put(std::vector<float>(nq, 0.0f)), tdk = put(std::vector<float>(nkv, 0.0f));
    const Tensor tdv = put(std::vector<float>(nkv, 0.0f));
    const SdpaDecision bwd = DecideSdpa(d, DType::kF16, SdpaDirection::kBackward, true);
    ASSERT_TRUE(bwd.use_cudnn) << bwd.reason;
    ran = sdpa.Backward(bwd.key, d.scale, tq.data, tk.data, tv.data, tout.data, tdout.data,
                        tlse.as<float>(), tdq.data, tdk.data, tdv.data, false);
    ASSERT_TRUE(ran.ok()) << ran.status().ToString();
    ASSERT_TRUE(ran.value().ran) << ran.value().why_not;
    EXPECT_TRUE(Close(get(tdq), dq, 2e-2, 2e-2)) << "dq";
    EXPECT_TRUE(Close(get(tdk), dk, 2e-2, 2e-2)) << "dk";
    EXPECT_TRUE(Close(get(tdv), dv, 2e-2, 2e-2)) << "dv";
    EXPECT_EQ(sdpa.cached_plans(), 2u);
    ASSERT_TRUE(dev().Synchronize().ok());
    keep.clear();
  }  // CudnnAttention (its arena, its handle) before the cuBLAS handle it uses
  EXPECT_EQ(cublasDestroy(cublas), CUBLAS_STATUS_SUCCESS);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudnnAttentionF16,
                         ::testing::Values(Case{"causal_gqa8_d128",
                                                Desc(2, 8, 1, 128, 64, 64, true)},
                                           Case{"full_gqa4_d64", Desc(1, 8, 2, 64, 48, 80, false)}),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           return std::string(param_info.param.name);
                         });

// A causal pair whose keys partly follow its queries is not cuDNN's: it runs on the kernel, right,
// and the device says so; under AUTOPAR_ATTENTION=cudnn it is an error instead.
TEST_F(CudnnAttentionTest, UnsupportedShapeFallsBackAndIsNoted) {
  const DType dt = DType::kBF16;
  const AttentionDesc d = Desc(1, 2, 2, 64, 40, 40, true, 0, 20);  // rows 0..19 see no key
  const kernels::ref::AttentionShape shape = ToShape(d);
  const std::int64_t n = std::int64_t{40} * 2 * 64, nstat = std::int64_t{40} * 2;
  const std::vector<float> q = Stored(dt, Random(1, n)), k = Stored(dt, Random(2, n));
  const std::vector<float> v = Stored(dt, Random(3, n));
  const Tensor tq = Put(dt, q), tk = Put(dt, k), tv = Put(dt, v);
  const Tensor tout = Zeros(dt, n), tlse = Zeros(DType::kF32, nstat);

  cuda().SetAttentionEngine(AttentionEngine::kCudnn);
  EXPECT_EQ(dev().AttentionForward(d, tq, tk, tv, tout, tlse).outcome(), Outcome::kInvalid);

  cuda().SetAttentionEngine(AttentionEngine::kAuto);
  ASSERT_EQ(dev().AttentionEngineNote(), "");
  ASSERT_TRUE(dev().AttentionForward(d, tq, tk, tv, tout, tlse).ok());
  const std::vector<double> qd = ToDouble(q), kd = ToDouble(k), vd = ToDouble(v);
  std::vector<double> out(n), lse(nstat);
  kernels::ref::AttentionForward(shape, qd.data(), kd.data(), vd.data(), out.data(), lse.data());
  EXPECT_TRUE(Close(Get(tout), out, 2e-2, 2e-2));
  EXPECT_TRUE(Close(Get(tlse), lse, 1e-4, 1e-5));
  const std::string note = dev().AttentionEngineNote();
  EXPECT_NE(note.find("1 of 1 calls ran on the CUDA-core kernel"), std::string::npos) << note;
  EXPECT_NE(note.find("partly overlapping"), std::string::npos) << note;

  // A supported call afterwards runs on cuDNN: the count grows, the first reason stays.
  const AttentionDesc ok = Desc(1, 2, 2, 64, 40, 40, true);
  ASSERT_TRUE(dev().AttentionForward(ok, tq, tk, tv, tout, tlse).ok());
  const std::string later = dev().AttentionEngineNote();
  EXPECT_NE(later.find("1 of 2 calls"), std::string::npos) << later;
  EXPECT_NE(later.find("partly overlapping"), std::string::npos) << later;
}

// cuDNN's workspace and temporaries come from the device's budget.
TEST_F(CudnnAttentionTest, ScratchCountsInTheBudget) {
  const DType dt = DType::kBF16;
  const AttentionDesc d = Desc(1, 8, 2, 64, 256, 256, true);
  const std::int64_t nq = std::int64_t{256} * 8 * 64, nkv = std::int64_t{256} * 2 * 64,
                     nstat = std::int64_t{256} * 8;
  const Tensor tq = Put(dt, Random(1, nq)), tk = Put(dt, Random(2, nkv));
  const Tensor tv = Put(dt, Random(3, nkv));
  const Tensor tout = Zeros(dt, nq), tlse = Zeros(DType::kF32, nstat);
  const std::size_t before = dev().bytes_in_use();
  cuda().SetAttentionEngine(AttentionEngine::kCudnn);
  const Status fwd = dev().AttentionForward(d, tq, tk, tv, tout, tlse);
  ASSERT_TRUE(fwd.ok()) << fwd.ToString();
  // At least the stats in cuDNN's layout live in the arena.
  EXPECT_GE(dev().bytes_in_use(), before + static_cast<std::size_t>(nstat) * sizeof(float));
  EXPECT_GE(dev().peak_bytes(), dev().bytes_in_use());
  // Between trials the arena goes (RunTrial reads its baseline after this), so the next trial
  // counts the arena its own shapes need; the next call makes it again.
  const Status released = dev().ReleaseCachedMemory();
  ASSERT_TRUE(released.ok()) << released.ToString();
  EXPECT_EQ(dev().bytes_in_use(), before);
  ASSERT_TRUE(dev().AttentionForward(d, tq, tk, tv, tout, tlse).ok());
  EXPECT_GE(dev().bytes_in_use(), before + static_cast<std::size_t>(nstat) * sizeof(float));
}

}  // namespace
}  // namespace autopar::device
