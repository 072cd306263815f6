// The command line of one `--backend megatron` trial (docs/trial.md §17): the user's training
// command and Megatron-LM arguments with every parallelism flag replaced by the candidate's, and
// the trial's own settings. Pure: words in, words out.
//
// The rules (which flags are replaced, kept while the configuration allows them, owned by the
// trial, and how many values each takes) are launcher/megatron_flags.txt's, the file
// launcher/autopar-train reads too; the build embeds it (src/cli/CMakeLists.txt), so a trial
// runs the command `autopar-train --study STUDY -- ...` would give for the same configuration.
// tests/fault/megatron_backend_test.py compares the two on the same inputs.
#pragma once

#include <string>
#include <vector>

#include "autopar/space/config.h"

namespace autopar::cli {

// What a trial adds to the user's arguments (each replacing the user's own value).
struct MegatronTrialSettings {
  int train_iters = 7;          // --train-iters: warm-up plus the most timed iterations
  int exit_duration_mins = 10;  // --exit-duration-in-mins: Megatron's own guard (whole minutes)
  bool mock_data = true;        // --mock-data, the user's data flags removed; false: kept
};

// Index of the first of the training script's own words in `command`: after the first `*.py`
// word, else after the program (autopar-train's script_start).
size_t MegatronScriptStart(const std::vector<std::string>& command);

// The user's words with every parallelism flag replaced by `parallel_flags` (MegatronFlags'
// words: the candidate's), as autopar-train replaces them. `notes` gets one line per conditional
// flag dropped because the configuration refuses it.
std::vector<std::string> ReplaceParallelFlags(const std::vector<std::string>& user,
                                              const std::vector<std::string>& parallel_flags,
                                              const ParallelConfig& config,
                                              std::vector<std::string>* notes);

// The whole argument vector of a trial's child: `train_command` (split into words), then the
// user's script flags (the words after the first `*.py` of `user_args`, or all of them) with the
// parallel flags replaced and the flags the trial owns removed, then the trial's settings:
//   --train-iters N --log-interval 1 --eval-iters 0 --log-throughput --exit-duration-in-mins M
//   [--mock-data]
// The trial owns --train-iters/--train-samples, the sample-based schedule flags
// (--lr-decay-samples, --lr-warmup-samples, --lr-wsd-decay-samples), --log-interval,
// --eval-iters, --eval-interval, --exit-interval, --exit-duration-in-mins, --log-throughput,
// --save, --load, --skip-train and, with mock data, the data sources (--mock-data, --data-path,
// --split, --train/valid/test-data-path, --data-args-path, --per-split-data-args-path).
std::vector<std::string> MegatronTrialCommand(const std::vector<std::string>& train_command,
                                              const std::vector<std::string>& user_args,
                                              const std::vector<std::string>& parallel_flags,
                                              const ParallelConfig& config,
                                              const MegatronTrialSettings& settings,
                                              std::vector<std::string>* notes);

// Whether Megatron-LM needs CUDA_DEVICE_MAX_CONNECTIONS=1 for this configuration and these
// arguments: tensor or context parallelism before Blackwell, unless FSDP or MoE all-to-all
// overlap ask for more connections (arguments.py validate_args).
bool NeedsOneDeviceConnection(const ParallelConfig& config, const std::vector<std::string>& args);

// launcher/megatron_flags.txt as the build embedded it.
const char* MegatronFlagsText();

// "" when `text` reads as launcher/megatron_flags.txt's format (every line a flag, an arity and a
// kind, or a conditional flag's `needs` line naming `virtual` or a replaced flag), else the first
// line that does not, and why.
std::string CheckMegatronFlagsTable(const std::string& text);

// Splits MegatronFlags' text (flags and values separated by single spaces) into words.
std::vector<std::string> SplitWords(const std::string& text);

}  // namespace autopar::cli
