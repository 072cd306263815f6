// NCCL collectives on the CUDA device: argument checks (as the MPI transport's) and the NCCL calls;
// the communicator's life, waiting and aborting are NcclComm's (nccl_comm.h).
//
// Blocking calls are enqueued on the device's compute stream: later ops see their result in stream
// order and the host does not wait. Non-blocking calls go to a side stream that first waits for
// the compute stream's work so far, and return a request on an event recorded after them; their
// kernels overlap with compute until the request is waited for, on the host (Wait, Test) or, at no
// host cost, by the compute stream (Request::OrderOnDevice: stream_ordered() is true). NCCL orders
// the operations of one communicator by issue order whatever the stream, so ranks that issue in the
// same order agree.
#include "src/device/cuda/nccl_collectives.h"

#include <cstdio>
#include <string>
#include <utility>

#include "src/device/cuda/nccl_comm.h"
#include "src/device/validate.h"

namespace autopar::device {
namespace {

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return ncclFloat32;
    case DType::kBF16:
      return ncclBfloat16;
    case DType::kF16:
      return ncclFloat16;
    case DType::kI32:
      return ncclInt32;
    case DType::kU8:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

// NCCL's element counts are size_t.
constexpr std::int64_t kMaxCount = INT64_MAX;

// NCCL reduces these in hardware; u8 is data movement only (as on the CPU platform).
Status CheckReducible(const char* op, const Tensor& t) {
  AUTOPAR_CHECK_ARG(t.dtype != DType::kU8,
                    std::string(op) + ": cannot reduce " + DTypeName(t.dtype));
  return OkStatus();
}

std::size_t Count(const Tensor& t) { return static_cast<std::size_t>(t.numel); }

class NcclCollectives final : public Collectives {
 public:
  explicit NcclCollectives(std::shared_ptr<NcclComm> comm) : comm_(std::move(comm)) {}
  ~NcclCollectives() override {
    // The scratch may be read by enqueued work, and cudaFree waits for the device without a
    // deadline: wait here with one first (a failure has aborted the communicators by then).
    if (scratch_.bytes() > 0) {
      const Status status = device().Synchronize();
      if (!status.ok()) std::fprintf(stderr, "~NcclCollectives: %s\n", status.ToString().c_str());
    }
  }

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  bool stream_ordered() const override { return true; }

  Status AllReduce(Tensor send, Tensor recv, ReduceOp op) override {
    AUTOPAR_RETURN_IF_ERROR(CheckAllReduce(send, recv));
    return Run([&](cudaStream_t s) { return EnqueueAllReduce(send, recv, op, s); });
  }

  Status AllGather(Tensor send, Tensor recv) override {
    AUTOPAR_RETURN_IF_ERROR(CheckAllGather(send, recv));
    return Run([&](cudaStream_t s) { return EnqueueAllGather(send, recv, s); });
  }

  Status ReduceScatter(Tensor send, Tensor recv, ReduceOp op) override {
    AUTOPAR_RETURN_IF_ERROR(CheckReduceScatter(send, recv));
    return Run([&](cudaStream_t s) { return EnqueueReduceScatter(send, recv, op, s); });
  }

  Status AllToAll(Tensor send, Tensor recv) override;

  Status AllToAllV(Tensor send, std::span<const std::int64_t> send_counts, Tensor recv,
                   std::span<const std::int64_t> recv_counts) override {
    AUTOPAR_RETURN_IF_ERROR(CheckAllToAllV(send, send_counts, recv, recv_counts));
    return Run(
        [&](cudaStream_t s) { return EnqueueAllToAllV(send, send_counts, recv, recv_counts, s); });
  }

  Status Broadcast(Tensor buf, int root) override;
  Status Barrier() override;
  Status Send(Tensor buf, int peer, int tag) override;
  Status Recv(Tensor buf, int peer, int tag) override;
  Status SendRecv(Tensor send, int dst, Tensor recv, int src, int tag) override;

