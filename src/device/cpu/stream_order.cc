#include "src/device/cpu/stream_order.h"

#include <cstdio>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace autopar::device {
namespace {

using Start = std::function<StatusOr<std::unique_ptr<Request>>()>;

// One operation of a queue: not started, running on `inner` (running != nullptr), or finished.
struct Op {
  Start start;
  std::unique_ptr<Request> running;
  bool finished = false;
  Status result;
};

// One communicator's stream: its operations in issue order, the head one running.
class Stream : public std::enable_shared_from_this<Stream> {
 public:
  explicit Stream(std::unique_ptr<Collectives> inner) : inner_(std::move(inner)) {}

  Collectives& inner() { return *inner_; }
  const Collectives& inner() const { return *inner_; }

  std::shared_ptr<Op> Enqueue(Start start) {
    auto op = std::make_shared<Op>();
    op->start = std::move(start);
    std::lock_guard<std::mutex> lock(Mutex());
    if (broken_) {
      op->finished = true;
      op->result = Status(Outcome::kCommError, "communicator abandoned after a timeout");
      return op;
    }
    if (ops_.empty()) Register();
    ops_.push_back(op);
    return op;
  }

  // Advances every stream of the process as far as it goes without waiting.
  static Status ProgressAll() {
    std::lock_guard<std::mutex> lock(Mutex());
    std::vector<std::shared_ptr<Stream>> busy;
    for (const std::weak_ptr<Stream>& weak : Busy()) {
      if (std::shared_ptr<Stream> stream = weak.lock()) busy.push_back(std::move(stream));
    }
    Busy().clear();
    Status first = OkStatus();
    for (const std::shared_ptr<Stream>& stream : busy) {
      Status s = stream->Progress();
      if (first.ok() && !s.ok()) first = s;
      if (!stream->ops_.empty()) Busy().push_back(stream);
    }
    return first;
  }

  // Gives up on everything queued: running operations are abandoned on `inner`, and later calls
  // fail at once (the caller treats the communicator as broken, as after ncclCommAbort).
  void Abandon() {
    std::lock_guard<std::mutex> lock(Mutex());
    broken_ = true;
    for (const std::shared_ptr<Op>& op : ops_) {
      if (op->running) op->running->Abandon();
      op->running.reset();
      op->finished = true;
      op->result = Status(Outcome::kCommError, "operation abandoned");
    }
    ops_.clear();
  }

  bool Drained() {
    std::lock_guard<std::mutex> lock(Mutex());
    return ops_.empty();
  }

 private:
  static std::mutex& Mutex() {
    static std::mutex mutex;
    return mutex;
  }
  // Streams with queued operations; a stream is listed from its first enqueue to its last
  // completion.
  static std::vector<std::weak_ptr<Stream>>& Busy() {
    static std::vector<std::weak_ptr<Stream>> busy;
    return busy;
  }
  void Register() { Busy().push_back(weak_from_this()); }

  // Starts the head operation, and the next each time one completes. A failed operation finishes
  // with its error and the stream moves on (the caller sees the error on its request).
  Status Progress() {
    while (!ops_.empty()) {
      Op& op = *ops_.front();
      if (!op.running) {
        StatusOr<std::unique_ptr<Request>> started = op.start();
        op.start = nullptr;
        if (!started.ok()) {
          Finish(started.status());
          continue;
        }
        op.running = std::move(*started);
      }
      StatusOr<bool> done = op.running->Test();
      if (!done.ok()) {
        Finish(done.status());
        continue;
      }
      if (!*done) break;
      Finish(OkStatus());
    }
    return OkStatus();
  }

  void Finish(Status result) {
    Op& op = *ops_.front();
    op.running.reset();
    op.finished = true;
    op.result = std::move(result);
    ops_.pop_front();
  }

  std::unique_ptr<Collectives> inner_;
  std::deque<std::shared_ptr<Op>> ops_;
  bool broken_ = false;
};

class QueuedRequest final : public Request {
 public:
  QueuedRequest(std::shared_ptr<Stream> stream, std::shared_ptr<Op> op)
      : stream_(std::move(stream)), op_(std::move(op)) {}
  ~QueuedRequest() override {
    // A finished operation's error was the waiter's to see; only a running one is waited for.
    if (abandoned_ || op_->finished) return;
    const Status status = Wait();
    if (!status.ok()) std::fprintf(stderr, "~QueuedRequest: %s\n", status.ToString().c_str());
  }

  Status Wait() override {
    for (;;) {
      StatusOr<bool> done = Test();
      if (!done.ok()) return done.status();
      if (*done) return OkStatus();
      std::this_thread::yield();
    }
  }

  StatusOr<bool> Test() override {
    if (!op_->finished) AUTOPAR_RETURN_IF_ERROR(Stream::ProgressAll());
    if (!op_->finished) return false;
    if (!op_->result.ok()) return op_->result;
    return true;
  }

  void Abandon() override {
    abandoned_ = true;
    stream_->Abandon();
  }

