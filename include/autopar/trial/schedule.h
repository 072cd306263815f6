// Pipeline schedules and the trial's timing rules: pure functions, unit-tested alone.
#pragma once

#include <cstdint>
#include <map>
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

// The activation slots a rank needs under `ops`, by the transformer layers a slot holds: for
// each size among its chunks (chunk_layers[chunk]), the most micro-batches of chunks of that
// size alive at once. A counted split (split_embedding, split_loss) makes the very first or
// last chunk a layer short, or of none; its micro-batches keep that much, as in Megatron-LM.
std::map<int64_t, int> SlotsBySize(const std::vector<PipelineOp>& ops,
                                   const std::vector<int64_t>& chunk_layers);

// Where a chunk's activations come from and go to. Virtual stage v = chunk·pp + rank; stage
// v − 1 feeds v. A peer of -1 means the embedding (first stage) or the loss (last stage).
struct StageLinks {
  int prev_rank = -1, prev_chunk = -1;
  int next_rank = -1, next_chunk = -1;
};
StageLinks LinksOf(int pp, int vpp, int rank, int chunk);

// One point-to-point transfer of a pipeline rank: a micro-batch's activations (forward) or their
// gradient (backward) between virtual stage `stage` and its neighbour on pipeline rank `peer`.
struct PipelineTransfer {
  enum Kind : uint8_t { kSend, kRecv };
  Kind kind;
  int32_t peer;        // pipeline rank
  int32_t microbatch;
  int32_t stage;       // the receiving virtual stage (chunk·pp + rank of the receiver)
  bool backward;
  friend bool operator==(const PipelineTransfer&, const PipelineTransfer&) = default;
};

// The transfers of pipeline rank `rank` around its `ops` (PipelineSchedule), in the groups that
// run as one batched send/recv each, as Megatron-core's p2p_communication does
// (send_forward_recv_backward, send_backward_recv_forward, ... over batch_isend_irecv):
// exchanges[k] runs after ops[k − 1] and before ops[k], and holds the send of ops[k − 1]'s output
// and the receive of ops[k]'s input (each where it has a peer); exchanges[ops.size()] sends the
// last op's output. A rank waits for a group before running the op that needs it.
//
// NCCL has no tags and no buffering: the k-th send from rank a to b meets the k-th receive on b
// from a, and a send completes only when that receive runs. These groups keep both properties
// safe: on every rank the transfers of a peer pair come in the same order on both sides, and the
// groups never wait on each other in a cycle (tests/unit/trial_schedule_test.cc simulates every
// pp ≤ 8, vpp ≤ 4 and micro-batch count under those rules).
std::vector<std::vector<PipelineTransfer>> PipelineExchanges(int pp, int vpp, int rank,
                                                             const std::vector<PipelineOp>& ops);

// Micro-batches a trial runs: enough to reach the schedule's steady state (2·pp, and a multiple
// of pp for the interleaved schedule), never more than the job has, at most `cap` when cap > 0.
int TrialMicrobatches(int pp, int vpp, int job_microbatches, int cap);

// Extrapolates a step timed with `ran` micro-batches to the job's `total`: the pipelined part
// scales with the schedule's slots, m + (pp − 1)/vpp (docs/models.md §4.4); the gradient sync and optimizer
// step (`tail_s`) happen once per step whatever m is.
double ExtrapolateStepTime(double pipeline_s, double tail_s, int pp, int vpp, int ran, int total);

// The median of per-iteration maxima over ranks: `times[i][r]` is iteration i on rank r.
double MedianOfMax(const std::vector<std::vector<double>>& times);

}  // namespace autopar::trial
