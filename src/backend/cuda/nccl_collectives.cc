// NCCL collectives on the CUDA device (DESIGN §5: non-blocking communicators, so they can be
// aborted).
//
// Blocking calls are enqueued on the device's compute stream: later ops see their result in stream
// order and the host does not wait. Non-blocking calls go to a side stream that first waits for
// the compute stream's work so far, and return a request on an event recorded after them; their
// kernels overlap with compute until the request is waited for. NCCL orders the operations of one
// communicator by issue order whatever the stream, so ranks that issue in the same order agree.
//
// With config.blocking = 0 any NCCL call may answer ncclInProgress; the communicator must then be
// polled with ncclCommGetAsyncError until it leaves that state before it is used again (Settle).
// Every wait has the device's deadline, past which the communicator is aborted (ncclCommAbort).
#include "src/backend/cuda/nccl_collectives.h"

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>

#include "autopar/backend/mpi_check.h"

namespace autopar::backend {
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

bool Overlaps(const Tensor& a, const Tensor& b) {
  const char* pa = static_cast<const char*>(a.data);
  const char* pb = static_cast<const char*>(b.data);
  return a.numel > 0 && b.numel > 0 && pa < pb + b.bytes() && pb < pa + a.bytes();
}

Status CheckView(const char* op, const Tensor& t) {
  AUTOPAR_CHECK_ARG(t.valid(), std::string(op) + ": invalid view");
  return OkStatus();
}

Status CheckPair(const char* op, const Tensor& send, const Tensor& recv,
                 std::int64_t recv_per_send_num, std::int64_t recv_per_send_den) {
  AUTOPAR_RETURN_IF_ERROR(CheckView(op, send));
  AUTOPAR_RETURN_IF_ERROR(CheckView(op, recv));
  AUTOPAR_CHECK_ARG(send.dtype == recv.dtype, std::string(op) + ": send and recv dtypes differ");
  AUTOPAR_CHECK_ARG(send.numel * recv_per_send_num == recv.numel * recv_per_send_den,
                    std::string(op) + ": send has " + std::to_string(send.numel) +
                        " elements, recv " + std::to_string(recv.numel));
  return OkStatus();
}

// NCCL reduces these in hardware; u8 is data movement only (as on the CPU backend).
Status CheckReducible(const char* op, const Tensor& t) {
  AUTOPAR_CHECK_ARG(t.dtype != DType::kU8,
                    std::string(op) + ": cannot reduce " + DTypeName(t.dtype));
  return OkStatus();
}

std::size_t Count(const Tensor& t) { return static_cast<std::size_t>(t.numel); }

class NcclCollectives;

// A non-blocking operation: complete once the event recorded after it on the side stream is.
class NcclRequest final : public Request {
 public:
  NcclRequest(NcclCollectives* owner, cudaEvent_t done) : owner_(owner), done_(done) {}
  ~NcclRequest() override;
  Status Wait() override;
  StatusOr<bool> Test() override;
  // NCCL cannot cancel one operation: the whole communicator is aborted, which ends its kernels
  // (so the stream drains) and fails its later calls with kCommError.
  void Abandon() override;

 private:
  NcclCollectives* owner_;
  cudaEvent_t done_;
  bool complete_ = false;
  // A wait that failed (timeout or transport error) has aborted the communicator; waiting again
  // on destruction would only spend another timeout.
  bool failed_ = false;
};

class NcclCollectives final : public Collectives, public CommWatch {
 public:
  NcclCollectives(CudaDevice& device, int rank, int size)
      : device_(device), rank_(rank), size_(size) {}
  ~NcclCollectives() override;

  Status Init(const ncclUniqueId& id);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  CudaDevice& device() { return device_; }

  // ---- CommWatch ----
  Status AsyncError() override {
    if (aborted_.load() || comm_ == nullptr) return OkStatus();
    ncclResult_t state = ncclSuccess;
    AUTOPAR_CHECK_NCCL(ncclCommGetAsyncError(comm_, &state));
    if (state != ncclSuccess && state != ncclInProgress) {
      return NcclError(state, "NCCL communicator (asynchronous error)", __FILE__, __LINE__);
    }
    return OkStatus();
  }

