// Fuzz target: the status server's request parser (src/coord/status_server.cc, StatusResponse):
// the bytes a client sent so far give either "" (head incomplete, within 8 KiB) or a whole HTTP
// response; any other answer aborts. The snapshot holds strings that need JSON escaping.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "autopar/coord/status_server.h"

namespace {

const autopar::coord::StatusBoard& Board() {
  static const autopar::coord::StatusBoard* board = [] {
    auto* b = new autopar::coord::StatusBoard;
    autopar::coord::StatusSnapshot s;
    s.study = "fuzz \"study\"\n\\";
    s.model = "llama2-7b";
    s.best_config = "tp2-pp4";
    s.best_step_time_s = 1.5;
    s.stop_progress = 0.25;
    b->Update(s);
    return b;
  }();
  return *board;
}

void Check(std::string_view received) {
  const std::string response = autopar::coord::StatusResponse(received, Board());
  const bool complete = received.find("\r\n\r\n") != std::string_view::npos;
  const bool ok = response.empty() ? !complete && received.size() <= 8192
                                   : response.rfind("HTTP/1.1 ", 0) == 0 &&
                                         response.find("\r\n\r\n") != std::string::npos;
  if (!ok) {
    std::fprintf(stderr, "StatusResponse of %zu bytes answered %zu bytes: %.200s\n",
                 received.size(), response.size(), response.c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  Check(bytes);
  // As the server sees a request that arrives in pieces.
  Check(bytes.substr(0, size / 2));
  return 0;
}
