// Reading a pasted Megatron-LM argument list or launch script (--megatron-args,
// --megatron-args-file) and Megatron-LM's parallel flags on our command line: the configuration
// and software stack they describe, what a script's `$NAME`s expand to, torchrun's cluster shape,
// and the script's flags the model does not read (docs/cli.md §2). The pipeline's stages are
// pipeline_stages.h's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "autopar/perf/constants.h"
#include "autopar/space/config.h"
#include "autopar/spec/model.h"
#include "autopar/spec/parse.h"
#include "autopar/spec/train.h"

namespace autopar::cli {

// What Megatron-LM's parallel flags said besides the configuration and the stack.
struct MegatronFlagsRead {
  std::string uneven_flag;  // the flag that made the pipeline stages uneven ("" when even)
  // --recompute-modules (canonical RecomputeModule bits, 0 for core_attn alone): what selective
  // recompute reruns, in the configuration and in every selective candidate of a search.
  std::optional<uint8_t> recompute_modules;
  // --moe-token-dispatcher-type (true: flex), in the configuration and in every candidate of a
  // search that can dispatch by it.
  std::optional<bool> flex_dispatcher;
  // --fp8-param-gather (FP8 training; not with FSDP, which is not modelled): FP8 parameters in
  // the configuration and in every candidate of a search.
  bool fp8_param_gather = false;
};

// Megatron-LM's parallelism and software-stack flags, taken out of `args` (argv items).
// Returns the configuration they describe, if any parallel flag was present, and in `read`
// what else they said. `precision` decides
// what an absent reduction-dtype flag means (Megatron reduces bf16 runs' gradients in fp32 and
// fp16 runs' in fp16 by default).
// From a pasted script that defines the model (`script`: no --model), Megatron's defaults apply
// where it is silent (dropout 0.1). Megatron's own corrections are made with a note (sequence
// parallelism off at tp = 1).
std::optional<ParallelConfig> TakeMegatronParallelFlags(std::vector<std::string>& args,
                                                        const ModelSpec& model, Precision precision,
                                                        bool script, StackOptions& stack,
                                                        std::vector<std::string>& notes,
                                                        MegatronFlagsRead& read);

// --megatron-env NAME=VALUE[,NAME=VALUE...] and this process's environment: what a pasted
// script's `$NAME` expands to.
ShellVariables ScriptVariables(const std::optional<std::string>& overrides);

// torchrun's --nnodes and --nproc-per-node (also spelt --nproc_per_node) in a launch script.
struct TorchrunShape {
  std::optional<int64_t> nnodes, nproc_per_node;
};

TorchrunShape TakeTorchrunShape(const std::vector<std::string>& words);

// One note naming every flag of a pasted script that could change the step and that the model
// does not read (MegatronFlagAccountedFor lists those that change nothing costed).
std::optional<std::string> IgnoredNote(const std::vector<std::string>& script_rest);

}  // namespace autopar::cli
