// The data-parallel buckets of the trial: Megatron's bucketing (reverse order, closed at
// bucket_size), the distributed optimizer's share of each bucket, and when the runtime starts a
// bucket's reduction. Host only: a group of one rank has no collectives to run.
#include <gtest/gtest.h>

#include <vector>

#include "autopar/space/config.h"
#include "src/trial/grad_buckets.h"

namespace autopar::trial {
namespace {

// Four parameters of 10, 20, 30 and 40 elements, each its own unit.
const std::vector<ParamSpan> kParams = {{0, 10, 0}, {10, 20, 1}, {30, 30, 2}, {60, 40, 3}};

TEST(PlanGradBuckets, ReverseOrderClosedAtTheBucketSize) {
  // Megatron walks 40, then 40 + 30 >= 50 closes {3, 2}; 20 + 10 is the last bucket.
  const std::vector<GradBucket> b = PlanGradBuckets(kParams, 100, 50, 1);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].begin, 30);
  EXPECT_EQ(b[0].end, 100);
  EXPECT_EQ(b[0].units, (std::vector<int>{2, 3}));
  EXPECT_EQ(b[1].begin, 0);
  EXPECT_EQ(b[1].end, 30);
  EXPECT_EQ(b[1].units, (std::vector<int>{0, 1}));
  // A bucket per parameter when each one fills it.
  EXPECT_EQ(PlanGradBuckets(kParams, 100, 10, 1).size(), 4u);
}

TEST(PlanGradBuckets, OneBucketWithoutASizeOrWhenEverythingFits) {
  for (int64_t size : {int64_t{0}, int64_t{100}, MegatronDdpBucketSize(8)}) {
    const std::vector<GradBucket> b = PlanGradBuckets(kParams, 100, size, 1);
    ASSERT_EQ(b.size(), 1u) << size;
    EXPECT_EQ(b[0].begin, 0);
    EXPECT_EQ(b[0].end, 100);
    EXPECT_EQ(b[0].units, (std::vector<int>{0, 1, 2, 3}));
  }
}

TEST(PlanGradBuckets, MegatronDefaultSize) {
  EXPECT_EQ(MegatronDdpBucketSize(1), 40000000);
  EXPECT_EQ(MegatronDdpBucketSize(40), 40000000);
  EXPECT_EQ(MegatronDdpBucketSize(64), 64000000);
}

TEST(PlanGradBuckets, ShardedBucketsRoundTheirBoundaryDownAndOwnASlice) {
  // With 4 shards the boundary at 30 becomes 28: the first bucket takes parameter 1's tail, and
  // waits for it.
  const std::vector<GradBucket> b = PlanGradBuckets(kParams, 100, 50, 4);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].begin, 28);
  EXPECT_EQ(b[0].units, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(b[1].end, 28);
  for (const GradBucket& bucket : b) EXPECT_EQ(bucket.numel() % 4, 0);
  // Rank 1 updates the second quarter of each bucket; its Adam state is packed.
  const std::vector<OwnedRange> owned = OwnedRanges(b, 4, 1);
  ASSERT_EQ(owned.size(), 2u);
  EXPECT_EQ(owned[0].offset, 28 + 18);
  EXPECT_EQ(owned[0].numel, 18);
  EXPECT_EQ(owned[0].state_offset, 0);
  EXPECT_EQ(owned[1].offset, 7);
  EXPECT_EQ(owned[1].numel, 7);
  EXPECT_EQ(owned[1].state_offset, 18);
  // One bucket: the contiguous share the knob-off trial has always used.
  const std::vector<OwnedRange> whole = OwnedRanges(PlanGradBuckets(kParams, 100, 0, 4), 4, 2);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].offset, 50);
  EXPECT_EQ(whole[0].numel, 25);
}

// The runtime on a group of one (no collectives): which buckets start when.
struct Runtime : ::testing::Test {
  Comm alone;
  std::vector<int> prepared;  // bucket begins, in the order their reduction started
  GradBuckets::Prepare prepare = [this](const GradBucket& b) {
    prepared.push_back(static_cast<int>(b.begin));
    return device::OkStatus();
  };
};

TEST_F(Runtime, ABucketStartsOnTheLastMicrobatchOnceAllItsUnitsAreReady) {
  GradBuckets sync(PlanGradBuckets(kParams, 100, 50, 1), 4, 1, 0, /*overlap=*/true, {});
  sync.BeginStep(2);
  // Micro-batch 0: nothing starts (Megatron's no_sync for all but the last micro-batch).
  for (int unit : {3, 2, 1, 0}) ASSERT_TRUE(sync.Ready(unit, alone, Tensor{}, prepare).ok());
  EXPECT_TRUE(prepared.empty());
  // Micro-batch 1, in backward order: {3, 2} goes after unit 2, {1, 0} after unit 0.
  ASSERT_TRUE(sync.Ready(3, alone, Tensor{}, prepare).ok());
  EXPECT_TRUE(prepared.empty());
  ASSERT_TRUE(sync.Ready(2, alone, Tensor{}, prepare).ok());
  EXPECT_EQ(prepared, (std::vector<int>{30}));
  ASSERT_TRUE(sync.Ready(1, alone, Tensor{}, prepare).ok());
  ASSERT_TRUE(sync.Ready(0, alone, Tensor{}, prepare).ok());
  EXPECT_EQ(prepared, (std::vector<int>{30, 0}));
  EXPECT_EQ(sync.reduced_early(), 2);
  // The step only waits.
  ASSERT_TRUE(sync.FinishReduce(alone, Tensor{}, prepare).ok());
  EXPECT_EQ(prepared.size(), 2u);
  // The next step counts afresh.
  sync.BeginStep(1);
  EXPECT_EQ(sync.reduced_early(), 0);
}

TEST_F(Runtime, OffOrHeldBucketsWaitForTheStep) {
  GradBuckets off(PlanGradBuckets(kParams, 100, 0, 1), 4, 1, 0, /*overlap=*/false, {});
  off.BeginStep(1);
  for (int unit : {3, 2, 1, 0}) ASSERT_TRUE(off.Ready(unit, alone, Tensor{}, prepare).ok());
  EXPECT_TRUE(prepared.empty());
  ASSERT_TRUE(off.FinishReduce(alone, Tensor{}, prepare).ok());
  EXPECT_EQ(prepared, (std::vector<int>{0}));
  EXPECT_EQ(off.reduced_early(), 0);

  prepared.clear();
  GradBuckets held(PlanGradBuckets(kParams, 100, 50, 1), 4, 1, 0, /*overlap=*/true, {false, true});
  held.BeginStep(1);
  for (int unit : {3, 2, 1, 0}) ASSERT_TRUE(held.Ready(unit, alone, Tensor{}, prepare).ok());
  EXPECT_EQ(prepared, (std::vector<int>{30}));
  ASSERT_TRUE(held.FinishReduce(alone, Tensor{}, prepare).ok());
  EXPECT_EQ(prepared, (std::vector<int>{30, 0}));
  EXPECT_EQ(held.reduced_early(), 1);
}

}  // namespace
}  // namespace autopar::trial
