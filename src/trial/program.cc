#include "src/trial/program.h"

#include "kernels/init.h"
#include "src/trial/carver.h"
#include "src/trial/linear.h"

namespace autopar::trial {
namespace {

using device::DType;
using device::OkStatus;
using device::Outcome;

// The outputs a stage sends: a forward pass's activations and a backward pass's input gradient
// (Megatron's output_tensor and input_tensor_grad), each until the exchange after its op.
constexpr int kSendBuffers = 2;

}  // namespace

// ---- set-up ----

StatusOr<std::unique_ptr<StageProgram>> StageProgram::Create(Device& device, const Shapes& s,
                                                             const ParallelConfig& c,
                                                             ProcessGroups& g, ModelShard& w,
                                                             const DataSpec& data,
                                                             const std::map<int64_t, int>& slots) {
  std::unique_ptr<StageProgram> p(new StageProgram(device, s, c, g, w, data));
  // The dense MLP part's width of each layer of a slot (MLP, or a MoE layer's shared experts):
  // the slots of the model chunks differ only in which layers are MoE layers, so a slot is carved
  // for the widest chunk's layers. The shared work areas hold the widest of all.
  // A part that selective recompute rebuilds is kept in the work area instead (rerun_ffn wide).
  std::vector<int64_t> ffn_of(s.layers_per_chunk, 0);
  int64_t widest_ffn = 0, rerun_ffn = 0;
  for (int chunk = 0; chunk < s.vpp; ++chunk) {
    for (int64_t j = 0; j < s.chunk_layers[chunk]; ++j) {
      const bool moe = s.IsMoe(s.GlobalLayer(chunk, j));
      const bool rebuilt = s.RerunsMlpPart(moe);
      ffn_of[j] = std::max(ffn_of[j], rebuilt ? 0 : s.MlpFfn(moe));
      widest_ffn = std::max(widest_ffn, s.MlpFfn(moe));
      rerun_ffn = std::max(rerun_ffn, rebuilt ? s.MlpFfn(moe) : 0);
    }
  }

  AUTOPAR_RETURN_IF_ERROR(p->AllocateSlots(slots, ffn_of));
  AUTOPAR_RETURN_IF_ERROR(p->AllocateWorkArea(widest_ffn, rerun_ffn));
  AUTOPAR_RETURN_IF_ERROR(p->AllocateWorkspaces(widest_ffn));
  p->slot_of_.assign(data.samples_per_replica / s.mbs, std::vector<int>(s.vpp, -1));
  if (s.cp > 1 || s.up > 1) {
    AUTOPAR_ASSIGN_OR_RETURN(p->context_, ContextAttention::Create(device, s, g));
  }
  if (s.experts > 0) {
    AUTOPAR_ASSIGN_OR_RETURN(p->moe_, MoeLayer::Create(device, s, g, data.tokens_per_step / s.seq));
  }
  return p;
}

void StageProgram::CarveLayer(Carver& cc, Carver& cs, bool full, LayerActs& a, int64_t ffn) const {
  const Shapes& s = s_;
  const int64_t T = s.tokens, Tl = s.local_tokens, h = s.hidden;
  const bool ulysses = s.up > 1;
  a.x = cc.Take(Tl * h);
  if (!full) return;
  const bool norms = !s.Reruns(kRecomputeLayernorm);  // kept, not rebuilt
  if (norms) a.y1 = cc.Take(Tl * h);
  a.qkv = cc.Take(ulysses ? T * s.up * s.ul_cols : T * s.qkv_cols);
  a.o = cc.Take(T * s.q_cols);
  a.x1 = cc.Take(Tl * h);
  if (norms) a.y2 = cc.Take(Tl * h);
  a.h1 = cc.Take(T * (s.swiglu ? 2 : 1) * ffn);
  a.a1 = cc.Take(T * ffn);
  a.rstd1 = cs.Take(Tl);
  a.rstd2 = cs.Take(Tl);
  if (!s.rmsnorm) {
    a.mean1 = cs.Take(Tl);
    a.mean2 = cs.Take(Tl);
  }
  if (s.qk_norm) {
    a.qk_x = cc.Take(T * (s.q_cols + s.kv_cols));
    a.qk_rstd = cs.Take(T * (s.heads + s.kv_heads));
    if (!s.rmsnorm) a.qk_mean = cs.Take(T * (s.heads + s.kv_heads));
  }
  if (!s.Reruns(kRecomputeCoreAttn)) {  // the attention statistics are kept
    a.lse = cs.Take(T * s.heads);
    if (ulysses) a.o_ul = cc.Take(T * s.q_cols);
  }
}

std::pair<int64_t, int64_t> StageProgram::CarveSlot(Carver cc, Carver cs, Slot& slot, int64_t size,
                                                    const std::vector<int64_t>& ffn_of) const {
  slot.layers.resize(std::max<int64_t>(size, 1));
  slot.moe.resize(slot.layers.size());
  if (size == 0) CarveLayer(cc, cs, false, slot.layers[0], 0);  // the chunk's input
  for (int64_t j = 0; j < size; ++j) {
    CarveLayer(cc, cs, !Recomputed(static_cast<int>(j)), slot.layers[j], ffn_of[j]);
  }
  if (g_.at.pp == s_.pp - 1) slot.dlast = cc.Take(s_.local_tokens * s_.hidden);
  return std::pair{cc.used(), cs.used()};
}

// Measure a slot of each size, then allocate and carve each for real.
Status StageProgram::AllocateSlots(const std::map<int64_t, int>& slots,
                                   const std::vector<int64_t>& ffn_of) {
  size_t total = 0;
  for (const auto& [size, count] : slots) total += static_cast<size_t>(count);
  slots_.reserve(total);  // the slots' tensors stay where they are carved
  for (const auto& [size, count] : slots) {
    Slot probe;
    const auto [slot_compute, slot_stats] = CarveSlot(Carver(), Carver(), probe, size, ffn_of);
    for (int i = 0; i < count; ++i) {
      Slot& slot = slots_.emplace_back();
      AUTOPAR_ASSIGN_OR_RETURN(slot.compute, dev_.Allocate(slot_compute, dev_.compute_dtype()));
      AUTOPAR_ASSIGN_OR_RETURN(slot.stats,
                               dev_.Allocate(std::max<int64_t>(slot_stats, 1), DType::kF32));
      CarveSlot(Carver(slot.compute.tensor()), Carver(slot.stats.tensor()), slot, size, ffn_of);
      AUTOPAR_RETURN_IF_ERROR(AllocateMasks(slot.layers, slot.masks));
      free_slots_[size].push_back(static_cast<int>(slots_.size()) - 1);
    }
  }
  return OkStatus();
}

Status StageProgram::AllocateMasks(std::span<LayerActs> layers, Buffer& masks) {
  if (data_.hidden_dropout <= 0) return OkStatus();
  const int64_t mask = s_.local_tokens * s_.hidden;
  int64_t kept = 0;
  for (const LayerActs& a : layers) kept += a.x1.numel > 0 ? 1 : 0;
  if (kept == 0) return OkStatus();
  AUTOPAR_ASSIGN_OR_RETURN(masks, dev_.Allocate(2 * kept * mask, DType::kU8));
  Carver cm(masks.tensor());
  for (LayerActs& a : layers) {
    if (a.x1.numel == 0) continue;
    a.drop1 = cm.Take(mask);
    a.drop2 = cm.Take(mask);
  }
  return OkStatus();
}

void StageProgram::SetLayerDraws(int microbatch, int chunk, size_t layer_in_chunk) {
  using kernels::ref::SplitMix64;
  const int64_t layer = s_.GlobalLayer(chunk, static_cast<int64_t>(layer_in_chunk));
  uint64_t h = SplitMix64(data_.seed ^ 0xD207ull);
  for (const int64_t v : {int64_t{g_.at.tp}, int64_t{g_.at.up}, int64_t{g_.at.cp},
                          int64_t{g_.at.dp}, int64_t{g_.at.pp}, int64_t{microbatch}, layer}) {
    h = SplitMix64(h + static_cast<uint64_t>(v));
  }
  dropout_seed_ = h;
  random_logits_.layer_seed = SplitMix64(SplitMix64(data_.seed ^ 0x40E7ull) + layer);
  random_logits_.first_sample = FirstSample(microbatch);
}

std::optional<RandomLogits> StageProgram::RoutingDraws() const {
  if (!data_.moe_force_load_balancing) return std::nullopt;
  return random_logits_;
}

// The one-layer work area: the activations a fully recomputed layer rebuilds, or what selective
// recompute's modules rebuild: the attention output and statistics (core_attn), both norms'
// outputs and statistics (layernorm), the dense MLP part's fc1 and activation outputs (mlp, moe,
// shared_experts).
Status StageProgram::AllocateWorkArea(int64_t widest_ffn, int64_t rerun_ffn) {
  const DType compute = dev_.compute_dtype();
  const int64_t T = s_.tokens, Tl = s_.local_tokens, h = s_.hidden;
  if (c_.recompute == Recompute::kFull) {
    Carver cc, cs;
    LayerActs tmp;
    CarveLayer(cc, cs, true, tmp, widest_ffn);
    AUTOPAR_ASSIGN_OR_RETURN(work_compute_, dev_.Allocate(cc.used(), compute));
    AUTOPAR_ASSIGN_OR_RETURN(work_stats_, dev_.Allocate(cs.used(), DType::kF32));
    Carver wc(work_compute_.tensor()), ws(work_stats_.tensor());
    CarveLayer(wc, ws, true, work_, widest_ffn);
    return AllocateMasks(std::span<LayerActs>(&work_, 1), work_masks_);
  }
  if (s_.rerun == 0) return OkStatus();
  auto carve = [&](Carver cc, Carver cs) {
    if (s_.Reruns(kRecomputeCoreAttn)) {
      work_.o = cc.Take(T * s_.q_cols);
      if (s_.up > 1) work_.o_ul = cc.Take(T * s_.q_cols);
      work_.lse = cs.Take(T * s_.heads);
    }
    if (s_.Reruns(kRecomputeLayernorm)) {
      work_.y1 = cc.Take(Tl * h);
      work_.y2 = cc.Take(Tl * h);
      work_rstd_ = cs.Take(Tl);
      work_mean_ = cs.Take(Tl);
    }
    work_.h1 = cc.Take(T * (s_.swiglu ? 2 : 1) * rerun_ffn);
    work_.a1 = cc.Take(T * rerun_ffn);
    return std::pair{cc.used(), cs.used()};
  };
  const auto [compute_elems, stats_elems] = carve(Carver(), Carver());
  AUTOPAR_ASSIGN_OR_RETURN(work_compute_,
                           dev_.Allocate(std::max<int64_t>(compute_elems, 1), compute));
  AUTOPAR_ASSIGN_OR_RETURN(work_stats_,
                           dev_.Allocate(std::max<int64_t>(stats_elems, 1), DType::kF32));
  carve(Carver(work_compute_.tensor()), Carver(work_stats_.tensor()));
  return OkStatus();
}

// Workspaces of the backward pass and the loss.
Status StageProgram::AllocateWorkspaces(int64_t widest_ffn) {
  const Shapes& s = s_;
  const int64_t T = s.tokens, Tl = s.local_tokens, h = s.hidden;
  const int64_t widest_fc1 = (s.swiglu ? 2 : 1) * widest_ffn;
  const bool last_rank = g_.at.pp == s.pp - 1;
  const int64_t compute_ws = 2 * T * h + Tl * h + T * s.qkv_cols + T * s.q_cols + T * widest_fc1 +
                             T * widest_ffn + 5 * Tl * h + kSendBuffers * Tl * h +
                             (last_rank ? T * s.vocab_shard + Tl * h : 0);
  AUTOPAR_ASSIGN_OR_RETURN(ws_compute_, dev_.Allocate(compute_ws, dev_.compute_dtype()));
  AUTOPAR_ASSIGN_OR_RETURN(ws_stats_, dev_.Allocate(2 * Tl + 5 * T, DType::kF32));
  AUTOPAR_ASSIGN_OR_RETURN(ws_ids_, dev_.Allocate(2 * T + Tl, DType::kI32));
  Carver cc(ws_compute_.tensor()), cs(ws_stats_.tensor()), ci(ws_ids_.tensor());
  gathered_ = cc.Take(T * h);
  partial_ = cc.Take(T * h);
  reduced_ = cc.Take(Tl * h);
  dqkv_ = cc.Take(T * s.qkv_cols);
  do_ = cc.Take(T * s.q_cols);
  dh1_ = cc.Take(T * widest_fc1);
  da1_ = cc.Take(T * widest_ffn);
  dx1_ = cc.Take(Tl * h);
  dtmp_ = cc.Take(Tl * h);
  grad_a_ = cc.Take(Tl * h);
  grad_b_ = cc.Take(Tl * h);
  // Never needed together: the output a recomputed layer rebuilds in backward, the position
  // embedding in the first stage's forward, the last stage's output in its forward.
  last_out_ = cc.Take(Tl * h);
  scratch_ = last_out_;
  forward_out_ = cc.Take(Tl * h);
  backward_out_ = cc.Take(Tl * h);
  if (last_rank) {
    logits_ = cc.Take(T * s.vocab_shard);
    yf_ = cc.Take(Tl * h);
  }
  rstdf_ = cs.Take(Tl);
  meanf_ = cs.Take(Tl);
  row_max_ = cs.Take(T);
  ce_partials_ = cs.Take(2 * T);
  loss_ = cs.Take(T);
  dloss_ = cs.Take(T);
  ids_ = ci.Take(T);
  targets_ = ci.Take(T);
  positions_ = ci.Take(Tl);
  return dev_.Fill(dloss_, static_cast<float>(1.0 / data_.tokens_per_step));
}

LayerActs StageProgram::ActsOf(const Slot& slot, size_t j, bool moe) const {
  LayerActs a = slot.layers[j];
  if (s_.Reruns(kRecomputeLayernorm)) {
    a.y1 = work_.y1;
    a.y2 = work_.y2;
  }
  if (s_.RerunsMlpPart(moe)) {
    const int64_t T = s_.tokens, ffn = s_.MlpFfn(moe);
    a.h1 = work_.h1.Slice(0, T * s_.MlpFc1Cols(moe));
    a.a1 = work_.a1.Slice(0, T * ffn);
  }
  return a;
}

MoeActs& StageProgram::MoeActsOf(Slot& slot, size_t j, bool moe) {
  return moe && s_.Reruns(kRecomputeMoe) ? work_moe_ : slot.moe[j];
}

bool StageProgram::Recomputed(int layer_in_chunk) const {
  if (c_.recompute != Recompute::kFull) return false;
  return c_.recompute_layers == 0 || layer_in_chunk < c_.recompute_layers;
}

int StageProgram::Tag(int microbatch, int receiving_stage, bool backward) const {
  const int stages = static_cast<int>(s_.pp * s_.vpp);
  return ((microbatch * stages + receiving_stage) * 2 + (backward ? 1 : 0)) % 30000;
}

// Token ids and targets of a micro-batch: a pure function of the data seed and the global
// sample and position, so every layout of the job sees the same data.
Status StageProgram::LoadTokens(int microbatch) {
  if (loaded_microbatch_ == microbatch) return OkStatus();
  const int64_t T = s_.tokens;
  std::vector<int32_t> ids(T), targets(T), positions(s_.local_tokens);
  const int64_t first_sample = FirstSample(microbatch);
  // Row (s, b) holds the token at this rank's s-th position of the sequence (GlobalPosition).
  for (int64_t local = 0; local < s_.seq_local; ++local) {
    const int64_t pos = GlobalPosition(s_, g_.at, local);
    for (int64_t b = 0; b < s_.mbs; ++b) {
      const uint64_t base = static_cast<uint64_t>(first_sample + b) * (s_.seq + 1) + pos;
      auto token = [&](uint64_t i) {
        return static_cast<int32_t>(
            kernels::ref::SplitMix64(data_.seed ^ (i * 0x2545F4914F6CDD1Dull)) %
            static_cast<uint64_t>(s_.vocab));
      };
      ids[local * s_.mbs + b] = token(base);
      targets[local * s_.mbs + b] = token(base + 1);  // the next token of the same sequence
    }
  }
  const int64_t first_row = s_.sp ? g_.at.tp * s_.local_tokens : 0;
  for (int64_t r = 0; r < s_.local_tokens; ++r) {
    positions[r] = static_cast<int32_t>(GlobalPosition(s_, g_.at, (first_row + r) / s_.mbs));
  }
  AUTOPAR_RETURN_IF_ERROR(dev_.Upload(ids_, ids));
  AUTOPAR_RETURN_IF_ERROR(dev_.Upload(targets_, targets));
  AUTOPAR_RETURN_IF_ERROR(dev_.Upload(positions_, positions));
  loaded_microbatch_ = microbatch;
  return OkStatus();
}

// ---- embedding and loss ----

Status StageProgram::Embed(int microbatch, Tensor x) {
  AUTOPAR_RETURN_IF_ERROR(LoadTokens(microbatch));
  const device::EmbeddingDesc word{s_.tokens, s_.hidden, s_.vocab_shard, s_.vocab_start};
  AUTOPAR_RETURN_IF_ERROR(dev_.EmbeddingForward(word, w_.word_embedding, ids_, partial_));
  AUTOPAR_RETURN_IF_ERROR(ReduceRows(partial_, x));
  if (!s_.learned_positions) return OkStatus();
  const device::EmbeddingDesc pos{s_.local_tokens, s_.hidden, s_.max_positions, 0};
  AUTOPAR_RETURN_IF_ERROR(dev_.EmbeddingForward(pos, w_.positions, positions_, scratch_));
  return dev_.Add(x, scratch_, x);
}

Status StageProgram::EmbedBackward(int microbatch, Tensor dx) {
  AUTOPAR_RETURN_IF_ERROR(LoadTokens(microbatch));
  if (s_.learned_positions) {
    const device::EmbeddingDesc pos{s_.local_tokens, s_.hidden, s_.max_positions, 0};
    AUTOPAR_RETURN_IF_ERROR(dev_.EmbeddingBackward(pos, dx, positions_, w_.d_positions));
  }
  AUTOPAR_ASSIGN_OR_RETURN(Tensor full, GatherRows(dx, gathered_));
  const device::EmbeddingDesc word{s_.tokens, s_.hidden, s_.vocab_shard, s_.vocab_start};
  return dev_.EmbeddingBackward(word, full, ids_, w_.d_word_embedding);
}

// The loss and its backward run together at the end of the last stage's forward pass, so only
// the gradient at the last layer's output waits for the backward pass (logits are transient).
Status StageProgram::HeadForwardBackward(int microbatch, Tensor x, Tensor dx) {
  AUTOPAR_RETURN_IF_ERROR(LoadTokens(microbatch));
  const int64_t T = s_.tokens, h = s_.hidden, V = s_.vocab_shard;
  AUTOPAR_RETURN_IF_ERROR(Norm(w_.final_norm, w_.final_norm_bias, x, yf_, rstdf_, meanf_));
  AUTOPAR_ASSIGN_OR_RETURN(Tensor y, GatherRows(yf_, gathered_));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(Linear(T, V, h), y, w_.output, logits_));
  const device::CrossEntropyDesc ce{T, V, s_.vocab_start};
  AUTOPAR_RETURN_IF_ERROR(dev_.CrossEntropyMax(ce, logits_, row_max_));
  AUTOPAR_RETURN_IF_ERROR(g_.tp.AllReduce(row_max_, ReduceOp::kMax));
  AUTOPAR_RETURN_IF_ERROR(dev_.CrossEntropyPartials(ce, logits_, targets_, row_max_, ce_partials_));
  AUTOPAR_RETURN_IF_ERROR(g_.tp.AllReduce(ce_partials_));
  AUTOPAR_RETURN_IF_ERROR(dev_.CrossEntropyLoss(ce, row_max_, ce_partials_, loss_));
  AUTOPAR_ASSIGN_OR_RETURN(std::vector<float> loss, dev_.Download<float>(loss_));
  for (float l : loss) loss_sum_ += l;
  AUTOPAR_RETURN_IF_ERROR(
      dev_.CrossEntropyBackward(ce, logits_, targets_, row_max_, ce_partials_, dloss_, logits_));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearWeightGrad(T, V, h), logits_, y, w_.d_output));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearInputGrad(T, V, h), logits_, w_.output, partial_));
  AUTOPAR_RETURN_IF_ERROR(ReduceRows(partial_, dtmp_));
  return NormBackward(w_.final_norm, w_.d_final_norm, w_.d_final_norm_bias, dtmp_, x, rstdf_,
                      meanf_, dx);
}

