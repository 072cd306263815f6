#include "src/trial/shard.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>

#include "kernels/init.h"

namespace autopar::trial {
namespace {

using device::DType;
using device::OkStatus;
using device::Outcome;

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

// Lays out a rank's parameters as pieces of the shard's two partitions, in Megatron's
// registration order (embedding, layers, final norm, output layer), and makes the parameters'
// views once the flat buffers exist. A parameter spans its consecutive pieces (q, k, v; gate, up).
class ModelShard::Layout {
 public:
  Layout(ModelShard& shard, const Shapes& s, const Coordinates& at, uint64_t seed)
      : shard_(shard), s_(s), at_(at), seed_(seed) {}

  // Megatron registers the embedding first: its gradient, complete last, goes in the last bucket.
  void AddEmbedding();
  void AddLayers();
  void AddHead();
  int64_t numel(int part) const { return next_[part]; }
  // The views of every parameter and gradient in the shard's allocated partitions.
  void MakeViews();

 private:
  // A piece reserved in a partition.
  struct Ref {
    int part = kDense;
    size_t index = SIZE_MAX;
  };
  struct LayerRefs {
    Ref n1, n1b, q, proj, qn, qnb, kn, knb, n2, n2b, fc1, fc2, router;
    bool moe = false;
    std::vector<std::pair<Ref, Ref>> experts;  // fc1 (gate, up), fc2
  };

  Ref Add(int part, Piece p);
  // A norm's weight (or bias) of `width` elements (0: hidden), replicated over tp.
  Ref Norm(bool bias, int64_t width = 0);
  Ref Matrix(uint64_t seed, int64_t rows, int64_t cols, int64_t global_cols, int64_t row_offset,
             int64_t col_offset, int part = kDense);
  std::pair<Ref, Ref> Mlp(Kind gate, Kind up, Kind fc2, int64_t key, int64_t ffn, int part,
                          int64_t rank, int64_t size);
  LayerRefs AddLayer(int64_t layer);
  void AddMoe(int64_t layer, LayerRefs& li);
  Piece& PieceOf(Ref r) { return shard_.parts_[r.part].pieces[r.index]; }
  // The view of the parameter (or its gradient) made of `count` pieces from `first`.
  Tensor View(Ref first, size_t count, bool grad) const;
  LayerWeights LayerViews(const LayerRefs& li) const;

