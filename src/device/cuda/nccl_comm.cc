#include "src/device/cuda/nccl_comm.h"

#include <cstdio>
#include <string>
#include <utility>

#include "autopar/device/mpi_check.h"

namespace autopar::device {
namespace {

// A non-blocking operation: complete once the event recorded after it on the side stream is.
class NcclRequest final : public Request {
 public:
  NcclRequest(NcclComm* comm, cudaEvent_t done) : comm_(comm), done_(done) {}
  ~NcclRequest() override;
  Status Wait() override;
  StatusOr<bool> Test() override;
  // cudaStreamWaitEvent(compute stream, done): the compute stream's later work waits on the
  // device; the host returns at once (CudaDevice::OrderAfter keeps the deadline).
  Status OrderOnDevice(std::chrono::steady_clock::time_point deadline) override;
  // NCCL cannot cancel one operation: the whole communicator is aborted, which ends its kernels
  // (so the streams drain) and fails its later calls with kCommError.
  void Abandon() override;

 private:
  NcclComm* comm_;
  cudaEvent_t done_;
  bool complete_ = false;
  // A wait that failed (timeout or transport error) has aborted the communicator; waiting again
  // on destruction would only spend another timeout.
  bool failed_ = false;
};

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
  CudaDevice& device = comm_->device();
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

StatusOr<bool> NcclRequest::Test() {
  if (complete_) return true;
  AUTOPAR_RETURN_IF_ERROR(comm_->device().Activate());
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
  Status error = comm_->AsyncError();
  if (!error.ok()) {
    // The failed communicator's kernels may never end: abort it so the streams drain.
    comm_->Abort();
    failed_ = true;
    return std::move(error).WithFrame(__FILE__, __LINE__);
  }
  return false;
}

Status NcclRequest::OrderOnDevice(std::chrono::steady_clock::time_point deadline) {
  if (complete_) return OkStatus();
  if (failed_) {
    return Status::Error(Outcome::kCommError, "ordering a failed NCCL request", __FILE__, __LINE__);
  }
  CudaDevice& device = comm_->device();
  AUTOPAR_RETURN_IF_ERROR(device.Activate());
  // The event's recorded work is what the compute stream waits for; destroying the event later
  // (in the destructor) does not undo the wait.
  Status status = device.OrderAfter(done_, deadline);
  if (!status.ok()) {
    failed_ = true;
    return std::move(status).WithFrame(__FILE__, __LINE__);
  }
  complete_ = true;
  return OkStatus();
}

void NcclRequest::Abandon() {
  if (complete_ || failed_) return;
  comm_->Abort();
  failed_ = true;
}

}  // namespace

StatusOr<std::unique_ptr<NcclComm>> NcclComm::Create(CudaDevice& device, const Group& group) {
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
  std::unique_ptr<NcclComm> comm(new NcclComm(device, group.rank(), group.size()));
  AUTOPAR_RETURN_IF_ERROR(comm->Init(hello.id));
  return comm;
}

StatusOr<std::unique_ptr<NcclComm>> NcclComm::Split(NcclComm& parent, int color, int key) {
  AUTOPAR_RETURN_IF_ERROR(parent.Ready());
  ncclConfig_t config = NcclCommConfig();  // no resources shared with the parent
  // Owned from here, so a failure below aborts the child (the destructor aborts what is not
  // healthy).
  std::unique_ptr<NcclComm> comm(new NcclComm(parent.device_, -1, 0));
  // A non-blocking split returns ncclInProgress with *newcomm still NULL; NCCL's init thread writes
  // the child handle there when the split completes (src/init.cc, ncclCommInitChildComm: "*newcomm
  // should be NCCL_COMM_NULL until comm split fully complete"; ncclCommInitRankFunc assigns
  // job->newcomm at its end). So NCCL gets the address of the member that keeps the handle, which
  // outlives the wait, and the handle is read only once the parent has settled. A copy taken right
  // after the call would be NULL.
  const ncclResult_t rc = ncclCommSplit(parent.comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key,
                                        &comm->comm_, &config);
  // A non-blocking split is waited for on the parent's state (the split runs as an asynchronous
  // job of the parent, which stays ncclInProgress until it ends; ncclCommSplit itself returns
  // ncclSuccess as soon as the job is launched, so Settle polls whatever it returned), then on
  // the child's own initialisation. On any failure the parent is aborted too, which also joins the
  // split's job (ncclCommAbort -> ncclCommEnsureReady): its owner then rebuilds the family instead
  // of splitting again from a parent in an unknown state.
  Status status = parent.Settle(rc, "ncclCommSplit", __FILE__, __LINE__);
  if (!status.ok()) parent.Abort();  // no-op if Settle already aborted it; the job has ended
  const ncclComm_t child = comm->comm_;
  if (status.ok() && child != nullptr) {
    status = comm->Settle(ncclSuccess, "ncclCommSplit (child initialisation)", __FILE__, __LINE__);
  }
  if (status.ok() && child != nullptr) {
    ncclResult_t query = ncclCommUserRank(child, &comm->rank_);
    if (query == ncclSuccess) query = ncclCommCount(child, &comm->size_);
    if (query != ncclSuccess) {
      status = NcclError(query, "ncclCommUserRank / ncclCommCount", __FILE__, __LINE__);
    }
  }
  if (status.ok() && child != nullptr) status = comm->Finish();
  if (!status.ok()) {
    parent.Abort();
    return std::move(status).WithFrame(__FILE__, __LINE__);
  }
  if (child == nullptr) return std::unique_ptr<NcclComm>();
  return comm;
}

Status NcclComm::Init(const ncclUniqueId& id) {
  AUTOPAR_RETURN_IF_ERROR(device_.Activate());
  ncclConfig_t config = NcclCommConfig();
  const ncclResult_t rc = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
  // A failed or timed-out initialisation leaves a communicator that can only be aborted; the
  // destructor does so because it is not marked healthy.
  AUTOPAR_RETURN_IF_ERROR(Settle(rc, "ncclCommInitRankConfig", __FILE__, __LINE__));
  return Finish();
}

Status NcclComm::Finish() {
  AUTOPAR_CHECK_CUDA(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  device_.Watch(this);
  healthy_ = true;
  return OkStatus();
}

NcclComm::~NcclComm() {
  if (healthy_) device_.Unwatch(this);
  if (device_.Activate().ok() && comm_ != nullptr && !aborted_.load()) {
    // Finalize flushes what is still in flight; a healthy communicator becomes quiescent, a broken
    // one times out (Settle aborts it then) or fails (aborted here).
    Status status = healthy_
                        ? Settle(ncclCommFinalize(comm_), "ncclCommFinalize", __FILE__, __LINE__)
                        : Status(Outcome::kCommError, "initialisation did not complete");
    if (!aborted_.load()) {
      if (status.ok()) {
        const ncclResult_t rc = ncclCommDestroy(comm_);
        if (rc != ncclSuccess) status = NcclError(rc, "ncclCommDestroy", __FILE__, __LINE__);
      } else {
        Abort();
      }
    }
    if (!status.ok() && healthy_) {
      std::fprintf(stderr, "~NcclComm: %s\n", status.ToString().c_str());
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

Status NcclComm::AsyncError() {
  if (aborted_.load() || comm_ == nullptr) return OkStatus();
  ncclResult_t state = ncclSuccess;
  AUTOPAR_CHECK_NCCL(ncclCommGetAsyncError(comm_, &state));
  if (state != ncclSuccess && state != ncclInProgress) {
    return NcclError(state, "NCCL communicator (asynchronous error)", __FILE__, __LINE__);
  }
  return OkStatus();
}

void NcclComm::Abort() {
  if (comm_ == nullptr || aborted_.exchange(true)) return;
  const ncclResult_t rc = ncclCommAbort(comm_);
  // A non-blocking communicator may finish tearing down in the background (ncclInProgress); the
  // handle is not used again either way.
  if (rc != ncclSuccess && rc != ncclInProgress) {
    std::fprintf(stderr, "%s\n",
                 NcclError(rc, "ncclCommAbort", __FILE__, __LINE__).ToString().c_str());
  }
}

Status NcclComm::Ready() const {
  if (aborted_.load()) {
    return Status::Error(Outcome::kCommError,
                         "the NCCL communicator was aborted after an earlier failure", __FILE__,
                         __LINE__);
  }
  return device_.Activate();
}

Status NcclComm::Settle(ncclResult_t rc, const char* call, const char* file, int line) {
  const double started_s = SteadySeconds();
  const NcclSettled settled = SettleNcclCall(
      rc, [this](ncclResult_t* state) { return ncclCommGetAsyncError(comm_, state); },
      [&] { return SteadySeconds() > device_.wait_end_s(started_s); });
  switch (settled.how) {
    case NcclSettled::kReady:
      return OkStatus();
    case NcclSettled::kFailed:
      return NcclError(settled.code, settled.query_failed ? "ncclCommGetAsyncError" : call, file,
                       line);
    case NcclSettled::kExpired:
      break;
  }
  Abort();
  return Status::Error(Outcome::kTimeout,
                       std::string(call) + " still in progress after " +
                           std::to_string(SteadySeconds() - started_s) +
                           " s (the device's bound or the trial's deadline); communicator aborted",
                       file, line);
}

Status NcclComm::Grouped(const std::function<ncclResult_t()>& body) {
  AUTOPAR_CHECK_NCCL(ncclGroupStart());
  const ncclResult_t body_rc = body();
  const ncclResult_t end_rc = ncclGroupEnd();
  if (body_rc != ncclSuccess) {
    (void)Settle(end_rc, "ncclGroupEnd", __FILE__, __LINE__);
    return NcclError(body_rc, "ncclSend/ncclRecv in a group", __FILE__, __LINE__);
  }
  return Settle(end_rc, "ncclGroupEnd", __FILE__, __LINE__);
}

StatusOr<std::unique_ptr<Request>> NcclComm::Async(
    const std::function<Status(cudaStream_t)>& enqueue) {
  AUTOPAR_RETURN_IF_ERROR(Ready());
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

}  // namespace autopar::device
