// Host-side logic of the CUDA platform, checked without a GPU: the row-major -> column-major GEMM
// mapping, the attention tile plans, the bf16 rounding the GPU tests rely on, the error classes,
// the NCCL communicator configuration and the ncclInProgress protocol (SettleNcclCall), and that
// asking for the platform without a GPU is a clean kDeviceError.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "autopar/device/cuda_platform.h"
#include "kernels/cuda_attention_plan.cuh"
#include "src/device/cuda/cuda_check.h"
#include "src/device/cuda/cuda_device.h"
#include "src/device/cuda/gemm_mapping.h"
#include "src/device/cuda/nccl_comm.h"
#include "src/device/validate.h"
#include "tests/unit/cuda_test_util.h"

namespace autopar::device {
namespace {

using cuda_test::FromBf16Bits;
using cuda_test::Random;
using cuda_test::ToBf16Bits;

// Reference BLAS semantics, column-major: C[i + j ldc] = alpha sum_l op(A)[i, l] op(B)[l, j]
// + beta C, with op(A)[i, l] = trans ? A[l + i lda] : A[i + l lda].
void ColumnMajorGemmNaive(const ColumnMajorGemm& g, float alpha, const float* first,
                          const float* second, float beta, float* c) {
  for (std::int64_t b = 0; b < g.batch; ++b) {
    const float* a = first + b * g.stride_first;
    const float* bb = second + b * g.stride_second;
    float* cc = c + b * g.stride_c;
    for (std::int64_t j = 0; j < g.n; ++j) {
      for (std::int64_t i = 0; i < g.m; ++i) {
        double acc = 0.0;
        for (std::int64_t l = 0; l < g.k; ++l) {
          const double av = g.trans_first ? a[l + i * g.ld_first] : a[i + l * g.ld_first];
          const double bv = g.trans_second ? bb[j + l * g.ld_second] : bb[l + j * g.ld_second];
          acc += av * bv;
        }
        float& out = cc[i + j * g.ld_c];
        out = static_cast<float>(alpha * acc + (beta == 0.0f ? 0.0 : beta * double{out}));
      }
    }
  }
}

// Row-major semantics of GemmDesc, straight from ops.h.
void RowMajorGemmNaive(const GemmDesc& d, const float* a, const float* b, float* c) {
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
        float& out = c[bt * d.stride_c + i * d.ldc + j];
        out = static_cast<float>(d.alpha * acc + (d.beta == 0.0f ? 0.0 : d.beta * double{out}));
      }
    }
  }
}

TEST(CudaGemmMapping, ColumnMajorCallComputesTheRowMajorProduct) {
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      for (const std::int64_t batch : {1, 3}) {
        GemmDesc desc;
        desc.trans_a = ta;
        desc.trans_b = tb;
        desc.m = 5;
        desc.n = 7;
        desc.k = 4;
        desc.alpha = 0.5f;
        desc.beta = 2.0f;
        // Padded rows, so a swapped leading dimension would read the wrong elements.
        desc.lda = (ta ? desc.m : desc.k) + 3;
        desc.ldb = (tb ? desc.k : desc.n) + 2;
        desc.ldc = desc.n + 1;
        desc.batch = batch;
        const std::int64_t a_rows = ta ? desc.k : desc.m, b_rows = tb ? desc.n : desc.k;
        const std::vector<float> a0 = Random(1, a_rows * desc.lda * batch);
        const std::vector<float> b0 = Random(2, b_rows * desc.ldb * batch);
        std::vector<float> c0 = Random(3, desc.m * desc.ldc * batch);
        const Tensor a{const_cast<float*>(a0.data()), static_cast<std::int64_t>(a0.size())};
        const Tensor b{const_cast<float*>(b0.data()), static_cast<std::int64_t>(b0.size())};
        const Tensor c{c0.data(), static_cast<std::int64_t>(c0.size())};
        StatusOr<GemmDesc> resolved = ResolveGemm(desc, a, b, c, DType::kF32);
        ASSERT_TRUE(resolved.ok()) << resolved.status().ToString();

        std::vector<float> want = c0, got = c0;
        RowMajorGemmNaive(*resolved, a0.data(), b0.data(), want.data());
        const ColumnMajorGemm g = ToColumnMajor(*resolved);
        // cuBLAS gets B first and A second.
        ColumnMajorGemmNaive(g, resolved->alpha, b0.data(), a0.data(), resolved->beta, got.data());
        for (std::size_t i = 0; i < want.size(); ++i) {
          ASSERT_FLOAT_EQ(got[i], want[i])
              << "ta=" << ta << " tb=" << tb << " batch=" << batch << " at " << i;
        }
        // Leading dimensions meet cuBLAS's requirements for the operands as it sees them.
        EXPECT_GE(g.ld_first, g.trans_first ? g.k : g.m);
        EXPECT_GE(g.ld_second, g.trans_second ? g.n : g.k);
        EXPECT_GE(g.ld_c, g.m);
      }
    }
  }
}

