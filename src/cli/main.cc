#include <iostream>
#include <string>
#include <vector>

#include "autopar/cli/commands.h"
#include "autopar/cli/trial_cmd.h"

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  autopar::cli::RegisterMpiTrialBackends();
  return autopar::cli::Main(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
