// Turning user input into specs: presets, YAML, Hugging Face config.json, Megatron-LM flags.
//
// These functions take text, never paths: reading files is the CLI's job, so the core stays free
// of I/O. Every error is an InputError naming the field or flag and the allowed values.
#pragma once

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
// peaks in TFLOP/s) or a cluster (`nnodes`, `gpus_per_node`, `gpu: NAME` or a nested GPU map).
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
};
MegatronArgs ApplyMegatronFlags(const std::vector<std::string>& args, const ModelSpec& base,
                                const TrainSpec& train);
// Splits a pasted command line on whitespace and line continuations (`\` + newline). Quotes
// group words, `#` starts a comment, and a script's `VAR="--flag value ..."` yields the flags.
std::vector<std::string> SplitCommandLine(const std::string& text);

}  // namespace autopar
