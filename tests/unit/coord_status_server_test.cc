#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <chrono>
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

TEST(StatusServer, RefusesAnAddressThatIsNotOne) {
  StatusBoard board;
  EXPECT_THROW(StatusServer("not-an-ip", 0, board), std::runtime_error);
}

}  // namespace
}  // namespace autopar::coord
