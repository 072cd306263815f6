// The read-only live status endpoint of rank 0 (docs/protocol.md §8): `GET /status` (JSON) and
// `GET /metrics` (Prometheus text format 0.0.4), served by Boost.Asio on its own thread.
//
// It never touches the search: handlers read a StatusBoard snapshot under its mutex. Requests are
// parsed defensively: a request line or header block that is malformed gets 400, one larger than
// 8 KiB gets 413, methods other than GET/HEAD get 405, unknown paths 404; every connection is
// closed after one response or after 5 s of silence, so no client can hold the server. At most
// kMaxConnections are open at once: one beyond is closed as soon as it is accepted, so a flood
// of connections holds at most that many descriptors; when accept itself fails (descriptors run
// out: EMFILE, ENFILE) the next waits 10 ms, doubling to 1 s, instead of spinning.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace autopar::coord {

// What the search reports about itself; written by the search loop, read by the server.
struct StatusSnapshot {
  std::string study, model, searcher;
  int64_t trials_done = 0, trials_failed = 0, candidates = 0;
  bool trial_in_flight = false;
  std::string in_flight_config;
  std::string best_config;              // best measured so far ("" before the first ok trial)
  double best_step_time_s = 0;
  std::string predicted_best_config;    // the posterior mean's best candidate
  double predicted_best_step_time_s = 0;
  double stop_progress = 0;             // 0..1: how close the convergence rule is to firing
  std::string stop_rule;                // "" while running, else the rule that fired
  double elapsed_s = 0, budget_s = 0;
  bool finished = false;
};

class StatusBoard {
 public:
  void Update(const StatusSnapshot& s) {
    std::lock_guard<std::mutex> lock(mutex_);
    snapshot_ = s;
  }
  StatusSnapshot Get() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return snapshot_;
  }

 private:
  mutable std::mutex mutex_;
  StatusSnapshot snapshot_;
};

std::string StatusJson(const StatusSnapshot& s);
// The server's answer to the bytes one connection has sent so far: the whole HTTP response, or ""
// while the request head is incomplete and within 8 KiB. Pure but for reading `board`; the
// server's parser, apart so that tests/fuzz can reach it.
std::string StatusResponse(std::string_view received, const StatusBoard& board);
std::string StatusPrometheus(const StatusSnapshot& s);

class StatusServer {
 public:
  // Binds address:port (port 0 picks a free one) and starts serving. Throws std::runtime_error
  // naming the address when it cannot bind.
  StatusServer(const std::string& address, uint16_t port, const StatusBoard& board);
  ~StatusServer();  // stops the thread and closes the socket
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

  static constexpr int64_t kMaxConnections = 64;

  uint16_t port() const;
  int64_t requests_served() const;
  int64_t open_connections() const;     // accepted and not yet closed
  int64_t connections_refused() const;  // closed at once: kMaxConnections were open
  int64_t accept_failures() const;      // accepts that failed (each followed by a backoff)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace autopar::coord
