#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "autopar/coord/status_server.h"

namespace autopar::coord {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

// Sends `request` raw over loopback and returns the whole response.
std::string Exchange(uint16_t port, const std::string& request) {
  asio::io_context io;
  tcp::socket socket(io);
  socket.connect({asio::ip::make_address("127.0.0.1"), port});
  boost::system::error_code ec;
  asio::write(socket, asio::buffer(request), ec);
  std::string response;
  std::array<char, 4096> buf;
  for (;;) {
    const size_t n = socket.read_some(asio::buffer(buf), ec);
    response.append(buf.data(), n);
    if (ec) break;
  }
  return response;
}

struct StatusServerTest : ::testing::Test {
  StatusBoard board;
  StatusServer server{"127.0.0.1", 0, board};
  StatusServerTest() {
    StatusSnapshot s;
    s.study = "runs/x";
    s.model = "tiny";
    s.trials_done = 7;
    s.best_config = "tp=2,pp=1";
    s.best_step_time_s = 0.25;
    s.budget_s = 100;
    s.elapsed_s = 40;
    board.Update(s);
  }
};

TEST_F(StatusServerTest, StatusIsJson) {
  const std::string r = Exchange(server.port(), "GET /status HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK", 0), 0u) << r;
  EXPECT_NE(r.find("application/json"), std::string::npos);
  EXPECT_NE(r.find("\"trials_done\":7"), std::string::npos) << r;
  EXPECT_NE(r.find("\"config\":\"tp=2,pp=1\""), std::string::npos) << r;
  EXPECT_NE(r.find("\"budget_left_s\":60"), std::string::npos) << r;
}

