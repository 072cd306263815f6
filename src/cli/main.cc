#include <iostream>
#include <string>
#include <vector>

#include "autopar/cli/commands.h"

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  return autopar::cli::Main(std::vector<std::string>(argv + 1, argv + argc), std::cout, std::cerr);
}
