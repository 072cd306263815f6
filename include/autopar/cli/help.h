// The usage text of every command, from one table (docs/cli.md §1): `autopar-tune --help` lists
// the commands, `autopar-tune COMMAND --help` and `autopar-tune help COMMAND` print that command's
// flags. The table names every flag a command reads (tests/unit/cli_commands_test.cc checks that
// each one is accepted); the parsers themselves stay where they are (`Args` in each command).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace autopar::cli {

struct FlagHelp {
  const char* flag;     // "--top"
  const char* value;    // "K"; "" for a switch
  const char* meaning;  // one line, the default in parentheses
};

struct FlagGroup {
  const char* title;
  std::vector<FlagHelp> flags;
  // Printed as a wrapped list of `--flag VALUE` items without meanings (Megatron-LM's own flags,
  // whose meaning is Megatron's).
  bool compact = false;
};

struct CommandHelp {
  const char* name;
  const char* summary;  // one line, for the command list
  const char* details;  // more lines (each ending in '\n'), or ""
  std::vector<const FlagGroup*> groups;
};

// Every command, in the order `--help` lists them. `trial` and `probe` are listed only in builds
// with the trial runner.
const std::vector<CommandHelp>& Commands();
// nullptr when there is no such command.
const CommandHelp* FindCommand(const std::string& name);

void WriteUsage(std::ostream& out);
void WriteCommandHelp(std::ostream& out, const CommandHelp& command);

// The project version (CMakeLists.txt `project(... VERSION ...)`), e.g. "0.1.0".
const char* Version();

}  // namespace autopar::cli
