// NCCL collectives of the CUDA platform, one GPU per rank, under mpirun:
//   mpirun -np <ranks> build/tests/bin/cuda_collectives_test   (ctest -L gpu: 1 and 2 ranks)
// Every rank runs every test in the same order (own main, not discovered). Ranks without a GPU of
// their own (no device, or fewer devices on the node than ranks on it) skip, all together.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "autopar/device/cuda_platform.h"
#include "autopar/device/group.h"
#include "tests/gpu/gpu_ranks.h"
#include "tests/unit/cuda_test_util.h"
#include "tests/unit/device_test_util.h"

namespace autopar::device {
namespace {

using cuda_test::FromBf16Bits;
using cuda_test::ToBf16Bits;

class NcclCollectivesTest : public test_util::DeviceDataTest {
 protected:
  void SetUp() override {
    if (!EveryRankHasAGpu()) GTEST_SKIP() << "needs one CUDA device per rank";
    CudaPlatformOptions options;  // device from the local rank
    options.timeout_s = 30.0;
    StatusOr<std::unique_ptr<Platform>> platform = MakeCudaPlatform(options);
    ASSERT_TRUE(platform.ok()) << platform.status().ToString();
    platform_ = std::move(platform).value();
    StatusOr<Group> world = Group::World();
    ASSERT_TRUE(world.ok()) << world.status().ToString();
    StatusOr<std::unique_ptr<Collectives>> comm = platform_->Connect(*world);
    ASSERT_TRUE(comm.ok()) << comm.status().ToString();
    comm_ = std::move(comm).value();
    rank_ = comm_->rank();
    size_ = comm_->size();
  }
  void TearDown() override {
    DeviceDataTest::TearDown();
    comm_.reset();  // before the platform's device
    platform_.reset();
  }

  Device& dev() override { return platform_->device(); }
  // Element i of rank r's data: a pure function, so every rank knows every other's.
  static float Value(int r, std::int64_t i) {
    return static_cast<float>(std::int64_t{r} * 1000 + i);
  }
  std::vector<float> Mine(std::int64_t n) const {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[i] = Value(rank_, i);
    return v;
  }