TEST(CudaAttentionPlan, TilesFitAndShrinkForWideHeads) {
  using kernels::cuda::PlanAttentionTiles;
  for (const std::int64_t dim : {16, 64, 80, 96, 128, 160, 256, 17}) {
    const auto plan = PlanAttentionTiles(dim);
    EXPECT_LE(plan.block_kv, 32) << dim;  // one lane per key in the softmax
    EXPECT_EQ(plan.threads % 32, 0) << dim;
    EXPECT_EQ(plan.row_stride % 2, 1) << dim;  // odd: conflict-free column reads
    EXPECT_GE(plan.row_stride, dim);
    // Every head size a Megatron model uses fits an A100's 163 KiB opt-in shared memory.
    EXPECT_LE(plan.MaxBytes(), 163u * 1024u) << dim;
  }
  EXPECT_EQ(PlanAttentionTiles(128).block_q, 32);
  EXPECT_EQ(PlanAttentionTiles(256).block_q, 16);
  // The byte counts follow the layout: 128-dim backward over keys, 32x32 tiles.
  const auto p = PlanAttentionTiles(128);
  EXPECT_EQ(p.BackwardKvFloats(), std::size_t{4 * 32 * 129 + 2 * 32 * 128 + 2 * 32 * 32 + 2 * 32});
}

