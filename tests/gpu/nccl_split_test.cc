// The CUDA platform's communicators built once and its stream-ordered requests, one GPU per rank,
// under mpirun (linked into cuda_collectives_test, whose main initialises MPI):
//   mpirun -np <ranks> build/tests/bin/cuda_collectives_test --gtest_filter='NcclSplit*'
// Ranks without a GPU of their own skip, all together.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "autopar/device/cuda_platform.h"
#include "autopar/device/group.h"
#include "autopar/device/timer.h"
#include "tests/gpu/gpu_ranks.h"
#include "tests/unit/device_test_util.h"

namespace autopar::device {
namespace {

class NcclSplitTest : public test_util::DeviceDataTest {
 protected:
  void SetUp() override {
    if (!EveryRankHasAGpu()) GTEST_SKIP() << "needs one CUDA device per rank";
    CudaPlatformOptions options;
    options.timeout_s = 30.0;
    StatusOr<std::unique_ptr<Platform>> platform = MakeCudaPlatform(options);
    ASSERT_TRUE(platform.ok()) << platform.status().ToString();
    platform_ = std::move(platform).value();
    StatusOr<Group> world = Group::World();
    ASSERT_TRUE(world.ok()) << world.status().ToString();
    world_ = std::move(world).value();
  }
  void TearDown() override {
    DeviceDataTest::TearDown();
    platform_.reset();
  }
  Device& dev() override { return platform_->device(); }
  // The sum over `group` of rank + 1, checked through an all-reduce on `c`.
  void ExpectSumOfRanks(Collectives& c, const Group& group) {
    const Tensor t = Put({static_cast<float>(world_.rank() + 1)});
    ASSERT_TRUE(c.AllReduce(t, t, ReduceOp::kSum).ok());
    StatusOr<std::vector<float>> got = dev().Download<float>(t);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    float want = 0;
    for (int r : group.world_ranks()) want += static_cast<float>(r + 1);
    EXPECT_EQ((*got)[0], want);
  }