// ---- a micro-batch through a model chunk ----

Status StageProgram::Forward(int microbatch, int chunk) {
  std::vector<int>& pool = FreeSlotsOf(chunk);
  if (pool.empty()) {
    return Status(Outcome::kInvalid, "trial: more micro-batches in flight than slots");
  }
  const int slot_index = pool.back();
  pool.pop_back();
  slot_of_[microbatch][chunk] = slot_index;
  Slot& slot = slots_[slot_index];
  const StageLinks links = LinksOf(s_.pp, s_.vpp, g_.at.pp, chunk);
  const ChunkWeights& weights = w_.chunks[chunk];
  Tensor x = slot.layers[0].x;  // received by the exchange before this op unless first
  // Data-parallel overlap (ModelShard): a unit's deferred parameter all-gather is waited for
  // before its first use, and its gradient reported complete after each backward.
  if (links.prev_rank < 0) {
    AUTOPAR_RETURN_IF_ERROR(w_.AwaitParams(g_, w_.EmbeddingUnit()));
    AUTOPAR_RETURN_IF_ERROR(Embed(microbatch, x));
  }
  const bool last = links.next_rank < 0;
  const Tensor out = last ? last_out_ : forward_out_;
  for (size_t j = 0; j < weights.layers.size(); ++j) {
    const Tensor next = j + 1 < weights.layers.size() ? slot.layers[j + 1].x : out;
    const bool recomputed = Recomputed(static_cast<int>(j));
    const LayerWeights& w = weights.layers[j];
    const LayerActs acts = recomputed ? work_ : ActsOf(slot, j, w.moe);
    MoeActs& moe = recomputed ? work_moe_ : MoeActsOf(slot, j, w.moe);
    AUTOPAR_RETURN_IF_ERROR(w_.AwaitParams(g_, w_.LayerUnit(chunk, static_cast<int64_t>(j))));
    SetLayerDraws(microbatch, chunk, j);
    AUTOPAR_RETURN_IF_ERROR(LayerForward(w, acts, moe, x, next, true));
    // Under moe recompute the layer's routed activations are dropped (Megatron's checkpoint keeps
    // the input alone) and rebuilt before its backward.
    if (!recomputed && w.moe && s_.Reruns(kRecomputeMoe)) work_moe_.compute.Reset();
    x = next;
  }
  // A chunk of no layers (the embedding or the loss alone: split_embedding/split_loss with chunks
  // of one layer) passes its input on as it is.
  if (weights.layers.empty()) {
    AUTOPAR_RETURN_IF_ERROR(dev_.Copy(out, x));
  }
  if (last) {
    AUTOPAR_RETURN_IF_ERROR(w_.AwaitParams(g_, w_.HeadUnit()));
    AUTOPAR_RETURN_IF_ERROR(HeadForwardBackward(microbatch, out, slot.dlast));
    return w_.GradsReady(g_, w_.HeadUnit());
  }
  return OkStatus();  // `out` goes to the next stage in the exchange after this op
}

