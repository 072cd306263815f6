// One non-blocking NCCL communicator of a CudaDevice (docs/trial.md §14: communicators that can be
// aborted): creation over an MPI group, the ncclInProgress protocol, asynchronous errors, abort,
// and non-blocking operations on a side stream.
//
// With config.blocking = 0 any NCCL call may answer ncclInProgress; the communicator must then be
// polled with ncclCommGetAsyncError until it leaves that state before it is used again (Settle).
// Every wait has the device's deadline, past which the communicator is aborted (ncclCommAbort).
// The device watches the communicator while it exists, so its Synchronize notices failures.
//
// A communicator is made either from a unique id over an MPI group (Create) or by splitting a
// parent (Split, ncclCommSplit). Children do not share their parent's resources (NcclCommConfig);
// the platform still treats a world communicator and its children as one family, rebuilt whole
// after any abort.
#pragma once

#include <nccl.h>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "autopar/device/collectives.h"
#include "autopar/device/group.h"
#include "src/device/cuda/cuda_device.h"

namespace autopar::device {

// The configuration of every communicator made here, world and split alike:
//  * blocking = 0: every call returns at once (ncclInProgress while NCCL works in the
//    background), so a stuck one can be given up and aborted;
//  * splitShare = 0: a split child gets channels, buffers and streams of its own. With
//    splitShare = 1 it takes its parent's shared resources (NCCL src/init.cc: comm->sharedRes =
//    parent->sharedRes), among them the strong "deviceStream" that every kernel launch of a
//    communicator waits on and then advances to its own completion (src/enqueue.cc,
//    ncclLaunchPrepare / ncclLaunchFinish): all collectives of the family would run one after
//    another on the device, so a TP all-reduce or CP/PP transfer in the backward would wait for
//    the overlapped DP reduce-scatter to finish. Megatron's process groups are separate
//    communicators that run concurrently, and their buffers are part of the memory the real job
//    holds (measured by NonTensorBytes).
inline ncclConfig_t NcclCommConfig() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.splitShare = 0;
  return config;
}

// How a call on a non-blocking communicator ended (NcclComm::Settle).
struct NcclSettled {
  enum How { kReady, kFailed, kExpired } how;
  ncclResult_t code = ncclSuccess;  // the failure (kFailed)
  bool query_failed = false;        // the failure was the state query's own
};

// Settle's protocol, apart from the communicator so that it is tested on any host: `rc` is the
// call's return; `query(&state)` reads the communicator's state (ncclCommGetAsyncError);
// `expired()` says the deadline has passed. ncclSuccess and ncclInProgress are both followed by
// polling until the state leaves ncclInProgress (NCCL user guide: "If the return code of any NCCL
// function is ncclInProgress ... users must query the states of the communicators until all the
// states become ncclSuccess"; ncclCommFinalize returns ncclSuccess and sets the state
// ncclInProgress; ncclCommSplit returns ncclSuccess once its job is launched, and the guide's
// split example polls the parent whatever the call returned). One query when already ready.
template <typename Query, typename Expired>
NcclSettled SettleNcclCall(ncclResult_t rc, Query&& query, Expired&& expired) {
  if (rc != ncclSuccess && rc != ncclInProgress) return {NcclSettled::kFailed, rc};
  for (;;) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t queried = query(&state);
    if (queried != ncclSuccess) return {NcclSettled::kFailed, queried, true};
    if (state == ncclSuccess) return {NcclSettled::kReady};
    if (state != ncclInProgress) return {NcclSettled::kFailed, state};
    if (expired()) return {NcclSettled::kExpired, ncclInProgress};
    std::this_thread::yield();
  }
}

class NcclComm final : public CommWatch {
 public:
  // Collective over the members of `group`: rank 0 makes the unique id and broadcasts it over the
  // group's MPI communicator, then every member polls ncclCommInitRankConfig to completion or the
  // device's deadline. The result must be destroyed before `device`.
  static StatusOr<std::unique_ptr<NcclComm>> Create(CudaDevice& device, const Group& group);
  // Collective over every rank of `parent` (ncclCommSplit): ranks passing the same color form a
  // communicator, ordered by key; a negative color (NCCL_SPLIT_NOCOLOR) takes part without
  // joining one and gets nullptr. There must be no NCCL operation of `parent` outstanding:
  // callers synchronize the device first. Waits for the split and the child's initialisation
  // with the device's deadline, aborting on expiry.
  static StatusOr<std::unique_ptr<NcclComm>> Split(NcclComm& parent, int color, int key);
  // Finalizes and destroys a healthy communicator (aborting it if that does not finish in time).
  ~NcclComm() override;

  int rank() const { return rank_; }
  int size() const { return size_; }
  CudaDevice& device() { return device_; }
  ncclComm_t get() const { return comm_; }
  bool aborted() const { return aborted_.load(); }

  // ---- CommWatch ----
  Status AsyncError() override;
  void Abort() override;

  // kCommError once aborted; otherwise makes the device current for the NCCL calls to follow.
  Status Ready() const;
  // The return of an NCCL call on this communicator: ncclSuccess or ncclInProgress are followed by
  // polling the communicator's state (ncclCommGetAsyncError) until it leaves ncclInProgress, with
  // the device's deadline (then aborted); anything else is the call's error. Polled after
  // ncclSuccess too: ncclCommSplit and ncclCommFinalize return it with their work still running.
  Status Settle(ncclResult_t rc, const char* call, const char* file, int line);
  // ncclGroupStart, `body` (returning its first failure), ncclGroupEnd, settled: the group is
  // closed even when a call inside it failed.
  Status Grouped(const std::function<ncclResult_t()>& body);
  // Runs `enqueue` on the side stream behind the compute stream's work so far (which may have
  // written the send buffer) and returns a request that completes with it.
  StatusOr<std::unique_ptr<Request>> Async(const std::function<Status(cudaStream_t)>& enqueue);

 private:
  NcclComm(CudaDevice& device, int rank, int size) : device_(device), rank_(rank), size_(size) {}
  Status Init(const ncclUniqueId& id);
  // The side stream and the device's watch, once comm_ is initialised.
  Status Finish();

  CudaDevice& device_;
  int rank_;
  int size_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t side_ = nullptr;
  bool healthy_ = false;  // initialised and watched
  std::atomic<bool> aborted_{false};
};

}  // namespace autopar::device

#define AUTOPAR_NCCL_SETTLE(comm, call) (comm).Settle((call), #call, __FILE__, __LINE__)
