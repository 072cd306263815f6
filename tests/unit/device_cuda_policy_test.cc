// The pure decisions behind the CUDA platform, tested on any host: communicator caching by member
// set, the memory budget and non-tensor bytes, FP8 scaling and the FP8 GEMM's TN mapping.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "kernels/fp8_scale.h"
#include "src/device/comm_cache.h"
#include "src/device/cuda/fp8_gemm_plan.h"
#include "src/device/device_memory.h"

namespace autopar::device {
namespace {

constexpr std::size_t kGiB = std::size_t{1} << 30;

struct FakeComm {
  int id = 0;
  bool aborted = false;
};

TEST(MemberSetCache, FindsExactlyTheSameRanksInTheSameOrder) {
  MemberSetCache<FakeComm> cache;
  cache.Insert(std::vector<int>{0, 2}, std::make_shared<FakeComm>(FakeComm{1}));
  cache.Insert(std::vector<int>{1, 3}, std::make_shared<FakeComm>(FakeComm{2}));
  ASSERT_NE(cache.Find(std::vector<int>{0, 2}), nullptr);
  EXPECT_EQ(cache.Find(std::vector<int>{0, 2})->id, 1);
  EXPECT_EQ(cache.Find(std::vector<int>{1, 3})->id, 2);
  // Same members in another order rank differently: a different communicator.
  EXPECT_EQ(cache.Find(std::vector<int>{2, 0}), nullptr);
  EXPECT_EQ(cache.Find(std::vector<int>{0, 2, 4}), nullptr);
  EXPECT_EQ(cache.Find(std::vector<int>{0}), nullptr);
  EXPECT_EQ(cache.size(), 2u);
}

TEST(MemberSetCache, ReplacesAnEntryAndClearsAll) {
  MemberSetCache<FakeComm> cache;
  cache.Insert(std::vector<int>{0, 1}, std::make_shared<FakeComm>(FakeComm{1}));
  cache.Insert(std::vector<int>{0, 1}, std::make_shared<FakeComm>(FakeComm{7}));
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(cache.Find(std::vector<int>{0, 1})->id, 7);
  EXPECT_FALSE(cache.Any([](const FakeComm& c) { return c.aborted; }));
  cache.Find(std::vector<int>{0, 1})->aborted = true;
  EXPECT_TRUE(cache.Any([](const FakeComm& c) { return c.aborted; }));
  cache.Clear();
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.Find(std::vector<int>{0, 1}), nullptr);
}

TEST(MemberSetCache, VisitsEveryCommunicatorInKeyOrderToAbortAFamily) {
  // The CUDA platform aborts a whole family (every cached group, then the world) before dropping
  // it: the visit must reach every entry, in the same order on every rank.
  MemberSetCache<FakeComm> cache;
  cache.Insert(std::vector<int>{2, 3}, std::make_shared<FakeComm>(FakeComm{1}));
  cache.Insert(std::vector<int>{0, 2}, std::make_shared<FakeComm>(FakeComm{2}));
  cache.Insert(std::vector<int>{0, 1}, std::make_shared<FakeComm>(FakeComm{3}));
  std::vector<int> visited;
  cache.ForEach([&](FakeComm& c) {
    c.aborted = true;
    visited.push_back(c.id);
  });
  EXPECT_EQ(visited, (std::vector<int>{3, 2, 1}));  // {0,1} < {0,2} < {2,3}
  EXPECT_FALSE(cache.Any([](const FakeComm& c) { return !c.aborted; }));
  EXPECT_EQ(cache.size(), 3u);  // visiting drops nothing
}

TEST(MemberSetCache, KeepsACommunicatorAliveWhileInUse) {
  MemberSetCache<FakeComm> cache;
  cache.Insert(std::vector<int>{4, 5}, std::make_shared<FakeComm>(FakeComm{3}));
  std::shared_ptr<FakeComm> held = cache.Find(std::vector<int>{4, 5});
  cache.Clear();
  EXPECT_EQ(held->id, 3);  // a trial's collectives outlive a cache reset
}

TEST(MemberSetCache, RetainsOnlyTheGroupsOfTheCurrentConfiguration) {
  MemberSetCache<FakeComm> cache;
  cache.Insert(std::vector<int>{0, 1}, std::make_shared<FakeComm>(FakeComm{1}));  // tp=2
  cache.Insert(std::vector<int>{0, 2}, std::make_shared<FakeComm>(FakeComm{2}));  // dp=2
  cache.Insert(std::vector<int>{0, 1, 2, 3}, std::make_shared<FakeComm>(FakeComm{3}));
  std::shared_ptr<FakeComm> held = cache.Find(std::vector<int>{0, 2});
  // The next configuration uses tp over {0, 1} and a group over {0, 4}: the rest goes.
  const std::vector<std::vector<int>> keep = {{0, 1}, {0, 4}};
  cache.RetainOnly(keep);
  EXPECT_EQ(cache.size(), 1u);
  ASSERT_NE(cache.Find(std::vector<int>{0, 1}), nullptr);
  EXPECT_EQ(cache.Find(std::vector<int>{0, 1})->id, 1);
  EXPECT_EQ(cache.Find(std::vector<int>{0, 2}), nullptr);
  EXPECT_EQ(cache.Find(std::vector<int>{0, 1, 2, 3}), nullptr);
  EXPECT_EQ(held->id, 2);  // still alive for whoever holds it
  cache.RetainOnly({});
  EXPECT_EQ(cache.size(), 0u);
}

TEST(SplitColor, IsTheLowestWorldRankAndDistinctForDisjointGroups) {
  EXPECT_EQ(SplitColor(std::vector<int>{5, 1, 3}), 1);
  EXPECT_EQ(SplitColor(std::vector<int>{0, 4}), 0);
  EXPECT_EQ(SplitColor(std::vector<int>{}), -1);
  // tp groups of 2 over 8 ranks, and dp groups of stride 2: colors differ within each split.
  EXPECT_NE(SplitColor(std::vector<int>{0, 1}), SplitColor(std::vector<int>{2, 3}));
  EXPECT_NE(SplitColor(std::vector<int>{0, 2, 4, 6}), SplitColor(std::vector<int>{1, 3, 5, 7}));
}

TEST(DeviceMemory, BudgetIsTotalLessReserveCappedByTheRequest) {
  EXPECT_EQ(kDefaultMemoryReserveBytes, kGiB);
  EXPECT_EQ(DeviceBudgetBytes(80 * kGiB, kGiB, std::numeric_limits<std::size_t>::max()), 79 * kGiB);
  EXPECT_EQ(DeviceBudgetBytes(80 * kGiB, kGiB, 40 * kGiB), 40 * kGiB);
  EXPECT_EQ(DeviceBudgetBytes(80 * kGiB, 0, 80 * kGiB), 80 * kGiB);
  EXPECT_EQ(DeviceBudgetBytes(kGiB / 2, kGiB, 10 * kGiB), 0u);
}

TEST(DeviceMemory, AnAllocationMustLeaveTheReserveFree) {
  EXPECT_TRUE(LeavesReserve(3 * kGiB, 2 * kGiB, kGiB));
  EXPECT_FALSE(LeavesReserve(3 * kGiB, 2 * kGiB + 1, kGiB));
  EXPECT_FALSE(LeavesReserve(kGiB, 2 * kGiB, 0));  // more than is free
  EXPECT_TRUE(LeavesReserve(kGiB, kGiB, 0));
}

TEST(DeviceMemory, NonTensorBytesAreTheProcessUseLessItsTensors) {
  // 80 GiB device, 1 GiB used at start (context, other processes); now 20 GiB free, of which
  // 55 GiB are tensors: 4 GiB of workspaces, NCCL buffers and rounding.
  EXPECT_EQ(NonTensorBytes(80 * kGiB, 20 * kGiB, kGiB, 55 * kGiB), 4 * kGiB);
  EXPECT_EQ(NonTensorBytes(80 * kGiB, 80 * kGiB, 0, 0), 0u);
  // Another process freed memory meanwhile: never negative.
  EXPECT_EQ(NonTensorBytes(80 * kGiB, 79 * kGiB, 2 * kGiB, 0), 0u);
  EXPECT_EQ(NonTensorBytes(80 * kGiB, 70 * kGiB, kGiB, 20 * kGiB), 0u);
}

TEST(DeviceMemory, ThePoolsUnusedReserveCountsAsFree) {
  // cudaMemGetInfo says 10 GiB free; the tensor pool has 6 GiB reserved of which 4 GiB are in
  // use (2 GiB freed by cudaFreeAsync, not yet trimmed): 12 GiB can be allocated.
  EXPECT_EQ(PoolAdjustedFreeBytes(10 * kGiB, 6 * kGiB, 4 * kGiB), 12 * kGiB);
  EXPECT_EQ(PoolAdjustedFreeBytes(10 * kGiB, 0, 0), 10 * kGiB);            // no pool, or trimmed
  EXPECT_EQ(PoolAdjustedFreeBytes(10 * kGiB, kGiB, kGiB), 10 * kGiB);      // all in use
  EXPECT_EQ(PoolAdjustedFreeBytes(10 * kGiB, kGiB, 2 * kGiB), 10 * kGiB);  // never less than free
  // The reserve check and the non-tensor bytes see the cached 2 GiB as free, not as overhead:
  // 80 GiB device, 10 GiB free, pool 6 GiB reserved / 4 GiB used, 4 GiB of tensors, so 80 - 12
  // - 4 = 64 GiB are the context, workspaces and communicators.
  EXPECT_TRUE(LeavesReserve(PoolAdjustedFreeBytes(10 * kGiB, 6 * kGiB, 4 * kGiB), 11 * kGiB, kGiB));
  EXPECT_FALSE(LeavesReserve(10 * kGiB, 11 * kGiB, kGiB));
  EXPECT_EQ(
      NonTensorBytes(80 * kGiB, PoolAdjustedFreeBytes(10 * kGiB, 6 * kGiB, 4 * kGiB), 0, 4 * kGiB),
      64 * kGiB);
}

TEST(Fp8Scale, MapsTheAmaxOntoTheFormatsLargestValue) {
  using kernels::Fp8ScaleFromAmax;
  EXPECT_FLOAT_EQ(Fp8ScaleFromAmax(1.0f, kernels::kFp8E4M3Max), 448.0f);
  EXPECT_FLOAT_EQ(Fp8ScaleFromAmax(448.0f, kernels::kFp8E4M3Max), 1.0f);
  EXPECT_FLOAT_EQ(Fp8ScaleFromAmax(2.0f, kernels::kFp8E5M2Max), 28672.0f);
  EXPECT_FLOAT_EQ(Fp8ScaleFromAmax(1e4f, kernels::kFp8E4M3Max), 0.0448f);
  // amax * scale lands on the largest finite value, so the cast saturates nothing.
  const float amax = 0.0123f;
  EXPECT_NEAR(amax * Fp8ScaleFromAmax(amax, kernels::kFp8E4M3Max), 448.0f, 448.0f * 1e-6f);
}

TEST(Fp8Scale, DegenerateAmaxKeepsAUsableScale) {
  using kernels::Fp8ScaleFromAmax;
  EXPECT_EQ(Fp8ScaleFromAmax(0.0f, kernels::kFp8E4M3Max), 1.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(-1.0f, kernels::kFp8E4M3Max), 1.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(std::numeric_limits<float>::infinity(), kernels::kFp8E4M3Max), 1.0f);
  EXPECT_EQ(Fp8ScaleFromAmax(std::nanf(""), kernels::kFp8E4M3Max), 1.0f);
  // A subnormal amax overflows the quotient: clamp to the largest float, as TE does.
  EXPECT_EQ(Fp8ScaleFromAmax(1e-44f, kernels::kFp8E5M2Max), FLT_MAX);
  static_assert(kernels::Fp8ScaleFromAmax(1.0f, 448.0f) == 448.0f,
                "usable in constant expressions");
}

TEST(Fp8Support, NeedsComputeCapability89OrNewer) {
  using kernels::DeviceHasFp8;
  EXPECT_FALSE(DeviceHasFp8(7, 0));  // V100
  EXPECT_FALSE(DeviceHasFp8(8, 0));  // A100
  EXPECT_FALSE(DeviceHasFp8(8, 6));  // A10, RTX 30
  EXPECT_FALSE(DeviceHasFp8(8, 7));  // Orin
  EXPECT_TRUE(DeviceHasFp8(8, 9));   // L4, L40, RTX 40 (Ada)
  EXPECT_TRUE(DeviceHasFp8(9, 0));   // H100, H200
  EXPECT_TRUE(DeviceHasFp8(10, 0));  // B200
  EXPECT_TRUE(DeviceHasFp8(12, 0));  // RTX 50
}

GemmDesc Resolved(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k) {
  GemmDesc d;
  d.trans_a = trans_a;
  d.trans_b = trans_b;
  d.m = m;
  d.n = n;
  d.k = k;
  d.lda = trans_a ? m : k;
  d.ldb = trans_b ? k : n;
  d.ldc = n;
  d.fp8_a = Fp8Operand::kE4M3;
  d.fp8_b = Fp8Operand::kE4M3;
  return d;
}

TEST(Fp8GemmPlan, QuantizesEachOperandKContiguousForTheTnForm) {
  // Forward of a linear layer: y[m, n] = x[m, k] W[n, k]^T: both already K-contiguous.
  Fp8GemmPlan p = PlanFp8Gemm(Resolved(false, true, 64, 32, 48));
  EXPECT_EQ(p.lt_m, 32);
  EXPECT_EQ(p.lt_n, 64);
  EXPECT_EQ(p.lt_k, 48);
  EXPECT_FALSE(p.a_transpose);
  EXPECT_EQ(p.a_rows, 64);
  EXPECT_EQ(p.a_cols, 48);
  EXPECT_FALSE(p.b_transpose);
  EXPECT_EQ(p.b_rows, 32);
  EXPECT_EQ(p.b_cols, 48);
  EXPECT_EQ(p.ld_d, 32);
  // Input gradient dx[m, k] = dy[m, n] W[n, k]: W is stored [k, n] for this product (k = n of
  // the layer) and must be transposed.
  p = PlanFp8Gemm(Resolved(false, false, 64, 48, 32));
  EXPECT_FALSE(p.a_transpose);
  EXPECT_TRUE(p.b_transpose);
  EXPECT_EQ(p.b_rows, 32);  // stored [k, n]
  EXPECT_EQ(p.b_cols, 48);
  // Weight gradient dW[n, k] = dy[m, n]^T x[m, k]: dy is stored [k, m] here and is transposed.
  p = PlanFp8Gemm(Resolved(true, false, 32, 48, 64));
  EXPECT_TRUE(p.a_transpose);
  EXPECT_EQ(p.a_rows, 64);
  EXPECT_EQ(p.a_cols, 32);
  EXPECT_EQ(p.a_ld, 32);
  EXPECT_TRUE(p.b_transpose);
}

TEST(Fp8GemmPlan, FastAccumulationOnlyWhenTheGemmAsksForIt) {
  GemmDesc d = Resolved(false, true, 64, 32, 48);
  EXPECT_EQ(PlanFp8Gemm(d).fast_accumulate, 0);  // split accumulation, the accurate default
  d.fp8_fast_accumulate = true;                  // a linear layer's forward (trial/linear.h)
  EXPECT_EQ(PlanFp8Gemm(d).fast_accumulate, 1);
}

TEST(Fp8GemmPlan, RefusesWhatCublasLtCannotRun) {
  GemmDesc d = Resolved(false, true, 64, 32, 48);
  EXPECT_EQ(Fp8GemmUnsupported(d, 2), "");
  d.k = 40;
  EXPECT_NE(Fp8GemmUnsupported(d, 2).find("multiples of 16"), std::string::npos);
  d = Resolved(false, true, 64, 32, 48);
  d.fp8_a = d.fp8_b = Fp8Operand::kE5M2;
  EXPECT_NE(Fp8GemmUnsupported(d, 2).find("e5m2 x e5m2"), std::string::npos);
  d.fp8_b = Fp8Operand::kNone;
  EXPECT_NE(Fp8GemmUnsupported(d, 2), "");
  d = Resolved(false, true, 64, 32, 48);
  d.batch = 2;
  EXPECT_NE(Fp8GemmUnsupported(d, 2), "");
  d = Resolved(false, true, 64, 32, 48);
  d.ldc = 36;  // 72 bytes of bf16
  EXPECT_NE(Fp8GemmUnsupported(d, 2), "");
  EXPECT_EQ(Fp8GemmUnsupported(d, 4), "");  // 144 bytes of f32
  d.fp8_a = Fp8Operand::kE5M2;              // hybrid's gradient operand with an e4m3 one
  EXPECT_EQ(Fp8GemmUnsupported(d, 4), "");
}

}  // namespace
}  // namespace autopar::device
