// The pieces the cost model builds a pipeline stage from (docs/models.md §4.4): the cost of one
// layer of each kind, and which layers a stage holds. Internal to src/perf.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

#include "autopar/perf/cost_model.h"
#include "autopar/space/config.h"
#include "autopar/spec/model.h"

namespace autopar {

using FeatureTimes = std::array<double, kNumFeatures>;

inline void AddScaled(FeatureTimes& to, const FeatureTimes& x, double scale) {
  for (int k = 0; k < kNumFeatures; ++k) to[k] += scale * x[k];
}
inline double Sum(const FeatureTimes& x) {
  double s = 0;
  for (double v : x) s += v;
  return s;
}

// Component times of one transformer layer (or a stage) for one micro-batch on one rank.
struct LayerCost {
  FeatureTimes fwd{};
  FeatureTimes bwd{};
  double forward() const { return Sum(fwd); }
  double backward() const { return Sum(bwd); }
  void Add(const LayerCost& x, double times) {
    AddScaled(fwd, x.fwd, times);
    AddScaled(bwd, x.bwd, times);
  }
};

// Real-rank strides of the expert groups. The expert grid orders a pipeline stage's ranks as tp,
// then the (cp, dp) block (at rank stride tp·up), then up (at stride tp): etp takes consecutive
// positions, ep every etp-th, edp every (etp·ep)-th (docs/architecture.md §3). A group of n at
// position stride σ lies in one tp group while σ·n ≤ tp (stride σ), spans (cp, dp) positions up
// to σ·n = tp·cp·dp (stride σ·up) and beyond that every up slice too (stride σ: it covers the
// stage's ranks). At etp = tp these are the tp, cp and tp·ep strides of the earlier model.
struct ExpertStrides {
  int64_t etp, ep, edp;
};
inline ExpertStrides ExpertGroupStrides(const ParallelConfig& c) {
  const int64_t tp = c.tp, block = tp * c.cp * c.dp;
  auto stride = [&](int64_t sigma, int64_t n) {
    const int64_t span = sigma * n;
    return span <= tp ? sigma : span <= block ? sigma * c.up : sigma;
  };
  const int64_t etp = c.expert_tp();
  return {stride(1, etp), stride(etp, c.ep), stride(etp * c.ep, c.expert_dp())};
}

// What one layer's time is computed from (CostModel::ShapeOf): the per-rank sizes of a
// configuration and the strides of its groups. t, s, h, a: tp, sequence, hidden, heads; tokens
// per rank and micro-batch; hbm the reachable HBM bandwidth; tp_heads and tp_kv the query and kv
// heads per tp rank; et the expert tp size and gathered the expert rows' share (et/t).
struct LayerShape {
  double t = 1, s = 0, h = 0, a = 0, tokens = 0, hbm = 0;
  int64_t up_stride = 1, cp_stride = 1;
  ExpertStrides ex{};
  double et = 1, gathered = 1;
  double qk_dim = 0, v_dim = 0, kv_heads = 0, tp_heads = 0, tp_kv = 0;
  double one_expert = 0, window_share = 1;
  // AttentionShapeFactor of a full and of a windowed layer's attention kernels.
  double attention_shape = 1, attention_shape_windowed = 1;
};

// The layers of [first, first + count) by kind: dense or MoE (the MoE ones follow the first
// moe_first_dense_layers), full or sliding-window attention (ModelSpec::is_windowed_layer).
struct LayerMix {
  int64_t dense = 0, moe = 0, dense_windowed = 0, moe_windowed = 0;
  int64_t dense_total() const { return dense + dense_windowed; }
  int64_t moe_total() const { return moe + moe_windowed; }
};
inline LayerMix MixOf(const ModelSpec& m, int64_t first, int64_t count) {
  const int64_t end = first + count;
  const int64_t dense_end = std::clamp(m.num_layers - m.num_moe_layers(), first, end);
  LayerMix mix;
  mix.dense_windowed = m.num_windowed_layers(first, dense_end - first);
  mix.moe_windowed = m.num_windowed_layers(dense_end, end - dense_end);
  mix.dense = dense_end - first - mix.dense_windowed;
  mix.moe = end - dense_end - mix.moe_windowed;
  return mix;
}

// One layer of each kind, and the last stage's own work: the logits and the loss (and with
// multi-token prediction, each module's projection, logits and loss; its layer is `mtp_layer`).
struct StageTimeParts {
  LayerCost dense, moe, dense_windowed, moe_windowed;
  LayerCost last_extra;
  const LayerCost& mtp_layer(const ModelSpec& m) const { return m.is_moe() ? moe : dense; }
  void AddMix(LayerCost& to, const LayerMix& x) const {
    to.Add(dense, static_cast<double>(x.dense));
    to.Add(moe, static_cast<double>(x.moe));
    to.Add(dense_windowed, static_cast<double>(x.dense_windowed));
    to.Add(moe_windowed, static_cast<double>(x.moe_windowed));
  }
};

// What the stages of a configuration come to (CostModel::SummarizeStages): the slowest stage's
// cost (which paces the pipeline), its share of recomputed layers and its FP8-cast weights, and
// the parameters and gradient reduction of the stage whose reduction takes longest (with
// fp8_param_gather, the FP8 ones among them).
struct StageSummary {
  LayerCost slowest;
  double recompute_share = 0, fp8_weights = 0;
  double dense_params = 0, expert_params = 0, grad_time = -1;
  double fp8_dense_params = 0, fp8_expert_params = 0;
  bool embedding_copy = false;  // a tied (or MTP-read) embedding duplicated on the last stage
};

// One layer's activation bytes for one micro-batch on one rank (CostModel::LayerBytesOf,
// docs/models.md §3): what a dense, a MoE and an MTP layer keep for backward, their working sets
// without the routed experts (ws), a MoE backward's transient buffers, the sequence-split
// attention's workspaces, and the layer input full recompute keeps instead.
struct LayerBytes {
  double tokens = 0;
  double dense = 0, moe = 0, mtp = 0, dense_ws = 0, moe_ws = 0;
  double moe_transient = 0, context_ws = 0, layer_input = 0;
  // What selective recompute's modules rebuild in one layer's backward (beside its working set).
  double dense_rerun = 0, moe_rerun = 0;
};

// A stage's layers as the model sees them: all its chunks' layers by kind, the ones block
// recompute reruns (the first recompute_layers of every chunk, all with 0), and the layers per
// chunk.
struct StageLayout {
  LayerMix all, recomputed;
  int64_t per_chunk = 0;
  int64_t layers() const { return all.dense_total() + all.moe_total(); }
};
// `before` is the layers per chunk of the stages before `stage` (Σ StageLayers / vpp), so that
// chunk k starts at k·num_layers/vpp + before (ChunkFirstLayer, without its loop). With the
// embedding and the loss counted in the split (split_embedding, split_loss) the first and the
// last chunk are a layer short: ChunkLayers and ChunkFirstLayer place each chunk.
inline StageLayout LayoutOf(const ModelSpec& m, const ParallelConfig& c, int64_t stage,
                            int64_t before) {
  StageLayout out;
  out.per_chunk = StageLayers(c, m.num_layers, stage) / c.vpp;
  const bool counted = c.split_embedding || c.split_loss;
  auto add = [](LayerMix& to, const LayerMix& x) {
    to.dense += x.dense;
    to.moe += x.moe;
    to.dense_windowed += x.dense_windowed;
    to.moe_windowed += x.moe_windowed;
  };
  for (int64_t k = 0; k < c.vpp; ++k) {
    const int64_t layers = counted ? ChunkLayers(c, m.num_layers, stage, k) : out.per_chunk;
    const int64_t first =
        counted ? ChunkFirstLayer(c, m.num_layers, stage, k) : k * (m.num_layers / c.vpp) + before;
    const int64_t rerun = c.recompute != Recompute::kFull ? 0
                          : c.recompute_layers == 0       ? layers
                                                    : std::min<int64_t>(c.recompute_layers, layers);
    add(out.all, MixOf(m, first, layers));
    add(out.recomputed, MixOf(m, first, rerun));
  }
  return out;
}

}  // namespace autopar
