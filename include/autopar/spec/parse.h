// Turning user input into specs: presets, YAML, Hugging Face config.json, Megatron-LM flags.
//
// These functions take text, never paths: reading files is the CLI's job, so the core stays free
// of I/O. Every error is an InputError naming the field or flag and the allowed values.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "autopar/spec/cluster.h"
#include "autopar/spec/model.h"
#include "autopar/spec/train.h"

namespace autopar {

// Presets. Names are lower-case (`llama2-70b`, `a100-80gb`); lookup ignores case.
std::vector<std::string> ModelPresetNames();
std::vector<std::string> GpuPresetNames();
bool HasModelPreset(const std::string& name);
bool HasGpuPreset(const std::string& name);
ModelSpec ModelPreset(const std::string& name);  // throws InputError("--model", ...)
GpuSpec GpuPreset(const std::string& name);      // throws InputError("--gpu", ...)

// A YAML document whose keys are ModelSpec field names (Megatron names; `swiglu: true`,
// `activation: gelu|swiglu`, `normalization: RMSNorm|LayerNorm`, ...). Optional key `base:`
// starts from a preset.
ModelSpec ModelFromYaml(const std::string& text);

// A Hugging Face `config.json` (Llama, Mistral, Mixtral, Qwen2/3, Qwen3-MoE, gpt-oss, Gemma-2/3,
// Phi-3, DeepSeek-V2/V3, GPT-2/OPT; docs/models.md §9). A key that looks like a mixture-of-experts
// or multi-token-prediction setting and that the family does not read is an InputError naming it.
ModelSpec ModelFromHfConfig(const std::string& json_text);

// A YAML document describing a GPU (GpuSpec field names, bandwidths in GB/s, latencies in us,
// peaks in TFLOP/s, `nvlink_domain_gpus` in GPUs) or a cluster (`nnodes`, `gpus_per_node`,
// `gpu: NAME` or a nested GPU map, where the NVLink domain is given).
GpuSpec GpuFromYaml(const std::string& text);
ClusterSpec ClusterFromYaml(const std::string& text);

// Megatron-LM arguments as pasted from a training script (`--num-layers 32 --hidden-size 4096
// --swiglu ...`). Recognised model flags are applied on top of `base`; train flags
// (`--global-batch-size`, `--seq-length`, `--bf16`, ...) on top of `train`. Flags that are not
// model/train flags are returned in `unused` so the caller can treat them (or reject them).
struct MegatronArgs {
  ModelSpec model;
  TrainSpec train;
  std::vector<std::string> unused;
  // What the import assumed where the flags were silent (a tokenizer's vocabulary, its padding),
  // for the user to read.
  std::vector<std::string> notes;
};
MegatronArgs ApplyMegatronFlags(const std::vector<std::string>& args, const ModelSpec& base,
                                const TrainSpec& train);
// A Megatron-LM flag the model accounts for without reading it: one that changes nothing of a
// step's time or memory (learning rate, data, tokenizer files, logging, checkpoints, ...) or
// that asks for what the model assumes (grouped expert GEMMs). A script's flag that is neither
// read nor one of these is reported as ignored.
bool MegatronFlagAccountedFor(const std::string& flag);

// The variables a pasted script's `$NAME` may name: `overrides` (--megatron-env NAME=VALUE) win
// over the script's own assignments, which win over `environment` (the process's, as in bash).
struct ShellVariables {
  std::map<std::string, std::string> overrides;
  std::map<std::string, std::string> environment;
};
// Splits a pasted command line or launch script into the words bash would pass on, as far as
// flags go (src/spec/shell_words.cc): whitespace and line continuations (`\` + newline) separate
// words, quotes group them, `#` starts a comment; `$NAME`, `${NAME}` and `${NAME:-default}`
// expand; bash array items (`ARGS=( "--fp8-format hybrid" ... )`) are split into words, as their
// unquoted expansion would be; a script's `VAR="--flag value ..."` yields the flags. What cannot
// be expanded stays as written.
std::vector<std::string> SplitCommandLine(const std::string& text,
                                          const ShellVariables& variables = {});

}  // namespace autopar
