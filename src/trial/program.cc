#include "src/trial/program.h"

#include "kernels/init.h"

namespace autopar::trial {
namespace {

using backend::AttentionDesc;
using backend::DType;
using backend::GemmDesc;
using backend::OkStatus;
using backend::Outcome;

constexpr int kSendBuffers = 2;  // per program: sends in flight before the oldest must finish

// Row-major y[m, n] (+)= x[m, k] · W[n, k]ᵀ: a linear layer with PyTorch's [out, in] weight.
GemmDesc Linear(int64_t m, int64_t n, int64_t k, float beta = 0) {
  GemmDesc d;
  d.trans_b = true;
  d.m = m;
  d.n = n;
  d.k = k;
  d.beta = beta;
  return d;
}
// dx[m, k] = dy[m, n] · W[n, k].
GemmDesc LinearInputGrad(int64_t m, int64_t n, int64_t k) {
  GemmDesc d;
  d.m = m;
  d.n = k;
  d.k = n;
  return d;
}
// dW[n, k] += dy[m, n]ᵀ · x[m, k].
GemmDesc LinearWeightGrad(int64_t m, int64_t n, int64_t k) {
  GemmDesc d;
  d.trans_a = true;
  d.m = n;
  d.n = k;
  d.k = m;
  d.beta = 1;
  return d;
}

// Carves consecutive views out of a buffer; without a buffer it only measures.
class Carver {
 public:
  Carver() = default;
  explicit Carver(Tensor base) : base_(base), measure_(false) {}
  Tensor Take(int64_t numel) {
    const Tensor t = measure_ ? Tensor{} : base_.Slice(used_, numel);
    used_ += numel;
    return t;
  }
  int64_t used() const { return used_; }

 private:
  Tensor base_;
  bool measure_ = true;
  int64_t used_ = 0;
};

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