  void Abort() override {
    if (comm_ == nullptr || aborted_.exchange(true)) return;
    const ncclResult_t rc = ncclCommAbort(comm_);
    if (rc != ncclSuccess) {
      std::fprintf(stderr, "%s\n",
                   NcclError(rc, "ncclCommAbort", __FILE__, __LINE__).ToString().c_str());
    }
  }

  // ---- Collectives ----
  Status AllReduce(Tensor send, Tensor recv, ReduceOp op) override {
    AUTOPAR_RETURN_IF_ERROR(CheckAllReduce(send, recv));
    return Run(device_.stream(), [&](cudaStream_t s) {
      return Settle(ncclAllReduce(send.data, recv.data, Count(recv), NcclType(recv.dtype),
                                  NcclOp(op), comm_, s),
                    "ncclAllReduce", __FILE__, __LINE__);
    });
  }

  Status AllGather(Tensor send, Tensor recv) override {
    AUTOPAR_RETURN_IF_ERROR(CheckAllGather(send, recv));
    return Run(device_.stream(), [&](cudaStream_t s) { return EnqueueAllGather(send, recv, s); });
  }

  Status ReduceScatter(Tensor send, Tensor recv, ReduceOp op) override {
    AUTOPAR_RETURN_IF_ERROR(CheckReduceScatter(send, recv));
    return Run(device_.stream(),
               [&](cudaStream_t s) { return EnqueueReduceScatter(send, recv, op, s); });
  }

  Status AllToAll(Tensor send, Tensor recv) override;
  Status Broadcast(Tensor buf, int root) override;
  Status Barrier() override;
  Status Send(Tensor buf, int peer, int tag) override;
  Status Recv(Tensor buf, int peer, int tag) override;
  Status SendRecv(Tensor send, int dst, Tensor recv, int src, int tag) override;

  StatusOr<std::unique_ptr<Request>> ISend(Tensor buf, int peer, int /*tag*/) override {
    AUTOPAR_RETURN_IF_ERROR(CheckView("ISend", buf));
    AUTOPAR_RETURN_IF_ERROR(CheckPeer("ISend", peer));
    return Async([&](cudaStream_t s) {
      return Settle(ncclSend(buf.data, Count(buf), NcclType(buf.dtype), peer, comm_, s),
                    "ncclSend", __FILE__, __LINE__);
    });
  }

  StatusOr<std::unique_ptr<Request>> IRecv(Tensor buf, int peer, int /*tag*/) override {
    AUTOPAR_RETURN_IF_ERROR(CheckView("IRecv", buf));
    AUTOPAR_RETURN_IF_ERROR(CheckPeer("IRecv", peer));
    return Async([&](cudaStream_t s) {
      return Settle(ncclRecv(buf.data, Count(buf), NcclType(buf.dtype), peer, comm_, s),
                    "ncclRecv", __FILE__, __LINE__);
    });
  }

  StatusOr<std::unique_ptr<Request>> IAllReduce(Tensor send, Tensor recv, ReduceOp op) override {
    AUTOPAR_RETURN_IF_ERROR(CheckAllReduce(send, recv));
    return Async([&](cudaStream_t s) {
      return Settle(ncclAllReduce(send.data, recv.data, Count(recv), NcclType(recv.dtype),
                                  NcclOp(op), comm_, s),
                    "ncclAllReduce", __FILE__, __LINE__);
    });
  }

  StatusOr<std::unique_ptr<Request>> IAllGather(Tensor send, Tensor recv) override {
    AUTOPAR_RETURN_IF_ERROR(CheckAllGather(send, recv));
    return Async([&](cudaStream_t s) { return EnqueueAllGather(send, recv, s); });
  }

  StatusOr<std::unique_ptr<Request>> IReduceScatter(Tensor send, Tensor recv,
                                                    ReduceOp op) override {
    AUTOPAR_RETURN_IF_ERROR(CheckReduceScatter(send, recv));
    return Async([&](cudaStream_t s) { return EnqueueReduceScatter(send, recv, op, s); });
  }

 private:
  // Accepts ncclSuccess; waits out ncclInProgress (the non-blocking communicator is still taking
  // the call) until the communicator is ready again; anything else is the call's error.
  Status Settle(ncclResult_t rc, const char* call, const char* file, int line);

