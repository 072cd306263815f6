#include "src/device/cpu/mpi_collectives.h"

#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "autopar/device/mpi_check.h"
#include "src/device/validate.h"

namespace autopar::device {
namespace {

// MPI types for moving data; 16-bit floats travel as opaque 16-bit words.
MPI_Datatype MpiType(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return MPI_FLOAT;
    case DType::kI32:
      return MPI_INT32_T;
    case DType::kBF16:
    case DType::kF16:
      return MPI_UINT16_T;
    case DType::kU8:
      return MPI_BYTE;
  }
  return MPI_BYTE;
}

MPI_Op MpiOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  return MPI_SUM;
}

// MPI's element counts are ints.
constexpr std::int64_t kMaxCount = INT_MAX;

// MPI has no 16-bit float arithmetic; reductions run on f32 and i32 only.
Status CheckReducible(const char* op, const Tensor& t) {
  AUTOPAR_CHECK_ARG(t.dtype == DType::kF32 || t.dtype == DType::kI32,
                    std::string(op) + ": cannot reduce " + DTypeName(t.dtype) + " over MPI");
  return OkStatus();
}

// One operation's MPI requests (one, or a batch's sends and receives); complete when all are.
class MpiRequest final : public Request {
 public:
  MpiRequest(MPI_Request request, bool point_to_point)
      : requests_{request}, point_to_point_(point_to_point) {}
  MpiRequest(std::vector<MPI_Request> requests, bool point_to_point)
      : requests_(std::move(requests)), point_to_point_(point_to_point) {}
  ~MpiRequest() override {
    if (Finished()) return;
    int finalized = 0;
    if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
    // The transport may still be writing the caller's buffer: finish before it can be freed.
    const Status status = Wait();
    if (!status.ok()) std::fprintf(stderr, "~MpiRequest: %s\n", status.ToString().c_str());
  }

  Status Wait() override {
    if (Finished()) return OkStatus();
    AUTOPAR_CHECK_MPI(MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(),
                                  MPI_STATUSES_IGNORE));
    Complete();
    return OkStatus();
  }

  StatusOr<bool> Test() override {
    if (Finished()) return true;
    int done = 0;
    AUTOPAR_CHECK_MPI(MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done,
                                  MPI_STATUSES_IGNORE));
    if (done) Complete();
    return done != 0;
  }

  // Runs once when the operation completes (the in-place reduce-scatter's block move).
  std::function<void()> on_complete;
  // Arrays MPI reads until the operation completes (MPI_Ialltoallv's counts and displacements).
  std::vector<int> arrays;

  void Complete() {
    if (on_complete) {
      on_complete();
      on_complete = nullptr;
    }
  }

  // Takes the MPI request once it exists (after the arrays it reads are in place).
  void Adopt(MPI_Request request) { requests_.assign(1, request); }

  void Abandon() override {
    for (MPI_Request& request : requests_) {
      if (request == MPI_REQUEST_NULL) continue;
      // MPI forbids cancelling or freeing a non-blocking collective's request: leave it to MPI.
      if (point_to_point_ && MPI_Cancel(&request) == MPI_SUCCESS) {
        if (MPI_Request_free(&request) != MPI_SUCCESS) {
          std::fprintf(stderr, "MpiRequest::Abandon: MPI_Request_free failed\n");
        }
      }
      request = MPI_REQUEST_NULL;
    }
  }

 private:
  bool Finished() const {
    for (const MPI_Request& request : requests_) {
      if (request != MPI_REQUEST_NULL) return false;
    }
    return true;
  }

  std::vector<MPI_Request> requests_;  // each MPI_REQUEST_NULL once complete
  bool point_to_point_;
};