 private:
  std::shared_ptr<Stream> stream_;  // keeps `inner` alive while the operation may run
  std::shared_ptr<Op> op_;
  bool abandoned_ = false;
};

class StreamOrdered final : public Collectives {
 public:
  explicit StreamOrdered(std::unique_ptr<Collectives> inner)
      : stream_(std::make_shared<Stream>(std::move(inner))) {}
  ~StreamOrdered() override {
    // Like ncclCommDestroy after the stream's work: wait for what is queued.
    const Status s = Drain();
    if (!s.ok()) std::fprintf(stderr, "~StreamOrdered: %s\n", s.ToString().c_str());
  }

  int rank() const override { return stream_->inner().rank(); }
  int size() const override { return stream_->inner().size(); }

  // ---- non-blocking: enqueued, started on `inner` when they reach the head ----
  StatusOr<std::unique_ptr<Request>> IBatchSendRecv(std::span<const P2POp> ops) override {
    std::vector<P2POp> copy(ops.begin(), ops.end());
    return Queue([this, copy = std::move(copy)] { return inner().IBatchSendRecv(copy); });
  }
  StatusOr<std::unique_ptr<Request>> ISend(Tensor buf, int peer, int tag) override {
    return Queue([=, this] { return inner().ISend(buf, peer, tag); });
  }
  StatusOr<std::unique_ptr<Request>> IRecv(Tensor buf, int peer, int tag) override {
    return Queue([=, this] { return inner().IRecv(buf, peer, tag); });
  }
  StatusOr<std::unique_ptr<Request>> IAllReduce(Tensor send, Tensor recv, ReduceOp op) override {
    return Queue([=, this] { return inner().IAllReduce(send, recv, op); });
  }
  StatusOr<std::unique_ptr<Request>> IAllGather(Tensor send, Tensor recv) override {
    return Queue([=, this] { return inner().IAllGather(send, recv); });
  }
  StatusOr<std::unique_ptr<Request>> IReduceScatter(Tensor send, Tensor recv,
                                                    ReduceOp op) override {
    return Queue([=, this] { return inner().IReduceScatter(send, recv, op); });
  }
  StatusOr<std::unique_ptr<Request>> IAllToAllV(
      Tensor send, std::span<const std::int64_t> send_counts, Tensor recv,
      std::span<const std::int64_t> recv_counts) override {
    std::vector<std::int64_t> sc(send_counts.begin(), send_counts.end());
    std::vector<std::int64_t> rc(recv_counts.begin(), recv_counts.end());
    return Queue([=, this] { return inner().IAllToAllV(send, sc, recv, rc); });
  }

  // ---- blocking: the non-blocking form, waited for ----
  Status AllReduce(Tensor send, Tensor recv, ReduceOp op) override {
    return WaitFor(IAllReduce(send, recv, op));
  }
  Status AllGather(Tensor send, Tensor recv) override { return WaitFor(IAllGather(send, recv)); }
  Status ReduceScatter(Tensor send, Tensor recv, ReduceOp op) override {
    return WaitFor(IReduceScatter(send, recv, op));
  }
  Status AllToAllV(Tensor send, std::span<const std::int64_t> send_counts, Tensor recv,
                   std::span<const std::int64_t> recv_counts) override {
    return WaitFor(IAllToAllV(send, send_counts, recv, recv_counts));
  }
  Status Send(Tensor buf, int peer, int tag) override { return WaitFor(ISend(buf, peer, tag)); }
  Status Recv(Tensor buf, int peer, int tag) override { return WaitFor(IRecv(buf, peer, tag)); }
  Status SendRecv(Tensor send, int dst, Tensor recv, int src, int tag) override {
    const P2POp ops[] = {{P2POp::kSend, send, dst, tag}, {P2POp::kRecv, recv, src, tag}};
    return WaitFor(IBatchSendRecv(ops));
  }
  // No non-blocking form on `inner`: run after everything queued before them.
  Status AllToAll(Tensor send, Tensor recv) override {
    AUTOPAR_RETURN_IF_ERROR(Drain());
    return inner().AllToAll(send, recv);
  }
  Status Broadcast(Tensor buf, int root) override {
    AUTOPAR_RETURN_IF_ERROR(Drain());
    return inner().Broadcast(buf, root);
  }
  Status Barrier() override {
    AUTOPAR_RETURN_IF_ERROR(Drain());
    return inner().Barrier();
  }

 private:
  Collectives& inner() { return stream_->inner(); }

  StatusOr<std::unique_ptr<Request>> Queue(Start start) {
    std::shared_ptr<Op> op = stream_->Enqueue(std::move(start));
    return std::unique_ptr<Request>(std::make_unique<QueuedRequest>(stream_, std::move(op)));
  }

  static Status WaitFor(StatusOr<std::unique_ptr<Request>> request) {
    if (!request.ok()) return request.status();
    return (*request)->Wait();
  }

  Status Drain() {
    while (!stream_->Drained()) {
      AUTOPAR_RETURN_IF_ERROR(Stream::ProgressAll());
      std::this_thread::yield();
    }
    return OkStatus();
  }

  std::shared_ptr<Stream> stream_;
};

}  // namespace

std::unique_ptr<Collectives> MakeStreamOrdered(std::unique_ptr<Collectives> inner) {
  return std::make_unique<StreamOrdered>(std::move(inner));
}

}  // namespace autopar::device
