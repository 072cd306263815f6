// Data-parallel gradient buckets as Megatron-core forms and launches them, and the runtime that
// overlaps their collectives with the backward pass (gradient reduction) and with the next
// forward pass (the distributed optimizer's parameter all-gather).
//
// Megatron-core (megatron/core/distributed/, the version cited in src/space/config.h):
//  - param_and_grad_buffer.py lays the parameters of a buffer out in reverse order and closes a
//    bucket once it holds at least bucket_size elements (MegatronDdpBucketSize(dp) unless
//    --ddp-bucket-size); with --overlap-grad-reduce off, or on a pipeline stage after the first,
//    there is one bucket. The distributed optimizer pads every bucket to a multiple of the
//    data-parallel size and each rank owns its 1/dp of every bucket.
//  - A bucket's collective (reduce-scatter with the distributed optimizer, else all-reduce) is
//    started by register_grad_ready() once every parameter in it has its gradient during the
//    last micro-batch's backward; finish_grad_sync() waits for all before the optimizer step.
//  - With --overlap-param-gather the optimizer step does not gather: the forward pre-hook of the
//    first module to use a bucket's parameters dispatches its all-gather if needed, waits for it,
//    and dispatches the next bucket's (finish_param_sync), so the gathers run under the forward.
//
// Here a buffer is one of ModelShard's flat partitions. Readiness is tracked per unit (a layer,
// the embedding, the head: what one call of the step program completes) rather than per
// parameter. The flat layout stays that of the knob-off trial: a bucket's lower boundary is
// rounded down to a multiple of the shards instead of padding the bucket, so a bucket may take
// the tail of the parameter before it (and then waits for that parameter's unit too).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "src/trial/comm.h"

namespace autopar::trial {

// A contiguous run of a flat buffer whose gradient one unit completes.
struct ParamSpan {
  int64_t offset = 0, numel = 0;
  int unit = 0;
};

// Elements [begin, end) of the flat buffer, and the units whose gradients are in them (sorted).
struct GradBucket {
  int64_t begin = 0, end = 0;
  std::vector<int> units;
  int64_t numel() const { return end - begin; }
};

// Megatron's buckets over `params` (in layout order, together covering [0, padded_numel)):
// walking from the end, a bucket closes at the first parameter that brings it to at least
// `bucket_size` elements, its lower boundary rounded down to a multiple of `shards`. Bucket 0
// holds the last parameters, whose gradients the backward pass completes first. padded_numel
// must be a multiple of shards; bucket_size <= 0 means one bucket.
std::vector<GradBucket> PlanGradBuckets(std::span<const ParamSpan> params, int64_t padded_numel,
                                        int64_t bucket_size, int shards);

// A range of the flat buffer this rank's optimizer updates, and where its Adam state starts.
struct OwnedRange {
  int64_t offset = 0, numel = 0, state_offset = 0;
};

// Rank `shard`'s 1/shards of every bucket, in bucket order (the whole buffer when shards == 1).
std::vector<OwnedRange> OwnedRanges(const std::vector<GradBucket>& buckets, int shards, int shard);

// The collectives of one flat partition over its data-parallel group, one step at a time:
// BeginStep, then Ready per unit and micro-batch, FinishReduce before the optimizer (which ends
// the step's reduction state), then
// GatherNow or DeferGather; with a deferred gather AwaitParams before each unit's first forward
// of the next step (or FinishGather). Every rank of the group calls the same sequence, so the
// collectives start in the same order everywhere.
class GradBuckets {
 public:
  // Reductions that must precede a bucket's data-parallel one (the tensor-parallel sum of
  // replicated parameters' gradients, the tied embedding's), so that every element is summed in
  // the same order whatever the knobs.
  using Prepare = std::function<Status(const GradBucket&)>;

  GradBuckets() = default;
  // `overlap`: start a bucket's reduction as soon as its gradients are complete (else all in
  // FinishReduce). `held`: buckets kept for FinishReduce anyway (their Prepare needs a group
  // that is not in lock-step during the backward pass). `units`: how many unit ids there are.
  GradBuckets(std::vector<GradBucket> buckets, int units, int shards, int shard, bool overlap,
              std::vector<bool> held);
  GradBuckets(GradBuckets&&) = default;
  GradBuckets& operator=(GradBuckets&&) = default;
  // Completes what is still in flight (the last step's deferred gathers) by the group's deadline;
  // after a failure elsewhere (a peer that never starts its side) it gives up at the deadline
  // instead of blocking. The group must outlive this.
  ~GradBuckets();

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  const std::vector<OwnedRange>& owned() const { return owned_; }

  // A step of `microbatches` micro-batches (the count Ready waits for per unit).
  void BeginStep(int microbatches);
  // One micro-batch's gradient of `unit` is complete. On its last micro-batch, starts (after
  // `prepare`) the reduction of every bucket whose units are all complete, in bucket order.
  // Whether Ready may start a reduction this step (overlap on and BeginStep called).
  bool overlapping() const { return overlap_ && microbatches_ > 0; }
  Status Ready(int unit, Comm& group, Tensor grads, const Prepare& prepare);
  // Starts the reductions not started yet and waits for all of them.
  Status FinishReduce(Comm& group, Tensor grads, const Prepare& prepare);

  // The distributed optimizer's all-gather of every bucket, waited for.
  Status GatherNow(Comm& group, Tensor weights);
  // Leaves the gather to AwaitParams: the next step's forward.
  void DeferGather();
  // Before `unit`'s parameters are used: gathers, in forward order (the last bucket first),
  // every bucket up to the ones holding `unit`, dispatching the next bucket's gather when one
  // completes. A no-op once nothing is pending.
  Status AwaitParams(int unit, Comm& group, Tensor weights);
  Status FinishGather(Comm& group, Tensor weights);

  // Since the last BeginStep: buckets whose reduction started in Ready (under the backward
  // pass), and buckets gathered in AwaitParams (under the forward pass).
  int reduced_early() const { return reduced_early_; }
  int gathered_late() const { return gathered_late_; }

 private:
  Status StartReduce(size_t b, Comm& group, Tensor grads, const Prepare& prepare);
  Status StartGather(size_t b, Comm& group, Tensor weights);
  // Starts bucket b's pending gather if it has not started, waits for it, and clears it.
  Status CompleteGather(size_t b, Comm& group, Tensor weights);

  std::vector<GradBucket> buckets_;
  std::vector<OwnedRange> owned_;
  std::vector<std::vector<int>> buckets_of_unit_;
  std::vector<bool> held_;
  Comm* group_ = nullptr;  // the group the collectives run on, once one has started
  int shards_ = 1;
  bool overlap_ = false;
  int microbatches_ = 0;           // 0 until BeginStep: Ready starts nothing
  std::vector<int> ready_counts_;  // per unit, this step
  std::vector<std::unique_ptr<device::Request>> reduce_;
  std::vector<bool> reduce_started_;
  // Gathers in flight, and the buckets whose gather is deferred and not yet complete.
  std::vector<std::unique_ptr<device::Request>> gather_;
  std::vector<bool> gather_pending_;
  int reduced_early_ = 0, gathered_late_ = 0;
};

}  // namespace autopar::trial