  std::unique_ptr<Platform> platform_;
  std::unique_ptr<Collectives> comm_;
  int rank_ = 0;
  int size_ = 1;
};

TEST_F(NcclCollectivesTest, AllReduceSumMaxInPlaceAndBf16) {
  const std::int64_t n = 1000;
  const Tensor x = Put(Mine(n)), y = Put(std::vector<float>(n));
  ASSERT_TRUE(comm_->AllReduce(x, y, ReduceOp::kSum).ok());
  std::vector<float> want(n);
  for (std::int64_t i = 0; i < n; ++i) {
    for (int r = 0; r < size_; ++r) want[i] += Value(r, i);
  }
  EXPECT_EQ(Get(y), want);
  ASSERT_TRUE(comm_->AllReduce(x, x, ReduceOp::kMax).ok());
  for (std::int64_t i = 0; i < n; ++i) want[i] = Value(size_ - 1, i);
  EXPECT_EQ(Get(x), want);

  // bf16 sums of small integers are exact.
  StatusOr<Buffer> half = dev().Allocate(n, DType::kBF16);
  ASSERT_TRUE(half.ok());
  std::vector<std::uint16_t> bits(n);
  for (std::int64_t i = 0; i < n; ++i) bits[i] = ToBf16Bits(static_cast<float>(i % 7));
  ASSERT_TRUE(dev().CopyFromHost(half->tensor(), bits.data(), bits.size() * 2).ok());
  ASSERT_TRUE(comm_->AllReduce(half->tensor(), half->tensor(), ReduceOp::kSum).ok());
  ASSERT_TRUE(dev().CopyToHost(bits.data(), half->tensor(), bits.size() * 2).ok());
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(FromBf16Bits(bits[i]), static_cast<float>((i % 7) * size_)) << i;
  }
}

TEST_F(NcclCollectivesTest, GatherScatterAllToAllAndBroadcast) {
  const std::int64_t n = 64;
  // All-gather, out of place and in place (send = own block of recv).
  const Tensor send = Put(Mine(n)), recv = Put(std::vector<float>(n * size_));
  ASSERT_TRUE(comm_->AllGather(send, recv).ok());
  std::vector<float> want;
  for (int r = 0; r < size_; ++r) {
    for (std::int64_t i = 0; i < n; ++i) want.push_back(Value(r, i));
  }
  EXPECT_EQ(Get(recv), want);
  std::vector<float> own(n * size_, -1.0f);
  for (std::int64_t i = 0; i < n; ++i) own[rank_ * n + i] = Value(rank_, i);
  const Tensor in_place = Put(own);
  ASSERT_TRUE(comm_->AllGather(in_place.Slice(rank_ * n, n), in_place).ok());
  EXPECT_EQ(Get(in_place), want);

  // Reduce-scatter: block b of everyone's send summed into rank b; also in place.
  std::vector<float> block_data(n * size_);
  for (std::int64_t i = 0; i < n * size_; ++i) block_data[i] = Value(rank_, i);
  const Tensor rs_send = Put(block_data), rs_recv = Put(std::vector<float>(n));
  ASSERT_TRUE(comm_->ReduceScatter(rs_send, rs_recv, ReduceOp::kSum).ok());
  std::vector<float> rs_want(n, 0.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    for (int r = 0; r < size_; ++r) rs_want[i] += Value(r, rank_ * n + i);
  }
  EXPECT_EQ(Get(rs_recv), rs_want);
  ASSERT_TRUE(comm_->ReduceScatter(rs_send, rs_send.Slice(rank_ * n, n), ReduceOp::kSum).ok());
  EXPECT_EQ(Get(rs_send.Slice(rank_ * n, n)), rs_want);

  // All-to-all: block j of rank r goes to rank j's block r; in place too.
  const Tensor a2a = Put(block_data), a2a_out = Put(std::vector<float>(n * size_));
  ASSERT_TRUE(comm_->AllToAll(a2a, a2a_out).ok());
  std::vector<float> a2a_want(n * size_);
  for (int r = 0; r < size_; ++r) {
    for (std::int64_t i = 0; i < n; ++i) a2a_want[r * n + i] = Value(r, rank_ * n + i);
  }
  EXPECT_EQ(Get(a2a_out), a2a_want);
  ASSERT_TRUE(comm_->AllToAll(a2a, a2a).ok());
  EXPECT_EQ(Get(a2a), a2a_want);

  const Tensor b = Put(Mine(n));
  ASSERT_TRUE(comm_->Broadcast(b, size_ - 1).ok());
  std::vector<float> b_want(n);
  for (std::int64_t i = 0; i < n; ++i) b_want[i] = Value(size_ - 1, i);
  EXPECT_EQ(Get(b), b_want);
  EXPECT_TRUE(comm_->Barrier().ok());
}

TEST_F(NcclCollectivesTest, PointToPointRingAndRequests) {
  const std::int64_t n = 128;
  const int right = (rank_ + 1) % size_, left = (rank_ + size_ - 1) % size_;
  const Tensor send = Put(Mine(n)), recv = Put(std::vector<float>(n));
  ASSERT_TRUE(comm_->SendRecv(send, right, recv, left, 0).ok());
  std::vector<float> want(n);
  for (std::int64_t i = 0; i < n; ++i) want[i] = Value(left, i);
  EXPECT_EQ(Get(recv), want);

  // Non-blocking ring shift as one batch (ncclGroupStart/End, as the trial's pipeline and CP ring
  // transfers): grouped, so it also runs on one rank, which sends to and receives from itself.
  const Tensor recv2 = Put(std::vector<float>(n));
  const P2POp shift[] = {{P2POp::kRecv, recv2, left, 1}, {P2POp::kSend, send, right, 1}};
  StatusOr<std::unique_ptr<Request>> batch = comm_->IBatchSendRecv(shift);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  for (;;) {
    StatusOr<bool> done = (*batch)->Test();
    ASSERT_TRUE(done.ok()) << done.status().ToString();
    if (*done) break;
  }
  EXPECT_EQ(Get(recv2), want);

  // Ungrouped sends and receives, in pairs (2k -> 2k+1) so that no cycle of ranks waits on itself:
  // each is a kernel that blocks its stream until the peer's matching call runs. NCCL refuses an
  // ungrouped send to or receive from the rank itself, so this part needs two ranks.
  if (size_ >= 2) {
    const int peer = rank_ % 2 == 0 ? rank_ + 1 : rank_ - 1;
    if (peer < size_) {
      const Tensor recv3 = Put(std::vector<float>(n, -1.0f));
      StatusOr<std::unique_ptr<Request>> one =
          rank_ % 2 == 0 ? comm_->ISend(send, peer, 2) : comm_->IRecv(recv3, peer, 2);
      ASSERT_TRUE(one.ok()) << one.status().ToString();
      const Status waited = (*one)->Wait();
      ASSERT_TRUE(waited.ok()) << waited.ToString();
      std::vector<float> from_peer(n);
      for (std::int64_t i = 0; i < n; ++i) from_peer[i] = Value(peer, i);
      if (rank_ % 2 == 1) {
        EXPECT_EQ(Get(recv3), from_peer);
      }
    }
  }

  const Tensor x = Put(Mine(n));
  StatusOr<std::unique_ptr<Request>> ar = comm_->IAllReduce(x, x, ReduceOp::kSum);
  ASSERT_TRUE(ar.ok()) << ar.status().ToString();
  ASSERT_TRUE((*ar)->Wait().ok());
  std::vector<float> sum(n, 0.0f);
  for (std::int64_t i = 0; i < n; ++i) {
    for (int r = 0; r < size_; ++r) sum[i] += Value(r, i);
  }
  EXPECT_EQ(Get(x), sum);

  const Tensor gathered = Put(std::vector<float>(n * size_));
  StatusOr<std::unique_ptr<Request>> ag = comm_->IAllGather(send, gathered);
  ASSERT_TRUE(ag.ok());
  ASSERT_TRUE((*ag)->Wait().ok());
  EXPECT_EQ(Get(gathered).size(), static_cast<std::size_t>(n * size_));

  const std::int64_t block = 4;
  std::vector<float> ones(block * size_, 1.0f);
  const Tensor rs_send = Put(ones), rs_recv = Put(std::vector<float>(block));
  StatusOr<std::unique_ptr<Request>> rs = comm_->IReduceScatter(rs_send, rs_recv, ReduceOp::kSum);
  ASSERT_TRUE(rs.ok());
  ASSERT_TRUE((*rs)->Wait().ok());
  EXPECT_EQ(Get(rs_recv), std::vector<float>(block, static_cast<float>(size_)));
}

TEST_F(NcclCollectivesTest, VariableAllToAllPacksBlocksInRankOrder) {
  // Rank i sends i + j + 1 elements to rank j, so every pair's counts agree.
  auto count = [](int from, int to) { return std::int64_t{from} + to + 1; };
  std::vector<std::int64_t> send_counts(size_), recv_counts(size_);
  std::int64_t send_total = 0, recv_total = 0;
  for (int j = 0; j < size_; ++j) {
    send_counts[j] = count(rank_, j);
    recv_counts[j] = count(j, rank_);
    send_total += send_counts[j];
    recv_total += recv_counts[j];
  }
  const Tensor send = Put(Mine(send_total)), recv = Put(std::vector<float>(recv_total, -1.0f));
  std::vector<float> want;
  for (int i = 0; i < size_; ++i) {
    std::int64_t offset = 0;  // where rank i's block for this rank starts in its send buffer
    for (int j = 0; j < rank_; ++j) offset += count(i, j);
    for (std::int64_t e = 0; e < count(i, rank_); ++e) want.push_back(Value(i, offset + e));
  }
  ASSERT_TRUE(comm_->AllToAllV(send, send_counts, recv, recv_counts).ok());
  EXPECT_EQ(Get(recv), want);
  ASSERT_TRUE(dev().Fill(recv, 0.0f).ok());
  StatusOr<std::unique_ptr<Request>> request =
      comm_->IAllToAllV(send, send_counts, recv, recv_counts);
  ASSERT_TRUE(request.ok()) << request.status().ToString();
  ASSERT_TRUE((*request)->Wait().ok());
  EXPECT_EQ(Get(recv), want);
}

TEST_F(NcclCollectivesTest, RejectsBadArgumentsAsInvalid) {
  const Tensor x = Put(std::vector<float>(10));
  EXPECT_EQ(comm_->Send(x, size_, 0).outcome(), Outcome::kInvalid);
  EXPECT_EQ(comm_->AllGather(x, x.Slice(0, 5)).outcome(), Outcome::kInvalid);
  EXPECT_EQ(comm_->SendRecv(x, 0, x, 0, 0).outcome(), Outcome::kInvalid);
}

// A receive nobody sends to never completes: the wait must give up at the deadline, abort the
// communicator, and leave the device usable. Run last: it breaks the communicator.
TEST_F(NcclCollectivesTest, UnmatchedReceiveTimesOutAndAborts) {
  // On one rank the only peer is the rank itself, whose ungrouped receive NCCL refuses at once.
  if (size_ < 2) GTEST_SKIP() << "needs 2 ranks: a receive from another rank that never sends";
  const int peer = (rank_ + 1) % size_;
  comm_.reset();
  CudaPlatformOptions options;
  options.timeout_s = 3.0;
  StatusOr<std::unique_ptr<Platform>> platform = MakeCudaPlatform(options);
  ASSERT_TRUE(platform.ok());
  StatusOr<Group> world = Group::World();
  ASSERT_TRUE(world.ok());
  StatusOr<std::unique_ptr<Collectives>> comm = (*platform)->Connect(*world);
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  Device& device = (*platform)->device();
  {
    StatusOr<Buffer> buf = device.Allocate(16, DType::kF32);
    ASSERT_TRUE(buf.ok());
    StatusOr<std::unique_ptr<Request>> rx = (*comm)->IRecv(buf->tensor(), peer, 0);
    ASSERT_TRUE(rx.ok()) << rx.status().ToString();
    const Status waited = (*rx)->Wait();
    EXPECT_FALSE(waited.ok());
    EXPECT_TRUE(waited.outcome() == Outcome::kTimeout || waited.outcome() == Outcome::kCommError)
        << waited.ToString();
    // The aborted communicator refuses further work; the device carries on.
    EXPECT_EQ((*comm)->AllReduce(buf->tensor(), buf->tensor(), ReduceOp::kSum).outcome(),
              Outcome::kCommError);
    EXPECT_TRUE(device.Fill(buf->tensor(), 1.0f).ok());
    const Status synced = device.Synchronize();
    EXPECT_TRUE(synced.ok()) << synced.ToString();
  }
  comm.value().reset();  // before its platform
}

}  // namespace
}  // namespace autopar::device

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    // One report is enough; failures on other ranks still set the exit code.
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int failed = RUN_ALL_TESTS();
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}