  // Activates the device, refuses an aborted communicator, then enqueues on `stream`.
  template <typename Enqueue>
  Status Run(cudaStream_t stream, Enqueue&& enqueue) {
    AUTOPAR_RETURN_IF_ERROR(CheckNotAborted());
    AUTOPAR_RETURN_IF_ERROR(device_.Activate());
    return enqueue(stream);
  }

  Status CheckNotAborted() const {
    if (!aborted_.load()) return OkStatus();
    return Status::Error(Outcome::kCommError,
                         "the NCCL communicator was aborted after an earlier failure", __FILE__,
                         __LINE__);
  }

  // Enqueues on the side stream behind the compute stream's work so far (which may have written
  // the send buffer), and returns a request completing with the operation.
  template <typename Enqueue>
  StatusOr<std::unique_ptr<Request>> Async(Enqueue&& enqueue);

  // ncclGroupStart, `body` (its first failure), ncclGroupEnd: the group is closed even when a
  // call inside it failed.
  template <typename Body>
  Status Grouped(Body&& body) {
    AUTOPAR_CHECK_NCCL(ncclGroupStart());
    const ncclResult_t body_rc = body();
    const ncclResult_t end_rc = ncclGroupEnd();
    if (body_rc != ncclSuccess) {
      (void)Settle(end_rc, "ncclGroupEnd", __FILE__, __LINE__);
      return NcclError(body_rc, "ncclSend/ncclRecv in a group", __FILE__, __LINE__);
    }
    return Settle(end_rc, "ncclGroupEnd", __FILE__, __LINE__);
  }

  Status EnqueueAllGather(const Tensor& send, const Tensor& recv, cudaStream_t s) {
    return Settle(ncclAllGather(send.data, recv.data, Count(send), NcclType(send.dtype), comm_, s),
                  "ncclAllGather", __FILE__, __LINE__);
  }

  Status EnqueueReduceScatter(const Tensor& send, const Tensor& recv, ReduceOp op,
                              cudaStream_t s) {
    return Settle(ncclReduceScatter(send.data, recv.data, Count(recv), NcclType(recv.dtype),
                                    NcclOp(op), comm_, s),
                  "ncclReduceScatter", __FILE__, __LINE__);
  }

  Status CheckAllReduce(const Tensor& send, const Tensor& recv) const {
    AUTOPAR_RETURN_IF_ERROR(CheckPair("AllReduce", send, recv, 1, 1));
    AUTOPAR_RETURN_IF_ERROR(CheckReducible("AllReduce", send));
    AUTOPAR_CHECK_ARG(send.data == recv.data || !Overlaps(send, recv),
                      "AllReduce: send and recv overlap without being the same view");
    return OkStatus();
  }

  // In place when send is this rank's block of recv, as NCCL and MPI define it.
  Status CheckAllGather(const Tensor& send, const Tensor& recv) const {
    AUTOPAR_RETURN_IF_ERROR(CheckPair("AllGather", send, recv, size(), 1));
    const Tensor mine = recv.Slice(send.numel * rank(), send.numel);
    AUTOPAR_CHECK_ARG(send.data == mine.data || !Overlaps(send, recv),
                      "AllGather: send overlaps recv other than as this rank's block");
    return OkStatus();
  }

  // In place when recv is this rank's block of send: NCCL's own convention, so no extra work.
  Status CheckReduceScatter(const Tensor& send, const Tensor& recv) const {
    AUTOPAR_RETURN_IF_ERROR(CheckPair("ReduceScatter", send, recv, 1, size()));
    AUTOPAR_RETURN_IF_ERROR(CheckReducible("ReduceScatter", send));
    const bool in_place =
        recv.numel > 0 && recv.data == send.Slice(recv.numel * rank(), recv.numel).data;
    AUTOPAR_CHECK_ARG(in_place || !Overlaps(send, recv),
                      "ReduceScatter: send and recv overlap other than recv = own block of send");
    return OkStatus();
  }

  Status CheckPeer(const char* op, int peer) const {
    AUTOPAR_CHECK_ARG(peer >= 0 && peer < size(), std::string(op) + ": peer " +
                                                      std::to_string(peer) + " not in group of " +
                                                      std::to_string(size()));
    return OkStatus();
  }

