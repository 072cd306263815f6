// The per-rank step program of a configuration: embedding, transformer layers, loss and their
// backward passes over this rank's model chunks, with the tensor-parallel collectives, the
// sequence-split attention (context_attention.h), the expert-parallel MoE layers (moe.h) and the
// pipeline send/recv of each micro-batch.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "autopar/trial/schedule.h"
#include "src/trial/carver.h"
#include "src/trial/context_attention.h"
#include "src/trial/moe.h"
#include "src/trial/shard.h"

namespace autopar::trial {

// Activations one layer keeps for its backward pass. Fully recomputed layers keep only `x` in
// their slot and rebuild the rest in the program's one-layer work area; under selective recompute
// the outputs of the modules it reruns (the norms' y1 and y2, the dense MLP part's h1 and a1)
// live in the work area too, and are rebuilt there before their backward (ActsOf).
struct LayerActs {
  Tensor x;               // layer input [Tl, h]
  Tensor y1, x1, y2;      // norm1 out, attention residual out, norm2 out [Tl, h]
  Tensor qkv, o, h1, a1;  // [T, qkv], [T, q], [T, fc1], [T, ffn] (MLP or shared experts)
  Tensor rstd1, mean1, rstd2, mean2;  // f32 [Tl]
  Tensor lse;                         // f32 [T, heads]; empty when core_attn is recomputed
  // qk-layernorm (Shapes::qk_norm): the projection's q and k columns before the norm [T, q + kv]
  // and the norm's statistics, f32 [T, heads + kv_heads]; empty without it.
  Tensor qk_x, qk_rstd, qk_mean;
  // With Ulysses, qkv is the all-to-all's result [T·up, ul_cols] and o_ul the attention output
  // before the all-to-all back [T·up, ul_heads·d] (empty under selective recompute).
  Tensor o_ul;
  // Hidden dropout's masks (u8 [Tl, h]) of the attention and the MLP block's outputs; empty
  // without dropout.
  Tensor drop1, drop2;
};

struct DataSpec {
  uint64_t seed = 0;
  int64_t samples_per_replica = 0;  // global batch / dp
  double tokens_per_step = 0;       // the loss is the mean over these
  float hidden_dropout = 0;         // TrialOptions::hidden_dropout
  bool moe_force_load_balancing = false;  // TrialOptions::moe_force_load_balancing
};

class StageProgram {
 public:
  // Allocates the activation slots (`slots`: how many of each size, SlotsBySize) and the work
  // areas. kOom when they do not fit.
  static StatusOr<std::unique_ptr<StageProgram>> Create(Device& device, const Shapes& s,
                                                        const ParallelConfig& c, ProcessGroups& g,
                                                        ModelShard& w, const DataSpec& data,
                                                        const std::map<int64_t, int>& slots);

  // A pass of a micro-batch through a model chunk. Its input from another stage must have arrived
  // by the exchange before it, and its output leaves in the exchange after it.
  Status Forward(int microbatch, int chunk);
  Status Backward(int microbatch, int chunk);
  // One group of pipeline transfers (PipelineExchanges), waited for: sends the previous op's
  // output and receives the next op's input into the place that op reads it from.
  Status Exchange(std::span<const PipelineTransfer> transfers);
  // Sum of the token losses computed since the last call (last stage only; 0 elsewhere).
  double TakeLossSum();
  // The MoE load-balancing loss added since the last call (already divided by the samples).
  double TakeAuxLoss() { return moe_ ? moe_->TakeAuxLoss() : 0.0; }

 private:
  StageProgram(Device& d, const Shapes& s, const ParallelConfig& c, ProcessGroups& g, ModelShard& w,
               const DataSpec& data)
      : dev_(d), s_(s), c_(c), g_(g), w_(w), data_(data) {}

