#include "src/trial/grad_buckets.h"

#include <algorithm>
#include <set>

namespace autopar::trial {

using device::OkStatus;

std::vector<GradBucket> PlanGradBuckets(std::span<const ParamSpan> params, int64_t padded_numel,
                                        int64_t bucket_size, int shards) {
  // The boundaries first, walking the parameters backwards as Megatron does; then each bucket's
  // units are those of the parameters it overlaps.
  std::vector<std::pair<int64_t, int64_t>> ranges;  // [begin, end)
  int64_t end = padded_numel;
  for (size_t i = params.size(); i-- > 0;) {
    const int64_t begin = params[i].offset / shards * shards;
    if (i > 0 && bucket_size > 0 && end - params[i].offset >= bucket_size && begin > 0 &&
        begin < end) {
      ranges.emplace_back(begin, end);
      end = begin;
    }
  }
  if (end > 0 || ranges.empty()) ranges.emplace_back(0, end);
  std::vector<GradBucket> buckets;
  for (const auto& [begin, stop] : ranges) {
    GradBucket b{begin, stop, {}};
    std::set<int> units;
    for (const ParamSpan& p : params) {
      if (p.numel > 0 && p.offset < stop && p.offset + p.numel > begin) units.insert(p.unit);
    }
    b.units.assign(units.begin(), units.end());
    buckets.push_back(std::move(b));
  }
  return buckets;
}

std::vector<OwnedRange> OwnedRanges(const std::vector<GradBucket>& buckets, int shards, int shard) {
  std::vector<OwnedRange> owned;
  int64_t state = 0;
  for (const GradBucket& b : buckets) {
    const int64_t n = b.numel() / shards;
    owned.push_back({b.begin + shard * n, n, state});
    state += n;
  }
  return owned;
}

GradBuckets::GradBuckets(std::vector<GradBucket> buckets, int units, int shards, int shard,
                         bool overlap, std::vector<bool> held)
    : buckets_(std::move(buckets)),
      owned_(OwnedRanges(buckets_, shards, shard)),
      buckets_of_unit_(static_cast<size_t>(units)),
      held_(std::move(held)),
      shards_(shards),
      overlap_(overlap),
      ready_counts_(static_cast<size_t>(units), 0),
      reduce_(buckets_.size()),
      reduce_started_(buckets_.size(), false),
      gather_(buckets_.size()),
      gather_pending_(buckets_.size(), false) {
  held_.resize(buckets_.size(), false);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (int u : buckets_[b].units) buckets_of_unit_[static_cast<size_t>(u)].push_back(int(b));
  }
}

GradBuckets::~GradBuckets() {
  if (group_ == nullptr) return;
  for (auto& request : reduce_) (void)group_->Wait(request);
  for (auto& request : gather_) (void)group_->Wait(request);
}

void GradBuckets::BeginStep(int microbatches) {
  microbatches_ = microbatches;
  std::fill(ready_counts_.begin(), ready_counts_.end(), 0);
  reduced_early_ = 0;
  gathered_late_ = 0;
}

Status GradBuckets::StartReduce(size_t b, Comm& group, Tensor grads, const Prepare& prepare) {
  const GradBucket& bucket = buckets_[b];
  reduce_started_[b] = true;
  if (prepare) AUTOPAR_RETURN_IF_ERROR(prepare(bucket));
  if (!group.active()) return OkStatus();
  group_ = &group;
  const Tensor all = grads.Slice(bucket.begin, bucket.numel());
  if (shards_ == 1) return group.StartAllReduce(all, reduce_[b]);
  return group.StartReduceScatter(all, grads.Slice(owned_[b].offset, owned_[b].numel), reduce_[b]);
}

Status GradBuckets::Ready(int unit, Comm& group, Tensor grads, const Prepare& prepare) {
  if (!overlapping()) return OkStatus();
  if (++ready_counts_[static_cast<size_t>(unit)] != microbatches_) return OkStatus();
  // Megatron's register_grad_ready(): a bucket goes once every gradient in it is final.
  for (int b : buckets_of_unit_[static_cast<size_t>(unit)]) {
    if (reduce_started_[b] || held_[b]) continue;
    const bool complete =
        std::all_of(buckets_[b].units.begin(), buckets_[b].units.end(),
                    [&](int u) { return ready_counts_[static_cast<size_t>(u)] == microbatches_; });
    if (!complete) continue;
    AUTOPAR_RETURN_IF_ERROR(StartReduce(static_cast<size_t>(b), group, grads, prepare));
    ++reduced_early_;
  }
  return OkStatus();
}

Status GradBuckets::FinishReduce(Comm& group, Tensor grads, const Prepare& prepare) {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!reduce_started_[b]) AUTOPAR_RETURN_IF_ERROR(StartReduce(b, group, grads, prepare));
  }
  for (auto& request : reduce_) AUTOPAR_RETURN_IF_ERROR(group.Wait(request));
  std::fill(reduce_started_.begin(), reduce_started_.end(), false);
  return OkStatus();
}

Status GradBuckets::StartGather(size_t b, Comm& group, Tensor weights) {
  const GradBucket& bucket = buckets_[b];
  group_ = &group;
  return group.StartAllGather(weights.Slice(owned_[b].offset, owned_[b].numel),
                              weights.Slice(bucket.begin, bucket.numel()), gather_[b]);
}

Status GradBuckets::GatherNow(Comm& group, Tensor weights) {
  if (shards_ == 1) return OkStatus();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    AUTOPAR_RETURN_IF_ERROR(StartGather(b, group, weights));
  }
  for (auto& request : gather_) AUTOPAR_RETURN_IF_ERROR(group.Wait(request));
  return OkStatus();
}

void GradBuckets::DeferGather() {
  if (shards_ > 1) std::fill(gather_pending_.begin(), gather_pending_.end(), true);
}

Status GradBuckets::AwaitParams(int unit, Comm& group, Tensor weights) {
  const std::vector<int>& mine = buckets_of_unit_[static_cast<size_t>(unit)];
  auto pending = [&] {
    return std::any_of(mine.begin(), mine.end(), [&](int b) { return gather_pending_[b]; });
  };
  // Forward order is the reverse of the bucket order: the first layers are in the last bucket.
  while (pending()) {
    size_t b = buckets_.size();
    while (!gather_pending_[b - 1]) --b;
    --b;
    AUTOPAR_RETURN_IF_ERROR(CompleteGather(b, group, weights));
    ++gathered_late_;
    // finish_param_sync(): the next bucket's gather goes while this bucket's layers run.
    if (b > 0 && gather_pending_[b - 1] && !gather_[b - 1]) {
      AUTOPAR_RETURN_IF_ERROR(StartGather(b - 1, group, weights));
    }
  }
  return OkStatus();
}

Status GradBuckets::FinishGather(Comm& group, Tensor weights) {
  for (size_t b = buckets_.size(); b-- > 0;) {
    if (gather_pending_[b]) AUTOPAR_RETURN_IF_ERROR(CompleteGather(b, group, weights));
  }
  return OkStatus();
}

Status GradBuckets::CompleteGather(size_t b, Comm& group, Tensor weights) {
  if (!gather_[b]) AUTOPAR_RETURN_IF_ERROR(StartGather(b, group, weights));
  AUTOPAR_RETURN_IF_ERROR(group.Wait(gather_[b]));
  gather_pending_[b] = false;
  return OkStatus();
}

}  // namespace autopar::trial