  StatusOr<std::unique_ptr<Request>> IBatchSendRecv(std::span<const P2POp> ops) override {
    AUTOPAR_RETURN_IF_ERROR(CheckBatch(ops, size(), kMaxCount));
    return comm_->Async([&](cudaStream_t s) {
      return comm_->Grouped([&]() -> ncclResult_t {
        for (const P2POp& op : ops) {
          const ncclResult_t rc =
              op.kind == P2POp::kSend
                  ? ncclSend(op.buf.data, Count(op.buf), NcclType(op.buf.dtype), op.peer,
                             comm_->get(), s)
                  : ncclRecv(op.buf.data, Count(op.buf), NcclType(op.buf.dtype), op.peer,
                             comm_->get(), s);
          if (rc != ncclSuccess) return rc;
        }
        return ncclSuccess;
      });
    });
  }

  StatusOr<std::unique_ptr<Request>> ISend(Tensor buf, int peer, int /*tag*/) override {
    AUTOPAR_RETURN_IF_ERROR(CheckView("ISend", buf, kMaxCount));
    AUTOPAR_RETURN_IF_ERROR(CheckPeer("ISend", peer));
    return comm_->Async([&](cudaStream_t s) {
      return AUTOPAR_NCCL_SETTLE(
          *comm_, ncclSend(buf.data, Count(buf), NcclType(buf.dtype), peer, comm_->get(), s));
    });
  }

  StatusOr<std::unique_ptr<Request>> IRecv(Tensor buf, int peer, int /*tag*/) override {
    AUTOPAR_RETURN_IF_ERROR(CheckView("IRecv", buf, kMaxCount));
    AUTOPAR_RETURN_IF_ERROR(CheckPeer("IRecv", peer));
    return comm_->Async([&](cudaStream_t s) {
      return AUTOPAR_NCCL_SETTLE(
          *comm_, ncclRecv(buf.data, Count(buf), NcclType(buf.dtype), peer, comm_->get(), s));
    });
  }

  StatusOr<std::unique_ptr<Request>> IAllReduce(Tensor send, Tensor recv, ReduceOp op) override {
    AUTOPAR_RETURN_IF_ERROR(CheckAllReduce(send, recv));
    return comm_->Async([&](cudaStream_t s) { return EnqueueAllReduce(send, recv, op, s); });
  }

  StatusOr<std::unique_ptr<Request>> IAllGather(Tensor send, Tensor recv) override {
    AUTOPAR_RETURN_IF_ERROR(CheckAllGather(send, recv));
    return comm_->Async([&](cudaStream_t s) { return EnqueueAllGather(send, recv, s); });
  }

  StatusOr<std::unique_ptr<Request>> IReduceScatter(Tensor send, Tensor recv,
                                                    ReduceOp op) override {
    AUTOPAR_RETURN_IF_ERROR(CheckReduceScatter(send, recv));
    return comm_->Async([&](cudaStream_t s) { return EnqueueReduceScatter(send, recv, op, s); });
  }

  // The counts are read while enqueueing, which Async does before it returns.
  StatusOr<std::unique_ptr<Request>> IAllToAllV(
      Tensor send, std::span<const std::int64_t> send_counts, Tensor recv,
      std::span<const std::int64_t> recv_counts) override {
    AUTOPAR_RETURN_IF_ERROR(CheckAllToAllV(send, send_counts, recv, recv_counts));
    return comm_->Async(
        [&](cudaStream_t s) { return EnqueueAllToAllV(send, send_counts, recv, recv_counts, s); });
  }

 private:
  CudaDevice& device() { return comm_->device(); }

  // Blocking calls: enqueued on the compute stream, in order with the device's ops.
  template <typename Enqueue>
  Status Run(Enqueue&& enqueue) {
    AUTOPAR_RETURN_IF_ERROR(comm_->Ready());
    return enqueue(device().stream());
  }

  Status EnqueueAllReduce(const Tensor& send, const Tensor& recv, ReduceOp op, cudaStream_t s) {
    return AUTOPAR_NCCL_SETTLE(
        *comm_, ncclAllReduce(send.data, recv.data, Count(recv), NcclType(recv.dtype), NcclOp(op),
                              comm_->get(), s));
  }

