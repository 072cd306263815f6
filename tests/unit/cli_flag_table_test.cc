// The flag table (autopar/cli/help.h) against README.md and against the parser that reads it.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "autopar/cli/help.h"
#include "autopar/cli/inputs.h"
#include "autopar/common/errors.h"
#include "cli_test_util.h"

namespace autopar::cli {
namespace {

constexpr const char* kBegin = "<!-- flag table: begin -->\n";
constexpr const char* kEnd = "<!-- flag table: end -->";

std::string ReadmeFlagSection() {
  std::ifstream in(std::string(AUTOPAR_SOURCE_DIR) + "/README.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string readme = text.str();
  const size_t begin = readme.find(kBegin);
  const size_t end = readme.find(kEnd);
  if (begin == std::string::npos || end == std::string::npos || end < begin) return "(no section)";
  return readme.substr(begin + std::string(kBegin).size(),
                       end - begin - std::string(kBegin).size());
}

// README.md's flag section is the table's: a flag added, removed or renamed in one and not the
// other fails here, printing the section the table gives.
TEST(FlagTable, ReadmeSectionIsTheTable) {
  const std::string expected = FlagReferenceMarkdown();
  EXPECT_EQ(ReadmeFlagSection(), expected)
      << "README.md's section between '" << kBegin << "' and '" << kEnd
      << "' differs from the flag table (src/cli/flag_table.cc); the table gives:\n"
      << expected;
  // The section names every flag of every command, trial and probe included.
  for (const CommandHelp& c : AllCommands()) {
    for (const FlagGroup* g : c.groups) {
      for (const FlagHelp& f : g->flags) {
        EXPECT_NE(expected.find(std::string("`") + f.flag), std::string::npos) << f.flag;
      }
    }
  }
  std::istringstream lines(expected);
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 100u) << line;
}

// A command lists each flag once; a switch has no value and a value flag names it; a choice
// lists its values; a range is not empty.
TEST(FlagTable, RowsAreWellFormed) {
  for (const CommandHelp& c : AllCommands()) {
    std::set<std::string> seen;
    for (const FlagGroup* g : c.groups) {
      for (const FlagHelp& f : g->flags) {
        EXPECT_TRUE(seen.insert(f.flag).second) << c.name << " lists " << f.flag << " twice";
        EXPECT_EQ(std::string(f.flag).rfind("--", 0), 0u) << f.flag;
        if (f.type != FlagType::kMegatron) {  // Megatron-LM's switches and values alike
          EXPECT_EQ(*f.value == '\0', f.type == FlagType::kSwitch) << f.flag;
        }
        if (f.type == FlagType::kChoice) {
          EXPECT_NE(std::string(f.value).find('|'), std::string::npos) << f.flag;
        }
        if (f.type == FlagType::kInt) {
          EXPECT_LE(f.min, f.max) << f.flag;
        }
      }
    }
  }
}

// The parser reads what the table says: a choice refused with its allowed values, an integer
// with its range, each naming the flag; a flag of another command is not taken.
TEST(FlagTable, ArgsReadsTheTable) {
  auto refused = [](const std::vector<std::string>& argv, const std::string& command,
                    const std::string& flag, auto read) {
    Args args(argv, command);
    try {
      read(args);
    } catch (const InputError& e) {
      return std::string(e.what()).rfind(flag + ": ", 0) == 0 ? std::string(e.what()) : "";
    }
    return std::string();
  };
  EXPECT_EQ(
      refused({"--backend", "tpu"}, "tune", "--backend", [](Args& a) { a.Value("--backend"); }),
      "--backend: allowed: cpu, cuda, replay, megatron; got 'tpu'");
  EXPECT_EQ(
      refused({"--backend", "replay"}, "trial", "--backend", [](Args& a) { a.Value("--backend"); }),
      "--backend: allowed: cpu, cuda; got 'replay'");
  EXPECT_EQ(refused({"--status-port", "65536"}, "tune", "--status-port",
                    [](Args& a) { a.Int("--status-port", 0); }),
            "--status-port: expected an integer from -1 to 65535, got '65536'");
  EXPECT_EQ(refused({"--max-microbatches", "-2"}, "trial", "--max-microbatches",
                    [](Args& a) { a.Int("--max-microbatches", 0); }),
            "--max-microbatches: expected an integer from -1 to 2147483647, got '-2'");
  EXPECT_EQ(refused({"--budget", "1y"}, "tune", "--budget",
                    [](Args& a) { a.Duration("--budget", "8h"); }),
            "--budget: expected seconds (at most 1e9) or a duration such as 90s, 30m, 8h; got "
            "'1y'");
  {
    Args args({"--world", "mixed", "--budget", "30m", "--seed", "18446744073709551615"}, "tune");
    EXPECT_EQ(args.Duration("--budget", "8h"), 1800);
    EXPECT_EQ(args.Unsigned("--seed").value_or(0), 18446744073709551615u);
    // --world is make-replay-table's: tune does not take it, and it stays for Finish() to refuse.
    EXPECT_FALSE(args.Value("--world").has_value());
    EXPECT_EQ(args.Remaining(), (std::vector<std::string>{"--world", "mixed"}));
  }
  Args replay({"--world", "mixed"}, "make-replay-table");
  EXPECT_EQ(replay.Value("--world").value_or(""), "mixed");
  replay.Finish();
}

// A reading the table does not describe is a bug, caught the first time it runs.
TEST(FlagTable, ReadingOutsideTheTableIsABug) {
  Args args({"--top", "3"}, "plan");
  EXPECT_THROW(args.Value("--no-such-flag"), std::logic_error);
  EXPECT_THROW(args.Switch("--top"), std::logic_error);        // an int, not a switch
  EXPECT_THROW(args.Double("--top", 1), std::logic_error);     // an int, not a number
  EXPECT_THROW(args.Value("--num-layers"), std::logic_error);  // Megatron-LM's
  EXPECT_THROW(Args({}, "no-such-command"), std::logic_error);
  EXPECT_EQ(args.Int("--top", 5), 3);
}

// A flag the table gives another command only is an unknown flag here, as Finish() says.
TEST(FlagTable, AnotherCommandsFlagIsUnknown) {
  const Result r = RunCli({"report", "--study", "/nonexistent/study", "--resume"});
  EXPECT_EQ(r.code, kExitBadInput);
  EXPECT_NE(r.err.find("--resume: unknown flag"), std::string::npos) << r.err;
  const Result replay = RunCli(
      {"make-replay-table", "--model", "tiny", "--global-batch-size", "16", "--format", "json"});
  EXPECT_EQ(replay.code, kExitBadInput);
  EXPECT_NE(replay.err.find("--format: unknown flag"), std::string::npos) << replay.err;
}

}  // namespace
}  // namespace autopar::cli
