#include "autopar/coord/fake_channel.h"

namespace autopar::coord {

class FakeChannelHub::Endpoint : public Channel {
 public:
  Endpoint(FakeChannelHub& hub, int rank) : hub_(hub), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return hub_.world_; }

  void Broadcast(pb::Command* command) override {
    if (rank_ == 0) {
      std::string bytes;
      if (!command->SerializeToString(&bytes)) throw ChannelError("command does not serialize");
      for (int r = 1; r < hub_.world_; ++r) hub_.Push(hub_.commands_[r], bytes);
      return;
    }
    const std::string bytes = hub_.Pop(hub_.commands_[rank_]);
    if (!command->ParseFromString(bytes)) throw ChannelError("command does not parse");
  }

  void Gather(const pb::Report& mine, std::vector<pb::Report>* all) override {
    all->clear();
    if (rank_ != 0) {
      std::string bytes;
      if (!mine.SerializeToString(&bytes)) throw ChannelError("report does not serialize");
      hub_.Push(hub_.reports_[rank_], std::move(bytes));
      return;
    }
    all->push_back(mine);
    for (int r = 1; r < hub_.world_; ++r) {
      pb::Report report;
      if (!report.ParseFromString(hub_.Pop(hub_.reports_[r]))) {
        throw ChannelError("report of rank " + std::to_string(r) + " does not parse");
      }
      all->push_back(std::move(report));
    }
  }

 private:
  FakeChannelHub& hub_;
  int rank_;
};

FakeChannelHub::FakeChannelHub(int world) : world_(world), commands_(world), reports_(world) {
  for (int r = 0; r < world; ++r) endpoints_.push_back(std::make_unique<Endpoint>(*this, r));
}

FakeChannelHub::~FakeChannelHub() = default;

Channel& FakeChannelHub::endpoint(int rank) { return *endpoints_.at(rank); }

void FakeChannelHub::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

void FakeChannelHub::Push(std::deque<std::string>& box, std::string bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) throw ChannelError("channel closed");
    box.push_back(std::move(bytes));
  }
  cv_.notify_all();
}

std::string FakeChannelHub::Pop(std::deque<std::string>& box) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return closed_ || !box.empty(); });
  if (box.empty()) throw ChannelError("channel closed");
  std::string bytes = std::move(box.front());
  box.pop_front();
  return bytes;
}

}  // namespace autopar::coord
