// Point-to-point: blocking pairs, ring shifts, non-blocking rings, and a context-parallel
// attention ring that overlaps sending the next key/value chunk with attention on the current one.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "autopar/device/platform.h"
#include "tests/distributed/mpi_env.h"
#include "tests/unit/device_test_util.h"

namespace autopar::device::testing {
namespace {

class DistributedP2p : public test_util::DeviceDataTest {
 protected:
  void SetUp() override {
    StatusOr<std::unique_ptr<Collectives>> comm = TestPlatform().Connect(World());
    ASSERT_TRUE(comm.ok()) << comm.status().ToString();
    comm_ = std::move(comm).value();
    if (comm_->size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  }
  Device& dev() override { return TestPlatform().device(); }
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  int next() const { return (rank() + 1) % size(); }
  int prev() const { return (rank() + size() - 1) % size(); }

  std::unique_ptr<Collectives> comm_;
};

TEST_F(DistributedP2p, BlockingPairsExchange) {
  if (size() % 2 != 0) GTEST_SKIP() << "pairs need an even number of ranks";
  const int partner = rank() ^ 1;
  const Tensor mine = Put(Data(10, 100, rank())), theirs = Zeros(100);
  // Even ranks send first, odd ranks receive first, so blocking calls cannot deadlock.
  if (rank() % 2 == 0) {
    ASSERT_TRUE(comm_->Send(mine, partner, 7).ok());
    ASSERT_TRUE(comm_->Recv(theirs, partner, 7).ok());
  } else {
    ASSERT_TRUE(comm_->Recv(theirs, partner, 7).ok());
    ASSERT_TRUE(comm_->Send(mine, partner, 7).ok());
  }
  EXPECT_EQ(Get(theirs), Data(10, 100, partner));
}

TEST_F(DistributedP2p, SendRecvRingShiftReturnsHomeAfterSizeSteps) {
  Tensor current = Put(Data(11, 50, rank()));
  Tensor incoming = Zeros(50);
  for (int step = 1; step <= size(); ++step) {
    ASSERT_TRUE(comm_->SendRecv(current, next(), incoming, prev(), step).ok());
    std::swap(current, incoming);
    // After `step` shifts this rank holds the data of the rank `step` places before it.
    EXPECT_EQ(Get(current), Data(11, 50, (rank() + size() - step % size()) % size()));
  }
}

TEST_F(DistributedP2p, NonBlockingRing) {
  const Tensor send = Put(Data(12, 4096, rank())), recv = Zeros(4096);
  StatusOr<std::unique_ptr<Request>> r = comm_->IRecv(recv, prev(), 3);
  StatusOr<std::unique_ptr<Request>> s = comm_->ISend(send, next(), 3);
  ASSERT_TRUE(r.ok() && s.ok());
  ASSERT_TRUE((*s)->Wait().ok());
  ASSERT_TRUE((*r)->Wait().ok());
  StatusOr<bool> again = (*r)->Test();
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(*again);
  EXPECT_EQ(Get(recv), Data(12, 4096, prev()));
}

TEST_F(DistributedP2p, ShortMessagesAndBadPeersAreReported) {
  const Tensor three = Put(Data(13, 3, rank())), four = Zeros(4);
  StatusOr<std::unique_ptr<Request>> s = comm_->ISend(three, next(), 9);
  ASSERT_TRUE(s.ok());
  const Status short_recv = comm_->Recv(four, prev(), 9);
  EXPECT_EQ(short_recv.outcome(), Outcome::kCommError);
  EXPECT_NE(short_recv.message().find("received 3 elements, expected 4"), std::string::npos)
      << short_recv.message();
  ASSERT_TRUE((*s)->Wait().ok());
  EXPECT_EQ(comm_->Send(three, size(), 0).outcome(), Outcome::kInvalid);
  EXPECT_EQ(comm_->IRecv(three, -1, 0).status().outcome(), Outcome::kInvalid);
  EXPECT_TRUE(comm_->Barrier().ok());
}

// Context parallelism over the world: rank r owns query and key/value chunk r of a causal
// sequence. Key/value chunks travel around the ring; while chunk j is in flight to the next rank,
// attention runs on it locally, and partial results merge by log-sum-exp. Every rank also computes
// attention over the whole sequence (it can generate all the data) and compares its slice.
TEST_F(DistributedP2p, ContextParallelAttentionRingOverlapsTransfers) {
  AttentionDesc full;
  full.batch = 2;
  full.heads_q = 4;
  full.heads_kv = 2;
  full.head_dim = 8;
  full.seq_q = full.seq_kv = 8 * std::int64_t{size()};
  const std::int64_t len = 8;
  const std::int64_t q_tok = full.batch * full.heads_q * full.head_dim;
  const std::int64_t kv_tok = full.batch * full.heads_kv * full.head_dim;
  const std::int64_t stat_tok = full.batch * full.heads_q;
  // Global tensors as a pure function of the seed; rank 0's stream stands for "the dataset".
  const std::vector<float> q_all = Data(20, full.seq_q * q_tok, 0);
  const std::vector<float> kv_all = Data(21, 2 * full.seq_kv * kv_tok, 0);  // [k | v]
  const Tensor q = Put(q_all), kv = Put(kv_all);
  const Tensor out_full = Zeros(full.seq_q * q_tok), lse_full = Zeros(full.seq_q * stat_tok);
  ASSERT_TRUE(dev()
                  .AttentionForward(full, q, kv.Slice(0, full.seq_kv * kv_tok),
                                    kv.Slice(full.seq_kv * kv_tok, full.seq_kv * kv_tok), out_full,
                                    lse_full)
                  .ok());

  // This rank's shard: q chunk and the packed [k | v] chunk it starts with.
  const Tensor my_q = q.Slice(rank() * len * q_tok, len * q_tok);
  std::vector<float> kv_chunk(kv_all.begin() + rank() * len * kv_tok,
                              kv_all.begin() + (rank() + 1) * len * kv_tok);
  kv_chunk.insert(kv_chunk.end(), kv_all.begin() + (full.seq_kv + rank() * len) * kv_tok,
                  kv_all.begin() + (full.seq_kv + (rank() + 1) * len) * kv_tok);
  Tensor current = Put(kv_chunk), incoming = Zeros(2 * len * kv_tok);
  const Tensor out = Zeros(len * q_tok), lse = Zeros(len * stat_tok);
  const Tensor part_out = Zeros(len * q_tok), part_lse = Zeros(len * stat_tok);
  ASSERT_TRUE(dev().Fill(lse, -std::numeric_limits<float>::infinity()).ok());

  for (int step = 0; step < size(); ++step) {
    const int owner = (rank() + size() - step) % size();  // whose chunk `current` is
    std::unique_ptr<Request> recv, send;
    if (step + 1 < size()) {  // start moving the chunk on before computing with it
      StatusOr<std::unique_ptr<Request>> r = comm_->IRecv(incoming, prev(), 100 + step);
      StatusOr<std::unique_ptr<Request>> s = comm_->ISend(current, next(), 100 + step);
      ASSERT_TRUE(r.ok() && s.ok());
      recv = std::move(r).value();
      send = std::move(s).value();
    }
    AttentionDesc pair = full;
    pair.seq_q = pair.seq_kv = len;
    pair.q_offset = rank() * len;
    pair.kv_offset = owner * len;
    ASSERT_TRUE(dev()
                    .AttentionForward(pair, my_q, current.Slice(0, len * kv_tok),
                                      current.Slice(len * kv_tok, len * kv_tok), part_out, part_lse)
                    .ok());
    ASSERT_TRUE(
        dev().AttentionMerge(len * stat_tok, full.head_dim, out, lse, part_out, part_lse).ok());
    if (recv) {
      ASSERT_TRUE(send->Wait().ok());
      ASSERT_TRUE(recv->Wait().ok());
      std::swap(current, incoming);
    }
  }
  const std::vector<float> want_out = Get(out_full.Slice(rank() * len * q_tok, len * q_tok));
  const std::vector<float> want_lse = Get(lse_full.Slice(rank() * len * stat_tok, len * stat_tok));
  const std::vector<float> got_out = Get(out), got_lse = Get(lse);
  for (std::size_t i = 0; i < got_out.size(); ++i) EXPECT_NEAR(got_out[i], want_out[i], 1e-5);
  for (std::size_t i = 0; i < got_lse.size(); ++i) EXPECT_NEAR(got_lse[i], want_lse[i], 1e-5);
}

}  // namespace
}  // namespace autopar::device::testing
