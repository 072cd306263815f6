#include "autopar/coord/status_server.h"

// <utility> must come before asio (see below).
// clang-format off
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>  // Boost 1.74's asio uses std::exchange without including it

#include <boost/asio.hpp>
// clang-format on

namespace autopar::coord {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

constexpr size_t kMaxRequestBytes = 8192;
constexpr auto kIdleTimeout = std::chrono::seconds(5);
// After a failed accept (descriptors run out: EMFILE, ENFILE), the next waits this long, doubling
// to the ceiling while accept keeps failing, so a flood costs no busy loop.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(10);
constexpr auto kAcceptBackoffCeiling = std::chrono::seconds(1);

// The connections open now: each Session holds one while it lives.
class ConnectionCount {
 public:
  explicit ConnectionCount(std::atomic<int64_t>& open) : open_(open) { ++open_; }
  ~ConnectionCount() { --open_; }
  ConnectionCount(const ConnectionCount&) = delete;
  ConnectionCount& operator=(const ConnectionCount&) = delete;

 private:
  std::atomic<int64_t>& open_;
};

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string Num(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream s;
  s.precision(9);
  s << v;
  return s.str();
}

std::string Response(int code, const char* reason, const std::string& type,
                     const std::string& body, bool head) {
  std::ostringstream r;
  r << "HTTP/1.1 " << code << " " << reason << "\r\nContent-Type: " << type
    << "\r\nContent-Length: " << body.size() << "\r\nConnection: close\r\n"
    << "Cache-Control: no-store\r\n\r\n";
  if (!head) r << body;
  return r.str();
}

std::string Answer(const std::string& head, const StatusBoard& board) {
  const size_t eol = head.find("\r\n");
  const std::string line = head.substr(0, eol);
  std::istringstream in(line);
  std::string method, target, version, extra;
  in >> method >> target >> version;
  const bool well_formed = !method.empty() && !target.empty() && target[0] == '/' &&
                           version.rfind("HTTP/1.", 0) == 0 && !(in >> extra);
  if (!well_formed) return Response(400, "Bad Request", "text/plain", "bad request\n", false);
  if (method != "GET" && method != "HEAD") {
    return Response(405, "Method Not Allowed", "text/plain", "read-only: GET or HEAD\n", false);
  }
  const bool head_only = method == "HEAD";
  const std::string path = target.substr(0, target.find('?'));
  if (path == "/status") {
    return Response(200, "OK", "application/json", StatusJson(board.Get()), head_only);
  }
  if (path == "/metrics") {
    return Response(200, "OK", "text/plain; version=0.0.4", StatusPrometheus(board.Get()),
                    head_only);
  }
  return Response(404, "Not Found", "text/plain", "try /status or /metrics\n", head_only);
}

// One connection: read the head (bounded), answer, close.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const StatusBoard& board, std::atomic<int64_t>& served,
          std::atomic<int64_t>& open)
      : count_(open),
        socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        board_(board),
        served_(served) {}

  void Start() {
    timer_.expires_after(kIdleTimeout);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) {
        boost::system::error_code ignored;
        self->socket_.close(ignored);
      }
    });
    Read();
  }

 private:
  void Read() {
    socket_.async_read_some(
        asio::buffer(chunk_),
        [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
          if (ec) return self->Close();  // the client went away: free the descriptor now
          self->head_.append(self->chunk_.data(), n);
          std::string response = StatusResponse(self->head_, self->board_);
          if (response.empty()) return self->Read();
          self->Reply(std::move(response));
        });
  }

  void Reply(std::string response) {
    ++served_;
    response_ = std::move(response);
    asio::async_write(socket_, asio::buffer(response_),
                      [self = shared_from_this()](const boost::system::error_code&, size_t) {
                        boost::system::error_code ignored;
                        self->socket_.shutdown(tcp::socket::shutdown_both, ignored);
                        self->Close();
                      });
  }

  void Close() {
    boost::system::error_code ignored;
    socket_.close(ignored);
    timer_.cancel();
  }

  ConnectionCount count_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  const StatusBoard& board_;
  std::atomic<int64_t>& served_;
  std::array<char, 1024> chunk_{};
  std::string head_, response_;
};

}  // namespace

std::string StatusResponse(std::string_view received, const StatusBoard& board) {
  const size_t end = received.find("\r\n\r\n");
  if (end == std::string_view::npos && received.size() <= kMaxRequestBytes) return "";
  if (end == std::string_view::npos || end > kMaxRequestBytes) {
    return Response(413, "Payload Too Large", "text/plain", "request too large\n", false);
  }
  return Answer(std::string(received.substr(0, end)), board);
}

