// Communication on one process group, over device memory.
//
// Ranks and peers are ranks within the group. Buffers may be the same view (in place) where noted.
// Reductions need f32 (or i32) on the CPU platform; data movement works on any dtype. Every call
// returns kCommError when the transport fails and kInvalid for mismatched arguments.
//
// Non-blocking calls return a Request that must complete (Wait, or Test until true) before the
// buffers are reused; they let a context-parallel ring send the next chunk while attention runs on
// the current one, and let the data-parallel gradient reduction run under the backward pass.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>

#include "autopar/device/status.h"
#include "autopar/device/tensor.h"

namespace autopar::device {

enum class ReduceOp { kSum, kMax, kMin };

// One send or receive of a batch (IBatchSendRecv).
struct P2POp {
  enum Kind { kSend, kRecv };
  Kind kind = kSend;
  Tensor buf;
  int peer = 0;  // rank within the group
  int tag = 0;   // matched by MPI; NCCL matches by issue order per peer pair and ignores it
};

// One in-flight non-blocking operation. Destroying an unfinished request waits for it, so its
// buffers are never freed under the transport.
class Request {
 public:
  virtual ~Request() = default;
  virtual Status Wait() = 0;
  // True once complete (then Wait returns at once); drives progress on transports that need it.
  virtual StatusOr<bool> Test() = 0;
  // Gives up on an operation that will not complete (a peer stalled or died): point-to-point
  // requests are cancelled, collective ones are left to the transport. The caller must treat the
  // group as broken afterwards; destroying an abandoned request does not wait.
  virtual void Abandon() = 0;
  // Where the transport runs on the device (Collectives::stream_ordered()): makes the device's
  // later work wait for this operation on the device and returns without waiting on the host.
  // The request then counts as complete (Wait and Test return at once, destroying it does not
  // wait): later ops may reuse its buffers, and a failure or a stall shows at the device's next
  // host wait (Synchronize, a host copy), which gives up no later than `deadline`, aborting the
  // device's communicators. Elsewhere it is Wait(), a host wait.
  virtual Status OrderOnDevice(std::chrono::steady_clock::time_point deadline) {
    (void)deadline;
    return Wait();
  }
};

class Collectives {
 public:
  virtual ~Collectives() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // True when the operations run in the device's stream order (NCCL): a caller completes a
  // request with Request::OrderOnDevice instead of a host wait per operation, and waits on the
  // host only where it needs a result there (Device::Synchronize). False: requests complete on
  // the host (MPI).
  virtual bool stream_ordered() const { return false; }

  // recv = op over ranks of send; same numel; send may equal recv.
  virtual Status AllReduce(Tensor send, Tensor recv, ReduceOp op) = 0;
  // recv [size * n] = concatenation of every rank's send [n] in rank order.
  virtual Status AllGather(Tensor send, Tensor recv) = 0;
  // send [size * n]; recv [n] = op over ranks of their block `rank()` of send. In place when recv
  // is this rank's own block of send.
  virtual Status ReduceScatter(Tensor send, Tensor recv, ReduceOp op) = 0;
  // send, recv [size * n]: block j of send goes to rank j, block i of recv came from rank i.
  virtual Status AllToAll(Tensor send, Tensor recv) = 0;
  // Variable-size all-to-all (MPI_Alltoallv with packed blocks): send holds send_counts[j]
  // elements for rank j, and recv gets recv_counts[i] elements from rank i, each packed in rank
  // order. Counts are in elements, one per rank; send and recv must not overlap and must each hold
  // at least the sum of their counts. Rank i's send_counts[j] must equal rank j's recv_counts[i]:
  // callers exchange counts first (a dropless MoE dispatch sends its per-expert token counts with
  // an equal-split AllToAll before the tokens).
  virtual Status AllToAllV(Tensor send, std::span<const std::int64_t> send_counts, Tensor recv,
                           std::span<const std::int64_t> recv_counts) = 0;
  // buf on `root` is copied to every rank.
  virtual Status Broadcast(Tensor buf, int root) = 0;
  virtual Status Barrier() = 0;

  virtual Status Send(Tensor buf, int peer, int tag) = 0;
  virtual Status Recv(Tensor buf, int peer, int tag) = 0;
  // Sends to `dst` and receives from `src` at once, so a ring shift cannot deadlock.
  virtual Status SendRecv(Tensor send, int dst, Tensor recv, int src, int tag) = 0;

  // Starts the sends and receives of `ops` as one group (NCCL: between ncclGroupStart and
  // ncclGroupEnd; MPI: all posted before any completes), the way Megatron's batched p2p does: the
  // operations progress together, so two ranks that each send to and receive from the other in
  // one batch cannot deadlock even where a lone send waits for its receiver (NCCL). The request
  // completes when all have. Buffers must not overlap; an empty batch completes at once.
  virtual StatusOr<std::unique_ptr<Request>> IBatchSendRecv(std::span<const P2POp> ops) = 0;

  virtual StatusOr<std::unique_ptr<Request>> ISend(Tensor buf, int peer, int tag) = 0;
  virtual StatusOr<std::unique_ptr<Request>> IRecv(Tensor buf, int peer, int tag) = 0;
  virtual StatusOr<std::unique_ptr<Request>> IAllReduce(Tensor send, Tensor recv, ReduceOp op) = 0;
  virtual StatusOr<std::unique_ptr<Request>> IAllGather(Tensor send, Tensor recv) = 0;
  virtual StatusOr<std::unique_ptr<Request>> IReduceScatter(Tensor send, Tensor recv,
                                                            ReduceOp op) = 0;
  // The counts are copied: the spans need not outlive the call, the buffers must.
  virtual StatusOr<std::unique_ptr<Request>> IAllToAllV(
      Tensor send, std::span<const std::int64_t> send_counts, Tensor recv,
      std::span<const std::int64_t> recv_counts) = 0;
};

}  // namespace autopar::device