  ModelShard& shard_;
  const Shapes& s_;
  const Coordinates& at_;
  const uint64_t seed_;
  int unit_ = 0;  // of the pieces added next
  int64_t next_[2] = {0, 0};
  Ref word_, pos_, fnorm_, fnorm_b_, out_;
  std::vector<std::vector<LayerRefs>> layers_;  // [chunk][layer in chunk]
};

ModelShard::Layout::Ref ModelShard::Layout::Add(int part, Piece p) {
  p.offset = next_[part];
  p.unit = unit_;
  if (p.numel == 0) p.numel = p.rows * p.cols;
  next_[part] += p.numel;
  shard_.parts_[part].pieces.push_back(p);
  return Ref{part, shard_.parts_[part].pieces.size() - 1};
}

ModelShard::Layout::Ref ModelShard::Layout::Norm(bool bias, int64_t width) {
  return Add(kDense, {.numel = width > 0 ? width : s_.hidden,
                      .init = bias ? Piece::kZeros : Piece::kOnes,
                      .tp_replicated = true});
}

ModelShard::Layout::Ref ModelShard::Layout::Matrix(uint64_t seed, int64_t rows, int64_t cols,
                                                   int64_t global_cols, int64_t row_offset,
                                                   int64_t col_offset, int part) {
  return Add(part, {.seed = seed,
                    .init = Piece::kHash,
                    .rows = rows,
                    .cols = cols,
                    .global_cols = global_cols,
                    .row_offset = row_offset,
                    .col_offset = col_offset});
}

// A column-parallel fc1 ([gate; up] for SwiGLU) and row-parallel fc2 of width `ffn` per rank
// of a group of `size` (tp, or etp for routed experts) in which this rank is `rank`.
std::pair<ModelShard::Layout::Ref, ModelShard::Layout::Ref> ModelShard::Layout::Mlp(
    Kind gate, Kind up, Kind fc2, int64_t key, int64_t ffn, int part, int64_t rank, int64_t size) {
  const int64_t h = s_.hidden;
  const Ref fc1 = Matrix(SeedOf(seed_, gate, key), ffn, h, h, rank * ffn, 0, part);
  if (s_.swiglu) {
    const Ref up_rows = Matrix(SeedOf(seed_, up, key), ffn, h, h, rank * ffn, 0, part);
    PieceOf(up_rows).continues = true;
  }
  return std::pair{fc1, Matrix(SeedOf(seed_, fc2, key), h, ffn, ffn * size, 0, rank * ffn, part)};
}

void ModelShard::Layout::AddEmbedding() {
  unit_ = shard_.EmbeddingUnit();
  if (at_.pp != 0) return;
  const int64_t h = s_.hidden;
  word_ = Matrix(SeedOf(seed_, kWord, 0), s_.vocab_shard, h, h, s_.vocab_start, 0);
  PieceOf(word_).tied = s_.tied && s_.pp > 1;
  if (s_.learned_positions) {
    pos_ = Matrix(SeedOf(seed_, kPos, 0), s_.max_positions, h, h, 0, 0);
    PieceOf(pos_).tp_replicated = true;
  }
}

void ModelShard::Layout::AddLayers() {
  layers_.resize(s_.vpp);
  for (int chunk = 0; chunk < s_.vpp; ++chunk) {
    for (int64_t j = 0; j < s_.chunk_layers[chunk]; ++j) {
      unit_ = shard_.LayerUnit(chunk, j);
      layers_[chunk].push_back(AddLayer(s_.GlobalLayer(chunk, j)));
    }
  }
}

ModelShard::Layout::LayerRefs ModelShard::Layout::AddLayer(int64_t layer) {
  const bool layernorm = !s_.rmsnorm;
  const int64_t h = s_.hidden;
  LayerRefs li{};
  li.n1 = Norm(false);
  if (layernorm) li.n1b = Norm(true);
  li.q = Matrix(SeedOf(seed_, kQ, layer), s_.q_cols, h, h, at_.tp * s_.q_cols, 0);
  for (const Kind kv : {kK, kV}) {
    const Ref r = Matrix(SeedOf(seed_, kv, layer), s_.kv_cols, h, h, at_.tp * s_.kv_cols, 0);
    PieceOf(r).continues = true;
  }
  li.proj =
      Matrix(SeedOf(seed_, kProj, layer), h, s_.q_cols, s_.q_cols * s_.tp, 0, at_.tp * s_.q_cols);
  if (s_.qk_norm) {
    // Megatron-core's q_layernorm and k_layernorm: every tp rank normalizes its own heads, so
    // their gradients are partial sums over tp whatever SP (finalize_model_grads.py).
    for (auto [gamma, beta] : {std::pair{&li.qn, &li.qnb}, std::pair{&li.kn, &li.knb}}) {
      *gamma = Norm(false, s_.head_dim);
      PieceOf(*gamma).tp_partial = true;
      if (!layernorm) continue;
      *beta = Norm(true, s_.head_dim);
      PieceOf(*beta).tp_partial = true;
    }
  }
  li.n2 = Norm(false);
  if (layernorm) li.n2b = Norm(true);
  li.moe = s_.IsMoe(layer);
  if (!li.moe) {
    std::tie(li.fc1, li.fc2) = Mlp(kGate, kUp, kFc2, layer, s_.ffn, kDense, at_.tp, s_.tp);
  } else {
    AddMoe(layer, li);
  }
  return li;
}

// A MoE layer's router, shared experts and the ep rank's routed experts.
void ModelShard::Layout::AddMoe(int64_t layer, LayerRefs& li) {
  // The router is replicated; every tp rank routes its own rows, so its gradient is a partial
  // sum over tp.
  li.router = Matrix(SeedOf(seed_, kRouter, layer), s_.experts, s_.hidden, s_.hidden, 0, 0);
  Piece& router = PieceOf(li.router);
  router.tp_replicated = router.tp_partial = true;
  if (s_.shared_ffn > 0) {
    std::tie(li.fc1, li.fc2) =
        Mlp(kSharedGate, kSharedUp, kSharedFc2, layer, s_.shared_ffn, kDense, at_.tp, s_.tp);
  }
  for (int64_t e = 0; e < s_.local_experts; ++e) {
    const int64_t expert = at_.ep * s_.local_experts + e;  // global expert index
    li.experts.push_back(Mlp(kExpertGate, kExpertUp, kExpertFc2, layer * s_.experts + expert,
                             s_.expert_ffn, kExperts, at_.etp, s_.etp));
  }
}

void ModelShard::Layout::AddHead() {
  unit_ = shard_.HeadUnit();
  if (at_.pp != s_.pp - 1) return;
  const int64_t h = s_.hidden;
  fnorm_ = Norm(false);
  if (!s_.rmsnorm) fnorm_b_ = Norm(true);
  if (!s_.tied) {
    out_ = Matrix(SeedOf(seed_, kOutput, 0), s_.vocab_shard, h, h, s_.vocab_start, 0);
  } else if (at_.pp != 0) {
    out_ = Matrix(SeedOf(seed_, kWord, 0), s_.vocab_shard, h, h, s_.vocab_start, 0);
    PieceOf(out_).duplicate = true;
    PieceOf(out_).tied = true;
  }
}

Tensor ModelShard::Layout::View(Ref first, size_t count, bool grad) const {
  if (first.index == SIZE_MAX) return Tensor{};
  const Partition& part = shard_.parts_[first.part];
  int64_t numel = 0;
  for (size_t i = first.index; i < first.index + count; ++i) numel += part.pieces[i].numel;
  return (grad ? part.grads : part.weights).tensor().Slice(part.pieces[first.index].offset, numel);
}

LayerWeights ModelShard::Layout::LayerViews(const LayerRefs& li) const {
  const size_t fc1_pieces = s_.swiglu ? 2 : 1;
  LayerWeights lw;
  for (const bool grad : {false, true}) {
    (grad ? lw.d_norm1 : lw.norm1) = View(li.n1, 1, grad);
    (grad ? lw.d_norm1_bias : lw.norm1_bias) = View(li.n1b, 1, grad);
    (grad ? lw.d_qkv : lw.qkv) = View(li.q, 3, grad);
    (grad ? lw.d_proj : lw.proj) = View(li.proj, 1, grad);
    (grad ? lw.d_q_norm : lw.q_norm) = View(li.qn, 1, grad);
    (grad ? lw.d_q_norm_bias : lw.q_norm_bias) = View(li.qnb, 1, grad);
    (grad ? lw.d_k_norm : lw.k_norm) = View(li.kn, 1, grad);
    (grad ? lw.d_k_norm_bias : lw.k_norm_bias) = View(li.knb, 1, grad);
    (grad ? lw.d_norm2 : lw.norm2) = View(li.n2, 1, grad);
    (grad ? lw.d_norm2_bias : lw.norm2_bias) = View(li.n2b, 1, grad);
    (grad ? lw.d_fc1 : lw.fc1) = View(li.fc1, fc1_pieces, grad);
    (grad ? lw.d_fc2 : lw.fc2) = View(li.fc2, 1, grad);
    (grad ? lw.d_router : lw.router) = View(li.router, 1, grad);
  }
  lw.moe = li.moe;
  for (const auto& [fc1, fc2] : li.experts) {
    lw.experts.push_back({View(fc1, fc1_pieces, false), View(fc2, 1, false),
                          View(fc1, fc1_pieces, true), View(fc2, 1, true)});
  }
  return lw;
}

void ModelShard::Layout::MakeViews() {
  shard_.chunks.resize(s_.vpp);
  for (int chunk = 0; chunk < s_.vpp; ++chunk) {
    shard_.chunks[chunk].first_layer = static_cast<int>(s_.chunk_first_layer[chunk]);
    for (const LayerRefs& li : layers_[chunk]) {
      shard_.chunks[chunk].layers.push_back(LayerViews(li));
    }
  }
  shard_.word_embedding = View(word_, 1, false);
  shard_.d_word_embedding = View(word_, 1, true);
  shard_.positions = View(pos_, 1, false);
  shard_.d_positions = View(pos_, 1, true);
  shard_.final_norm = View(fnorm_, 1, false);
  shard_.d_final_norm = View(fnorm_, 1, true);
  shard_.final_norm_bias = View(fnorm_b_, 1, false);
  shard_.d_final_norm_bias = View(fnorm_b_, 1, true);
  const bool first_stage = at_.pp == 0, last_stage = at_.pp == s_.pp - 1;
  if (last_stage && s_.tied && first_stage) {
    shard_.output = shard_.word_embedding;
    shard_.d_output = shard_.d_word_embedding;
  } else {
    shard_.output = View(out_, 1, false);
    shard_.d_output = View(out_, 1, true);
  }
}

StatusOr<ModelShard> ModelShard::Create(Device& device, const ModelSpec& m, const Shapes& s,
                                        const ParallelConfig& c, const Coordinates& at,
                                        uint64_t seed, int64_t ddp_bucket_size) {
  ModelShard shard;
  shard.layers_per_chunk_ = s.layers_per_chunk;
  shard.units_ = static_cast<int>(s.vpp * s.layers_per_chunk) + 2;
  Layout layout(shard, s, at, seed);
  layout.AddEmbedding();
  layout.AddLayers();
  layout.AddHead();
  shard.parts_[kDense].padded_numel = layout.numel(kDense);
  shard.parts_[kExperts].padded_numel = layout.numel(kExperts);
  AUTOPAR_RETURN_IF_ERROR(shard.AllocatePartitions(device, c, at, ddp_bucket_size));
  layout.MakeViews();
  return shard;
}

// Flat buffers, padded so the distributed optimizer can split them evenly: dense parameters over
// their up·cp·dp replicas, experts over their tp·up·cp·dp / (etp·ep) replicas.
Status ModelShard::AllocatePartitions(Device& device, const ParallelConfig& c,
                                      const Coordinates& at, int64_t ddp_bucket_size) {
  const int replicas = c.up * c.cp * c.dp;
  const int k = at.cp + c.cp * at.dp;
  separate_master_ = device.compute_dtype() != DType::kF32;
  // Megatron buckets only the first pipeline stage, and only with the overlap on
  // (distributed_data_parallel.py): elsewhere one bucket, reduced after the flush or, with the
  // overlap on, as soon as the stage's last backward completes it. The tied embedding's bucket
  // waits for the step (its sum over the first and last stage is not in lock-step with the
  // backward pass).
  const bool bucketed = c.overlap_grad_reduce && at.pp == 0;
  const int64_t bucket_size =
      bucketed ? DdpBucketSize(ddp_bucket_size, c.dp) : 0;
  AUTOPAR_RETURN_IF_ERROR(Allocate(device, parts_[kDense], c.dist_opt ? replicas : 1,
                                   at.up + c.up * k, bucket_size, c.overlap_grad_reduce));
  AUTOPAR_RETURN_IF_ERROR(Allocate(device, parts_[kExperts],
                                   c.dist_opt ? static_cast<int>(c.expert_dp()) : 1, at.edp,
                                   bucket_size, c.overlap_grad_reduce));
  sp_ = c.sp;
  device_ = &device;
  // fp32 training reduces its fp32 gradients whatever the knob says, as Megatron does (the
  // gradient buffer takes the parameters' dtype under --grad-reduce-in-bf16).
  round_grads_ =
      c.grad_reduce_dtype == GradReduceDtype::kBF16 && device.compute_dtype() != DType::kF32;
  if (round_grads_) {
    const int64_t largest = std::max(parts_[kDense].padded_numel, parts_[kExperts].padded_numel);
    AUTOPAR_ASSIGN_OR_RETURN(
        round_scratch_, device.Allocate(2 * std::min<int64_t>(largest, kRoundBlock), DType::kF32));
  }
  defer_gather_ = c.overlap_param_gather && OverlapParamGatherAllowed(c);
  return OkStatus();
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
// replicated parameters whose tp ranks saw different rows or heads (all of them under SP, the
// router and qk-layernorm's weights always) sum their gradients over tp, then the first and last
// stage sum the tied embedding's. Each piece once per step, however the buckets cut it.
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
  device::AdamParams adam;
  adam.lr = lr;
  adam.eps = eps;
  adam.step = step;
  for (int part : {kDense, kExperts}) {
    Partition& p = parts_[part];
    AUTOPAR_RETURN_IF_ERROR(StepPartition(device, p, GroupOf(part, g), adam, PrepareOf(p, g)));
    std::fill(p.tp_summed.begin(), p.tp_summed.end(), false);
  }
  embedding_summed_ = false;
  device.WeightsChanged();
  return OkStatus();
}

// With 16-bit weights Adam updates the fp32 master copy and writes the weights from it. With the
// distributed optimizer each replica updates its 1/shards of every bucket and gathers the rest
// back, all in place in the flat buffers (Megatron-core's layout).
Status ModelShard::StepPartition(Device& device, Partition& p, Comm& group,
                                 const device::AdamParams& adam,
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

namespace {

// The direction the fingerprint projects on: the weight of element i of `piece` of a model
// initialised from `seed`, by the element's place in its global matrix (replicated norms have no
// matrix geometry: by position alone), so every layout of the model sees the same direction.
class FingerprintDirection {
 public:
  FingerprintDirection(const Piece& piece, uint64_t seed)
      : piece_(piece),
        key_(kernels::ref::SplitMix64(seed ^ piece.seed ^ 0xF1F1F1F1ull)),
        cols_(piece.cols > 0 ? piece.cols : piece.numel),
        global_cols_(piece.global_cols > 0 ? piece.global_cols : piece.numel) {}
  double operator()(int64_t i) const {
    const int64_t r = i / cols_, col = i % cols_;
    return kernels::ref::HashUniform(
        key_,
        static_cast<uint64_t>((piece_.row_offset + r) * global_cols_ + piece_.col_offset + col));
  }

 private:
  const Piece& piece_;
  const uint64_t key_;
  const int64_t cols_, global_cols_;
};

}  // namespace

Status ModelShard::Perturb(Device& device, uint64_t seed, double delta) {
  if (separate_master_) {
    return Status(Outcome::kInvalid, "weight_perturbation: needs fp32 weights (no master copy)");
  }
  for (Partition& p : parts_) {
    if (p.padded_numel == 0) continue;
    const Tensor w = p.weights.tensor();
    AUTOPAR_ASSIGN_OR_RETURN(std::vector<float> host, device.Download<float>(w));
    for (const Piece& piece : p.pieces) {
      const FingerprintDirection direction(piece, seed);
      for (int64_t i = 0; i < piece.numel; ++i) {
        float& v = host[static_cast<size_t>(piece.offset + i)];
        v = static_cast<float>(v + delta * direction(i));
      }
    }
    AUTOPAR_RETURN_IF_ERROR(device.Upload(w, host));
  }
  return OkStatus();
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
      const FingerprintDirection direction(piece, seed);
      for (int64_t i = 0; i < piece.numel; ++i) {
        const double v = host[piece.offset + i];
        sum += v;
        projection += v * direction(i);
      }
    }
  }
  return std::pair{sum, projection};
}

}  // namespace autopar::trial