  Status EnqueueAllGather(const Tensor& send, const Tensor& recv, cudaStream_t s) {
    return AUTOPAR_NCCL_SETTLE(*comm_, ncclAllGather(send.data, recv.data, Count(send),
                                                     NcclType(send.dtype), comm_->get(), s));
  }

  Status EnqueueReduceScatter(const Tensor& send, const Tensor& recv, ReduceOp op, cudaStream_t s) {
    return AUTOPAR_NCCL_SETTLE(
        *comm_, ncclReduceScatter(send.data, recv.data, Count(recv), NcclType(recv.dtype),
                                  NcclOp(op), comm_->get(), s));
  }

  // Grouped point-to-point calls, one send and one receive per peer with a non-empty block (both
  // sides skip the same empty blocks, since rank i's send count to j is j's receive count from i).
  Status EnqueueAllToAllV(const Tensor& send, std::span<const std::int64_t> send_counts,
                          const Tensor& recv, std::span<const std::int64_t> recv_counts,
                          cudaStream_t s) {
    const std::size_t elem = DTypeSize(send.dtype);
    const ncclDataType_t type = NcclType(send.dtype);
    const char* from = static_cast<const char*>(send.data);
    char* to = static_cast<char*>(recv.data);
    return comm_->Grouped([&]() -> ncclResult_t {
      std::size_t send_offset = 0, recv_offset = 0;
      for (int peer = 0; peer < size(); ++peer) {
        const auto send_count = static_cast<std::size_t>(send_counts[peer]);
        const auto recv_count = static_cast<std::size_t>(recv_counts[peer]);
        ncclResult_t rc = ncclSuccess;
        if (send_count > 0) {
          rc = ncclSend(from + send_offset * elem, send_count, type, peer, comm_->get(), s);
        }
        if (rc == ncclSuccess && recv_count > 0) {
          rc = ncclRecv(to + recv_offset * elem, recv_count, type, peer, comm_->get(), s);
        }
        if (rc != ncclSuccess) return rc;
        send_offset += send_count;
        recv_offset += recv_count;
      }
      return ncclSuccess;
    });
  }

  Status CheckAllToAllV(const Tensor& send, std::span<const std::int64_t> send_counts,
                        const Tensor& recv, std::span<const std::int64_t> recv_counts) const {
    AUTOPAR_RETURN_IF_ERROR(CheckView("AllToAllV", send, kMaxCount));
    AUTOPAR_RETURN_IF_ERROR(CheckView("AllToAllV", recv, kMaxCount));
    AUTOPAR_CHECK_ARG(send.dtype == recv.dtype, "AllToAllV: send and recv dtypes differ");
    const auto n = static_cast<std::size_t>(size());
    AUTOPAR_CHECK_ARG(send_counts.size() == n && recv_counts.size() == n,
                      "AllToAllV: need one count per rank");
    AUTOPAR_CHECK_ARG(!Overlaps(send, recv), "AllToAllV: send and recv overlap");
    std::int64_t send_total = 0, recv_total = 0;
    for (std::size_t i = 0; i < n; ++i) {
      AUTOPAR_CHECK_ARG(send_counts[i] >= 0 && recv_counts[i] >= 0, "AllToAllV: negative count");
      send_total += send_counts[i];
      recv_total += recv_counts[i];
    }
    AUTOPAR_CHECK_ARG(send_total <= send.numel && recv_total <= recv.numel,
                      "AllToAllV: the counts exceed the buffers");
    return OkStatus();
  }

  Status CheckAllReduce(const Tensor& send, const Tensor& recv) const {
    AUTOPAR_RETURN_IF_ERROR(CheckPair("AllReduce", send, recv, 1, 1, kMaxCount));
    AUTOPAR_RETURN_IF_ERROR(CheckReducible("AllReduce", send));
    AUTOPAR_CHECK_ARG(send.data == recv.data || !Overlaps(send, recv),
                      "AllReduce: send and recv overlap without being the same view");
    return OkStatus();
  }

