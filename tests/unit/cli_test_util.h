// Helpers shared by the CLI tests: a command run in-process, its exit code and both streams.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "autopar/cli/commands.h"

namespace autopar::cli {

struct Result {
  int code;
  std::string out, err;
};

inline Result RunCli(const std::vector<std::string>& argv) {
  std::ostringstream out, err;
  const int code = Main(argv, out, err);
  return {code, out.str(), err.str()};
}

}  // namespace autopar::cli
