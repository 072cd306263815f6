#include "src/trial/comm.h"

#include <thread>

#include <vector>

namespace autopar::trial {

namespace {
// A group of one is not connected (no communicator is made for it): callers skip its collectives.
Status NotConnected(const char* file, int line) {
  return Status::Error(device::Outcome::kInvalid, "collective on a group of one", file, line);
}
}  // namespace

Status WaitUntil(device::Request& request, Deadline deadline) {
  for (;;) {
    device::StatusOr<bool> done = request.Test();
    if (!done.ok()) return done.status();
    if (*done) return device::OkStatus();
    if (std::chrono::steady_clock::now() > deadline) {
      request.Abandon();
      return Status::Error(device::Outcome::kTimeout, "collective did not complete by the deadline",
                           __FILE__, __LINE__);
    }
    // With more ranks than cores (the CPU backend on a laptop), a spinning waiter would take the
    // core from the peer it waits for.
    std::this_thread::yield();
  }
}

Status Comm::Complete(device::Request& request) {
  if (c_ != nullptr && c_->stream_ordered()) return request.OrderOnDevice(deadline_);
  return WaitUntil(request, deadline_);
}

#define AUTOPAR_POLL(start_expr)                      \
  do {                                                \
    if (!c_) return NotConnected(__FILE__, __LINE__); \
    auto request_ = (start_expr);                     \
    if (!request_.ok()) return request_.status();     \
    AUTOPAR_RETURN_IF_ERROR(Complete(**request_));    \
  } while (0)

Status Comm::AllReduce(Tensor buf, ReduceOp op) {
  if (!active()) return device::OkStatus();
  AUTOPAR_POLL(c_->IAllReduce(buf, buf, op));
  return device::OkStatus();
}

Status Comm::AllGather(Tensor send, Tensor recv) {
  AUTOPAR_POLL(c_->IAllGather(send, recv));
  return device::OkStatus();
}

Status Comm::ReduceScatter(Tensor send, Tensor recv) {
  AUTOPAR_POLL(c_->IReduceScatter(send, recv, ReduceOp::kSum));
  return device::OkStatus();
}

Status Comm::AllToAll(Tensor send, Tensor recv) {
  const int n = size();
  if (send.numel % n != 0) {
    return Status::Error(device::Outcome::kInvalid, "AllToAll: numel is not a multiple of size",
                         __FILE__, __LINE__);
  }
  const std::vector<int64_t> counts(static_cast<size_t>(n), send.numel / n);
  return AllToAllV(send, counts, recv, counts);
}

Status Comm::AllToAllV(Tensor send, std::span<const int64_t> send_counts, Tensor recv,
                       std::span<const int64_t> recv_counts) {
  AUTOPAR_POLL(c_->IAllToAllV(send, send_counts, recv, recv_counts));
  return device::OkStatus();
}

Status Comm::SendRecv(std::span<const device::P2POp> ops) {
  if (ops.empty()) return device::OkStatus();
  AUTOPAR_POLL(c_->IBatchSendRecv(ops));
  return device::OkStatus();
}

#define AUTOPAR_START(start_expr)                     \
  do {                                                \
    AUTOPAR_RETURN_IF_ERROR(Wait(pending));           \
    if (!c_) return NotConnected(__FILE__, __LINE__); \
    auto request_ = (start_expr);                     \
    if (!request_.ok()) return request_.status();     \
    pending = std::move(*request_);                   \
  } while (0)

Status Comm::StartSendRecv(std::span<const device::P2POp> ops,
                           std::unique_ptr<device::Request>& pending) {
  if (ops.empty()) return Wait(pending);
  AUTOPAR_START(c_->IBatchSendRecv(ops));
  return device::OkStatus();
}

Status Comm::StartAllReduce(Tensor buf, std::unique_ptr<device::Request>& pending) {
  if (!active()) return Wait(pending);
  AUTOPAR_START(c_->IAllReduce(buf, buf, ReduceOp::kSum));
  return device::OkStatus();
}

Status Comm::StartReduceScatter(Tensor send, Tensor recv,
                                std::unique_ptr<device::Request>& pending) {
  AUTOPAR_START(c_->IReduceScatter(send, recv, ReduceOp::kSum));
  return device::OkStatus();
}

Status Comm::StartAllGather(Tensor send, Tensor recv, std::unique_ptr<device::Request>& pending) {
  AUTOPAR_START(c_->IAllGather(send, recv));
  return device::OkStatus();
}

Status Comm::Wait(std::unique_ptr<device::Request>& pending) {
  if (pending) {
    AUTOPAR_RETURN_IF_ERROR(Complete(*pending));
    pending.reset();
  }
  return device::OkStatus();
}

}  // namespace autopar::trial