  // In place when send is this rank's block of recv, as NCCL and MPI define it.
  Status CheckAllGather(const Tensor& send, const Tensor& recv) const {
    AUTOPAR_RETURN_IF_ERROR(CheckPair("AllGather", send, recv, size(), 1, kMaxCount));
    const Tensor mine = recv.Slice(send.numel * rank(), send.numel);
    AUTOPAR_CHECK_ARG(send.data == mine.data || !Overlaps(send, recv),
                      "AllGather: send overlaps recv other than as this rank's block");
    return OkStatus();
  }

  // In place when recv is this rank's block of send: NCCL's own convention, so no extra work.
  Status CheckReduceScatter(const Tensor& send, const Tensor& recv) const {
    AUTOPAR_RETURN_IF_ERROR(CheckPair("ReduceScatter", send, recv, 1, size(), kMaxCount));
    AUTOPAR_RETURN_IF_ERROR(CheckReducible("ReduceScatter", send));
    const bool in_place =
        recv.numel > 0 && recv.data == send.Slice(recv.numel * rank(), recv.numel).data;
    AUTOPAR_CHECK_ARG(in_place || !Overlaps(send, recv),
                      "ReduceScatter: send and recv overlap other than recv = own block of send");
    return OkStatus();
  }

  Status CheckPeer(const char* op, int peer) const { return device::CheckPeer(op, peer, size()); }

  // Device scratch of at least `bytes` (in-place all-to-all, barrier), kept for reuse and
  // counted in the budget like any buffer.
  StatusOr<Tensor> Scratch(std::size_t bytes);

