// How a trial completes its collectives: on a stream-ordered transport (NCCL) the device orders
// later work after them with no host wait, elsewhere (MPI) the host polls them against the
// deadline. Tested with a fake transport that records what was asked of its requests.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <span>
#include <vector>

#include "src/trial/comm.h"

namespace autopar::trial {
namespace {

using device::Collectives;
using device::OkStatus;
using device::P2POp;
using device::Request;
using device::StatusOr;

struct Log {
  int ordered = 0;  // OrderOnDevice calls
  int tested = 0;   // Test calls (host polling)
  Deadline deadline{};
};

class FakeRequest final : public Request {
 public:
  explicit FakeRequest(Log& log) : log_(log) {}
  Status Wait() override { return OkStatus(); }
  StatusOr<bool> Test() override {
    ++log_.tested;
    return true;
  }
  void Abandon() override {}
  Status OrderOnDevice(std::chrono::steady_clock::time_point deadline) override {
    ++log_.ordered;
    log_.deadline = deadline;
    return OkStatus();
  }

 private:
  Log& log_;
};

class FakeCollectives final : public Collectives {
 public:
  FakeCollectives(Log& log, bool stream_ordered) : log_(log), stream_ordered_(stream_ordered) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  bool stream_ordered() const override { return stream_ordered_; }
  Status AllReduce(Tensor, Tensor, ReduceOp) override { return OkStatus(); }
  Status AllGather(Tensor, Tensor) override { return OkStatus(); }
  Status ReduceScatter(Tensor, Tensor, ReduceOp) override { return OkStatus(); }
  Status AllToAll(Tensor, Tensor) override { return OkStatus(); }
  Status AllToAllV(Tensor, std::span<const std::int64_t>, Tensor,
                   std::span<const std::int64_t>) override {
    return OkStatus();
  }
  Status Broadcast(Tensor, int) override { return OkStatus(); }
  Status Barrier() override { return OkStatus(); }
  Status Send(Tensor, int, int) override { return OkStatus(); }
  Status Recv(Tensor, int, int) override { return OkStatus(); }
  Status SendRecv(Tensor, int, Tensor, int, int) override { return OkStatus(); }
  StatusOr<std::unique_ptr<Request>> IBatchSendRecv(std::span<const P2POp>) override {
    return Make();
  }
  StatusOr<std::unique_ptr<Request>> ISend(Tensor, int, int) override { return Make(); }
  StatusOr<std::unique_ptr<Request>> IRecv(Tensor, int, int) override { return Make(); }
  StatusOr<std::unique_ptr<Request>> IAllReduce(Tensor, Tensor, ReduceOp) override {
    return Make();
  }
  StatusOr<std::unique_ptr<Request>> IAllGather(Tensor, Tensor) override { return Make(); }
  StatusOr<std::unique_ptr<Request>> IReduceScatter(Tensor, Tensor, ReduceOp) override {
    return Make();
  }
  StatusOr<std::unique_ptr<Request>> IAllToAllV(Tensor, std::span<const std::int64_t>, Tensor,
                                                std::span<const std::int64_t>) override {
    return Make();
  }

 private:
  StatusOr<std::unique_ptr<Request>> Make() {
    return std::unique_ptr<Request>(std::make_unique<FakeRequest>(log_));
  }
  Log& log_;
  bool stream_ordered_;
};

TEST(TrialComm, StreamOrderedTransportsAreOrderedOnTheDeviceNotWaitedFor) {
  Log log;
  const Deadline deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  Comm comm(std::make_unique<FakeCollectives>(log, /*stream_ordered=*/true), deadline);
  std::vector<float> data(4);
  const Tensor t{data.data(), 4, device::DType::kF32};
  ASSERT_TRUE(comm.AllReduce(t).ok());
  ASSERT_TRUE(comm.AllGather(t.Slice(0, 2), t).ok());
  std::unique_ptr<Request> pending;
  ASSERT_TRUE(comm.StartAllReduce(t, pending).ok());
  ASSERT_TRUE(comm.Wait(pending).ok());
  EXPECT_EQ(log.ordered, 3);
  EXPECT_EQ(log.tested, 0);  // no host poll at all
  EXPECT_EQ(log.deadline, deadline);
}

TEST(TrialComm, HostTransportsArePolledOnTheHost) {
  Log log;
  Comm comm(std::make_unique<FakeCollectives>(log, /*stream_ordered=*/false),
            std::chrono::steady_clock::now() + std::chrono::seconds(60));
  std::vector<float> data(4);
  const Tensor t{data.data(), 4, device::DType::kF32};
  ASSERT_TRUE(comm.AllReduce(t).ok());
  std::unique_ptr<Request> pending;
  ASSERT_TRUE(comm.StartAllReduce(t, pending).ok());
  ASSERT_TRUE(comm.Wait(pending).ok());
  EXPECT_EQ(log.ordered, 0);
  EXPECT_EQ(log.tested, 2);
}

}  // namespace
}  // namespace autopar::trial
