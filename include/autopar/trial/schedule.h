// Pipeline schedules and the trial's timing rules: pure functions, unit-tested alone.
#pragma once

#include <cstdint>
#include <vector>

namespace autopar::trial {

struct PipelineOp {
  enum Kind : uint8_t { kForward, kBackward };
  Kind kind;
  int32_t microbatch;
  int32_t chunk;  // model chunk (virtual stage index on this rank), 0 .. vpp − 1
  friend bool operator==(const PipelineOp&, const PipelineOp&) = default;
};

// The order in which pipeline rank `rank` of `pp` runs forward and backward passes of
// `microbatches` micro-batches through its `vpp` model chunks: Megatron-LM's 1F1B
// (`forward_backward_pipelining_without_interleaving`) for vpp = 1 and its interleaved 1F1B
// (`..._with_interleaving`, micro-batches in groups of pp) otherwise.
std::vector<PipelineOp> PipelineSchedule(int pp, int vpp, int rank, int microbatches);

// Largest number of micro-batch chunks whose activations are alive at once under `ops`.
int MaxInFlight(const std::vector<PipelineOp>& ops);

// Where a chunk's activations come from and go to. Virtual stage v = chunk·pp + rank; stage
// v − 1 feeds v. A peer of -1 means the embedding (first stage) or the loss (last stage).
struct StageLinks {
  int prev_rank = -1, prev_chunk = -1;
  int next_rank = -1, next_chunk = -1;
};
StageLinks LinksOf(int pp, int vpp, int rank, int chunk);

// Micro-batches a trial runs: enough to reach the schedule's steady state (2·pp, and a multiple
// of pp for the interleaved schedule), never more than the job has, at most `cap` when cap > 0.
int TrialMicrobatches(int pp, int vpp, int job_microbatches, int cap);

// Extrapolates a step timed with `ran` micro-batches to the job's `total`: the pipelined part
// scales with the schedule's slots, m + (pp − 1)/vpp (DESIGN §4); the gradient sync and optimizer
// step (`tail_s`) happen once per step whatever m is.
double ExtrapolateStepTime(double pipeline_s, double tail_s, int pp, int vpp, int ran, int total);

// The median of per-iteration maxima over ranks: `times[i][r]` is iteration i on rank r.
double MedianOfMax(const std::vector<std::vector<double>>& times);

}  // namespace autopar::trial