  // Device scratch of at least `bytes` (in-place all-to-all, barrier), kept for reuse and
  // counted in the budget like any buffer.
  StatusOr<Tensor> Scratch(std::size_t bytes);

  CudaDevice& device_;
  const int rank_;
  const int size_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t side_ = nullptr;
  bool watched_ = false;
  std::atomic<bool> aborted_{false};
  Buffer scratch_;
};

// ---- requests ----

NcclRequest::~NcclRequest() {
  if (!complete_ && !failed_) {
    // The transport may still be using the caller's buffers: finish before they can be freed.
    const Status status = Wait();
    if (!status.ok()) std::fprintf(stderr, "~NcclRequest: %s\n", status.ToString().c_str());
  }
  const cudaError_t rc = cudaEventDestroy(done_);
  if (rc != cudaSuccess) {
    std::fprintf(stderr, "%s\n",
                 CudaError(rc, "cudaEventDestroy", __FILE__, __LINE__).ToString().c_str());
  }
}

Status NcclRequest::Wait() {
  if (complete_) return OkStatus();
  CudaDevice& device = owner_->device();
  AUTOPAR_RETURN_IF_ERROR(device.Activate());
  // Polls the event, watching every communicator of the device (this one included).
  Status status =
      device.Poll("NCCL request (cudaEventQuery)", [this] { return cudaEventQuery(done_); });
  if (!status.ok()) {
    failed_ = true;
    return std::move(status).WithFrame(__FILE__, __LINE__);
  }
  complete_ = true;
  return OkStatus();
}

void NcclRequest::Abandon() {
  if (complete_ || failed_) return;
  owner_->Abort();
  failed_ = true;
}

StatusOr<bool> NcclRequest::Test() {
  if (complete_) return true;
  AUTOPAR_RETURN_IF_ERROR(owner_->device().Activate());
  const cudaError_t rc = cudaEventQuery(done_);
  if (rc == cudaSuccess) {
    complete_ = true;
    return true;
  }
  if (rc != cudaErrorNotReady) {
    failed_ = true;
    return CudaError(rc, "cudaEventQuery", __FILE__, __LINE__);
  }
  if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
  Status error = owner_->AsyncError();
  if (!error.ok()) {
    // The failed communicator's kernels may never end: abort it so the streams drain.
    owner_->Abort();
    failed_ = true;
    return std::move(error).WithFrame(__FILE__, __LINE__);
  }
  return false;
}

// ---- communicator ----

Status NcclCollectives::Settle(ncclResult_t rc, const char* call, const char* file, int line) {
  if (rc == ncclSuccess) return OkStatus();
  if (rc != ncclInProgress) return NcclError(rc, call, file, line);
  const double started_s = SteadySeconds();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm_, &state);
    if (query != ncclSuccess) return NcclError(query, "ncclCommGetAsyncError", file, line);
    if (state == ncclSuccess) return OkStatus();
    if (state != ncclInProgress) return NcclError(state, call, file, line);
    if (SteadySeconds() - started_s > device_.timeout_s()) {
      Abort();
      return Status::Error(Outcome::kTimeout,
                           std::string(call) + " still in progress after " +
                               std::to_string(device_.timeout_s()) + " s; communicator aborted",
                           file, line);
    }
    std::this_thread::yield();
  }
}

