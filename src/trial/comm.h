// Collectives of a trial, each bounded by the trial's deadline.
//
// Every call is the non-blocking form of the backend's collective, completed by polling Test()
// against the deadline: a rank whose peer stalls or died gives up with kTimeout instead of
// blocking forever, which is how a trial ends as `timeout` on every rank (DESIGN §5).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>

#include "autopar/backend/collectives.h"
#include "autopar/backend/status.h"

namespace autopar::trial {

using backend::ReduceOp;
using backend::Status;
using backend::Tensor;
using Deadline = std::chrono::steady_clock::time_point;

// Polls `request` until it completes or the deadline passes.
Status WaitUntil(backend::Request& request, Deadline deadline);

class Comm {
 public:
  Comm() = default;
  Comm(std::unique_ptr<backend::Collectives> c, Deadline deadline)
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
  Status Recv(Tensor buf, int peer, int tag);
  // Starts a send (a receive) into `pending`; the buffer must stay untouched until Wait(pending).
  Status Send(Tensor buf, int peer, int tag, std::unique_ptr<backend::Request>& pending);
  Status StartRecv(Tensor buf, int peer, int tag, std::unique_ptr<backend::Request>& pending);
  // Completes `pending` if there is one.
  Status Wait(std::unique_ptr<backend::Request>& pending);

 private:
  std::unique_ptr<backend::Collectives> c_;
  Deadline deadline_{};
};

}  // namespace autopar::trial