  std::unique_ptr<Platform> platform_;
  Group world_;
};

TEST_F(NcclSplitTest, SplitGroupsWorkAndAreReusedByMembers) {
  // Pairs of neighbouring ranks (a single rank alone where the world is odd), twice: the second
  // round finds every group cached and must cost no NCCL set-up.
  double first_s = 0, again_s = 0;
  for (int round = 0; round < 2; ++round) {
    StatusOr<Group> pair = world_.Split(world_.rank() / 2, world_.rank());
    ASSERT_TRUE(pair.ok());
    WallTimer timer;
    StatusOr<std::unique_ptr<Collectives>> c = platform_->ConnectSplit(world_, *pair);
    (round == 0 ? first_s : again_s) = timer.Seconds();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_NE(*c, nullptr);
    EXPECT_TRUE((*c)->stream_ordered());
    EXPECT_EQ((*c)->size(), pair->size());
    EXPECT_EQ((*c)->rank(), pair->rank());
    ExpectSumOfRanks(**c, *pair);
  }
  // A cached connection is an MPI all-reduce of two ints; a split is NCCL initialisation.
  EXPECT_LT(again_s, first_s) << "first " << first_s << " s, again " << again_s << " s";
}

TEST_F(NcclSplitTest, RanksOutsideEveryGroupStillTakePart) {
  // Only world rank 0 and the last rank form a group; the others pass an empty group.
  const int last = world_.size() - 1;
  const bool member = world_.rank() == 0 || world_.rank() == last;
  StatusOr<Group> ends = world_.Split(member ? 0 : -1, world_.rank());
  ASSERT_TRUE(ends.ok());
  StatusOr<std::unique_ptr<Collectives>> c = platform_->ConnectSplit(world_, *ends);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  if (!member) {
    EXPECT_EQ(*c, nullptr);
    return;
  }
  ASSERT_NE(*c, nullptr);
  ExpectSumOfRanks(**c, *ends);
}

TEST_F(NcclSplitTest, TheWholeWorldUsesTheWorldCommunicator) {
  StatusOr<std::unique_ptr<Collectives>> c = platform_->ConnectSplit(world_, world_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ExpectSumOfRanks(**c, world_);
}

TEST_F(NcclSplitTest, AFamilyAbortedOnOneRankIsRebuiltOnEvery) {
  // Rank 0 alone starts an all-reduce its peers never join and gives it up: NCCL cannot cancel
  // one operation, so its world communicator is aborted. The next connection rebuilds the family
  // on every rank (the others abort their healthy halves) and the new groups work.
  {
    StatusOr<std::unique_ptr<Collectives>> c = platform_->ConnectSplit(world_, world_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    if (world_.rank() == 0) {
      const Tensor t = Put(std::vector<float>(1024, 1.0f));
      StatusOr<std::unique_ptr<Request>> request = (*c)->IAllReduce(t, t, ReduceOp::kSum);
      ASSERT_TRUE(request.ok()) << request.status().ToString();
      (*request)->Abandon();
      const Tensor u = Put({1.0f});
      EXPECT_EQ((*c)->AllReduce(u, u, ReduceOp::kSum).outcome(), Outcome::kCommError);
    }
  }
  StatusOr<Group> pair = world_.Split(world_.rank() / 2, world_.rank());
  ASSERT_TRUE(pair.ok());
  StatusOr<std::unique_ptr<Collectives>> again = platform_->ConnectSplit(world_, *pair);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  ASSERT_NE(*again, nullptr);
  ExpectSumOfRanks(**again, *pair);
  StatusOr<std::unique_ptr<Collectives>> whole = platform_->ConnectSplit(world_, world_);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  ExpectSumOfRanks(**whole, world_);
}

TEST_F(NcclSplitTest, OrderOnDeviceOrdersLaterOpsWithoutAHostWait) {
  StatusOr<std::unique_ptr<Collectives>> c = platform_->ConnectSplit(world_, world_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const Tensor t = Put(std::vector<float>(1 << 20, 1.0f));
  StatusOr<std::unique_ptr<Request>> request = (*c)->IAllReduce(t, t, ReduceOp::kSum);
  ASSERT_TRUE(request.ok()) << request.status().ToString();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  ASSERT_TRUE((*request)->OrderOnDevice(deadline).ok());
  StatusOr<bool> done = (*request)->Test();
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);  // complete from the host's point of view: ordered on the device
  // The scale runs on the compute stream after the all-reduce.
  ASSERT_TRUE(dev().Scale(t, 0.5f).ok());
  request->reset();
  StatusOr<std::vector<float>> got = dev().Download<float>(t);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->front(), 0.5f * static_cast<float>(world_.size()));
  EXPECT_EQ(got->back(), 0.5f * static_cast<float>(world_.size()));
}

TEST_F(NcclSplitTest, NonTensorBytesCountTheCommunicators) {
  StatusOr<std::size_t> before = dev().NonTensorBytes();
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  StatusOr<std::unique_ptr<Collectives>> c = platform_->ConnectSplit(world_, world_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ExpectSumOfRanks(**c, world_);  // NCCL connects at the first collective
  StatusOr<std::size_t> after = dev().NonTensorBytes();
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_GT(*after, 0u);
  EXPECT_GE(*after, *before);
}

TEST_F(NcclSplitTest, TheBudgetLeavesTheReserve) {
  // The default reserve: the budget is below the device's total.
  std::size_t free_bytes = 0, total_bytes = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
  EXPECT_LE(dev().budget_bytes(), total_bytes - CudaPlatformOptions{}.memory_reserve_bytes);
  // An allocation that would eat into the reserve is an oom, and the device stays usable.
  StatusOr<Buffer> too_big = dev().Allocate(free_bytes - (1 << 20));
  EXPECT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().outcome(), Outcome::kOom);
  EXPECT_TRUE(dev().Synchronize().ok());
}

}  // namespace
}  // namespace autopar::device