Status NcclCollectives::Init(const ncclUniqueId& id) {
  AUTOPAR_RETURN_IF_ERROR(device_.Activate());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once, so a stuck one can be aborted
  const ncclResult_t rc = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
  // A failed or timed-out initialisation leaves a communicator that can only be aborted; the
  // destructor does so because it is not marked healthy.
  AUTOPAR_RETURN_IF_ERROR(Settle(rc, "ncclCommInitRankConfig", __FILE__, __LINE__));
  AUTOPAR_CHECK_CUDA(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  device_.Watch(this);
  watched_ = true;
  return OkStatus();
}

NcclCollectives::~NcclCollectives() {
  if (watched_) device_.Unwatch(this);
  if (device_.Activate().ok() && comm_ != nullptr && !aborted_.load()) {
    // Finalize flushes what is still in flight; a healthy communicator becomes quiescent, a broken
    // one times out (Settle aborts it then) or fails (aborted here).
    Status status = watched_ ? Settle(ncclCommFinalize(comm_), "ncclCommFinalize", __FILE__,
                                      __LINE__)
                             : Status(Outcome::kCommError, "initialisation did not complete");
    if (!aborted_.load()) {
      if (status.ok()) {
        const ncclResult_t rc = ncclCommDestroy(comm_);
        if (rc != ncclSuccess) status = NcclError(rc, "ncclCommDestroy", __FILE__, __LINE__);
      } else {
        Abort();
      }
    }
    if (!status.ok() && watched_) {
      std::fprintf(stderr, "~NcclCollectives: %s\n", status.ToString().c_str());
    }
  }
  if (side_ != nullptr) {
    const cudaError_t rc = cudaStreamDestroy(side_);
    if (rc != cudaSuccess) {
      std::fprintf(stderr, "%s\n",
                   CudaError(rc, "cudaStreamDestroy", __FILE__, __LINE__).ToString().c_str());
    }
  }
}

template <typename Enqueue>
StatusOr<std::unique_ptr<Request>> NcclCollectives::Async(Enqueue&& enqueue) {
  AUTOPAR_RETURN_IF_ERROR(CheckNotAborted());
  AUTOPAR_RETURN_IF_ERROR(device_.Activate());
  cudaEvent_t ready = nullptr;
  AUTOPAR_CHECK_CUDA(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  cudaError_t rc = cudaEventRecord(ready, device_.stream());
  if (rc == cudaSuccess) rc = cudaStreamWaitEvent(side_, ready, 0);
  // Destroying a recorded event is fine: the wait already holds on to it.
  const cudaError_t destroy_rc = cudaEventDestroy(ready);
  AUTOPAR_CHECK_CUDA(rc);
  AUTOPAR_CHECK_CUDA(destroy_rc);
  AUTOPAR_RETURN_IF_ERROR(enqueue(side_));
  cudaEvent_t done = nullptr;
  AUTOPAR_CHECK_CUDA(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  auto request = std::make_unique<NcclRequest>(this, done);  // owns `done` from here on
  AUTOPAR_CHECK_CUDA(cudaEventRecord(done, side_));
  return std::unique_ptr<Request>(std::move(request));
}

StatusOr<Tensor> NcclCollectives::Scratch(std::size_t bytes) {
  if (scratch_.bytes() < bytes) {
    // The old scratch may still be read by enqueued work: let that finish before freeing it.
    if (scratch_.bytes() > 0) AUTOPAR_RETURN_IF_ERROR(device_.Synchronize());
    scratch_.Reset();
    AUTOPAR_ASSIGN_OR_RETURN(scratch_, device_.Allocate(bytes));
  }
  return scratch_.tensor();
}

Status NcclCollectives::AllToAll(Tensor send, Tensor recv) {
  AUTOPAR_RETURN_IF_ERROR(CheckPair("AllToAll", send, recv, 1, 1));
  AUTOPAR_CHECK_ARG(send.numel % size() == 0, "AllToAll: numel is not a multiple of size");
  AUTOPAR_CHECK_ARG(send.data == recv.data || !Overlaps(send, recv),
                    "AllToAll: send and recv overlap without being the same view");
  return Run(device_.stream(), [&](cudaStream_t s) -> Status {
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
    return Grouped([&]() -> ncclResult_t {
      for (int peer = 0; peer < size(); ++peer) {
        ncclResult_t rc = ncclSend(from + peer * block_bytes, block, type, peer, comm_, s);
        if (rc == ncclSuccess) rc = ncclRecv(to + peer * block_bytes, block, type, peer, comm_, s);
        if (rc != ncclSuccess) return rc;
      }
      return ncclSuccess;
    });
  });
}

Status NcclCollectives::Broadcast(Tensor buf, int root) {
  AUTOPAR_RETURN_IF_ERROR(CheckView("Broadcast", buf));
  AUTOPAR_RETURN_IF_ERROR(CheckPeer("Broadcast", root));
  return Run(device_.stream(), [&](cudaStream_t s) {
    return Settle(
        ncclBroadcast(buf.data, buf.data, Count(buf), NcclType(buf.dtype), root, comm_, s),
        "ncclBroadcast", __FILE__, __LINE__);
  });
}

Status NcclCollectives::Barrier() {
  // NCCL has no barrier: all-reduce one word, then wait for it (and everything before it) on the
  // host. Returns once every member has reached the barrier.
  AUTOPAR_ASSIGN_OR_RETURN(const Tensor word, Scratch(sizeof(float)));
  const Tensor flag{word.data, 1, DType::kF32};
  AUTOPAR_RETURN_IF_ERROR(AllReduce(flag, flag, ReduceOp::kSum));
  return device_.Synchronize();
}

Status NcclCollectives::Send(Tensor buf, int peer, int /*tag*/) {
  AUTOPAR_RETURN_IF_ERROR(CheckView("Send", buf));
  AUTOPAR_RETURN_IF_ERROR(CheckPeer("Send", peer));
  return Run(device_.stream(), [&](cudaStream_t s) {
    return Settle(ncclSend(buf.data, Count(buf), NcclType(buf.dtype), peer, comm_, s), "ncclSend",
                  __FILE__, __LINE__);
  });
}

Status NcclCollectives::Recv(Tensor buf, int peer, int /*tag*/) {
  AUTOPAR_RETURN_IF_ERROR(CheckView("Recv", buf));
  AUTOPAR_RETURN_IF_ERROR(CheckPeer("Recv", peer));
  return Run(device_.stream(), [&](cudaStream_t s) {
    return Settle(ncclRecv(buf.data, Count(buf), NcclType(buf.dtype), peer, comm_, s), "ncclRecv",
                  __FILE__, __LINE__);
  });
}

Status NcclCollectives::SendRecv(Tensor send, int dst, Tensor recv, int src, int /*tag*/) {
  AUTOPAR_RETURN_IF_ERROR(CheckView("SendRecv", send));
  AUTOPAR_RETURN_IF_ERROR(CheckView("SendRecv", recv));
  AUTOPAR_RETURN_IF_ERROR(CheckPeer("SendRecv", dst));
  AUTOPAR_RETURN_IF_ERROR(CheckPeer("SendRecv", src));
  AUTOPAR_CHECK_ARG(!Overlaps(send, recv), "SendRecv: send and recv overlap");
  return Run(device_.stream(), [&](cudaStream_t s) {
    // One group, so a ring shift (everyone sends right, receives left) cannot deadlock.
    return Grouped([&]() -> ncclResult_t {
      const ncclResult_t rc = ncclSend(send.data, Count(send), NcclType(send.dtype), dst, comm_, s);
      if (rc != ncclSuccess) return rc;
      return ncclRecv(recv.data, Count(recv), NcclType(recv.dtype), src, comm_, s);
    });
  });
}

}  // namespace

StatusOr<std::unique_ptr<Collectives>> MakeNcclCollectives(CudaDevice& device,
                                                           const Group& group) {
  AUTOPAR_CHECK_ARG(!group.empty(), "collectives over an empty group");
  // Rank 0 tells the others whether it has an id, so its failure cannot leave them waiting.
  struct {
    int ok = 0;
    ncclUniqueId id{};
  } hello;
  Status made;
  if (group.rank() == 0) {
    const ncclResult_t rc = ncclGetUniqueId(&hello.id);
    hello.ok = rc == ncclSuccess ? 1 : 0;
    if (rc != ncclSuccess) made = NcclError(rc, "ncclGetUniqueId", __FILE__, __LINE__);
  }
  AUTOPAR_CHECK_MPI(MPI_Bcast(&hello, static_cast<int>(sizeof(hello)), MPI_BYTE, 0, group.comm()));
  if (hello.ok == 0) {
    if (!made.ok()) return made;
    return Status::Error(Outcome::kCommError,
                         "rank 0 of the group could not make an NCCL unique id", __FILE__,
                         __LINE__);
  }
  auto collectives = std::make_unique<NcclCollectives>(device, group.rank(), group.size());
  AUTOPAR_RETURN_IF_ERROR(collectives->Init(hello.id));
  return std::unique_ptr<Collectives>(std::move(collectives));
}

}  // namespace autopar::backend
