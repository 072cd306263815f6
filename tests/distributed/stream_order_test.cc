// The NCCL-semantics emulation (`--p2p-semantics nccl`, src/device/cpu/stream_order.h) on 4
// ranks: what NCCL would hang on hangs here (caught by a deadline), what NCCL runs completes.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "autopar/device/platform.h"
#include "tests/distributed/mpi_env.h"

namespace autopar::device::testing {
namespace {

class StreamOrder : public ::testing::Test {
 protected:
  void SetUp() override {
    CpuPlatformOptions options;
    options.p2p_semantics = P2PSemantics::kNccl;
    StatusOr<std::unique_ptr<Platform>> platform = MakeCpuPlatform(options);
    ASSERT_TRUE(platform.ok()) << platform.status().ToString();
    platform_ = std::move(*platform);
    StatusOr<std::unique_ptr<Collectives>> comm = platform_->Connect(World());
    ASSERT_TRUE(comm.ok()) << comm.status().ToString();
    comm_ = std::move(*comm);
  }

  int next() const { return (comm_->rank() + 1) % comm_->size(); }
  int prev() const { return (comm_->rank() + comm_->size() - 1) % comm_->size(); }

  Tensor Filled(float value, std::int64_t n) {
    StatusOr<Buffer> b = platform_->device().Allocate(n, DType::kF32);
    EXPECT_TRUE(b.ok());
    buffers_.push_back(std::move(*b));
    Tensor t = buffers_.back().tensor();
    EXPECT_TRUE(platform_->device().Fill(t, value).ok());
    return t;
  }

  // Polls `request` for `seconds`; true when it completed.
  static bool CompletesWithin(Request& request, double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      StatusOr<bool> done = request.Test();
      EXPECT_TRUE(done.ok()) << done.status().ToString();
      if (!done.ok() || *done) return done.ok();
      std::this_thread::yield();
    }
    return false;
  }

  // Every rank learns whether all completed (over MPI, outside the emulated communicator).
  static bool AllRanks(bool mine) {
    int in = mine ? 1 : 0, all = 0;
    EXPECT_EQ(MPI_Allreduce(&in, &all, 1, MPI_INT, MPI_MIN, World().comm()), MPI_SUCCESS);
    return all == 1;
  }

  std::unique_ptr<Platform> platform_;
  std::unique_ptr<Collectives> comm_;
  std::vector<Buffer> buffers_;
};

TEST_F(StreamOrder, BatchedRingShiftCompletes) {
  const Tensor mine = Filled(static_cast<float>(comm_->rank()), 1 << 16);
  const Tensor theirs = Filled(-1, 1 << 16);
  const P2POp ops[] = {{P2POp::kSend, mine, next(), 0}, {P2POp::kRecv, theirs, prev(), 0}};
  StatusOr<std::unique_ptr<Request>> r = comm_->IBatchSendRecv(ops);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(AllRanks(CompletesWithin(**r, 30)));
  StatusOr<std::vector<float>> got = platform_->device().Download<float>(theirs);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->front(), static_cast<float>(prev()));
  EXPECT_EQ(got->back(), static_cast<float>(prev()));
}

// Each rank sends to the next and then receives from the previous, ungrouped: every send waits
// for a receive queued behind the peer's own send. MPI would buffer or progress them; NCCL hangs.
TEST_F(StreamOrder, LoneSendsAroundARingHang) {
  const Tensor mine = Filled(1, 1 << 16), theirs = Filled(0, 1 << 16);
  StatusOr<std::unique_ptr<Request>> s = comm_->ISend(mine, next(), 0);
  StatusOr<std::unique_ptr<Request>> r = comm_->IRecv(theirs, prev(), 0);
  ASSERT_TRUE(s.ok() && r.ok());
  EXPECT_FALSE(AllRanks(CompletesWithin(**r, 1.0)));
  (*r)->Abandon();
  (*s)->Abandon();
  // The communicator is broken afterwards, as after ncclCommAbort.
  StatusOr<std::unique_ptr<Request>> after = comm_->IAllReduce(mine, mine, ReduceOp::kSum);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ((*after)->Test().status().outcome(), Outcome::kCommError);
}

// Ranks 0 and 1 each queue a receive from the other before their send to it. MPI posts both and
// completes; on NCCL's one stream per communicator the send never starts behind the receive.
TEST_F(StreamOrder, OperationsRunInIssueOrder) {
  if (comm_->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int me = comm_->rank();
  bool done = true;
  if (me < 2) {
    const Tensor out = Filled(1, 1024), in = Filled(0, 1024);
    std::unique_ptr<Request> recv = std::move(comm_->IRecv(in, 1 - me, 0)).value();
    std::unique_ptr<Request> send = std::move(comm_->ISend(out, 1 - me, 0)).value();
    done = CompletesWithin(*recv, 1.0);
    recv->Abandon();
    send->Abandon();
  }
  EXPECT_FALSE(AllRanks(done));
}

}  // namespace
}  // namespace autopar::device::testing