std::string StatusJson(const StatusSnapshot& s) {
  std::ostringstream j;
  j << "{\"study\":\"" << JsonEscape(s.study) << "\",\"model\":\"" << JsonEscape(s.model)
    << "\",\"searcher\":\"" << JsonEscape(s.searcher) << "\",\"trials_done\":" << s.trials_done
    << ",\"trials_failed\":" << s.trials_failed << ",\"candidates\":" << s.candidates
    << ",\"in_flight\":" << (s.trial_in_flight ? "true" : "false")
    << ",\"in_flight_config\":\"" << JsonEscape(s.in_flight_config) << "\""
    << ",\"best\":{\"config\":\"" << JsonEscape(s.best_config)
    << "\",\"step_time_s\":" << Num(s.best_step_time_s) << "}"
    << ",\"predicted_best\":{\"config\":\"" << JsonEscape(s.predicted_best_config)
    << "\",\"step_time_s\":" << Num(s.predicted_best_step_time_s) << "}"
    << ",\"stop\":{\"progress\":" << Num(s.stop_progress) << ",\"rule\":\""
    << JsonEscape(s.stop_rule) << "\"},\"elapsed_s\":" << Num(s.elapsed_s)
    << ",\"budget_s\":" << Num(s.budget_s)
    << ",\"budget_left_s\":" << Num(std::max(0.0, s.budget_s - s.elapsed_s))
    << ",\"finished\":" << (s.finished ? "true" : "false") << "}\n";
  return j.str();
}

std::string StatusPrometheus(const StatusSnapshot& s) {
  std::ostringstream m;
  auto gauge = [&](const char* name, const char* help, double v) {
    m << "# HELP " << name << " " << help << "\n# TYPE " << name << " gauge\n"
      << name << " " << Num(v) << "\n";
  };
  gauge("autopar_trials_done", "Trials finished, any outcome.", s.trials_done);
  gauge("autopar_trials_failed", "Trials that did not end ok.", s.trials_failed);
  gauge("autopar_trial_in_flight", "1 while a trial runs.", s.trial_in_flight ? 1 : 0);
  gauge("autopar_candidates", "Configurations in the search space.", s.candidates);
  gauge("autopar_best_step_time_seconds", "Best measured step time.", s.best_step_time_s);
  gauge("autopar_predicted_best_step_time_seconds", "The posterior mean's best step time.",
        s.predicted_best_step_time_s);
  gauge("autopar_stop_progress", "Progress of the convergence rule, 0 to 1.", s.stop_progress);
  gauge("autopar_elapsed_seconds", "Wall time of the search.", s.elapsed_s);
  gauge("autopar_budget_seconds", "The search's time budget.", s.budget_s);
  gauge("autopar_finished", "1 once a stop rule fired.", s.finished ? 1 : 0);
  return m.str();
}

struct StatusServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  asio::steady_timer backoff_timer{io};
  std::chrono::milliseconds backoff{0};
  std::thread thread;
  const StatusBoard& board;
  std::atomic<int64_t> served{0}, open{0}, refused{0}, accept_failures{0};

  explicit Impl(const StatusBoard& b) : board(b) {}

  // Accepts the next connection: served while fewer than kMaxConnections are open, closed at
  // once beyond (a flood of idle connections holds at most the cap's descriptors, never the
  // search's); a failed accept waits (Backoff) before the next.
  void Accept() {
    acceptor.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (ec) return Backoff();
      backoff = std::chrono::milliseconds(0);
      if (open.load() >= StatusServer::kMaxConnections) {
        boost::system::error_code ignored;
        socket.close(ignored);
        ++refused;
      } else {
        std::make_shared<Session>(std::move(socket), board, served, open)->Start();
      }
      Accept();
    });
  }

  void Backoff() {
    ++accept_failures;
    backoff = std::min<std::chrono::milliseconds>(
        std::max<std::chrono::milliseconds>(backoff * 2, kAcceptBackoff), kAcceptBackoffCeiling);
    backoff_timer.expires_after(backoff);
    backoff_timer.async_wait([this](const boost::system::error_code& ec) {
      if (!ec) Accept();
    });
  }
};

StatusServer::StatusServer(const std::string& address, uint16_t port, const StatusBoard& board)
    : impl_(std::make_unique<Impl>(board)) {
  boost::system::error_code ec;
  const asio::ip::address addr = asio::ip::make_address(address, ec);
  if (ec) throw std::runtime_error("--status-addr: '" + address + "' is not an IP address");
  const tcp::endpoint endpoint(addr, port);
  impl_->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl_->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl_->acceptor.bind(endpoint, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    throw std::runtime_error("--status-port: cannot listen on " + address + ":" +
                             std::to_string(port) + ": " + ec.message());
  }
  impl_->Accept();
  impl_->thread = std::thread([this] { impl_->io.run(); });
}

StatusServer::~StatusServer() {
  asio::post(impl_->io, [this] {
    boost::system::error_code ignored;
    impl_->acceptor.close(ignored);
    impl_->backoff_timer.cancel();
    impl_->io.stop();
  });
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint16_t StatusServer::port() const { return impl_->acceptor.local_endpoint().port(); }

int64_t StatusServer::requests_served() const { return impl_->served.load(); }

int64_t StatusServer::open_connections() const { return impl_->open.load(); }

int64_t StatusServer::connections_refused() const { return impl_->refused.load(); }

int64_t StatusServer::accept_failures() const { return impl_->accept_failures.load(); }

}  // namespace autopar::coord
