// Groups and collectives on sub-groups of the world, checked against values every rank computes
// locally from (seed, index, rank).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "autopar/device/platform.h"
#include "tests/distributed/mpi_env.h"
#include "tests/unit/device_test_util.h"

namespace autopar::device::testing {
namespace {

// How the world is cut: "strided" pairs {0, 2}, {1, 3} (like DP groups across TP), "blocked"
// pairs {0, 1}, {2, 3} (like TP groups).
struct Split {
  const char* name;
  int (*color)(int rank);
};
const Split kSplits[] = {{"strided", [](int r) { return r % 2; }},
                         {"blocked", [](int r) { return r / 2; }}};

class DistributedCollectives : public test_util::DeviceDataTest {
 protected:
  void SetUp() override {
    if (World().size() % 2 != 0) GTEST_SKIP() << "needs an even number of ranks";
  }
  Device& dev() override { return TestPlatform().device(); }

  struct Connected {
    Group group;
    std::unique_ptr<Collectives> comm;
  };
  Connected Connect(const Split& split) {
    StatusOr<Group> group = World().Split(split.color(World().rank()), World().rank());
    EXPECT_TRUE(group.ok()) << group.status().ToString();
    StatusOr<std::unique_ptr<Collectives>> comm = TestPlatform().Connect(*group);
    EXPECT_TRUE(comm.ok()) << comm.status().ToString();
    return Connected{std::move(group).value(), std::move(comm).value()};
  }
};

TEST_F(DistributedCollectives, SplitGroupsKnowTheirMembers) {
  const int me = World().rank();
  for (const Split& split : kSplits) {
    Connected c = Connect(split);
    ASSERT_EQ(c.group.size(), World().size() / 2) << split.name;
    for (int r = 0; r < c.group.size(); ++r) {
      EXPECT_EQ(split.color(c.group.world_ranks()[r]), split.color(me));
    }
    EXPECT_EQ(c.group.world_ranks()[c.group.rank()], me);
    EXPECT_EQ(c.comm->rank(), c.group.rank());
    EXPECT_EQ(c.comm->size(), c.group.size());
  }
  // Reversed keys reverse the order; a negative color opts out.
  StatusOr<Group> reversed = World().Split(0, -me);
  ASSERT_TRUE(reversed.ok());
  EXPECT_EQ(reversed->rank(), World().size() - 1 - me);
  StatusOr<Group> only_even = World().Split(me % 2 == 0 ? 0 : -1, 0);
  ASSERT_TRUE(only_even.ok());
  EXPECT_EQ(only_even->empty(), me % 2 != 0);
}

TEST_F(DistributedCollectives, SubgroupFromWorldRanksInListedOrder) {
  if (World().size() < 4) GTEST_SKIP() << "needs 4 ranks";
  const int me = World().rank();
  const std::vector<int> members = {World().size() - 1, 1};  // e.g. {3, 1}
  if (std::find(members.begin(), members.end(), me) == members.end()) {
    // Non-members make no call at all: MPI_Comm_create_group involves the members only.
    EXPECT_EQ(World().Subgroup(members).status().outcome(), Outcome::kInvalid);
    return;
  }
  StatusOr<Group> sub = World().Subgroup(members);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  EXPECT_EQ(sub->world_ranks(), members);
  EXPECT_EQ(sub->world_ranks()[sub->rank()], me);
  StatusOr<std::unique_ptr<Collectives>> comm = TestPlatform().Connect(*sub);
  ASSERT_TRUE(comm.ok());
  const Tensor x = Put({static_cast<float>(me)});
  ASSERT_TRUE((*comm)->AllReduce(x, x, ReduceOp::kSum).ok());
  EXPECT_EQ(Get(x)[0], static_cast<float>(members[0] + members[1]));
}

TEST_F(DistributedCollectives, AllReduceSumMaxMinInAndOutOfPlace) {
  const std::int64_t n = 1000;
  for (const Split& split : kSplits) {
    Connected c = Connect(split);
    const std::vector<int>& members = c.group.world_ranks();
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
      std::vector<float> want = Data(1, n, members[0]);
      for (std::size_t m = 1; m < members.size(); ++m) {
        const std::vector<float> other = Data(1, n, members[m]);
        for (std::int64_t i = 0; i < n; ++i) {
          want[i] = op == ReduceOp::kSum   ? want[i] + other[i]
                    : op == ReduceOp::kMax ? std::max(want[i], other[i])
                                           : std::min(want[i], other[i]);
        }
      }
      const Tensor send = Put(Data(1, n, World().rank())), recv = Zeros(n);
      ASSERT_TRUE(c.comm->AllReduce(send, recv, op).ok());
      EXPECT_EQ(Get(recv), want) << split.name;
      ASSERT_TRUE(c.comm->AllReduce(send, send, op).ok());  // in place
      EXPECT_EQ(Get(send), want) << split.name;
    }
  }
}

TEST_F(DistributedCollectives, AllReduceOfIntegers) {
  Connected c = Connect(kSplits[0]);
  StatusOr<Buffer> buf = dev().Allocate(std::int64_t{3}, DType::kI32);
  ASSERT_TRUE(buf.ok());
  const int me = World().rank();
  ASSERT_TRUE(dev().Upload(buf->tensor(), std::vector<std::int32_t>{me, 1, -me}).ok());
  ASSERT_TRUE(c.comm->AllReduce(buf->tensor(), buf->tensor(), ReduceOp::kSum).ok());
  StatusOr<std::vector<std::int32_t>> got = dev().Download<std::int32_t>(buf->tensor());
  ASSERT_TRUE(got.ok());
  const std::vector<int>& members = c.group.world_ranks();
  const int rank_sum = members[0] + members[1];
  EXPECT_EQ(*got, (std::vector<std::int32_t>{rank_sum, 2, -rank_sum}));
}

TEST_F(DistributedCollectives, AllGatherInAndOutOfPlace) {
  const std::int64_t n = 257;
  for (const Split& split : kSplits) {
    Connected c = Connect(split);
    std::vector<float> want;
    for (int member : c.group.world_ranks()) {
      const std::vector<float> part = Data(2, n, member);
      want.insert(want.end(), part.begin(), part.end());
    }
    const Tensor send = Put(Data(2, n, World().rank())), recv = Zeros(n * c.comm->size());
    ASSERT_TRUE(c.comm->AllGather(send, recv).ok());
    EXPECT_EQ(Get(recv), want) << split.name;
    // In place: this rank's block of the output already holds its input.
    const Tensor whole = Zeros(n * c.comm->size());
    const Tensor mine = whole.Slice(n * c.comm->rank(), n);
    ASSERT_TRUE(dev().Copy(mine, send).ok());
    ASSERT_TRUE(c.comm->AllGather(mine, whole).ok());
    EXPECT_EQ(Get(whole), want) << split.name;
  }
}

TEST_F(DistributedCollectives, ReduceScatterSum) {
  const std::int64_t n = 130;  // per rank
  for (const Split& split : kSplits) {
    Connected c = Connect(split);
    const std::int64_t total = n * c.comm->size();
    std::vector<float> want(static_cast<std::size_t>(n), 0.0f);
    for (int member : c.group.world_ranks()) {
      const std::vector<float> full = Data(3, total, member);
      for (std::int64_t i = 0; i < n; ++i) want[i] += full[c.comm->rank() * n + i];
    }
    const Tensor send = Put(Data(3, total, World().rank())), recv = Zeros(n);
    ASSERT_TRUE(c.comm->ReduceScatter(send, recv, ReduceOp::kSum).ok());
    EXPECT_EQ(Get(recv), want) << split.name;
    EXPECT_EQ(c.comm->ReduceScatter(send, send.Slice(1, n), ReduceOp::kSum).outcome(),
              Outcome::kInvalid);
    // In place: the reduced block lands in this rank's own block of the input (NCCL's form).
    const Tensor own = send.Slice(c.comm->rank() * n, n);
    ASSERT_TRUE(c.comm->ReduceScatter(send, own, ReduceOp::kSum).ok());
    EXPECT_EQ(Get(own), want) << split.name << " in place";
  }
}

TEST_F(DistributedCollectives, AllToAllEqualSplits) {
  const std::int64_t block = 33;
  for (const Split& split : kSplits) {
    Connected c = Connect(split);
    const int size = c.comm->size();
    std::vector<float> want;
    for (int src = 0; src < size; ++src) {  // block `rank` of every member's send
      const std::vector<float> theirs = Data(4, block * size, c.group.world_ranks()[src]);
      want.insert(want.end(), theirs.begin() + c.comm->rank() * block,
                  theirs.begin() + (c.comm->rank() + 1) * block);
    }
    const Tensor send = Put(Data(4, block * size, World().rank())), recv = Zeros(block * size);
    ASSERT_TRUE(c.comm->AllToAll(send, recv).ok());
    EXPECT_EQ(Get(recv), want) << split.name;
    ASSERT_TRUE(c.comm->AllToAll(send, send).ok());  // in place
    EXPECT_EQ(Get(send), want) << split.name;
  }
}

// Variable blocks, as a dropless MoE dispatch sends them: rank i sends (i + 2j) % 3 elements
// to rank j (some blocks empty), blocking and non-blocking; bad counts are kInvalid.
TEST_F(DistributedCollectives, AllToAllVVariableBlocks) {
  auto count = [](int from, int to) { return static_cast<std::int64_t>((from + 2 * to) % 3); };
  for (const Split& split : kSplits) {
    Connected c = Connect(split);
    const int size = c.comm->size(), me = c.comm->rank();
    std::vector<std::int64_t> send_counts(size), recv_counts(size);
    std::int64_t recv_total = 0;
    for (int j = 0; j < size; ++j) {
      send_counts[j] = count(me, j);
      recv_counts[j] = count(j, me);
      recv_total += recv_counts[j];
    }
    // Block j of a rank's send is elements [offset_j, offset_j + count) of its Data(8, ...).
    std::vector<float> want;
    for (int src = 0; src < size; ++src) {
      const std::vector<float> theirs = Data(8, std::int64_t{3} * size, c.group.world_ranks()[src]);
      std::int64_t offset = 0;
      for (int j = 0; j < me; ++j) offset += count(src, j);
      want.insert(want.end(), theirs.begin() + offset, theirs.begin() + offset + count(src, me));
    }
    const std::vector<float> mine = Data(8, std::int64_t{3} * size, World().rank());
    const Tensor send = Put(mine), recv = Zeros(recv_total + 1);
    ASSERT_TRUE(c.comm->AllToAllV(send, send_counts, recv, recv_counts).ok());
    std::vector<float> got = Get(recv);
    EXPECT_EQ(std::vector<float>(got.begin(), got.end() - 1), want) << split.name;
    EXPECT_EQ(got.back(), 0.0f) << "wrote past the received blocks";

    const Tensor recv2 = Zeros(recv_total);
    StatusOr<std::unique_ptr<Request>> req =
        c.comm->IAllToAllV(send, send_counts, recv2, recv_counts);
    ASSERT_TRUE(req.ok()) << req.status().ToString();
    ASSERT_TRUE((*req)->Wait().ok());
    EXPECT_EQ(Get(recv2), want) << split.name;

    std::vector<std::int64_t> too_many = send_counts;
    too_many[0] += std::int64_t{3} * size;
    EXPECT_EQ(c.comm->AllToAllV(send, too_many, recv, recv_counts).outcome(), Outcome::kInvalid);
    EXPECT_EQ(c.comm->AllToAllV(send, std::vector<std::int64_t>(size + 1), recv, recv_counts)
                  .outcome(),
              Outcome::kInvalid);
  }
}

TEST_F(DistributedCollectives, BroadcastFromEachRootAndBarrier) {
  Connected c = Connect(kSplits[1]);
  for (int root = 0; root < c.comm->size(); ++root) {
    const Tensor buf = Put(Data(5, 64, World().rank()));
    ASSERT_TRUE(c.comm->Broadcast(buf, root).ok());
    EXPECT_EQ(Get(buf), Data(5, 64, c.group.world_ranks()[root]));
  }
  EXPECT_TRUE(c.comm->Barrier().ok());
  EXPECT_EQ(c.comm->Broadcast(Zeros(1), c.comm->size()).outcome(), Outcome::kInvalid);
}

// Non-blocking collectives progress while the device computes, as a DP gradient reduction runs
// under the backward pass; the GEMM's result must be unaffected and the reduction correct.
TEST_F(DistributedCollectives, NonBlockingCollectivesOverlapCompute) {
  Connected c = Connect(kSplits[0]);
  const std::int64_t n = 1 << 16;
  const Tensor grads = Put(Data(6, n, World().rank()));
  const Tensor shard = Zeros(n / c.comm->size());
  const Tensor gathered = Zeros(n);
  StatusOr<std::unique_ptr<Request>> reduce = c.comm->IAllReduce(grads, grads, ReduceOp::kSum);
  ASSERT_TRUE(reduce.ok()) << reduce.status().ToString();

  GemmDesc gemm;
  gemm.m = gemm.n = gemm.k = 64;
  const Tensor a = Put(Data(7, std::int64_t{64} * 64, World().rank())),
               out = Zeros(std::int64_t{64} * 64);
  bool done = false;
  int gemms = 0;
  while (!done) {  // compute, poll, compute, ... until the reduction lands
    ASSERT_TRUE(dev().Gemm(gemm, a, a, out).ok());
    ++gemms;
    StatusOr<bool> test = (*reduce)->Test();
    ASSERT_TRUE(test.ok()) << test.status().ToString();
    done = *test;
  }
  EXPECT_TRUE((*reduce)->Wait().ok());  // already complete: returns at once
  EXPECT_GE(gemms, 1);

  std::vector<float> want = Data(6, n, c.group.world_ranks()[0]);
  const std::vector<float> other = Data(6, n, c.group.world_ranks()[1]);
  for (std::int64_t i = 0; i < n; ++i) want[i] += other[i];
  EXPECT_EQ(Get(grads), want);

  // Distributed-optimizer pattern: reduce-scatter the gradients, then all-gather the parameters.
  StatusOr<std::unique_ptr<Request>> rs = c.comm->IReduceScatter(grads, shard, ReduceOp::kMax);
  ASSERT_TRUE(rs.ok());
  ASSERT_TRUE((*rs)->Wait().ok());
  StatusOr<std::unique_ptr<Request>> ag = c.comm->IAllGather(shard, gathered);
  ASSERT_TRUE(ag.ok());
  ASSERT_TRUE((*ag)->Wait().ok());
  EXPECT_EQ(Get(gathered), want);  // max over identical reduced copies is the copy

  std::vector<float> host(std::size_t{64} * 64, 0.0f);
  const std::vector<float> ah = Data(7, std::int64_t{64} * 64, World().rank());
  for (int i = 0; i < 64; ++i) {
    for (int j = 0; j < 64; ++j) {
      double acc = 0.0;
      for (int l = 0; l < 64; ++l) acc += double{ah[i * 64 + l]} * double{ah[l * 64 + j]};
      host[i * 64 + j] = static_cast<float>(acc);
    }
  }
  const std::vector<float> got = Get(out);
  for (std::size_t i = 0; i < host.size(); ++i) EXPECT_NEAR(got[i], host[i], 1e-3);
}

TEST_F(DistributedCollectives, BadArgumentsAreInvalidAndTransportErrorsAreCommErrors) {
  Connected c = Connect(kSplits[0]);
  EXPECT_EQ(c.comm->AllReduce(Zeros(4), Zeros(5), ReduceOp::kSum).outcome(), Outcome::kInvalid);
  EXPECT_EQ(c.comm->AllGather(Zeros(4), Zeros(4)).outcome(), Outcome::kInvalid);
  Tensor half = Zeros(4);
  half.dtype = DType::kBF16;
  EXPECT_EQ(c.comm->AllReduce(half, half, ReduceOp::kSum).outcome(), Outcome::kInvalid);
  // MPI itself rejects a negative tag: the error comes back as a value, and the process lives on.
  const Status bad_tag = c.comm->Send(Zeros(1), (c.comm->rank() + 1) % c.comm->size(), -5);
  EXPECT_EQ(bad_tag.outcome(), Outcome::kCommError) << bad_tag.ToString();
  EXPECT_NE(bad_tag.message().find("MPI_Send"), std::string::npos);
  EXPECT_TRUE(c.comm->Barrier().ok());
}

}  // namespace
}  // namespace autopar::device::testing