Status StageProgram::Backward(int microbatch, int chunk) {
  const int slot_index = slot_of_[microbatch][chunk];
  if (slot_index < 0) return Status(Outcome::kInvalid, "trial: backward before forward");
  Slot& slot = slots_[slot_index];
  const StageLinks links = LinksOf(s_.pp, s_.vpp, g_.at.pp, chunk);
  const ChunkWeights& weights = w_.chunks[chunk];
  Tensor dout = grad_a_, dx = grad_b_;  // grad_a_ received by the exchange unless last
  if (links.next_rank < 0) AUTOPAR_RETURN_IF_ERROR(dev_.Copy(dout, slot.dlast));
  for (size_t j = weights.layers.size(); j-- > 0;) {
    LayerActs acts = ActsOf(slot, j, weights.layers[j].moe);
    MoeActs* moe = &MoeActsOf(slot, j, weights.layers[j].moe);
    // A recompute's rerun (full, or the modules selective recompute reruns) draws what the
    // forward drew.
    SetLayerDraws(microbatch, chunk, j);
    if (Recomputed(static_cast<int>(j))) {
      // Full recompute: rebuild this layer's activations (and dropout masks) from its saved input.
      AUTOPAR_RETURN_IF_ERROR(
          LayerForward(weights.layers[j], work_, work_moe_, slot.layers[j].x, scratch_, false));
      acts = work_;
      acts.x = slot.layers[j].x;
      moe = &work_moe_;
    }
    AUTOPAR_RETURN_IF_ERROR(LayerBackward(weights.layers[j], acts, *moe, dout, dx));
    AUTOPAR_RETURN_IF_ERROR(w_.GradsReady(g_, w_.LayerUnit(chunk, static_cast<int64_t>(j))));
    std::swap(dout, dx);
  }
  FreeSlotsOf(chunk).push_back(slot_index);
  slot_of_[microbatch][chunk] = -1;
  if (links.prev_rank < 0) {
    AUTOPAR_RETURN_IF_ERROR(EmbedBackward(microbatch, dout));
    return w_.GradsReady(g_, w_.EmbeddingUnit());
  }
  return dev_.Copy(backward_out_, dout);  // sent in the exchange after this op
}

