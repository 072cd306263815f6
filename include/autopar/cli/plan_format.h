// Rendering ranked estimates in the formats of docs/cli.md §5: table, json, csv, megatron, yaml,
// bridge.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "autopar/cli/inputs.h"
#include "autopar/perf/cost_model.h"

namespace autopar::cli {

struct Ranked {
  ParallelConfig config;
  Estimate estimate;
};

struct PlanSummary {
  int64_t candidates = 0;  // satisfy the constraints
  int64_t feasible = 0;    // and fit in memory
  double elapsed_s = 0;    // planner wall time
};

// Megatron-LM arguments that select `c` for this model and job.
std::string MegatronFlags(const ParallelConfig& c, const ModelSpec& model, const TrainSpec& train);

// One Megatron-Bridge override of a ConfigContainer field: `key` dotted (model.*, train.*, ddp.*,
// optimizer.*, mixed_precision.*), `value` as Hydra and YAML both read it ("8", "true", "null",
// "a2a"), or `list` for a list value.
struct BridgeOverride {
  std::string key;
  std::string value;
  std::vector<std::string> list;  // a list value's items (value unused)
};

// The Megatron-Bridge overrides that select `c` (docs/cli.md §5): every parallel field explicitly,
// since a recipe sets its own; the reduction dtype only where it departs from the precision
// preset's.
std::vector<BridgeOverride> BridgeOverrides(const ParallelConfig& c, const ModelSpec& model,
                                            const TrainSpec& train);
// `key=value` items on one line, as scripts/training/run_recipe.py takes them (Hydra syntax).
std::string BridgeOverrideLine(const std::vector<BridgeOverride>& overrides);
// The same as a YAML override file, nested by section.
void WriteBridgeYaml(std::ostream& out, const std::vector<BridgeOverride>& overrides);

// `with_breakdown` adds the time and memory breakdown of each estimate.
void WriteRanked(std::ostream& out, Format format, const Inputs& in, const PlanSummary& summary,
                 const std::vector<Ranked>& ranked, bool with_breakdown);

}  // namespace autopar::cli
