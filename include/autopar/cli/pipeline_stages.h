// Megatron-LM's ways of splitting the layers over pipeline stages, read into a ParallelConfig's
// pp_first/pp_last/vpp (docs/cli.md §2): --decoder-first-pipeline-num-layers and
// --decoder-last-pipeline-num-layers (TransformerConfig.num_layers_in_first/last_pipeline_stage),
// --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split (the embedding
// and the loss counted as one layer each in the even split), --pipeline-model-parallel-layout,
// and the virtual stages' --num-layers-per-virtual-pipeline-stage and
// --num-virtual-stages-per-pipeline-rank. NVIDIA/Megatron-LM d98e8a6:
// megatron/training/arguments.py (validate_args), megatron/core/transformer/transformer_config.py
// (__post_init__), transformer_block.py (get_num_layers_to_build),
// pipeline_parallel_layer_layout.py.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "autopar/space/config.h"
#include "autopar/spec/model.h"

namespace autopar::cli {

// What a script says about its stages, as given (the sizes are read into the config apart).
struct MegatronStageFlags {
  std::optional<int64_t> first_layers;   // --decoder-first-pipeline-num-layers
  std::optional<int64_t> last_layers;    // --decoder-last-pipeline-num-layers
  std::optional<std::string> layout;     // --pipeline-model-parallel-layout
  bool account_for_embedding = false;    // --account-for-embedding-in-pipeline-split
  bool account_for_loss = false;         // --account-for-loss-in-pipeline-split
  int64_t layers_per_virtual_stage = 0;  // --num-layers-per-virtual-pipeline-stage (0: not given)
  // The flag that gave the virtual stages per rank directly ("" if none):
  // --num-virtual-stages-per-pipeline-rank, or the older --virtual-pipeline-model-parallel-size.
  std::string virtual_stages_flag;
};

// A --pipeline-model-parallel-layout string unrolled as Megatron-LM's parse_str_to_list does:
// commas dropped, every `(...)*n` and then every `x*n` repeated, split at `|`; one string of layer
// letters (E embedding, t transformer layer, m MTP layer, L loss) per stage, in the layout's
// order (virtual stage-major: stage i is virtual stage i / pp of pipeline rank i % pp). Throws
// InputError naming the flag on any other letter.
std::vector<std::string> ParseMegatronLayout(const std::string& text);

// Sets c.vpp, c.pp_first and c.pp_last (canonical, CanonicalStages) from `flags`, c.pp already
// read and `model` the model they split. Throws InputError naming the flag where Megatron-LM
// refuses the combination or the split, and where the split is one the model does not describe
// (only a first and a last stage differing from the even middle ones, each model chunk of a stage
// the same size, the embedding on the first stage and the loss and MTP layers on the last).
// Returns the flag that made the stages uneven, "" when they are even.
std::string ApplyMegatronStages(const MegatronStageFlags& flags, const ModelSpec& model,
                                ParallelConfig& c);

// The transformer layers of c's largest pipeline stage (StageLayers; the split must be valid, or
// even).
int64_t LargestStageLayers(const ParallelConfig& c, int64_t num_layers);

}  // namespace autopar::cli