  // One layer's activations, in elements of the compute dtype and of f32.
  auto carve_layer = [&](Carver& cc, Carver& cs, bool full, LayerActs& a) {
    a.x = cc.Take(Tl * h);
    if (!full) return;
    a.y1 = cc.Take(Tl * h);
    a.qkv = cc.Take(T * s.qkv_cols);
    a.o = cc.Take(T * s.q_cols);
    a.x1 = cc.Take(Tl * h);
    a.y2 = cc.Take(Tl * h);
    a.h1 = cc.Take(T * s.fc1_cols);
    a.a1 = cc.Take(T * s.ffn);
    a.rstd1 = cs.Take(Tl);
    a.rstd2 = cs.Take(Tl);
    if (layernorm) {
      a.mean1 = cs.Take(Tl);
      a.mean2 = cs.Take(Tl);
    }
    if (keep_lse) a.lse = cs.Take(T * s.heads);
  };
  // Measure a slot, then allocate and carve for real.
  auto carve_slot = [&](Carver cc, Carver cs, Slot& slot) {
    slot.layers.resize(s.layers_per_chunk);
    for (int64_t j = 0; j < s.layers_per_chunk; ++j) {
      carve_layer(cc, cs, !p->Recomputed(static_cast<int>(j)), slot.layers[j]);
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
    AUTOPAR_ASSIGN_OR_RETURN(slot.stats, device.Allocate(std::max<int64_t>(slot_stats, 1), DType::kF32));
    carve_slot(Carver(slot.compute.tensor()), Carver(slot.stats.tensor()), slot);
    p->free_slots_.push_back(slots - 1 - i);
  }

  // The one-layer work area: the activations a fully recomputed layer rebuilds, or the attention
  // output and statistics selective recompute runs again.
  if (c.recompute == Recompute::kFull) {
    Carver cc, cs;
    LayerActs tmp;
    carve_layer(cc, cs, true, tmp);
    AUTOPAR_ASSIGN_OR_RETURN(p->work_compute_, device.Allocate(cc.used(), compute));
    AUTOPAR_ASSIGN_OR_RETURN(p->work_stats_, device.Allocate(cs.used() + T * s.heads, DType::kF32));
    Carver wc(p->work_compute_.tensor()), ws(p->work_stats_.tensor());
    carve_layer(wc, ws, true, p->work_);
    if (p->work_.lse.numel == 0) p->work_.lse = ws.Take(T * s.heads);
  } else if (c.recompute == Recompute::kSelective) {
    AUTOPAR_ASSIGN_OR_RETURN(p->work_compute_, device.Allocate(T * s.q_cols, compute));
    AUTOPAR_ASSIGN_OR_RETURN(p->work_stats_, device.Allocate(T * s.heads, DType::kF32));
    p->work_.o = p->work_compute_.tensor();
    p->work_.lse = p->work_stats_.tensor();
  }

  // Workspaces of the backward pass and the loss.
  const int64_t compute_ws = 2 * T * h + Tl * h + T * s.qkv_cols + T * s.q_cols +
                             T * s.fc1_cols + T * s.ffn + 5 * Tl * h + kSendBuffers * Tl * h +
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
  p->dh1_ = cc.Take(T * s.fc1_cols);
  p->da1_ = cc.Take(T * s.ffn);
  p->dx1_ = cc.Take(Tl * h);
  p->dtmp_ = cc.Take(Tl * h);
  p->grad_a_ = cc.Take(Tl * h);
  p->grad_b_ = cc.Take(Tl * h);
  // Never needed together: the output a recomputed layer rebuilds in backward, the position
  // embedding in the first stage's forward, the last stage's output in its forward.
  p->last_out_ = cc.Take(Tl * h);
  p->scratch_ = p->last_out_;
  for (int i = 0; i < kSendBuffers; ++i) p->sends_.push_back({cc.Take(Tl * h), nullptr});
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

// ---- building blocks ----

Status StageProgram::Norm(Tensor gamma, Tensor beta, Tensor x, Tensor y, Tensor rstd,
                          Tensor mean) {
  const backend::NormDesc d{s_.local_tokens, s_.hidden, 1e-5f};
  if (s_.rmsnorm) return dev_.RmsNormForward(d, x, gamma, y, rstd);
  return dev_.LayerNormForward(d, x, gamma, beta, y, mean, rstd);
}

Status StageProgram::NormBackward(Tensor gamma, Tensor dgamma, Tensor dbeta, Tensor dy, Tensor x,
                                  Tensor rstd, Tensor mean, Tensor dx) {
  const backend::NormDesc d{s_.local_tokens, s_.hidden, 1e-5f};
  if (s_.rmsnorm) return dev_.RmsNormBackward(d, dy, x, gamma, rstd, dx, dgamma);
  return dev_.LayerNormBackward(d, dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
}

// With SP the tensor-parallel region starts with an all-gather of the sequence shards;
// without it every tp rank already holds all rows.
StatusOr<Tensor> StageProgram::GatherRows(Tensor local, Tensor full) {
  if (!s_.sp) return local;
  AUTOPAR_RETURN_IF_ERROR(g_.tp.AllGather(local, full));
  return full;
}

// ...and ends with a reduce-scatter (SP) or an all-reduce of the row-parallel partial sums.
Status StageProgram::ReduceRows(Tensor partial, Tensor local_out) {
  if (s_.sp) return g_.tp.ReduceScatter(partial, local_out);
  AUTOPAR_RETURN_IF_ERROR(g_.tp.AllReduce(partial));
  return dev_.Copy(local_out, partial);
}

Status StageProgram::Rope(Tensor qkv, bool backward) {
  if (!s_.rope) return OkStatus();
  backend::RopeDesc d;
  d.seq = s_.seq;
  d.batch = s_.mbs;
  d.head_dim = s_.head_dim;
  d.row_stride = s_.qkv_cols;
  const Tensor q = qkv.Slice(0, qkv.numel);
  const Tensor k = qkv.Slice(s_.q_cols, qkv.numel - s_.q_cols);
  for (auto [part, heads] : {std::pair{q, s_.heads}, std::pair{k, s_.kv_heads}}) {
    d.heads = heads;
    AUTOPAR_RETURN_IF_ERROR(backward ? dev_.RopeBackward(d, part, part)
                                     : dev_.RopeForward(d, part, part));
  }
  return OkStatus();
}

// Token ids and targets of a micro-batch: a pure function of the data seed and the global
// sample and position, so every layout of the job sees the same data.
Status StageProgram::LoadTokens(int microbatch) {
  if (loaded_microbatch_ == microbatch) return OkStatus();
  const int64_t T = s_.tokens;
  std::vector<int32_t> ids(T), targets(T), positions(s_.local_tokens);
  const int64_t first_sample = g_.at.dp * data_.samples_per_replica + int64_t{microbatch} * s_.mbs;
  for (int64_t pos = 0; pos < s_.seq; ++pos) {
    for (int64_t b = 0; b < s_.mbs; ++b) {
      const uint64_t base = static_cast<uint64_t>(first_sample + b) * (s_.seq + 1) + pos;
      auto token = [&](uint64_t i) {
        return static_cast<int32_t>(kernels::ref::SplitMix64(data_.seed ^ (i * 0x2545F4914F6CDD1Dull)) %
                                    static_cast<uint64_t>(s_.vocab));
      };
      ids[pos * s_.mbs + b] = token(base);
      targets[pos * s_.mbs + b] = token(base + 1);  // the next token of the same sequence
    }
  }
  const int64_t first_row = s_.sp ? g_.at.tp * s_.local_tokens : 0;
  for (int64_t r = 0; r < s_.local_tokens; ++r) {
    positions[r] = static_cast<int32_t>((first_row + r) / s_.mbs);
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

// ---- one transformer layer ----

Status StageProgram::LayerForward(const LayerWeights& w, const LayerActs& a, Tensor x, Tensor out) {
  const int64_t T = s_.tokens, h = s_.hidden;
  // Attention block: x1 = x + proj(attention(rope(qkv(norm1(x))))).
  AUTOPAR_RETURN_IF_ERROR(Norm(w.norm1, w.norm1_bias, x, a.y1, a.rstd1, a.mean1));
  AUTOPAR_ASSIGN_OR_RETURN(Tensor y1, GatherRows(a.y1, gathered_));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(Linear(T, s_.qkv_cols, h), y1, w.qkv, a.qkv));
  AUTOPAR_RETURN_IF_ERROR(Rope(a.qkv, false));
  AttentionDesc att;
  att.batch = s_.mbs;
  att.heads_q = s_.heads;
  att.heads_kv = s_.kv_heads;
  att.head_dim = s_.head_dim;
  att.seq_q = att.seq_kv = s_.seq;
  att.q_stride = att.kv_stride = s_.qkv_cols;
  const int64_t n = a.qkv.numel;
  const Tensor lse = a.lse.numel > 0 ? a.lse : work_.lse;
  AUTOPAR_RETURN_IF_ERROR(dev_.AttentionForward(att, a.qkv.Slice(0, n),
                                                a.qkv.Slice(s_.q_cols, n - s_.q_cols),
                                                a.qkv.Slice(s_.q_cols + s_.kv_cols,
                                                            n - s_.q_cols - s_.kv_cols),
                                                a.o, lse));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(Linear(T, h, s_.q_cols), a.o, w.proj, partial_));
  AUTOPAR_RETURN_IF_ERROR(ReduceRows(partial_, reduced_));
  AUTOPAR_RETURN_IF_ERROR(dev_.Add(x, reduced_, a.x1));
  // MLP block: out = x1 + fc2(act(fc1(norm2(x1)))).
  AUTOPAR_RETURN_IF_ERROR(Norm(w.norm2, w.norm2_bias, a.x1, a.y2, a.rstd2, a.mean2));
  AUTOPAR_ASSIGN_OR_RETURN(Tensor y2, GatherRows(a.y2, gathered_));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(Linear(T, s_.fc1_cols, h), y2, w.fc1, a.h1));
  AUTOPAR_RETURN_IF_ERROR(s_.swiglu ? dev_.SwiGluForward(T, s_.ffn, a.h1, a.a1)
                                    : dev_.GeluForward(a.h1, a.a1));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(Linear(T, h, s_.ffn), a.a1, w.fc2, partial_));
  AUTOPAR_RETURN_IF_ERROR(ReduceRows(partial_, reduced_));
  return dev_.Add(a.x1, reduced_, out);
}

Status StageProgram::LayerBackward(const LayerWeights& w, const LayerActs& a, Tensor dout,
                                   Tensor dx) {
  const int64_t T = s_.tokens, h = s_.hidden;
  // MLP block. The backward of a reduce-scatter is an all-gather (and of an all-reduce, nothing).
  AUTOPAR_ASSIGN_OR_RETURN(Tensor d_partial, GatherRows(dout, gathered_));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearWeightGrad(T, h, s_.ffn), d_partial, a.a1, w.d_fc2));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearInputGrad(T, h, s_.ffn), d_partial, w.fc2, da1_));
  AUTOPAR_RETURN_IF_ERROR(s_.swiglu ? dev_.SwiGluBackward(T, s_.ffn, da1_, a.h1, dh1_)
                                    : dev_.GeluBackward(da1_, a.h1, dh1_));
  AUTOPAR_ASSIGN_OR_RETURN(Tensor y2, GatherRows(a.y2, gathered_));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearWeightGrad(T, s_.fc1_cols, h), dh1_, y2, w.d_fc1));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearInputGrad(T, s_.fc1_cols, h), dh1_, w.fc1, partial_));
  AUTOPAR_RETURN_IF_ERROR(ReduceRows(partial_, reduced_));
  AUTOPAR_RETURN_IF_ERROR(NormBackward(w.norm2, w.d_norm2, w.d_norm2_bias, reduced_, a.x1,
                                       a.rstd2, a.mean2, dx1_));
  AUTOPAR_RETURN_IF_ERROR(dev_.Add(dx1_, dout, dx1_));  // the residual path

  // Attention block.
  AUTOPAR_ASSIGN_OR_RETURN(d_partial, GatherRows(dx1_, gathered_));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearWeightGrad(T, h, s_.q_cols), d_partial, a.o, w.d_proj));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearInputGrad(T, h, s_.q_cols), d_partial, w.proj, do_));
  AttentionDesc att;
  att.batch = s_.mbs;
  att.heads_q = s_.heads;
  att.heads_kv = s_.kv_heads;
  att.head_dim = s_.head_dim;
  att.seq_q = att.seq_kv = s_.seq;
  att.q_stride = att.kv_stride = s_.qkv_cols;
  const int64_t n = a.qkv.numel;
  const Tensor q = a.qkv.Slice(0, n), k = a.qkv.Slice(s_.q_cols, n - s_.q_cols),
               v = a.qkv.Slice(s_.q_cols + s_.kv_cols, n - s_.q_cols - s_.kv_cols);
  Tensor lse = a.lse;
  if (lse.numel == 0) {
    // Selective recompute kept q, k, v but not the softmax statistics: run attention again.
    AUTOPAR_RETURN_IF_ERROR(dev_.AttentionForward(att, q, k, v, work_.o, work_.lse));
    lse = work_.lse;
  }
  const int64_t dn = dqkv_.numel;
  AUTOPAR_RETURN_IF_ERROR(dev_.AttentionBackward(
      att, q, k, v, a.o, do_, lse, dqkv_.Slice(0, dn), dqkv_.Slice(s_.q_cols, dn - s_.q_cols),
      dqkv_.Slice(s_.q_cols + s_.kv_cols, dn - s_.q_cols - s_.kv_cols), false));
  AUTOPAR_RETURN_IF_ERROR(Rope(dqkv_, true));
  AUTOPAR_ASSIGN_OR_RETURN(Tensor y1, GatherRows(a.y1, gathered_));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearWeightGrad(T, s_.qkv_cols, h), dqkv_, y1, w.d_qkv));
  AUTOPAR_RETURN_IF_ERROR(dev_.Gemm(LinearInputGrad(T, s_.qkv_cols, h), dqkv_, w.qkv, partial_));
  AUTOPAR_RETURN_IF_ERROR(ReduceRows(partial_, reduced_));
  AUTOPAR_RETURN_IF_ERROR(NormBackward(w.norm1, w.d_norm1, w.d_norm1_bias, reduced_, a.x,
                                       a.rstd1, a.mean1, dx));
  return dev_.Add(dx, dx1_, dx);
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
  const int stage = chunk * static_cast<int>(s_.pp) + g_.at.pp;
  const ChunkWeights& weights = w_.chunks[chunk];
  Tensor x = slot.layers[0].x;
  if (links.prev_rank < 0) {
    AUTOPAR_RETURN_IF_ERROR(Embed(microbatch, x));
  } else {
    AUTOPAR_RETURN_IF_ERROR(g_.pp.Recv(x, links.prev_rank, Tag(microbatch, stage, false)));
  }
  SendBuffer* send = nullptr;
  Tensor out;
  if (links.next_rank < 0) {
    out = last_out_;
  } else {
    send = &sends_[next_send_++ % sends_.size()];
    AUTOPAR_RETURN_IF_ERROR(g_.pp.Wait(send->pending));
    out = send->buf;
  }
  for (size_t j = 0; j < weights.layers.size(); ++j) {
    const Tensor next = j + 1 < weights.layers.size() ? slot.layers[j + 1].x : out;
    const LayerActs& acts = Recomputed(static_cast<int>(j)) ? work_ : slot.layers[j];
    AUTOPAR_RETURN_IF_ERROR(LayerForward(weights.layers[j], acts, x, next));
    x = next;
  }
  if (send == nullptr) return HeadForwardBackward(microbatch, out, slot.dlast);
  return g_.pp.Send(out, links.next_rank, Tag(microbatch, stage + 1, false), send->pending);
}