TEST(CudaBf16, RoundsToNearestEven) {
  EXPECT_EQ(ToBf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(ToBf16Bits(-2.0f), 0xc000);
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even one (1).
  EXPECT_EQ(ToBf16Bits(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(ToBf16Bits(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_EQ(ToBf16Bits(1.0f + 1.5f / 256), 0x3f81);  // above halfway: up
  EXPECT_EQ(ToBf16Bits(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_TRUE(std::isnan(FromBf16Bits(ToBf16Bits(std::numeric_limits<float>::quiet_NaN()))));
  // Overflow past the largest bf16 rounds to infinity, as on the device.
  EXPECT_EQ(ToBf16Bits(std::numeric_limits<float>::max()), 0x7f80);
  for (const float v : Random(7, 1000, 100.0f)) {
    const float r = FromBf16Bits(ToBf16Bits(v));
    EXPECT_LE(std::abs(r - v), std::abs(v) * (1.0f / 256)) << v;  // half an ulp of 8 bits
  }
}

TEST(CudaErrors, OutcomesFollowTheLibraryCodes) {
  EXPECT_EQ(CudaOutcome(cudaErrorMemoryAllocation), Outcome::kOom);
  EXPECT_EQ(CudaOutcome(cudaErrorIllegalAddress), Outcome::kDeviceError);
  EXPECT_EQ(CublasOutcome(CUBLAS_STATUS_ALLOC_FAILED), Outcome::kOom);
  EXPECT_EQ(CublasOutcome(CUBLAS_STATUS_EXECUTION_FAILED), Outcome::kDeviceError);
  EXPECT_EQ(NcclOutcome(ncclRemoteError), Outcome::kCommError);
  EXPECT_EQ(NcclOutcome(ncclSystemError), Outcome::kCommError);
  EXPECT_EQ(NcclOutcome(ncclUnhandledCudaError), Outcome::kDeviceError);
  const Status s = CudaError(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)", "x/dev.cc", 12);
  EXPECT_EQ(s.outcome(), Outcome::kOom);
  EXPECT_NE(s.message().find("dev.cc:12"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("cudaErrorMemoryAllocation"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("cudaMalloc(&p, n)"), std::string::npos) << s.message();
}

TEST(CudaGemmMapping, CublasWorkspaceIsTheRecommendedSize) {
  EXPECT_EQ(CublasWorkspaceBytes(9), std::size_t{32} << 20);   // Hopper
  EXPECT_EQ(CublasWorkspaceBytes(10), std::size_t{32} << 20);  // Blackwell
  EXPECT_EQ(CublasWorkspaceBytes(8), std::size_t{4} << 20);    // Ampere, Ada
}

// Non-blocking (abortable), and split groups with resources of their own: with splitShare = 1
// every kernel of the family would wait for the previous one's completion (NCCL's shared
// deviceStream), serialising the TP/CP/PP collectives behind the overlapped DP reductions.
TEST(NcclConfig, NonBlockingAndNoResourcesSharedWithSplits) {
  const ncclConfig_t config = NcclCommConfig();
  EXPECT_EQ(config.blocking, 0);
  EXPECT_EQ(config.splitShare, 0);
}

// A scripted ncclCommGetAsyncError: the states it answers in turn (the last one repeated).
struct ScriptedState {
  std::vector<ncclResult_t> states;
  int queries = 0;
  ncclResult_t operator()(ncclResult_t* state) {
    *state = states[std::min<std::size_t>(queries++, states.size() - 1)];
    return ncclSuccess;
  }
};

TEST(NcclSettle, PollsAfterSuccessUntilTheStateLeavesInProgress) {
  // ncclCommSplit / ncclCommFinalize: ncclSuccess returned, the state still ncclInProgress.
  ScriptedState query{{ncclInProgress, ncclInProgress, ncclInProgress, ncclSuccess}};
  const NcclSettled settled = SettleNcclCall(ncclSuccess, std::ref(query), [] { return false; });
  EXPECT_EQ(settled.how, NcclSettled::kReady);
  EXPECT_EQ(query.queries, 4);
  // A communicator already ready costs one query.
  ScriptedState ready{{ncclSuccess}};
  EXPECT_EQ(SettleNcclCall(ncclInProgress, std::ref(ready), [] { return false; }).how,
            NcclSettled::kReady);
  EXPECT_EQ(ready.queries, 1);
}

TEST(NcclSettle, ErrorsAndTheDeadline) {
  ScriptedState untouched{{ncclSuccess}};
  NcclSettled settled = SettleNcclCall(ncclInvalidUsage, std::ref(untouched), [] { return false; });
  EXPECT_EQ(settled.how, NcclSettled::kFailed);
  EXPECT_EQ(settled.code, ncclInvalidUsage);
  EXPECT_FALSE(settled.query_failed);
  EXPECT_EQ(untouched.queries, 0);
  // The operation failed in the background.
  ScriptedState failing{{ncclInProgress, ncclRemoteError}};
  settled = SettleNcclCall(ncclSuccess, std::ref(failing), [] { return false; });
  EXPECT_EQ(settled.how, NcclSettled::kFailed);
  EXPECT_EQ(settled.code, ncclRemoteError);
  // The query itself failed.
  settled = SettleNcclCall(
      ncclSuccess, [](ncclResult_t*) { return ncclInvalidArgument; }, [] { return false; });
  EXPECT_EQ(settled.how, NcclSettled::kFailed);
  EXPECT_TRUE(settled.query_failed);
  // Still in progress at the deadline.
  ScriptedState stuck{{ncclInProgress}};
  int checks = 0;
  settled = SettleNcclCall(ncclInProgress, std::ref(stuck), [&] { return ++checks == 3; });
  EXPECT_EQ(settled.how, NcclSettled::kExpired);
  EXPECT_EQ(stuck.queries, 3);
}

// A device wait ends at its own bound or the trial's deadline, whichever comes first.
TEST(CudaWait, EndsAtTheEarlierOfItsBoundAndTheDeadline) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(WaitEndS(100.0, 300.0, inf), 400.0);    // no trial: the device's bound
  EXPECT_EQ(WaitEndS(100.0, 300.0, 160.0), 160.0);  // a 60 s trial: its deadline
  EXPECT_EQ(WaitEndS(100.0, 300.0, 900.0), 400.0);  // a long trial: each wait still bounded
  EXPECT_EQ(WaitEndS(100.0, 300.0, 50.0), 50.0);    // already past: give up at once
  EXPECT_EQ(ToSteadySeconds(std::chrono::steady_clock::time_point::max()), inf);
  const auto t = std::chrono::steady_clock::time_point(std::chrono::seconds(42));
  EXPECT_EQ(ToSteadySeconds(t), 42.0);
}

TEST(CudaPlatform, WithoutAGpuIsADeviceErrorNotACrash) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a GPU is present; the GPU tests cover this path";
  StatusOr<std::unique_ptr<Platform>> platform = MakeCudaPlatform(CudaPlatformOptions{});
  ASSERT_FALSE(platform.ok());
  EXPECT_EQ(platform.status().outcome(), Outcome::kDeviceError) << platform.status().ToString();
}

}  // namespace
}  // namespace autopar::device