  struct Slot;
  // Set-up (Create): the activation slots, `slots` (how many of each size), each laid out for
  // layers whose dense MLP parts are `ffn_of` wide; the one-layer work area of recompute; the
  // backward pass's and the loss's workspaces. `widest_ffn`: the widest of this rank's layers.
  Status AllocateSlots(const std::map<int64_t, int>& slots, const std::vector<int64_t>& ffn_of);
  // `widest_ffn`: the widest dense MLP part of this rank's layers (full recompute rebuilds it);
  // `rerun_ffn`: the widest that selective recompute rebuilds.
  Status AllocateWorkArea(int64_t widest_ffn, int64_t rerun_ffn);
  Status AllocateWorkspaces(int64_t widest_ffn);
  // Carves one layer's activations (all of them when `full`, else the input alone) from `cc`
  // (compute dtype) and `cs` (f32); a slot's layers likewise, returning the elements it took of
  // each (default Carvers only measure).
  void CarveLayer(Carver& cc, Carver& cs, bool full, LayerActs& a, int64_t ffn) const;
  // A slot of `size` layers (0: a chunk of none keeps its input alone).
  std::pair<int64_t, int64_t> CarveSlot(Carver cc, Carver cs, Slot& slot, int64_t size,
                                        const std::vector<int64_t>& ffn_of) const;
  // With hidden dropout: the two masks of each of `layers` that keeps its activations (x1), from
  // one u8 allocation, `masks`.
  Status AllocateMasks(std::span<LayerActs> layers, Buffer& masks);
  // Hidden dropout of a block's output `y` into `out` = residual + dropped y (`mask` its mask,
  // `site` 1 attention, 2 MLP), or the plain residual add without dropout; and its backward,
  // the block's output gradient `dy` through the mask into `dx` (`dy` itself without dropout).
  Status BlockResidualAdd(Tensor y, Tensor residual, Tensor out, Tensor mask, int site);
  StatusOr<Tensor> BlockOutputGrad(Tensor dy, Tensor mask, Tensor dx);

  bool Recomputed(int layer_in_chunk) const;
  // Layer j of `slot` as its forward and backward passes see it: the slot's activations, with
  // those selective recompute rebuilds taken from the work area.
  LayerActs ActsOf(const Slot& slot, size_t j, bool moe) const;
  // Where a MoE layer keeps its routing and expert activations: the slot's, or (under moe
  // recompute) the work area's, rebuilt before its backward.
  MoeActs& MoeActsOf(Slot& slot, size_t j, bool moe);
  // Selective recompute's reruns before a layer's MLP backward: the MLP block's forward (mlp, or
  // moe), or a MoE layer's shared experts alone (shared_experts).
  Status RerunMlp(const LayerWeights& w, const LayerActs& a, MoeActs& moe);
  // `moe` holds a MoE layer's routing and expert activations; count_aux is false on a full
  // recompute's rerun so its load-balancing loss is counted once.
  Status LayerForward(const LayerWeights& w, const LayerActs& a, MoeActs& moe, Tensor x, Tensor out,
                      bool count_aux);
  Status LayerBackward(const LayerWeights& w, const LayerActs& a, MoeActs& moe, Tensor dout,
                       Tensor dx);
  Status AttentionForward(const LayerActs& a, Tensor qkv);
  Status AttentionBackward(const LayerActs& a);
  Status MlpForward(const LayerWeights& w, const LayerActs& a, MoeActs& moe, bool count_aux);
  // The dense MLP part (the MLP, or a MoE layer's shared experts) of the gathered rows y2 into
  // partial_ (zeros where the layer has none).
  Status DenseMlpForward(const LayerWeights& w, const LayerActs& a, Tensor y2);
  Status MlpBackward(const LayerWeights& w, const LayerActs& a, MoeActs& moe, Tensor dout);
  // The model's norm (Shapes::rmsnorm) over the hidden rows of this rank, or over `d`'s vectors.
  Status Norm(Tensor gamma, Tensor beta, Tensor x, Tensor y, Tensor rstd, Tensor mean);
  Status NormBackward(Tensor gamma, Tensor dgamma, Tensor dbeta, Tensor dy, Tensor x, Tensor rstd,
                      Tensor mean, Tensor dx);
  Status Norm(const device::NormDesc& d, Tensor gamma, Tensor beta, Tensor x, Tensor y, Tensor rstd,
              Tensor mean);
  Status NormBackward(const device::NormDesc& d, Tensor gamma, Tensor dgamma, Tensor dbeta,
                      Tensor dy, Tensor x, Tensor rstd, Tensor mean, Tensor dx);
  // qk-layernorm (Shapes::qk_norm; nothing without it) on the projection's output `qkv`, in place,
  // keeping its input in a.qk_x; and backward, in place on dqkv_.
  Status QkNormForward(const LayerWeights& w, const LayerActs& a, Tensor qkv);
  Status QkNormBackward(const LayerWeights& w, const LayerActs& a);
  // Sequence-parallel entry and exit of the tensor-parallel region.
  StatusOr<Tensor> GatherRows(Tensor local, Tensor full);
  Status ReduceRows(Tensor partial, Tensor local_out);
  // The backward of a column-parallel linear y = x·Wᵀ as Megatron runs it asynchronously: with
  // SP the input x (local rows) is gathered again while the input-gradient GEMM runs, and the
  // input gradient's all-reduce (reduce-scatter) into reduced_ while the weight-gradient GEMM
  // adds into dw. `dgrad` and `wgrad` are the linear's LinearInputGrad / LinearWeightGrad.
  Status ColumnParallelBackward(const device::GemmDesc& dgrad, const device::GemmDesc& wgrad,
                                Tensor dy, Tensor w, Tensor dw, Tensor x_local);
  Status Rope(Tensor qkv, bool backward);
  Status Embed(int microbatch, Tensor x);
  Status EmbedBackward(int microbatch, Tensor dx);
  Status HeadForwardBackward(int microbatch, Tensor x, Tensor dx);
  Status LoadTokens(int microbatch);
  int Tag(int microbatch, int receiving_stage, bool backward) const;

