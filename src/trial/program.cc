#include "src/trial/program.h"

#include "kernels/init.h"
#include "src/trial/carver.h"
#include "src/trial/linear.h"

namespace autopar::trial {
namespace {

using backend::DType;
using backend::OkStatus;
using backend::Outcome;

// The outputs a stage sends: a forward pass's activations and a backward pass's input gradient
// (Megatron's output_tensor and input_tensor_grad), each until the exchange after its op.
constexpr int kSendBuffers = 2;

}  // namespace

// ---- set-up ----

StatusOr<std::unique_ptr<StageProgram>> StageProgram::Create(Device& device, const Shapes& s,
                                                             const ParallelConfig& c,
                                                             ProcessGroups& g, ModelShard& w,
                                                             const DataSpec& data, int slots) {
  std::unique_ptr<StageProgram> p(new StageProgram(device, s, c, g, w, data));
  const DType compute = device.compute_dtype();
  const int64_t T = s.tokens, Tl = s.local_tokens, h = s.hidden;
  const bool layernorm = !s.rmsnorm;
  const bool keep_lse = c.recompute != Recompute::kSelective;
  const bool last_rank = g.at.pp == s.pp - 1;

  const bool ulysses = s.up > 1;
  // The dense MLP part's width of each of this rank's layers (MLP, or a MoE layer's shared
  // experts), and the widest, which the shared work areas must hold.
  auto is_moe = [&](int chunk, int64_t j) { return s.IsMoe(s.GlobalLayer(chunk, j)); };
  int64_t widest_ffn = 0;
  for (int chunk = 0; chunk < s.vpp; ++chunk) {
    for (int64_t j = 0; j < s.layers_per_chunk; ++j) {
      widest_ffn = std::max(widest_ffn, s.MlpFfn(is_moe(chunk, j)));
    }
  }
  const int64_t widest_fc1 = (s.swiglu ? 2 : 1) * widest_ffn;
  const int64_t qkv_numel = ulysses ? T * s.up * s.ul_cols : T * s.qkv_cols;

  // One layer's activations, in elements of the compute dtype and of f32.
  auto carve_layer = [&](Carver& cc, Carver& cs, bool full, LayerActs& a, int64_t ffn) {
    a.x = cc.Take(Tl * h);
    if (!full) return;
    a.y1 = cc.Take(Tl * h);
    a.qkv = cc.Take(qkv_numel);
    a.o = cc.Take(T * s.q_cols);
    a.x1 = cc.Take(Tl * h);
    a.y2 = cc.Take(Tl * h);
    a.h1 = cc.Take(T * (s.swiglu ? 2 : 1) * ffn);
    a.a1 = cc.Take(T * ffn);
    a.rstd1 = cs.Take(Tl);
    a.rstd2 = cs.Take(Tl);
    if (layernorm) {
      a.mean1 = cs.Take(Tl);
      a.mean2 = cs.Take(Tl);
    }
    if (keep_lse) {
      a.lse = cs.Take(T * s.heads);
      if (ulysses) a.o_ul = cc.Take(T * s.q_cols);
    }
  };
  // Measure a slot, then allocate and carve for real. The slots of the model chunks differ only
  // in which layers are MoE layers, so a slot is carved for the widest chunk's layers.
  std::vector<int64_t> ffn_of(s.layers_per_chunk, 0);
  for (int chunk = 0; chunk < s.vpp; ++chunk) {
    for (int64_t j = 0; j < s.layers_per_chunk; ++j) {
      ffn_of[j] = std::max(ffn_of[j], s.MlpFfn(is_moe(chunk, j)));
    }
  }
  auto carve_slot = [&](Carver cc, Carver cs, Slot& slot) {
    slot.layers.resize(s.layers_per_chunk);
    slot.moe.resize(s.layers_per_chunk);
    for (int64_t j = 0; j < s.layers_per_chunk; ++j) {
      carve_layer(cc, cs, !p->Recomputed(static_cast<int>(j)), slot.layers[j], ffn_of[j]);
    }
    if (last_rank) slot.dlast = cc.Take(Tl * h);
    return std::pair{cc.used(), cs.used()};
  };
  Slot probe;
  const auto [slot_compute, slot_stats] = carve_slot(Carver(), Carver(), probe);
  p->slots_.resize(slots);
  for (int i = 0; i < slots; ++i) {
    Slot& slot = p->slots_[i];
    AUTOPAR_ASSIGN_OR_RETURN(slot.compute, device.Allocate(slot_compute, compute));
    AUTOPAR_ASSIGN_OR_RETURN(slot.stats,
                             device.Allocate(std::max<int64_t>(slot_stats, 1), DType::kF32));
    carve_slot(Carver(slot.compute.tensor()), Carver(slot.stats.tensor()), slot);
    p->free_slots_.push_back(slots - 1 - i);
  }

  // The one-layer work area: the activations a fully recomputed layer rebuilds, or the attention
  // output and statistics selective recompute runs again.
  if (c.recompute == Recompute::kFull) {
    Carver cc, cs;
    LayerActs tmp;
    carve_layer(cc, cs, true, tmp, widest_ffn);
    AUTOPAR_ASSIGN_OR_RETURN(p->work_compute_, device.Allocate(cc.used(), compute));
    AUTOPAR_ASSIGN_OR_RETURN(p->work_stats_, device.Allocate(cs.used(), DType::kF32));
    Carver wc(p->work_compute_.tensor()), ws(p->work_stats_.tensor());
    carve_layer(wc, ws, true, p->work_, widest_ffn);
  } else if (c.recompute == Recompute::kSelective) {
    AUTOPAR_ASSIGN_OR_RETURN(p->work_compute_,
                             device.Allocate((ulysses ? 2 : 1) * T * s.q_cols, compute));
    AUTOPAR_ASSIGN_OR_RETURN(p->work_stats_, device.Allocate(T * s.heads, DType::kF32));
    p->work_.o = p->work_compute_.tensor().Slice(0, T * s.q_cols);
    if (ulysses) p->work_.o_ul = p->work_compute_.tensor().Slice(T * s.q_cols, T * s.q_cols);
    p->work_.lse = p->work_stats_.tensor();
  }

  // Workspaces of the backward pass and the loss.
  const int64_t compute_ws = 2 * T * h + Tl * h + T * s.qkv_cols + T * s.q_cols + T * widest_fc1 +
                             T * widest_ffn + 5 * Tl * h + kSendBuffers * Tl * h +
                             (last_rank ? T * s.vocab_shard + Tl * h : 0);
  AUTOPAR_ASSIGN_OR_RETURN(p->ws_compute_, device.Allocate(compute_ws, compute));
  AUTOPAR_ASSIGN_OR_RETURN(p->ws_stats_, device.Allocate(2 * Tl + 5 * T, DType::kF32));
  AUTOPAR_ASSIGN_OR_RETURN(p->ws_ids_, device.Allocate(2 * T + Tl, DType::kI32));
  Carver cc(p->ws_compute_.tensor()), cs(p->ws_stats_.tensor()), ci(p->ws_ids_.tensor());
  p->gathered_ = cc.Take(T * h);
  p->partial_ = cc.Take(T * h);
  p->reduced_ = cc.Take(Tl * h);
  p->dqkv_ = cc.Take(T * s.qkv_cols);
  p->do_ = cc.Take(T * s.q_cols);
  p->dh1_ = cc.Take(T * widest_fc1);
  p->da1_ = cc.Take(T * widest_ffn);
  p->dx1_ = cc.Take(Tl * h);
  p->dtmp_ = cc.Take(Tl * h);
  p->grad_a_ = cc.Take(Tl * h);
  p->grad_b_ = cc.Take(Tl * h);
  // Never needed together: the output a recomputed layer rebuilds in backward, the position
  // embedding in the first stage's forward, the last stage's output in its forward.
  p->last_out_ = cc.Take(Tl * h);
  p->scratch_ = p->last_out_;
  p->forward_out_ = cc.Take(Tl * h);
  p->backward_out_ = cc.Take(Tl * h);
  if (last_rank) {
    p->logits_ = cc.Take(T * s.vocab_shard);
    p->yf_ = cc.Take(Tl * h);
  }
  p->rstdf_ = cs.Take(Tl);
  p->meanf_ = cs.Take(Tl);
  p->row_max_ = cs.Take(T);
  p->ce_partials_ = cs.Take(2 * T);
  p->loss_ = cs.Take(T);
  p->dloss_ = cs.Take(T);
  p->ids_ = ci.Take(T);
  p->targets_ = ci.Take(T);
  p->positions_ = ci.Take(Tl);
  AUTOPAR_RETURN_IF_ERROR(device.Fill(p->dloss_, static_cast<float>(1.0 / data.tokens_per_step)));
  p->slot_of_.assign(data.samples_per_replica / s.mbs, std::vector<int>(s.vpp, -1));
  if (s.cp > 1 || s.up > 1) {
    AUTOPAR_ASSIGN_OR_RETURN(p->context_, ContextAttention::Create(device, s, g));
  }
  if (s.experts > 0) {
    AUTOPAR_ASSIGN_OR_RETURN(p->moe_, MoeLayer::Create(device, s, g, data.tokens_per_step / s.seq));
  }
  return p;
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
  const int64_t first_sample = g_.at.dp * data_.samples_per_replica + int64_t{microbatch} * s_.mbs;
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
  const backend::EmbeddingDesc word{s_.tokens, s_.hidden, s_.vocab_shard, s_.vocab_start};
  AUTOPAR_RETURN_IF_ERROR(dev_.EmbeddingForward(word, w_.word_embedding, ids_, partial_));
  AUTOPAR_RETURN_IF_ERROR(ReduceRows(partial_, x));
  if (!s_.learned_positions) return OkStatus();
  const backend::EmbeddingDesc pos{s_.local_tokens, s_.hidden, s_.max_positions, 0};
  AUTOPAR_RETURN_IF_ERROR(dev_.EmbeddingForward(pos, w_.positions, positions_, scratch_));
  return dev_.Add(x, scratch_, x);
}

Status StageProgram::EmbedBackward(int microbatch, Tensor dx) {
  AUTOPAR_RETURN_IF_ERROR(LoadTokens(microbatch));
  if (s_.learned_positions) {
    const backend::EmbeddingDesc pos{s_.local_tokens, s_.hidden, s_.max_positions, 0};
    AUTOPAR_RETURN_IF_ERROR(dev_.EmbeddingBackward(pos, dx, positions_, w_.d_positions));
  }
  AUTOPAR_ASSIGN_OR_RETURN(Tensor full, GatherRows(dx, gathered_));
  const backend::EmbeddingDesc word{s_.tokens, s_.hidden, s_.vocab_shard, s_.vocab_start};
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
  const backend::CrossEntropyDesc ce{T, V, s_.vocab_start};
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
  if (free_slots_.empty()) {
    return Status(Outcome::kInvalid, "trial: more micro-batches in flight than slots");
  }
  const int slot_index = free_slots_.back();
  free_slots_.pop_back();
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
    const LayerActs& acts = recomputed ? work_ : slot.layers[j];
    MoeActs& moe = recomputed ? work_moe_ : slot.moe[j];
    AUTOPAR_RETURN_IF_ERROR(w_.AwaitParams(g_, w_.LayerUnit(chunk, static_cast<int64_t>(j))));
    AUTOPAR_RETURN_IF_ERROR(LayerForward(weights.layers[j], acts, moe, x, next, true));
    x = next;
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
    LayerActs acts = slot.layers[j];
    MoeActs* moe = &slot.moe[j];
    if (Recomputed(static_cast<int>(j))) {
      // Full recompute: rebuild this layer's activations from its saved input.
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
  free_slots_.push_back(slot_index);
  slot_of_[microbatch][chunk] = -1;
  if (links.prev_rank < 0) {
    AUTOPAR_RETURN_IF_ERROR(EmbedBackward(microbatch, dout));
    return w_.GradsReady(g_, w_.EmbeddingUnit());
  }
  return dev_.Copy(backward_out_, dout);  // sent in the exchange after this op
}

Status StageProgram::Exchange(std::span<const PipelineTransfer> transfers) {
  // A step sends and receives at most a forward's and a backward's tensor each.
  backend::P2POp ops[4];
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
      if (free_slots_.empty()) {
        return Status(Outcome::kInvalid, "trial: more micro-batches in flight than slots");
      }
      buf = slots_[free_slots_.back()].layers[0].x;
    }
    ops[n++] = {t.kind == PipelineTransfer::kSend ? backend::P2POp::kSend : backend::P2POp::kRecv,
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