  // Declared before comm_, so it is freed after the communicator has flushed its work (when
  // these collectives held the last reference).
  Buffer scratch_;
  std::shared_ptr<NcclComm> comm_;
};

StatusOr<Tensor> NcclCollectives::Scratch(std::size_t bytes) {
  if (scratch_.bytes() < bytes) {
    // The old scratch may still be read by enqueued work: let that finish before freeing it.
    if (scratch_.bytes() > 0) AUTOPAR_RETURN_IF_ERROR(device().Synchronize());
    scratch_.Reset();
    AUTOPAR_ASSIGN_OR_RETURN(scratch_, device().Allocate(bytes));
  }
  return scratch_.tensor();
}

Status NcclCollectives::AllToAll(Tensor send, Tensor recv) {
  AUTOPAR_RETURN_IF_ERROR(CheckPair("AllToAll", send, recv, 1, 1, kMaxCount));
  AUTOPAR_CHECK_ARG(send.numel % size() == 0, "AllToAll: numel is not a multiple of size");
  AUTOPAR_CHECK_ARG(send.data == recv.data || !Overlaps(send, recv),
                    "AllToAll: send and recv overlap without being the same view");
  return Run([&](cudaStream_t s) -> Status {
    const char* from = static_cast<const char*>(send.data);
    if (send.data == recv.data && send.numel > 0) {
      // Grouped send/recv read and write concurrently: in place needs a copy of the input.
      AUTOPAR_ASSIGN_OR_RETURN(const Tensor copy, Scratch(send.bytes()));
      AUTOPAR_CHECK_CUDA(
          cudaMemcpyAsync(copy.data, send.data, send.bytes(), cudaMemcpyDeviceToDevice, s));
      from = static_cast<const char*>(copy.data);
    }
    const std::size_t block = Count(send) / static_cast<std::size_t>(size());
    const std::size_t block_bytes = block * DTypeSize(send.dtype);
    const ncclDataType_t type = NcclType(send.dtype);
    char* to = static_cast<char*>(recv.data);
    return comm_->Grouped([&]() -> ncclResult_t {
      for (int peer = 0; peer < size(); ++peer) {
        ncclResult_t rc = ncclSend(from + peer * block_bytes, block, type, peer, comm_->get(), s);
        if (rc == ncclSuccess) {
          rc = ncclRecv(to + peer * block_bytes, block, type, peer, comm_->get(), s);
        }
        if (rc != ncclSuccess) return rc;
      }
      return ncclSuccess;
    });
  });
}

Status NcclCollectives::Broadcast(Tensor buf, int root) {
  AUTOPAR_RETURN_IF_ERROR(CheckView("Broadcast", buf, kMaxCount));
  AUTOPAR_RETURN_IF_ERROR(CheckPeer("Broadcast", root));
  return Run([&](cudaStream_t s) {
    return AUTOPAR_NCCL_SETTLE(*comm_, ncclBroadcast(buf.data, buf.data, Count(buf),
                                                     NcclType(buf.dtype), root, comm_->get(), s));
  });
}

Status NcclCollectives::Barrier() {
  // NCCL has no barrier: all-reduce one word, then wait for it (and everything before it) on the
  // host. Returns once every member has reached the barrier.
  AUTOPAR_ASSIGN_OR_RETURN(const Tensor word, Scratch(sizeof(float)));
  const Tensor flag{word.data, 1, DType::kF32};
  AUTOPAR_RETURN_IF_ERROR(AllReduce(flag, flag, ReduceOp::kSum));
  return device().Synchronize();
}

Status NcclCollectives::Send(Tensor buf, int peer, int /*tag*/) {
  AUTOPAR_RETURN_IF_ERROR(CheckView("Send", buf, kMaxCount));
  AUTOPAR_RETURN_IF_ERROR(CheckPeer("Send", peer));
  return Run([&](cudaStream_t s) {
    return AUTOPAR_NCCL_SETTLE(
        *comm_, ncclSend(buf.data, Count(buf), NcclType(buf.dtype), peer, comm_->get(), s));
  });
}

Status NcclCollectives::Recv(Tensor buf, int peer, int /*tag*/) {
  AUTOPAR_RETURN_IF_ERROR(CheckView("Recv", buf, kMaxCount));
  AUTOPAR_RETURN_IF_ERROR(CheckPeer("Recv", peer));
  return Run([&](cudaStream_t s) {
    return AUTOPAR_NCCL_SETTLE(
        *comm_, ncclRecv(buf.data, Count(buf), NcclType(buf.dtype), peer, comm_->get(), s));
  });
}

Status NcclCollectives::SendRecv(Tensor send, int dst, Tensor recv, int src, int /*tag*/) {
  AUTOPAR_RETURN_IF_ERROR(CheckView("SendRecv", send, kMaxCount));
  AUTOPAR_RETURN_IF_ERROR(CheckView("SendRecv", recv, kMaxCount));
  AUTOPAR_RETURN_IF_ERROR(CheckPeer("SendRecv", dst));
  AUTOPAR_RETURN_IF_ERROR(CheckPeer("SendRecv", src));
  AUTOPAR_CHECK_ARG(!Overlaps(send, recv), "SendRecv: send and recv overlap");
  return Run([&](cudaStream_t s) {
    // One group, so a ring shift (everyone sends right, receives left) cannot deadlock.
    return comm_->Grouped([&]() -> ncclResult_t {
      const ncclResult_t rc =
          ncclSend(send.data, Count(send), NcclType(send.dtype), dst, comm_->get(), s);
      if (rc != ncclSuccess) return rc;
      return ncclRecv(recv.data, Count(recv), NcclType(recv.dtype), src, comm_->get(), s);
    });
  });
}

}  // namespace

StatusOr<std::unique_ptr<Collectives>> MakeNcclCollectives(CudaDevice& device, const Group& group) {
  AUTOPAR_ASSIGN_OR_RETURN(std::unique_ptr<NcclComm> comm, NcclComm::Create(device, group));
  return MakeNcclCollectives(std::shared_ptr<NcclComm>(std::move(comm)));
}

std::unique_ptr<Collectives> MakeNcclCollectives(std::shared_ptr<NcclComm> comm) {
  return std::make_unique<NcclCollectives>(std::move(comm));
}

}  // namespace autopar::device