class MpiCollectives final : public Collectives {
 public:
  MpiCollectives(Group group, bool nccl_matching)
      : group_(std::move(group)), nccl_matching_(nccl_matching) {}

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }

  Status AllReduce(Tensor send, Tensor recv, ReduceOp op) override {
    AUTOPAR_RETURN_IF_ERROR(CheckPair("AllReduce", send, recv, 1, 1, kMaxCount));
    AUTOPAR_RETURN_IF_ERROR(CheckReducible("AllReduce", send));
    AUTOPAR_CHECK_MPI(MPI_Allreduce(SendOrInPlace(send, recv), recv.data, Count(recv),
                                    MpiType(recv.dtype), MpiOp(op), comm()));
    return OkStatus();
  }

  Status AllGather(Tensor send, Tensor recv) override {
    AUTOPAR_RETURN_IF_ERROR(CheckPair("AllGather", send, recv, size(), 1, kMaxCount));
    AUTOPAR_CHECK_MPI(MPI_Allgather(GatherSend(send, recv), Count(send), MpiType(send.dtype),
                                    recv.data, Count(send), MpiType(recv.dtype), comm()));
    return OkStatus();
  }

  Status ReduceScatter(Tensor send, Tensor recv, ReduceOp op) override {
    AUTOPAR_RETURN_IF_ERROR(CheckReduceScatter(send, recv));
    if (InPlaceScatter(send, recv)) {
      AUTOPAR_CHECK_MPI(MPI_Reduce_scatter_block(MPI_IN_PLACE, send.data, Count(recv),
                                                 MpiType(recv.dtype), MpiOp(op), comm()));
      MoveFirstBlockTo(send, recv);
      return OkStatus();
    }
    AUTOPAR_CHECK_MPI(MPI_Reduce_scatter_block(send.data, recv.data, Count(recv),
                                               MpiType(recv.dtype), MpiOp(op), comm()));
    return OkStatus();
  }

  Status AllToAll(Tensor send, Tensor recv) override {
    AUTOPAR_RETURN_IF_ERROR(CheckPair("AllToAll", send, recv, 1, 1, kMaxCount));
    AUTOPAR_CHECK_ARG(send.numel % size() == 0, "AllToAll: numel is not a multiple of size");
    const int block = static_cast<int>(send.numel / size());
    AUTOPAR_CHECK_MPI(MPI_Alltoall(SendOrInPlace(send, recv), block, MpiType(send.dtype), recv.data,
                                   block, MpiType(recv.dtype), comm()));
    return OkStatus();
  }

  Status AllToAllV(Tensor send, std::span<const std::int64_t> send_counts, Tensor recv,
                   std::span<const std::int64_t> recv_counts) override {
    AUTOPAR_ASSIGN_OR_RETURN(std::vector<int> a,
                             AllToAllVArrays(send, send_counts, recv, recv_counts));
    const std::ptrdiff_t n = size();
    AUTOPAR_CHECK_MPI(MPI_Alltoallv(send.data, a.data(), a.data() + n, MpiType(send.dtype),
                                    recv.data, a.data() + 2 * n, a.data() + 3 * n,
                                    MpiType(recv.dtype), comm()));
    return OkStatus();
  }

  Status Broadcast(Tensor buf, int root) override {
    AUTOPAR_RETURN_IF_ERROR(CheckView("Broadcast", buf, kMaxCount));
    AUTOPAR_RETURN_IF_ERROR(CheckPeer("Broadcast", root));
    AUTOPAR_CHECK_MPI(MPI_Bcast(buf.data, Count(buf), MpiType(buf.dtype), root, comm()));
    return OkStatus();
  }

  Status Barrier() override {
    AUTOPAR_CHECK_MPI(MPI_Barrier(comm()));
    return OkStatus();
  }

  Status Send(Tensor buf, int peer, int tag) override {
    AUTOPAR_RETURN_IF_ERROR(CheckView("Send", buf, kMaxCount));
    AUTOPAR_RETURN_IF_ERROR(CheckPeer("Send", peer));
    AUTOPAR_CHECK_MPI(MPI_Send(buf.data, Count(buf), MpiType(buf.dtype), peer, tag, comm()));
    return OkStatus();
  }

  Status Recv(Tensor buf, int peer, int tag) override {
    AUTOPAR_RETURN_IF_ERROR(CheckView("Recv", buf, kMaxCount));
    AUTOPAR_RETURN_IF_ERROR(CheckPeer("Recv", peer));
    MPI_Status status;
    AUTOPAR_CHECK_MPI(
        MPI_Recv(buf.data, Count(buf), MpiType(buf.dtype), peer, tag, comm(), &status));
    return CheckReceived("Recv", status, buf);
  }

  Status SendRecv(Tensor send, int dst, Tensor recv, int src, int tag) override {
    AUTOPAR_RETURN_IF_ERROR(CheckView("SendRecv", send, kMaxCount));
    AUTOPAR_RETURN_IF_ERROR(CheckView("SendRecv", recv, kMaxCount));
    AUTOPAR_RETURN_IF_ERROR(CheckPeer("SendRecv", dst));
    AUTOPAR_RETURN_IF_ERROR(CheckPeer("SendRecv", src));
    AUTOPAR_CHECK_ARG(!Overlaps(send, recv), "SendRecv: send and recv overlap");
    MPI_Status status;
    AUTOPAR_CHECK_MPI(MPI_Sendrecv(send.data, Count(send), MpiType(send.dtype), dst, tag, recv.data,
                                   Count(recv), MpiType(recv.dtype), src, tag, comm(), &status));
    return CheckReceived("SendRecv", status, recv);
  }

  StatusOr<std::unique_ptr<Request>> IBatchSendRecv(std::span<const P2POp> ops) override {
    AUTOPAR_RETURN_IF_ERROR(CheckBatch(ops, size(), kMaxCount));
    std::vector<MPI_Request> requests;
    requests.reserve(ops.size());
    for (const P2POp& op : ops) {
      MPI_Request request = MPI_REQUEST_NULL;
      const Status started = op.kind == P2POp::kSend ? StartSend(op.buf, op.peer, op.tag, &request)
                                                     : StartRecv(op.buf, op.peer, op.tag, &request);
      if (!started.ok()) {
        MpiRequest(std::move(requests), /*point_to_point=*/true).Abandon();
        return started;
      }
      requests.push_back(request);
    }
    return std::unique_ptr<Request>(
        std::make_unique<MpiRequest>(std::move(requests), /*point_to_point=*/true));
  }

  StatusOr<std::unique_ptr<Request>> ISend(Tensor buf, int peer, int tag) override {
    AUTOPAR_RETURN_IF_ERROR(CheckView("ISend", buf, kMaxCount));
    AUTOPAR_RETURN_IF_ERROR(CheckPeer("ISend", peer));
    MPI_Request request = MPI_REQUEST_NULL;
    AUTOPAR_RETURN_IF_ERROR(StartSend(buf, peer, tag, &request));
    return Wrap(request, /*point_to_point=*/true);
  }

  StatusOr<std::unique_ptr<Request>> IRecv(Tensor buf, int peer, int tag) override {
    AUTOPAR_RETURN_IF_ERROR(CheckView("IRecv", buf, kMaxCount));
    AUTOPAR_RETURN_IF_ERROR(CheckPeer("IRecv", peer));
    MPI_Request request = MPI_REQUEST_NULL;
    AUTOPAR_RETURN_IF_ERROR(StartRecv(buf, peer, tag, &request));
    return Wrap(request, /*point_to_point=*/true);
  }

  StatusOr<std::unique_ptr<Request>> IAllReduce(Tensor send, Tensor recv, ReduceOp op) override {
    AUTOPAR_RETURN_IF_ERROR(CheckPair("IAllReduce", send, recv, 1, 1, kMaxCount));
    AUTOPAR_RETURN_IF_ERROR(CheckReducible("IAllReduce", send));
    MPI_Request request = MPI_REQUEST_NULL;
    AUTOPAR_CHECK_MPI(MPI_Iallreduce(SendOrInPlace(send, recv), recv.data, Count(recv),
                                     MpiType(recv.dtype), MpiOp(op), comm(), &request));
    return Wrap(request, /*point_to_point=*/false);
  }

  StatusOr<std::unique_ptr<Request>> IAllGather(Tensor send, Tensor recv) override {
    AUTOPAR_RETURN_IF_ERROR(CheckPair("IAllGather", send, recv, size(), 1, kMaxCount));
    MPI_Request request = MPI_REQUEST_NULL;
    AUTOPAR_CHECK_MPI(MPI_Iallgather(GatherSend(send, recv), Count(send), MpiType(send.dtype),
                                     recv.data, Count(send), MpiType(recv.dtype), comm(),
                                     &request));
    return Wrap(request, /*point_to_point=*/false);
  }

  StatusOr<std::unique_ptr<Request>> IReduceScatter(Tensor send, Tensor recv,
                                                    ReduceOp op) override {
    AUTOPAR_RETURN_IF_ERROR(CheckReduceScatter(send, recv));
    MPI_Request request = MPI_REQUEST_NULL;
    if (InPlaceScatter(send, recv)) {
      AUTOPAR_CHECK_MPI(MPI_Ireduce_scatter_block(MPI_IN_PLACE, send.data, Count(recv),
                                                  MpiType(recv.dtype), MpiOp(op), comm(),
                                                  &request));
      auto wrapped = std::make_unique<MpiRequest>(request, /*point_to_point=*/false);
      wrapped->on_complete = [send, recv] { MoveFirstBlockTo(send, recv); };
      return std::unique_ptr<Request>(std::move(wrapped));
    }
    AUTOPAR_CHECK_MPI(MPI_Ireduce_scatter_block(send.data, recv.data, Count(recv),
                                                MpiType(recv.dtype), MpiOp(op), comm(), &request));
    return Wrap(request, /*point_to_point=*/false);
  }

  StatusOr<std::unique_ptr<Request>> IAllToAllV(
      Tensor send, std::span<const std::int64_t> send_counts, Tensor recv,
      std::span<const std::int64_t> recv_counts) override {
    AUTOPAR_ASSIGN_OR_RETURN(std::vector<int> a,
                             AllToAllVArrays(send, send_counts, recv, recv_counts));
    auto wrapped = std::make_unique<MpiRequest>(MPI_REQUEST_NULL, /*point_to_point=*/false);
    wrapped->arrays = std::move(a);  // MPI reads them until the operation completes
    const int* arrays = wrapped->arrays.data();
    const std::ptrdiff_t n = size();
    MPI_Request request = MPI_REQUEST_NULL;
    AUTOPAR_CHECK_MPI(MPI_Ialltoallv(send.data, arrays, arrays + n, MpiType(send.dtype), recv.data,
                                     arrays + 2 * n, arrays + 3 * n, MpiType(recv.dtype), comm(),
                                     &request));
    wrapped->Adopt(request);
    return std::unique_ptr<Request>(std::move(wrapped));
  }

 private:
  MPI_Comm comm() const { return group_.comm(); }

  // Under NCCL matching a message matches by order per peer pair, whatever its tag (NCCL has no
  // tags), and a send completes only once its receive is posted (MPI's synchronous mode). Only
  // the non-blocking point-to-point forms need it: the stream-order layer (stream_order.h) runs
  // every send and receive through them.
  int Tag(int tag) const { return nccl_matching_ ? 0 : tag; }
  Status StartSend(const Tensor& buf, int peer, int tag, MPI_Request* request) const {
    AUTOPAR_CHECK_MPI((nccl_matching_ ? MPI_Issend : MPI_Isend)(
        buf.data, Count(buf), MpiType(buf.dtype), peer, Tag(tag), comm(), request));
    return OkStatus();
  }
  Status StartRecv(const Tensor& buf, int peer, int tag, MPI_Request* request) const {
    AUTOPAR_CHECK_MPI(
        MPI_Irecv(buf.data, Count(buf), MpiType(buf.dtype), peer, Tag(tag), comm(), request));
    return OkStatus();
  }

  // Checks an all-to-all-v and returns MPI's int arrays: send counts, send displacements, recv
  // counts, recv displacements (n each, blocks packed in rank order).
  StatusOr<std::vector<int>> AllToAllVArrays(const Tensor& send,
                                             std::span<const std::int64_t> send_counts,
                                             const Tensor& recv,
                                             std::span<const std::int64_t> recv_counts) const {
    AUTOPAR_RETURN_IF_ERROR(CheckView("AllToAllV", send, kMaxCount));
    AUTOPAR_RETURN_IF_ERROR(CheckView("AllToAllV", recv, kMaxCount));
    AUTOPAR_CHECK_ARG(send.dtype == recv.dtype, "AllToAllV: send and recv dtypes differ");
    const auto n = static_cast<std::size_t>(size());
    AUTOPAR_CHECK_ARG(send_counts.size() == n && recv_counts.size() == n,
                      "AllToAllV: need one count per rank");
    AUTOPAR_CHECK_ARG(!Overlaps(send, recv), "AllToAllV: send and recv overlap");
    std::vector<int> a(4 * n);
    std::int64_t send_total = 0, recv_total = 0;
    for (std::size_t i = 0; i < n; ++i) {
      AUTOPAR_CHECK_ARG(send_counts[i] >= 0 && recv_counts[i] >= 0, "AllToAllV: negative count");
      a[i] = static_cast<int>(send_counts[i]);
      a[n + i] = static_cast<int>(send_total);
      a[2 * n + i] = static_cast<int>(recv_counts[i]);
      a[3 * n + i] = static_cast<int>(recv_total);
      send_total += send_counts[i];
      recv_total += recv_counts[i];
      AUTOPAR_CHECK_ARG(send_total <= INT_MAX && recv_total <= INT_MAX,
                        "AllToAllV: more than INT_MAX elements");
    }
    AUTOPAR_CHECK_ARG(send_total <= send.numel, "AllToAllV: send holds " +
                                                    std::to_string(send.numel) + " elements, " +
                                                    std::to_string(send_total) + " to send");
    AUTOPAR_CHECK_ARG(recv_total <= recv.numel, "AllToAllV: recv holds " +
                                                    std::to_string(recv.numel) + " elements, " +
                                                    std::to_string(recv_total) + " to receive");
    return a;
  }
  static int Count(const Tensor& t) { return static_cast<int>(t.numel); }

  static const void* SendOrInPlace(const Tensor& send, const Tensor& recv) {
    return send.data == recv.data && send.numel > 0 ? MPI_IN_PLACE : send.data;
  }

  // In place when recv is this rank's own block of send (NCCL's convention, the distributed
  // optimizer's gradient reduce-scatter). MPI's in-place form leaves the block at the start of
  // the buffer, so it is moved to the rank's block afterwards.
  bool InPlaceScatter(const Tensor& send, const Tensor& recv) const {
    return recv.numel > 0 && recv.data == send.Slice(recv.numel * rank(), recv.numel).data;
  }
  static void MoveFirstBlockTo(const Tensor& send, const Tensor& recv) {
    if (recv.data != send.data) std::memmove(recv.data, send.data, recv.bytes());
  }

  // In place when send is this rank's own block of recv (the distributed optimizer's gather).
  const void* GatherSend(const Tensor& send, const Tensor& recv) const {
    const Tensor mine = recv.Slice(send.numel * rank(), send.numel);
    return send.numel > 0 && send.data == mine.data ? MPI_IN_PLACE : send.data;
  }

  Status CheckReduceScatter(const Tensor& send, const Tensor& recv) const {
    AUTOPAR_RETURN_IF_ERROR(CheckPair("ReduceScatter", send, recv, 1, size(), kMaxCount));
    AUTOPAR_RETURN_IF_ERROR(CheckReducible("ReduceScatter", send));
    // In place only in the exact form InPlaceScatter accepts; any other aliasing is a bug.
    AUTOPAR_CHECK_ARG(InPlaceScatter(send, recv) || !Overlaps(send, recv),
                      "ReduceScatter: send and recv overlap other than recv = own block of send");
    return OkStatus();
  }

  Status CheckPeer(const char* op, int peer) const { return device::CheckPeer(op, peer, size()); }

  // A shorter message than the buffer is a protocol error between ranks, not a transport one.
  static Status CheckReceived(const char* op, const MPI_Status& status, const Tensor& buf) {
    int count = 0;
    AUTOPAR_CHECK_MPI(MPI_Get_count(&status, MpiType(buf.dtype), &count));
    if (count != Count(buf)) {
      return Status::Error(Outcome::kCommError,
                           std::string(op) + ": received " + std::to_string(count) +
                               " elements, expected " + std::to_string(buf.numel),
                           __FILE__, __LINE__);
    }
    return OkStatus();
  }

  static std::unique_ptr<Request> Wrap(MPI_Request request, bool point_to_point) {
    return std::make_unique<MpiRequest>(request, point_to_point);
  }

  Group group_;
  bool nccl_matching_;
};

}  // namespace

StatusOr<std::unique_ptr<Collectives>> MakeMpiCollectives(const Group& group,
                                                          P2PSemantics semantics) {
  AUTOPAR_CHECK_ARG(!group.empty(), "collectives over an empty group");
  AUTOPAR_ASSIGN_OR_RETURN(Group own, group.Duplicate());
  const bool nccl = semantics == P2PSemantics::kNccl;
  auto mpi = std::make_unique<MpiCollectives>(std::move(own), nccl);
  if (!nccl) return std::unique_ptr<Collectives>(std::move(mpi));
  return MakeStreamOrdered(std::move(mpi));
}

}  // namespace autopar::device
