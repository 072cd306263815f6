// Rendering ranked estimates in the formats of docs/cli.md §5: table, json, csv, megatron, yaml.
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

// `with_breakdown` adds the time and memory breakdown of each estimate.
void WriteRanked(std::ostream& out, Format format, const Inputs& in, const PlanSummary& summary,
                 const std::vector<Ranked>& ranked, bool with_breakdown);

}  // namespace autopar::cli