Status StageProgram::Backward(int microbatch, int chunk) {
  const int slot_index = slot_of_[microbatch][chunk];
  if (slot_index < 0) return Status(Outcome::kInvalid, "trial: backward before forward");
  Slot& slot = slots_[slot_index];
  const StageLinks links = LinksOf(s_.pp, s_.vpp, g_.at.pp, chunk);
  const int stage = chunk * static_cast<int>(s_.pp) + g_.at.pp;
  const ChunkWeights& weights = w_.chunks[chunk];
  Tensor dout = grad_a_, dx = grad_b_;
  if (links.next_rank < 0) {
    AUTOPAR_RETURN_IF_ERROR(dev_.Copy(dout, slot.dlast));
  } else {
    AUTOPAR_RETURN_IF_ERROR(g_.pp.Recv(dout, links.next_rank, Tag(microbatch, stage, true)));
  }
  for (size_t j = weights.layers.size(); j-- > 0;) {
    LayerActs acts = slot.layers[j];
    if (Recomputed(static_cast<int>(j))) {
      // Full recompute: rebuild this layer's activations from its saved input.
      AUTOPAR_RETURN_IF_ERROR(LayerForward(weights.layers[j], work_, slot.layers[j].x, scratch_));
      acts = work_;
      acts.x = slot.layers[j].x;
    }
    AUTOPAR_RETURN_IF_ERROR(LayerBackward(weights.layers[j], acts, dout, dx));
    std::swap(dout, dx);
  }
  free_slots_.push_back(slot_index);
  slot_of_[microbatch][chunk] = -1;
  if (links.prev_rank < 0) return EmbedBackward(microbatch, dout);
  SendBuffer& send = sends_[next_send_++ % sends_.size()];
  AUTOPAR_RETURN_IF_ERROR(g_.pp.Wait(send.pending));
  AUTOPAR_RETURN_IF_ERROR(dev_.Copy(send.buf, dout));
  return g_.pp.Send(send.buf, links.prev_rank, Tag(microbatch, stage - 1, true), send.pending);
}

Status StageProgram::FlushSends() {
  for (SendBuffer& send : sends_) AUTOPAR_RETURN_IF_ERROR(g_.pp.Wait(send.pending));
  return OkStatus();
}

double StageProgram::TakeLossSum() {
  const double sum = loss_sum_;
  loss_sum_ = 0;
  return sum;
}

}  // namespace autopar::trial
