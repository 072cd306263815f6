#include <exception>
#include <initializer_list>
#include <iostream>
#include <new>
#include <string>
#include <vector>

#include "autopar/cli/commands.h"
#include "autopar/cli/help.h"
#include "autopar/cli/inputs.h"
#include "autopar/cli/trial_cmd.h"
#include "autopar/cli/tune.h"
#include "autopar/common/errors.h"
#include "autopar/spec/parse.h"

namespace autopar::cli {
namespace {

// Whether one of `names` is among argv's flags: not the value of --megatron-args, which is a
// pasted argument list of its own.
bool HasFlag(const std::vector<std::string>& argv, std::initializer_list<const char*> names) {
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--megatron-args") {
      ++i;
      continue;
    }
    for (const char* name : names) {
      if (argv[i] == name) return true;
    }
  }
  return false;
}

std::string CommandNames() {
  std::string names;
  for (const CommandHelp& c : Commands()) {
    names += (names.empty() ? "" : ", ") + std::string(c.name);
  }
  return names;
}

// `help [COMMAND]`, `--help`, `-h`: the usage, or one command's.
int Help(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  if (argv.size() < 2) {
    WriteUsage(out);
    return kExitOk;
  }
  const CommandHelp* command = FindCommand(argv[1]);
  if (command == nullptr) {
    err << "autopar-tune help: unknown command '" << argv[1] << "'; allowed: " << CommandNames()
        << "\n";
    return kExitBadInput;
  }
  WriteCommandHelp(out, *command);
  return kExitOk;
}

}  // namespace

int Main(const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  if (argv.empty()) {
    WriteUsage(err);
    return kExitBadInput;
  }
  if (argv[0] == "--help" || argv[0] == "-h" || argv[0] == "help") return Help(argv, out, err);
  if (HasFlag(argv, {"--version"})) {
    out << "autopar-tune " << Version() << "\n";
    return kExitOk;
  }
  // No subcommand: flags go to `tune`, the default command (docs/cli.md §1).
  const bool implicit_tune = argv[0].rfind("--", 0) == 0;
  const std::string command = implicit_tune ? "tune" : argv[0];
  const std::vector<std::string> rest(argv.begin() + (implicit_tune ? 0 : 1), argv.end());
  if (const CommandHelp* help = FindCommand(command); help && HasFlag(rest, {"--help", "-h"})) {
    WriteCommandHelp(out, *help);
    return kExitOk;
  }
  try {
    if (command == "plan") return RunPlan(rest, out, err);
    if (command == "predict") return RunPredict(rest, out, err);
    if (command == "report") return RunReport(rest, out, err);
    if (command == "tune") return RunTune(rest, out, err);
    if (command == "make-replay-table") return RunMakeReplayTable(rest, out, err);
#if defined(AUTOPAR_WITH_TRIALS)
    if (command == "trial") return RunTrialCommand(rest, out, err);
    if (command == "probe") return RunProbeCommand(rest, out, err);
#endif
    if (command == "presets") {
      Args(rest, "presets").Finish();
      out << "models:";
      for (const auto& n : ModelPresetNames()) out << " " << n;
      out << "\ngpus:";
      for (const auto& n : GpuPresetNames()) out << " " << n;
      out << "\n";
      return kExitOk;
    }
    err << "autopar-tune: unknown command '" << command << "'; allowed: " << CommandNames()
        << " (autopar-tune --help)\n";
    return kExitBadInput;
  } catch (const InputError& e) {
    err << "autopar-tune " << command << ": " << e.what() << "\n";
    return kExitBadInput;
  } catch (const std::runtime_error& e) {  // the environment failed us (MPI, files)
    err << "autopar-tune " << command << ": " << e.what() << "\n";
    return kExitFailure;
  } catch (const std::bad_alloc&) {
    err << "autopar-tune " << command << ": out of memory\n";
    return kExitFailure;
  } catch (const std::exception& e) {
    // A bug (a std::logic_error the inputs should have been checked against): still an exit
    // code and a message, never an abort (issue 17).
    err << "autopar-tune " << command << ": internal error: " << e.what()
        << " (a bug: please report it with the command line)\n";
    return kExitFailure;
  }
}

}  // namespace autopar::cli