  Device& dev_;
  const Shapes s_;
  const ParallelConfig c_;
  ProcessGroups& g_;
  ModelShard& w_;
  const DataSpec data_;

  struct Slot {
    Buffer compute, stats, masks;
    std::vector<LayerActs> layers;
    std::vector<MoeActs> moe;  // per layer; allocated by the forward pass of a MoE layer
    Tensor dlast;              // gradient at the last layer's output (last stage)
  };
  std::vector<Slot> slots_;
  // The free slots by size; a chunk takes one of its own size (Shapes::chunk_layers).
  std::map<int64_t, std::vector<int>> free_slots_;
  std::vector<int>& FreeSlotsOf(int chunk) { return free_slots_[s_.chunk_layers[chunk]]; }
  std::vector<std::vector<int>> slot_of_;  // [microbatch][chunk] → slot, -1 when none
  Buffer work_compute_, work_stats_, work_masks_, ws_compute_, ws_stats_, ws_ids_;
  LayerActs work_;
  MoeActs work_moe_;
  Tensor work_rstd_, work_mean_;  // f32 [Tl]: the norm statistics a layernorm rerun writes
  std::unique_ptr<ContextAttention> context_;  // cp > 1 or up > 1
  std::unique_ptr<MoeLayer> moe_;              // MoE models
  Tensor gathered_, partial_, reduced_, dqkv_, do_, dh1_, da1_, dx1_, dtmp_, grad_a_, grad_b_;
  Tensor scratch_, last_out_, logits_, yf_, rstdf_, meanf_, row_max_, ce_partials_, loss_, dloss_;
  Tensor ids_, targets_, positions_;
  Tensor forward_out_, backward_out_;  // a stage's outputs until the exchange after their op
  int loaded_microbatch_ = -1;
  // The draws of the layer LayerForward (or a rerun) runs next (SetLayerDraws): hidden dropout's
  // seed, from the rank's coordinates, and the forced routing's logits (RandomLogits), from the
  // global layer and the micro-batch's samples alone. A recompute's rerun draws the same again.
  uint64_t dropout_seed_ = 0;
  RandomLogits random_logits_;
  void SetLayerDraws(int microbatch, int chunk, size_t layer_in_chunk);
  // The micro-batch's first sample in the global batch.
  int64_t FirstSample(int microbatch) const {
    return g_.at.dp * data_.samples_per_replica + int64_t{microbatch} * s_.mbs;
  }
  std::optional<RandomLogits> RoutingDraws() const;
  double loss_sum_ = 0;
};

}  // namespace autopar::trial
