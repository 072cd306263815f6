#include "src/trial/comm.h"

namespace autopar::trial {

Status WaitUntil(backend::Request& request, Deadline deadline) {
  for (;;) {
    backend::StatusOr<bool> done = request.Test();
    if (!done.ok()) return done.status();
    if (*done) return backend::OkStatus();
    if (std::chrono::steady_clock::now() > deadline) {
      request.Abandon();
      return Status::Error(backend::Outcome::kTimeout, "collective did not complete by the deadline",
                           __FILE__, __LINE__);
    }
  }
}

#define AUTOPAR_POLL(start_expr)                                   \
  do {                                                             \
    auto request_ = (start_expr);                                  \
    if (!request_.ok()) return request_.status();                  \
    AUTOPAR_RETURN_IF_ERROR(WaitUntil(**request_, deadline_));     \
  } while (0)

Status Comm::AllReduce(Tensor buf, ReduceOp op) {
  if (!active()) return backend::OkStatus();
  AUTOPAR_POLL(c_->IAllReduce(buf, buf, op));
  return backend::OkStatus();
}

Status Comm::AllGather(Tensor send, Tensor recv) {
  AUTOPAR_POLL(c_->IAllGather(send, recv));
  return backend::OkStatus();
}

Status Comm::ReduceScatter(Tensor send, Tensor recv) {
  AUTOPAR_POLL(c_->IReduceScatter(send, recv, ReduceOp::kSum));
  return backend::OkStatus();
}

Status Comm::Recv(Tensor buf, int peer, int tag) {
  AUTOPAR_POLL(c_->IRecv(buf, peer, tag));
  return backend::OkStatus();
}

Status Comm::Send(Tensor buf, int peer, int tag, std::unique_ptr<backend::Request>& pending) {
  AUTOPAR_RETURN_IF_ERROR(Wait(pending));
  auto request = c_->ISend(buf, peer, tag);
  if (!request.ok()) return request.status();
  pending = std::move(*request);
  return backend::OkStatus();
}

Status Comm::Wait(std::unique_ptr<backend::Request>& pending) {
  if (pending) {
    AUTOPAR_RETURN_IF_ERROR(WaitUntil(*pending, deadline_));
    pending.reset();
  }
  return backend::OkStatus();
}

}  // namespace autopar::trial