Status StageProgram::Exchange(std::span<const PipelineTransfer> transfers) {
  // A step sends and receives at most a forward's and a backward's tensor each.
  device::P2POp ops[4];
  if (transfers.size() > std::size(ops)) {
    return Status(Outcome::kInvalid, "trial: more than 4 pipeline transfers in one step");
  }
  size_t n = 0;
  for (const PipelineTransfer& t : transfers) {
    Tensor buf;
    if (t.kind == PipelineTransfer::kSend) {
      buf = t.backward ? backward_out_ : forward_out_;
    } else if (t.backward) {
      buf = grad_a_;
    } else {
      // The next forward's input, in the slot it will take.
      const std::vector<int>& pool = FreeSlotsOf(t.stage / s_.pp);
      if (pool.empty()) {
        return Status(Outcome::kInvalid, "trial: more micro-batches in flight than slots");
      }
      buf = slots_[pool.back()].layers[0].x;
    }
    ops[n++] = {t.kind == PipelineTransfer::kSend ? device::P2POp::kSend : device::P2POp::kRecv,
                buf, t.peer, Tag(t.microbatch, t.stage, t.backward)};
  }
  return g_.pp.SendRecv(std::span(ops, n));
}

double StageProgram::TakeLossSum() {
  const double sum = loss_sum_;
  loss_sum_ = 0;
  return sum;
}

}  // namespace autopar::trial
