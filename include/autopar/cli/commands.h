// The subcommands of autopar-tune (docs/cli.md §1). Each takes argv after the subcommand name and
// returns the process exit code; bad input surfaces as InputError, which main() maps to 2.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace autopar::cli {

int RunPlan(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);
int RunPredict(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);
int RunReport(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

// Runs a whole command line (argv without the program name); catches InputError → exit 2.
int Main(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err);

}  // namespace autopar::cli
