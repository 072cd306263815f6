#include "src/trial/shard.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>

#include "kernels/init.h"

namespace autopar::trial {
namespace {

using backend::DType;
using backend::OkStatus;
using backend::Outcome;

constexpr float kInitScale = 0.02f;
constexpr int64_t kRoundBlock = int64_t{1} << 20;  // elements RoundToBf16 works on at a time

// Seeds of the global parameter matrices: a pure function of (seed, kind, layer).
enum Kind : uint64_t {
  kQ = 1, kK, kV, kProj, kGate, kUp, kFc2, kWord, kPos, kOutput,
  kRouter, kSharedGate, kSharedUp, kSharedFc2, kExpertGate, kExpertUp, kExpertFc2
};
uint64_t SeedOf(uint64_t seed, Kind kind, int64_t layer) {
  return kernels::ref::SplitMix64(seed ^ (static_cast<uint64_t>(kind) << 40) ^
                                  (static_cast<uint64_t>(layer) * 0x9E3779B97F4A7C15ull));
}

// Initialises elements [begin, begin + target.numel) of the flat parameter vector into `target`
// (the whole weights, or a dp rank's share of the fp32 master copy). Hash-filled pieces are made
// in row blocks of a scratch buffer of the target's dtype, so a share may start mid-row.
Status FillPieces(Device& device, const std::vector<Piece>& pieces, Tensor target, int64_t begin) {
  const int64_t end = begin + target.numel;
  for (const Piece& p : pieces) {
    const int64_t lo = std::max(begin, p.offset), hi = std::min(end, p.offset + p.numel);
    if (lo >= hi) continue;
    const Tensor out = target.Slice(lo - begin, hi - lo);
    if (p.init != Piece::kHash) {
      AUTOPAR_RETURN_IF_ERROR(device.Fill(out, p.init == Piece::kOnes ? 1.0f : 0.0f));
      continue;
    }
    if (lo == p.offset && hi == p.offset + p.numel) {
      AUTOPAR_RETURN_IF_ERROR(device.FillHash(
          out, {p.seed, kInitScale, p.rows, p.cols, p.global_cols, p.row_offset, p.col_offset}));
      continue;
    }
    const int64_t block_rows = std::max<int64_t>(1, (int64_t{1} << 20) / p.cols);
    AUTOPAR_ASSIGN_OR_RETURN(Buffer scratch, device.Allocate(block_rows * p.cols, target.dtype));
    for (int64_t r = (lo - p.offset) / p.cols; r * p.cols < hi - p.offset; r += block_rows) {
      const int64_t rows = std::min(block_rows, p.rows - r);
      const Tensor block = scratch.tensor().Slice(0, rows * p.cols);
      AUTOPAR_RETURN_IF_ERROR(device.FillHash(block, {p.seed, kInitScale, rows, p.cols,
                                                      p.global_cols, p.row_offset + r,
                                                      p.col_offset}));
      const int64_t block_lo = std::max(lo, p.offset + r * p.cols);
      const int64_t block_hi = std::min(hi, p.offset + (r + rows) * p.cols);
      AUTOPAR_RETURN_IF_ERROR(
          device.Copy(target.Slice(block_lo - begin, block_hi - block_lo),
                      block.Slice(block_lo - p.offset - r * p.cols, block_hi - block_lo)));
    }
  }
  return OkStatus();
}

}  // namespace


StatusOr<ModelShard> ModelShard::Create(Device& device, const ModelSpec& m, const Shapes& s,
                                        const ParallelConfig& c, const Coordinates& at,
                                        uint64_t seed, int64_t ddp_bucket_size) {
  ModelShard shard;
  shard.layers_per_chunk_ = s.layers_per_chunk;
  shard.units_ = static_cast<int>(s.vpp * s.layers_per_chunk) + 2;
  int unit = 0;  // of the pieces added next
  int64_t next[2] = {0, 0};
  // A piece reserved in a partition; views are made once the flat buffers exist.
  struct Ref {
    int part = kDense;
    size_t index = SIZE_MAX;
  };
  auto add = [&](int part, Piece p) {
    p.offset = next[part];
    p.unit = unit;
    if (p.numel == 0) p.numel = p.rows * p.cols;
    next[part] += p.numel;
    shard.parts_[part].pieces.push_back(p);
    return Ref{part, shard.parts_[part].pieces.size() - 1};
  };
  auto norm = [&](bool bias) {
    return add(kDense, {.numel = s.hidden, .init = bias ? Piece::kZeros : Piece::kOnes,
                        .tp_replicated = true});
  };
  auto matrix = [&](uint64_t sd, int64_t rows, int64_t cols, int64_t global_cols,
                    int64_t row_offset, int64_t col_offset, int part = kDense) {
    return add(part, {.seed = sd, .init = Piece::kHash, .rows = rows, .cols = cols,
                      .global_cols = global_cols, .row_offset = row_offset,
                      .col_offset = col_offset});
  };
  const bool layernorm = !s.rmsnorm;
  const int64_t h = s.hidden;
  struct LayerIdx {
    Ref n1, n1b, q, proj, n2, n2b, fc1, fc2, router;
    bool moe = false;
    std::vector<std::pair<Ref, Ref>> experts;  // fc1 (gate, up), fc2
  };
  // A column-parallel fc1 ([gate; up] for SwiGLU) and row-parallel fc2 of width `ffn` per rank
  // of a group of `size` (tp, or etp for routed experts) in which this rank is `rank`.
  auto mlp = [&](Kind gate, Kind up, Kind fc2, int64_t key, int64_t ffn, int part, int64_t rank,
                 int64_t size) {
    const Ref fc1 = matrix(SeedOf(seed, gate, key), ffn, h, h, rank * ffn, 0, part);
    if (s.swiglu) {
      const Ref up_rows = matrix(SeedOf(seed, up, key), ffn, h, h, rank * ffn, 0, part);
      shard.parts_[part].pieces[up_rows.index].continues = true;
    }
    return std::pair{fc1, matrix(SeedOf(seed, fc2, key), h, ffn, ffn * size, 0, rank * ffn, part)};
  };
  const bool first_stage = at.pp == 0, last_stage = at.pp == s.pp - 1;
  // Megatron registers the embedding first: its gradient, complete last, goes in the last bucket.
  Ref word, pos, fnorm, fnorm_b, out;
  unit = shard.EmbeddingUnit();
  if (first_stage) {
    word = matrix(SeedOf(seed, kWord, 0), s.vocab_shard, h, h, s.vocab_start, 0);
    shard.parts_[kDense].pieces[word.index].tied = s.tied && s.pp > 1;
    if (s.learned_positions) {
      pos = matrix(SeedOf(seed, kPos, 0), s.max_positions, h, h, 0, 0);
      shard.parts_[kDense].pieces[pos.index].tp_replicated = true;
    }
  }
  std::vector<std::vector<LayerIdx>> layer_idx(s.vpp);
  for (int chunk = 0; chunk < s.vpp; ++chunk) {
    for (int64_t j = 0; j < s.layers_per_chunk; ++j) {
      const int64_t layer = s.GlobalLayer(chunk, j);
      unit = shard.LayerUnit(chunk, j);
      LayerIdx li{};
      li.n1 = norm(false);
      if (layernorm) li.n1b = norm(true);
      li.q = matrix(SeedOf(seed, kQ, layer), s.q_cols, h, h, at.tp * s.q_cols, 0);
      for (const Kind kv : {kK, kV}) {
        const Ref r = matrix(SeedOf(seed, kv, layer), s.kv_cols, h, h, at.tp * s.kv_cols, 0);
        shard.parts_[kDense].pieces[r.index].continues = true;
      }
      li.proj = matrix(SeedOf(seed, kProj, layer), h, s.q_cols, s.q_cols * s.tp, 0,
                       at.tp * s.q_cols);
      li.n2 = norm(false);
      if (layernorm) li.n2b = norm(true);
      li.moe = s.IsMoe(layer);
      if (!li.moe) {
        std::tie(li.fc1, li.fc2) = mlp(kGate, kUp, kFc2, layer, s.ffn, kDense, at.tp, s.tp);
      } else {
        // The router is replicated; every tp rank routes its own rows, so its gradient is a
        // partial sum over tp.
        li.router = matrix(SeedOf(seed, kRouter, layer), s.experts, h, h, 0, 0);
        Piece& router = shard.parts_[kDense].pieces[li.router.index];
        router.tp_replicated = router.tp_partial = true;
        if (s.shared_ffn > 0) {
          std::tie(li.fc1, li.fc2) =
              mlp(kSharedGate, kSharedUp, kSharedFc2, layer, s.shared_ffn, kDense, at.tp, s.tp);
        }
        for (int64_t e = 0; e < s.local_experts; ++e) {
          const int64_t expert = at.ep * s.local_experts + e;  // global expert index
          li.experts.push_back(mlp(kExpertGate, kExpertUp, kExpertFc2, layer * s.experts + expert,
                                   s.expert_ffn, kExperts, at.etp, s.etp));
        }
      }
      layer_idx[chunk].push_back(std::move(li));
    }
  }
  unit = shard.HeadUnit();
  if (last_stage) {
    fnorm = norm(false);
    if (layernorm) fnorm_b = norm(true);
    if (!s.tied) {
      out = matrix(SeedOf(seed, kOutput, 0), s.vocab_shard, h, h, s.vocab_start, 0);
    } else if (!first_stage) {
      out = matrix(SeedOf(seed, kWord, 0), s.vocab_shard, h, h, s.vocab_start, 0);
      shard.parts_[kDense].pieces[out.index].duplicate = true;
      shard.parts_[kDense].pieces[out.index].tied = true;
    }
  }

  // Flat buffers, padded so the distributed optimizer can split them evenly: dense parameters over
  // their up·cp·dp replicas, experts over their tp·up·cp·dp / (etp·ep) replicas.
  const int replicas = c.up * c.cp * c.dp;
  const int k = at.cp + c.cp * at.dp;
  shard.separate_master_ = device.compute_dtype() != DType::kF32;
  shard.parts_[kDense].padded_numel = next[kDense];
  shard.parts_[kExperts].padded_numel = next[kExperts];
  // Megatron buckets only the first pipeline stage, and only with the overlap on
  // (distributed_data_parallel.py): elsewhere one bucket, reduced after the flush or, with the
  // overlap on, as soon as the stage's last backward completes it. The tied embedding's bucket
  // waits for the step (its sum over the first and last stage is not in lock-step with the
  // backward pass).
  const bool bucketed = c.overlap_grad_reduce && at.pp == 0;
  const int64_t bucket_size =
      bucketed ? DdpBucketSize(ddp_bucket_size, c.dp) : 0;
  AUTOPAR_RETURN_IF_ERROR(shard.Allocate(device, shard.parts_[kDense], c.dist_opt ? replicas : 1,
                                         at.up + c.up * k, bucket_size, c.overlap_grad_reduce));
  AUTOPAR_RETURN_IF_ERROR(shard.Allocate(device, shard.parts_[kExperts],
                                         c.dist_opt ? static_cast<int>(c.expert_dp()) : 1, at.edp,
                                         bucket_size, c.overlap_grad_reduce));
  shard.sp_ = c.sp;
  shard.device_ = &device;
  // fp32 training reduces its fp32 gradients whatever the knob says, as Megatron does (the
  // gradient buffer takes the parameters' dtype under --grad-reduce-in-bf16).
  shard.round_grads_ =
      c.grad_reduce_dtype == GradReduceDtype::kBF16 && device.compute_dtype() != DType::kF32;
  if (shard.round_grads_) {
    const int64_t largest = std::max(shard.parts_[kDense].padded_numel,
                                     shard.parts_[kExperts].padded_numel);
    AUTOPAR_ASSIGN_OR_RETURN(
        shard.round_scratch_,
        device.Allocate(2 * std::min<int64_t>(largest, kRoundBlock), DType::kF32));
  }
  shard.defer_gather_ = c.overlap_param_gather && OverlapParamGatherAllowed(c);

  // Views: a parameter spans its consecutive pieces (q, k, v; gate, up).
  auto span = [&](Ref first, size_t count, bool grad) {
    if (first.index == SIZE_MAX) return Tensor{};
    const Partition& part = shard.parts_[first.part];
    int64_t numel = 0;
    for (size_t i = first.index; i < first.index + count; ++i) numel += part.pieces[i].numel;
    return (grad ? part.grads : part.weights).tensor().Slice(part.pieces[first.index].offset,
                                                             numel);
  };
  const size_t fc1_pieces = s.swiglu ? 2 : 1;
  shard.chunks.resize(s.vpp);
  for (int chunk = 0; chunk < s.vpp; ++chunk) {
    shard.chunks[chunk].first_layer = static_cast<int>(s.chunk_first_layer[chunk]);
    for (const LayerIdx& li : layer_idx[chunk]) {
      LayerWeights lw;
      for (const bool grad : {false, true}) {
        (grad ? lw.d_norm1 : lw.norm1) = span(li.n1, 1, grad);
        (grad ? lw.d_norm1_bias : lw.norm1_bias) = span(li.n1b, 1, grad);
        (grad ? lw.d_qkv : lw.qkv) = span(li.q, 3, grad);
        (grad ? lw.d_proj : lw.proj) = span(li.proj, 1, grad);
        (grad ? lw.d_norm2 : lw.norm2) = span(li.n2, 1, grad);
        (grad ? lw.d_norm2_bias : lw.norm2_bias) = span(li.n2b, 1, grad);
        (grad ? lw.d_fc1 : lw.fc1) = span(li.fc1, fc1_pieces, grad);
        (grad ? lw.d_fc2 : lw.fc2) = span(li.fc2, 1, grad);
        (grad ? lw.d_router : lw.router) = span(li.router, 1, grad);
      }
      lw.moe = li.moe;
      for (const auto& [fc1, fc2] : li.experts) {
        lw.experts.push_back({span(fc1, fc1_pieces, false), span(fc2, 1, false),
                              span(fc1, fc1_pieces, true), span(fc2, 1, true)});
      }
      shard.chunks[chunk].layers.push_back(std::move(lw));
    }
  }
  shard.word_embedding = span(word, 1, false);
  shard.d_word_embedding = span(word, 1, true);
  shard.positions = span(pos, 1, false);
  shard.d_positions = span(pos, 1, true);
  shard.final_norm = span(fnorm, 1, false);
  shard.d_final_norm = span(fnorm, 1, true);
  shard.final_norm_bias = span(fnorm_b, 1, false);
  shard.d_final_norm_bias = span(fnorm_b, 1, true);
  if (last_stage && s.tied && first_stage) {
    shard.output = shard.word_embedding;
    shard.d_output = shard.d_word_embedding;
  } else {
    shard.output = span(out, 1, false);
    shard.d_output = span(out, 1, true);
  }
  return shard;
}

Status ModelShard::Allocate(Device& device, Partition& p, int shards, int shard,
                            int64_t bucket_size, bool overlap) {
  if (p.padded_numel == 0) return OkStatus();  // a dense model has no experts
  if (shards == 1) shard = 0;  // every replica updates the whole partition
  p.padded_numel = (p.padded_numel + shards - 1) / shards * shards;
  const int64_t n = p.padded_numel, owned = n / shards;
  // Buckets close between parameters, not inside one (q, k, v are one parameter, as in Megatron).
  std::vector<ParamSpan> spans;
  for (const Piece& piece : p.pieces) {
    if (piece.continues && !spans.empty()) {
      spans.back().numel += piece.numel;
    } else {
      spans.push_back({piece.offset, piece.numel, piece.unit});
    }
  }
  std::vector<GradBucket> buckets = PlanGradBuckets(spans, n, bucket_size, shards);
  std::vector<bool> held(buckets.size(), false);
  for (size_t b = 0; b < buckets.size(); ++b) {
    for (const Piece& piece : p.pieces) {
      // Pieces are marked tied only when the tied embedding is summed over stages (pp > 1).
      held[b] = held[b] || (piece.tied && piece.offset < buckets[b].end &&
                            piece.offset + piece.numel > buckets[b].begin);
    }
  }
  p.sync = GradBuckets(std::move(buckets), units_, shards, shard, overlap, std::move(held));
  p.tp_summed.assign(p.pieces.size(), false);
  AUTOPAR_ASSIGN_OR_RETURN(p.weights, device.Allocate(n, device.compute_dtype()));
  AUTOPAR_ASSIGN_OR_RETURN(p.grads, device.Allocate(n, DType::kF32));
  if (separate_master_) {
    AUTOPAR_ASSIGN_OR_RETURN(p.master, device.Allocate(owned, DType::kF32));
  }
  AUTOPAR_ASSIGN_OR_RETURN(p.exp_avg, device.Allocate(owned, DType::kF32));
  AUTOPAR_ASSIGN_OR_RETURN(p.exp_avg_sq, device.Allocate(owned, DType::kF32));
  const Tensor w = p.weights.tensor();
  AUTOPAR_RETURN_IF_ERROR(device.Fill(w, 0.0f));
  AUTOPAR_RETURN_IF_ERROR(device.Fill(p.grads.tensor(), 0.0f));
  AUTOPAR_RETURN_IF_ERROR(device.Fill(p.exp_avg.tensor(), 0.0f));
  AUTOPAR_RETURN_IF_ERROR(device.Fill(p.exp_avg_sq.tensor(), 0.0f));
  AUTOPAR_RETURN_IF_ERROR(FillPieces(device, p.pieces, w, 0));
  if (separate_master_) {
    // 16-bit compute keeps an fp32 master copy of this rank's share, from the same pure function.
    for (const OwnedRange& r : p.sync.owned()) {
      AUTOPAR_RETURN_IF_ERROR(
          FillPieces(device, p.pieces, p.master.tensor().Slice(r.state_offset, r.numel), r.offset));
    }
  }
  return OkStatus();
}

Status ModelShard::BeginStep(Device& device, int microbatches) {
  for (Partition& p : parts_) {
    p.sync.BeginStep(microbatches);
    if (p.padded_numel > 0) AUTOPAR_RETURN_IF_ERROR(device.Fill(p.grads.tensor(), 0.0f));
  }
  return OkStatus();
}

// Before a bucket's data-parallel reduction, in the order the knob-off step has always used:
// replicated parameters whose tp ranks saw different rows (all of them under SP, the router
// always) sum their gradients over tp, then the first and last stage sum the tied embedding's.
// Each piece once per step, however the buckets cut it.
GradBuckets::Prepare ModelShard::PrepareOf(Partition& p, ProcessGroups& g) {
  return [this, &p, &g](const GradBucket& bucket) -> Status {
    const Tensor grads = p.grads.tensor();
    bool tied = false;
    for (size_t i = 0; i < p.pieces.size(); ++i) {
      const Piece& piece = p.pieces[i];
      if (piece.offset >= bucket.end || piece.offset + piece.numel <= bucket.begin) continue;
      tied = tied || piece.tied;
      if (p.tp_summed[i] || !(piece.tp_partial || (sp_ && piece.tp_replicated))) continue;
      AUTOPAR_RETURN_IF_ERROR(g.tp.AllReduce(grads.Slice(piece.offset, piece.numel)));
      p.tp_summed[i] = true;
    }
    if (tied && !embedding_summed_ && g.embedding.active()) {
      AUTOPAR_RETURN_IF_ERROR(g.embedding.AllReduce(g.at.pp == 0 ? d_word_embedding : d_output));
      embedding_summed_ = true;
    }
    if (round_grads_) return RoundToBf16(grads.Slice(bucket.begin, bucket.numel()));
    return OkStatus();
  };
}

// Rounds fp32 values to bf16's 8 significant bits in place, with the device's own arithmetic:
// Veltkamp's split c = x·(2¹⁶ + 1), hi = c − (c − x) keeps the upper 8 of fp32's 24 bits
// (round to nearest). Gradients are far from overflowing the product.
Status ModelShard::RoundToBf16(Tensor x) {
  const Tensor scratch = round_scratch_.tensor();
  const int64_t block = scratch.numel / 2;
  for (int64_t begin = 0; begin < x.numel; begin += block) {
    const int64_t n = std::min(block, x.numel - begin);
    const Tensor v = x.Slice(begin, n), c = scratch.Slice(0, n), d = scratch.Slice(block, n);
    AUTOPAR_RETURN_IF_ERROR(device_->Copy(c, v));
    AUTOPAR_RETURN_IF_ERROR(device_->Scale(c, 65537.0f));
    AUTOPAR_RETURN_IF_ERROR(device_->Copy(d, c));
    AUTOPAR_RETURN_IF_ERROR(device_->Axpy(-1.0f, v, d));  // c − x
    AUTOPAR_RETURN_IF_ERROR(device_->Axpy(-1.0f, d, c));  // c − (c − x)
    AUTOPAR_RETURN_IF_ERROR(device_->Copy(v, c));
  }
  return OkStatus();
}

Status ModelShard::GradsReady(ProcessGroups& g, int unit) {
  for (int part : {kDense, kExperts}) {
    Partition& p = parts_[part];
    if (p.padded_numel == 0 || !p.sync.overlapping()) continue;  // no Prepare built per layer
    AUTOPAR_RETURN_IF_ERROR(
        p.sync.Ready(unit, GroupOf(part, g), p.grads.tensor(), PrepareOf(p, g)));
  }
  return OkStatus();
}

Status ModelShard::AwaitParams(ProcessGroups& g, int unit) {
  if (!defer_gather_) return OkStatus();
  for (int part : {kDense, kExperts}) {
    Partition& p = parts_[part];
    if (p.padded_numel == 0) continue;
    AUTOPAR_RETURN_IF_ERROR(p.sync.AwaitParams(unit, GroupOf(part, g), p.weights.tensor()));
  }
  return OkStatus();
}

int ModelShard::grad_buckets_overlapped() const {
  return parts_[kDense].sync.reduced_early() + parts_[kExperts].sync.reduced_early();
}

int ModelShard::param_buckets_overlapped() const {
  return parts_[kDense].sync.gathered_late() + parts_[kExperts].sync.gathered_late();
}

Status ModelShard::Step(Device& device, ProcessGroups& g, float lr, float eps, int64_t step) {
  backend::AdamParams adam;
  adam.lr = lr;
  adam.eps = eps;
  adam.step = step;
  for (int part : {kDense, kExperts}) {
    Partition& p = parts_[part];
    AUTOPAR_RETURN_IF_ERROR(StepPartition(device, p, GroupOf(part, g), adam, PrepareOf(p, g)));
    std::fill(p.tp_summed.begin(), p.tp_summed.end(), false);
  }
  embedding_summed_ = false;
  return OkStatus();
}

// With 16-bit weights Adam updates the fp32 master copy and writes the weights from it. With the
// distributed optimizer each replica updates its 1/shards of every bucket and gathers the rest
// back, all in place in the flat buffers (Megatron-core's layout).
Status ModelShard::StepPartition(Device& device, Partition& p, Comm& group,
                                 const backend::AdamParams& adam,
                                 const GradBuckets::Prepare& prepare) {
  if (p.padded_numel == 0) return OkStatus();
  const Tensor weights = p.weights.tensor(), grads = p.grads.tensor();
  AUTOPAR_RETURN_IF_ERROR(p.sync.FinishReduce(group, grads, prepare));
  if (round_grads_) {  // the reduced gradient, as a bf16 reduction leaves it
    for (const OwnedRange& r : p.sync.owned()) {
      AUTOPAR_RETURN_IF_ERROR(RoundToBf16(grads.Slice(r.offset, r.numel)));
    }
  }
  for (const OwnedRange& r : p.sync.owned()) {
    const Tensor mine = weights.Slice(r.offset, r.numel);
    const Tensor my_grads = grads.Slice(r.offset, r.numel);
    const Tensor exp_avg = p.exp_avg.tensor().Slice(r.state_offset, r.numel);
    const Tensor exp_avg_sq = p.exp_avg_sq.tensor().Slice(r.state_offset, r.numel);
    if (separate_master_) {
      AUTOPAR_RETURN_IF_ERROR(device.AdamStep(
          adam, p.master.tensor().Slice(r.state_offset, r.numel), my_grads, exp_avg, exp_avg_sq,
          mine));
    } else {
      AUTOPAR_RETURN_IF_ERROR(device.AdamStep(adam, mine, my_grads, exp_avg, exp_avg_sq, {}));
    }
  }
  if (defer_gather_) {
    p.sync.DeferGather();
    return OkStatus();
  }
  return p.sync.GatherNow(group, weights);
}

StatusOr<std::pair<double, double>> ModelShard::Fingerprint(Device& device, ProcessGroups& g,
                                                            uint64_t seed) {
  const Coordinates& at = g.at;
  for (int part : {kDense, kExperts}) {
    Partition& p = parts_[part];
    if (p.padded_numel == 0) continue;
    AUTOPAR_RETURN_IF_ERROR(p.sync.FinishGather(GroupOf(part, g), p.weights.tensor()));
  }
  double sum = 0, projection = 0;
  for (int part : {kDense, kExperts}) {
    const Partition& p = parts_[part];
    // Every replica holds the same weights: count the first one (dense: up = cp = dp = 0;
    // experts: expert-data-parallel rank 0).
    const bool owner = part == kDense ? at.up == 0 && at.cp == 0 && at.dp == 0 : at.edp == 0;
    if (p.padded_numel == 0 || !owner) continue;
    // The weights on the host as floats: bf16 is the upper half of an fp32.
    const Tensor w = p.weights.tensor();
    std::vector<float> host(static_cast<size_t>(w.numel));
    if (w.dtype == DType::kF32) {
      AUTOPAR_RETURN_IF_ERROR(device.CopyToHost(host.data(), w, w.bytes()));
    } else if (w.dtype == DType::kBF16) {
      std::vector<uint16_t> raw(host.size());
      AUTOPAR_RETURN_IF_ERROR(device.CopyToHost(raw.data(), w, w.bytes()));
      for (size_t i = 0; i < raw.size(); ++i) {
        const uint32_t bits = static_cast<uint32_t>(raw[i]) << 16;
        std::memcpy(&host[i], &bits, sizeof bits);
      }
    } else {
      return Status(Outcome::kInvalid, "fingerprint: weights must be f32 or bf16");
    }
    for (const Piece& piece : p.pieces) {
      if (piece.duplicate || (piece.tp_replicated && at.tp != 0)) continue;
      // Replicated norms have no matrix geometry: index them by position alone.
      const int64_t cols = piece.cols > 0 ? piece.cols : piece.numel;
      const int64_t global_cols = piece.global_cols > 0 ? piece.global_cols : piece.numel;
      const uint64_t key = kernels::ref::SplitMix64(seed ^ piece.seed ^ 0xF1F1F1F1ull);
      for (int64_t i = 0; i < piece.numel; ++i) {
        const int64_t r = i / cols, col = i % cols;
        const uint64_t index = static_cast<uint64_t>((piece.row_offset + r) * global_cols +
                                                     piece.col_offset + col);
        const double v = host[piece.offset + i];
        sum += v;
        projection += v * kernels::ref::HashUniform(key, index);
      }
    }
  }
  return std::pair{sum, projection};
}

}  // namespace autopar::trial
