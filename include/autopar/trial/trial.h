// One real training step of a parallel configuration, on every rank (docs/trial.md §1–§10).
//
// RunTrial builds the configuration's process groups (Megatron-core rank order tp-up-cp-dp-pp,
// expert-parallel groups of ep consecutive (cp, dp) indices), allocates the real per-rank
// footprint (weights, fp32 gradients, Adam states — sharded over the up·cp·dp replicas, and the
// experts over their up·cp·dp/ep replicas, with the distributed optimizer — and the activations of
// the micro-batches in flight under the pipeline schedule), and runs the step program: embedding
// on the first stage, the stage's transformer layers (norm, QKV with GQA, RoPE, causal attention —
// local, or over a sequence split by Ulysses all-to-alls and a context-parallel ring —, output
// projection, SwiGLU or GeLU MLP or a dropless expert-parallel MoE block, residuals) with
// tensor-parallel all-reduces (or all-gather / reduce-scatter with sequence parallelism), final
// norm, vocab-parallel logits and cross-entropy on the last stage, the full backward with real
// gradient GEMMs, pipeline send/recv under 1F1B or the interleaved schedule, the data-parallel
// gradient all-reduce (or reduce-scatter + parameter all-gather with the distributed optimizer),
// and the Adam step; recompute none / selective / full.
//
// Outcomes are values, never crashes: an allocation past the budget ends the trial as `oom` on
// every rank and frees everything, so the next trial in the same process runs normally.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "autopar/device/group.h"
#include "autopar/device/platform.h"
#include "autopar/space/config.h"
#include "autopar/spec/model.h"
#include "autopar/spec/train.h"

namespace autopar::trial {

inline constexpr int kMaxTimedIterations = 100;

struct TrialOptions {
  int warmup_iterations = 1;  // run and discarded
  int timed_iterations = 3;
  // More timed iterations, up to kMaxTimedIterations in all, until they add up to this many
  // seconds (the slowest rank's wall time): a 30 ms step timed 5 times is mostly scheduler
  // noise, a 10 s one is not. The count is agreed by all ranks after the first timed_iterations.
  double min_timed_s = 0;
  // Micro-batches run per iteration: 0 picks the steady-state minimum (TrialMicrobatches) and
  // extrapolates; -1 runs the job's full count (what numerical checks need).
  int max_microbatches = 0;
  uint64_t seed = 1234;        // weights and data are pure functions of (seed, global index)
  double timeout_s = 600;      // the whole trial, set-up included
  float learning_rate = 1e-3f;
  // Adam's epsilon. Numerical tests raise it so the update is proportional to the gradient (the
  // first Adam step is otherwise lr·sign(g), blind to a wrongly scaled gradient).
  float adam_eps = 1e-8f;
  int stall_rank = -1;         // test hook: this world rank stops working (a stalled worker)
  bool fingerprint = false;    // compute weight fingerprints after the last iteration
  // Test hook: the initial weights moved by this much along the direction the fingerprint's
  // projection weighs them by (fp32 weights), so that central differences of `loss` along it check
  // the gradient each layout's update follows, end to end. 0: none.
  double weight_perturbation = 0;
  // Megatron's --ddp-bucket-size in parameters for the data-parallel overlap; 0 = its default,
  // MegatronDdpBucketSize(dp), which leaves small models one bucket.
  int64_t ddp_bucket_size = 0;
  // Megatron's --hidden-dropout: each block's output (attention, MLP) is dropped elementwise with
  // this probability before its residual add, the masks kept for backward; 0 = none.
  float hidden_dropout = 0;
  // Megatron's --moe-router-force-load-balancing, as its MoE benchmarks run: the router's logits
  // replaced by random draws (src/trial/moe.h, RandomLogits), so every expert gets its share of
  // the tokens however training moves the router. A trial times the step of a job in training,
  // whose router its load-balancing loss keeps near balance; a freshly drawn router updated at
  // this trial's learning rate instead collapses onto a few experts within two steps (docs/
  // trial.md §8). false: the router's own logits (the numerical checks of its gradient).
  bool moe_force_load_balancing = true;
};

// What a trial runs when the stack keeps dropout (StackOptions::dropout, which records whether,
// not how much: the step's time and memory do not depend on p): Megatron-LM's default.
constexpr float kMegatronHiddenDropout = 0.1f;

// How many timed iterations to add after the first options.timed_iterations took timed_s
// seconds (the slowest rank's total), so that all of them last options.min_timed_s at the
// measured pace: 0 once they do, never past kMaxTimedIterations in all.
int ExtraTimedIterations(double timed_s, const TrialOptions& options);

struct TrialMeasurement {
  device::Outcome outcome = device::Outcome::kOk;
  std::string message;                   // the failing rank's error, when not ok
  // What the trial ran differently from the fast path, e.g. attention calls that fell back from
  // cuDNN to the CUDA-core kernel (Device::AttentionEngineNote); empty when nothing did.
  std::string notes;
  double step_time_s = 0;                // median over timed iterations of the max over ranks
  std::vector<double> iteration_times_s; // each timed iteration, extrapolated, max over ranks
  std::vector<double> peak_memory_gib;   // per world rank: the trial's peak device memory
  double tokens_per_s = 0;
  int microbatches_run = 0;
  int microbatches_total = 0;
  double loss = 0;  // mean token loss of the first iteration over the whole global batch
  // The MoE load-balancing loss the first iteration added to the objective (0 for dense models).
  double aux_loss = 0;
  // Sharding-invariant checksums of the updated weights (sum, and a hash-weighted sum), equal for
  // every layout of the same model and seed up to rounding.
  double weight_sum = 0;
  double weight_projection = 0;
  // The data-parallel overlap as it ran in the last iteration on world rank 0 (the first pipeline
  // stage, where Megatron buckets): buckets whose gradient reduction started under the backward
  // pass (0 with overlap_grad_reduce off: one reduction after the flush), and buckets whose
  // parameter all-gather was waited for under the forward pass (0 with overlap_param_gather off).
  int grad_buckets_overlapped = 0;
  int param_buckets_overlapped = 0;
};

// Collective over `world` (every rank calls it with the same arguments); the result is the same
// on every rank. `world` must have exactly config.world_size() ranks. Configurations the runner
// cannot express (multi-head latent attention, replicated kv heads over tp, ...) end as `invalid`
// with the reason.
TrialMeasurement RunTrial(device::Platform& platform, const device::Group& world,
                          const ModelSpec& model, const TrainSpec& train,
                          const ParallelConfig& config, const TrialOptions& options);

}  // namespace autopar::trial
