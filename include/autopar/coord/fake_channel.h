// An in-process Channel for unit tests: `world` endpoints that run on threads of one process.
// Messages cross as serialised bytes, as they would over MPI, so a test exercises the same
// encoding. Close() makes every pending and later operation throw ChannelError, which is how a
// test simulates a lost peer.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "autopar/coord/protocol.h"

namespace autopar::coord {

class FakeChannelHub {
 public:
  explicit FakeChannelHub(int world);
  ~FakeChannelHub();
  // The endpoint of `rank` (owned by the hub; one thread per endpoint).
  Channel& endpoint(int rank);
  void Close();

 private:
  class Endpoint;
  friend class Endpoint;
  // Blocks until a message arrives in `box`; throws ChannelError once closed.
  std::string Pop(std::deque<std::string>& box);
  void Push(std::deque<std::string>& box, std::string bytes);

  int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::vector<std::deque<std::string>> commands_;  // per rank, from rank 0
  std::vector<std::deque<std::string>> reports_;   // at rank 0, per source rank
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
};

}  // namespace autopar::coord
