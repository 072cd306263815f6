// The flag table of every command (src/cli/flag_table.cc, docs/cli.md §1): each flag's name, its
// argument, what the parser accepts of it (type and range, or the allowed values), its help text,
// and, through the groups each command lists, which commands accept it. The parser (`Args`,
// inputs.h) reads a command's flags from it; `autopar-tune --help`, `autopar-tune COMMAND --help`
// and `autopar-tune help COMMAND` print it; README.md's flag section is FlagReferenceMarkdown()
// (tests/unit/cli_flag_table_test.cc fails when they differ).
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace autopar::cli {

// The largest integer a flag takes unless its row says otherwise: the counts flags set are ints,
// and a larger value would wrap.
inline constexpr int64_t kMaxIntFlag = 2147483647;

// How `Args` reads a flag's value.
enum class FlagType {
  kSwitch,    // no value
  kText,      // a string the command checks itself (a path, a SPEC, a list, an address, ...)
  kChoice,    // one of `value`'s '|'-separated words, else "allowed: a, b; got 'x'"
  kInt,       // an integer in [min, max]
  kUnsigned,  // an integer from 0 to 2^64 - 1
  kNumber,    // a finite number from 0 to max_number
  kDuration,  // seconds (at most 1e9), or a duration such as 90s, 30m, 8h
  kMegatron,  // Megatron-LM's own flag: its parsers read it (spec/parse.h, src/cli), not `Args`
};

struct FlagHelp {
  const char* flag;     // "--top"
  const char* value;    // "K"; "" for a switch; a choice's allowed values, "table|json"
  const char* meaning;  // one line, the default in parentheses
  FlagType type = FlagType::kText;
  int64_t min = 1;            // kInt
  int64_t max = kMaxIntFlag;  // kInt
  double max_number = 1e15;   // kNumber
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
  bool needs_trial_runner = false;  // `trial` and `probe`: only in builds with the trial runner
};

// Every command of this build, in the order `--help` lists them.
const std::vector<CommandHelp>& Commands();
// Every command of a build with the trial runner (what README.md documents).
const std::vector<CommandHelp>& AllCommands();
// nullptr when there is no such command.
const CommandHelp* FindCommand(const std::string& name);
// --help and --version, which every command takes (main_dispatch.cc reads them).
const FlagGroup& EveryCommandFlags();

// `command`'s entry for `flag`, nullptr when the command does not take it.
const FlagHelp* FindFlag(const CommandHelp& command, const std::string& flag);
// Whether any command (AllCommands()) takes `flag`.
bool AnyCommandTakes(const std::string& flag);

void WriteUsage(std::ostream& out);
void WriteCommandHelp(std::ostream& out, const CommandHelp& command);

// README.md's flag section, from the table: each group once, with the commands that take it and
// its flags (`--flag VALUE`), in lines of at most 100 columns.
std::string FlagReferenceMarkdown();

// The project version (CMakeLists.txt `project(... VERSION ...)`), e.g. "0.1.0".
const char* Version();

}  // namespace autopar::cli
