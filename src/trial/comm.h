// Collectives of a trial, each bounded by the trial's deadline.
//
// Every call is the non-blocking form of the platform's collective, completed by polling Test()
// against the deadline: a rank whose peer stalls or died gives up with kTimeout instead of
// blocking forever, which is how a trial ends as `timeout` on every rank (docs/trial.md §10).
// On a stream-ordered transport (Collectives::stream_ordered(): NCCL) a call completes instead
// by making the device's stream wait for it (Request::OrderOnDevice) and returns at once: the
// host does not drain the device per collective, and the deadline is enforced where the host
// does wait on the device (Device::Synchronize, host copies), aborting the communicators.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>

#include "autopar/device/collectives.h"
#include "autopar/device/status.h"

namespace autopar::trial {

using device::ReduceOp;
using device::Status;
using device::Tensor;
using Deadline = std::chrono::steady_clock::time_point;

// Polls `request` until it completes or the deadline passes.
Status WaitUntil(device::Request& request, Deadline deadline);

class Comm {
 public:
  Comm() = default;
  Comm(std::unique_ptr<device::Collectives> c, Deadline deadline)
      : c_(std::move(c)), deadline_(deadline) {}

  bool active() const { return c_ != nullptr && c_->size() > 1; }
  int rank() const { return c_ ? c_->rank() : 0; }
  int size() const { return c_ ? c_->size() : 1; }
  void set_deadline(Deadline d) { deadline_ = d; }

  Status AllReduce(Tensor buf, ReduceOp op = ReduceOp::kSum);  // in place
  Status AllGather(Tensor send, Tensor recv);
  Status ReduceScatter(Tensor send, Tensor recv);
  // Equal blocks of numel / size() per rank, and the variable-size form (see Collectives).
  Status AllToAll(Tensor send, Tensor recv);
  Status AllToAllV(Tensor send, std::span<const int64_t> send_counts, Tensor recv,
                   std::span<const int64_t> recv_counts);
  // Runs the sends and receives of `ops` as one group (Collectives::IBatchSendRecv) and waits for
  // them; an empty batch does nothing.
  Status SendRecv(std::span<const device::P2POp> ops);
  // Starts them into `pending` (completing an earlier `pending` first); the buffers must stay
  // untouched until Wait(pending).
  Status StartSendRecv(std::span<const device::P2POp> ops,
                       std::unique_ptr<device::Request>& pending);
  // Start the collective into `pending` (completing an earlier `pending` first), for the
  // data-parallel overlap (grad_buckets.h); the buffers must stay untouched until Wait(pending).
  Status StartAllReduce(Tensor buf, std::unique_ptr<device::Request>& pending);  // in place
  Status StartReduceScatter(Tensor send, Tensor recv, std::unique_ptr<device::Request>& pending);
  Status StartAllGather(Tensor send, Tensor recv, std::unique_ptr<device::Request>& pending);
  // Completes `pending` if there is one.
  Status Wait(std::unique_ptr<device::Request>& pending);

 private:
  // Completes `request` as the transport allows: ordered on the device, or polled on the host.
  Status Complete(device::Request& request);

  std::unique_ptr<device::Collectives> c_;
  Deadline deadline_{};
};

}  // namespace autopar::trial