TEST_F(StatusServerTest, MetricsArePrometheusText) {
  const std::string r = Exchange(server.port(), "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(r.rfind("HTTP/1.1 200 OK", 0), 0u) << r;
  EXPECT_NE(r.find("# TYPE autopar_trials_done gauge\nautopar_trials_done 7\n"), std::string::npos)
      << r;
  EXPECT_NE(r.find("autopar_best_step_time_seconds 0.25"), std::string::npos);
}

TEST_F(StatusServerTest, BadRequestsGetErrorsAndTheServerKeepsServing) {
  EXPECT_EQ(Exchange(server.port(), "GARBAGE\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(Exchange(server.port(), "GET status HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(Exchange(server.port(), "POST /status HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
  EXPECT_EQ(Exchange(server.port(), "GET /nope HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  const std::string huge = "GET /status HTTP/1.1\r\nX-Pad: " + std::string(20000, 'a') + "\r\n\r\n";
  EXPECT_EQ(Exchange(server.port(), huge).rfind("HTTP/1.1 413", 0), 0u);
  const std::string binary("\x00\xff\x13\n\r\n\r\n", 8);
  EXPECT_EQ(Exchange(server.port(), binary).rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(Exchange(server.port(), "GET /status HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_GE(server.requests_served(), 7);
}

// Issue 17: a flood of idle connections holds at most kMaxConnections of the server's
// descriptors (the rest are closed as soon as they are accepted), and once they go the server
// serves again.
TEST_F(StatusServerTest, IdleConnectionsBeyondTheCapAreClosedAtOnce) {
  asio::io_context io;
  std::vector<tcp::socket> idle;
  for (int i = 0; i < 200; ++i) {
    idle.emplace_back(io);
    idle.back().connect({asio::ip::make_address("127.0.0.1"), server.port()});
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  while (server.connections_refused() < 200 - StatusServer::kMaxConnections &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(server.open_connections(), StatusServer::kMaxConnections);
  EXPECT_EQ(server.connections_refused(), 200 - StatusServer::kMaxConnections);
  // A refused connection reads end-of-file at once, without a response.
  size_t closed = 0;
  for (tcp::socket& s : idle) {
    s.non_blocking(true);
    std::array<char, 16> buf;
    boost::system::error_code ec;
    s.read_some(asio::buffer(buf), ec);
    closed += ec == asio::error::eof;
  }
  EXPECT_EQ(closed, static_cast<size_t>(200 - StatusServer::kMaxConnections));
  for (tcp::socket& s : idle) s.close();
  while (server.open_connections() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(server.open_connections(), 0);  // closed by the clients: freed at once, not at 5 s
  EXPECT_EQ(Exchange(server.port(), "GET /status HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(server.accept_failures(), 0);
}

// Lowers this process's soft RLIMIT_NOFILE to at most `soft` and fills the descriptor table with
// /dev/null until open() fails with EMFILE; the destructor closes them and restores the limit.
class DescriptorExhaustion {
 public:
  explicit DescriptorExhaustion(rlim_t soft) {
    if (getrlimit(RLIMIT_NOFILE, &saved_) != 0) {
      ADD_FAILURE() << "getrlimit(RLIMIT_NOFILE): " << std::strerror(errno);
      return;
    }
    rlimit lowered = saved_;
    lowered.rlim_cur = std::min(saved_.rlim_cur, soft);
    if (setrlimit(RLIMIT_NOFILE, &lowered) != 0) {
      ADD_FAILURE() << "setrlimit(RLIMIT_NOFILE, " << soft << "): " << std::strerror(errno);
      return;
    }
    lowered_ = true;
    for (;;) {
      const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        open_errno_ = errno;
        break;
      }
      fds_.push_back(fd);
    }
  }
  ~DescriptorExhaustion() { Release(); }
  DescriptorExhaustion(const DescriptorExhaustion&) = delete;
  DescriptorExhaustion& operator=(const DescriptorExhaustion&) = delete;

  // Whether the table is full: the last open() failed with EMFILE.
  bool exhausted() const { return lowered_ && open_errno_ == EMFILE; }
  int open_errno() const { return open_errno_; }

  void Release() {
    for (const int fd : fds_) ::close(fd);
    fds_.clear();
    if (lowered_ && setrlimit(RLIMIT_NOFILE, &saved_) != 0) {
      ADD_FAILURE() << "restoring RLIMIT_NOFILE: " << std::strerror(errno);
    }
    lowered_ = false;
  }

 private:
  rlimit saved_{};
  bool lowered_ = false;
  int open_errno_ = 0;
  std::vector<int> fds_;
};

// Reads from `socket` until the peer closes it or `deadline` passes; "" if nothing came.
std::string ReadUntilClosed(tcp::socket& socket, std::chrono::steady_clock::time_point deadline) {
  socket.non_blocking(true);
  std::string response;
  std::array<char, 4096> buf;
  while (std::chrono::steady_clock::now() < deadline) {
    boost::system::error_code ec;
    const size_t n = socket.read_some(asio::buffer(buf), ec);
    response.append(buf.data(), n);
    if (ec == asio::error::would_block) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } else if (ec) {
      break;
    }
  }
  return response;
}

// How many accepts can fail within `window` of the first failure when each failure waits 10 ms,
// doubling to 1 s, before the next accept (status_server.h): failures at 0, 10, 30, 70, 150,
// 310, 630 and 1270 ms, then every second. Timers never fire early, so a loaded machine only
// makes fewer.
int64_t MostFailuresWithin(std::chrono::steady_clock::duration window) {
  int64_t failures = 0;
  std::chrono::milliseconds at{0}, wait{10};
  while (at <= window) {
    ++failures;
    at += wait;
    wait = std::min<std::chrono::milliseconds>(wait * 2, std::chrono::seconds(1));
  }
  return failures;
}

TEST(StatusServer, MostFailuresWithinFollowsTheBackoff) {
  using std::chrono::milliseconds;
  EXPECT_EQ(MostFailuresWithin(milliseconds(0)), 1);
  EXPECT_EQ(MostFailuresWithin(milliseconds(9)), 1);
  EXPECT_EQ(MostFailuresWithin(milliseconds(10)), 2);
  EXPECT_EQ(MostFailuresWithin(milliseconds(900)), 7);
  EXPECT_EQ(MostFailuresWithin(milliseconds(1270)), 8);
  EXPECT_EQ(MostFailuresWithin(milliseconds(3270)), 10);
}

// Issue 17: when accept fails because the process has no descriptor left (EMFILE), the server
// waits 10 ms, doubling to 1 s, before the next accept, rather than retrying at once (the
// pending connection keeps the listening socket readable, so an immediate retry spins); it
// survives, and serves the waiting client once descriptors are free again.
//
// While the table is full nothing here may need a descriptor, the sanitizers' runtimes included
// (UBSan's vptr check probes memory through a pipe on a cache miss): every code path the window
// runs has run once before it (the clock, the sleep and the failure counter the wait polls among
// them).
TEST_F(StatusServerTest, AcceptBacksOffWhileDescriptorsRunOutAndServesAfter) {
  const uint16_t port = server.port();
  const std::string request = "GET /status HTTP/1.1\r\n\r\n";
  ASSERT_EQ(Exchange(port, request).rfind("HTTP/1.1 200", 0), 0u);
  ASSERT_EQ(server.accept_failures(), 0);
  // That connection's descriptor is closed too: one freed inside the window would be the one the
  // server's next accept takes.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (server.open_connections() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(server.open_connections(), 0);
  asio::io_context io;
  tcp::socket client(io);
  client.open(tcp::v4());  // its descriptor before the table fills: connect() needs none
  const auto window_start = std::chrono::steady_clock::now();
  {
    DescriptorExhaustion exhaustion(256);
    ASSERT_TRUE(exhaustion.exhausted())
        << "open() ended with " << std::strerror(exhaustion.open_errno());
    // The kernel completes the handshake from the listen backlog; the server's accept fails.
    client.connect({asio::ip::make_address("127.0.0.1"), port});
    asio::write(client, asio::buffer(request));
    // At least 900 ms, in which backing off fails 7 times (retrying at once would fail
    // thousands of times, a fixed 10 ms wait about 90), and until the accept was retried: a
    // loaded machine delays the server's thread, and the 60 s only bound a server that never
    // retries.
    const auto least = window_start + std::chrono::milliseconds(900);
    const auto most = window_start + std::chrono::seconds(60);
    for (auto now = window_start; (now < least || server.accept_failures() < 2) && now < most;
         now = std::chrono::steady_clock::now()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  // Descriptors are free again: a retry from now on succeeds, so the failures are the window's.
  const int64_t failures = server.accept_failures();
  const auto window = std::chrono::steady_clock::now() - window_start;
  EXPECT_GE(failures, 2) << "accept failed once and was never retried";
  EXPECT_LE(failures, MostFailuresWithin(window))
      << "accept is retried without backing off: " << failures << " failures in "
      << std::chrono::duration_cast<std::chrono::milliseconds>(window).count() << " ms";
  // The next retry (at most 1 s away) accepts the waiting client and serves it.
  const std::string r =
      ReadUntilClosed(client, std::chrono::steady_clock::now() + std::chrono::seconds(10));
  ASSERT_EQ(r.rfind("HTTP/1.1 200 OK", 0), 0u) << r;  // else the Exchange below would wait
  EXPECT_NE(r.find("\"trials_done\":7"), std::string::npos) << r;
  // A success resets the backoff: the next client is served at once, with no failure between.
  EXPECT_EQ(Exchange(port, request).rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(server.accept_failures(), failures);
  EXPECT_EQ(server.requests_served(), 3);
}

TEST(StatusServer, RefusesAnAddressThatIsNotOne) {
  StatusBoard board;
  EXPECT_THROW(StatusServer("not-an-ip", 0, board), std::runtime_error);
}

}  // namespace
}  // namespace autopar::coord
