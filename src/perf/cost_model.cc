#include "autopar/perf/cost_model.h"

#include <algorithm>
#include <cmath>

#include "autopar/spec/units.h"
#include "fp8.h"
#include "stages.h"

namespace autopar {
namespace {


}  // namespace

const char* FeatureName(int k) {
  static const char* const kNames[kNumFeatures] = {
      "gemm", "attention", "memory_bound", "tp_comm", "cp_comm",
      "ulysses_comm", "ep_comm", "pp_comm", "dp_comm", "optimizer"};
  return k >= 0 && k < kNumFeatures ? kNames[k] : "?";
}

CostModel::CostModel(const ModelSpec& model, const TrainSpec& train, const ClusterSpec& cluster,
                     const PerfConstants& constants)
    : model_(model), train_(train), cluster_(cluster), constants_(constants) {
  params_ = CountParams(model_);
  peak_flops_ = cluster_.gpu.PeakFlops(train_.precision);
  // FP8 training quantizes the GEMMs; attention stays in BF16 (Transformer Engine's recipes leave
  // fp8_dpa off, Megatron-LM's --fp8-dot-product-attention is opt-in).
  attention_peak_flops_ = cluster_.gpu.PeakFlops(
      train_.precision == Precision::kFP8 ? Precision::kBF16 : train_.precision);
  attention_law_ = AttentionShapeLawOf(cluster_.gpu.name);
  fp8_ = train_.precision == Precision::kFP8;
  const Fp8Traits fp8 = Fp8TraitsOf(cluster_.gpu.name);
  gemm_peak_flops_ = peak_flops_ * (fp8_ ? fp8.gemm_ratio : 1.0);
  fp8_transposed_copy_ = fp8_ && fp8.transposed_copy;
  grouped_gemm_tile_rows_ = GroupedGemmTileRows(cluster_.gpu.name);
  element_bytes_ = train_.precision == Precision::kFP32 ? 4 : 2;
  model_flops_per_step_ = ModelFlopsPerStep(model_, train_.global_batch_size, train_.seq_length);
}

// ---- collectives on the link a group crosses (docs/models.md §4.1) ----

// A group's members are ranks base + i·stride (i < n); the groups of one kind tile the world in
// aligned blocks of n·stride ranks. The NVLink domains tile it in aligned blocks of D ranks
// (ClusterSpec::NvlinkDomainGpus: a node, or 72 on an NVL72 rack), so every group stays in one
// domain exactly when its block divides D; otherwise some group straddles two domains and the
// collective, paced by its slowest hop, runs on the network.
bool CostModel::CrossesNodes(int64_t n, int64_t stride) const {
  const int64_t domain = cluster_.NvlinkDomainGpus();
  if (n <= 1 || domain >= cluster_.world_size()) return false;
  const int64_t span = n * stride;
  return span > domain || domain % span != 0;
}

// Members of a group that share one NVLink domain (the whole group when it stays in one).
int64_t CostModel::MembersPerDomain(int64_t n, int64_t stride) const {
  return std::clamp<int64_t>(cluster_.NvlinkDomainGpus() / std::max<int64_t>(stride, 1), 1, n);
}

double CostModel::BusBandwidth(int64_t n, int64_t stride) const {
  const GpuSpec& g = cluster_.gpu;
  const double intra = g.intra_node_bandwidth * constants_.eff.intra_node_bus;
  if (!CrossesNodes(n, stride)) return intra;
  // NCCL runs one ring per NIC: with k members of the group in a domain, their k NICs carry the
  // ring's traffic between domains in parallel, up to what NVLink can feed them.
  return std::min(
      intra, MembersPerDomain(n, stride) * g.inter_node_bandwidth * constants_.eff.inter_node_bus);
}

double CostModel::Latency(int64_t n, int64_t stride) const {
  return CrossesNodes(n, stride) ? cluster_.gpu.inter_node_latency_s
                                 : cluster_.gpu.intra_node_latency_s;
}

double CostModel::AllReduceTime(double bytes, int64_t n, int64_t stride) const {
  if (n <= 1) return 0;
  // Ring bandwidth term; NCCL switches to trees at scale, so latency grows with log n there.
  const double steps = std::min<double>(2.0 * (n - 1), 2.0 * std::ceil(std::log2(n)) + 2);
  return 2.0 * (n - 1) / n * bytes / BusBandwidth(n, stride) + steps * Latency(n, stride);
}

double CostModel::AllGatherTime(double bytes_total, int64_t n, int64_t stride) const {
  if (n <= 1) return 0;
  return static_cast<double>(n - 1) / n * bytes_total / BusBandwidth(n, stride) +
         static_cast<double>(n - 1) * Latency(n, stride);
}

double CostModel::AllToAllTime(double bytes, int64_t n, int64_t stride) const {
  if (n <= 1) return 0;
  const GpuSpec& g = cluster_.gpu;
  const double sent = static_cast<double>(n - 1) / n * bytes;
  if (!CrossesNodes(n, stride)) {
    return sent / (g.intra_node_bandwidth * constants_.eff.intra_node_bus) + g.intra_node_latency_s;
  }
  // Peers in the same NVLink domain go over NVLink, the rest over the NIC, concurrently.
  const double local_peers = static_cast<double>(MembersPerDomain(n, stride));
  const double remote_share = (n - local_peers) / (n - 1);
  const double remote = sent * remote_share / (g.inter_node_bandwidth * constants_.eff.inter_node_bus);
  const double local =
      sent * (1 - remote_share) / (g.intra_node_bandwidth * constants_.eff.intra_node_bus);
  return std::max(remote, local) + g.inter_node_latency_s;
}

double CostModel::P2PTime(double bytes, bool crosses_nodes) const {
  const GpuSpec& g = cluster_.gpu;
  return crosses_nodes ? bytes / (g.inter_node_bandwidth * constants_.eff.inter_node_bus) +
                             g.inter_node_latency_s
                       : bytes / (g.intra_node_bandwidth * constants_.eff.intra_node_bus) +
                             g.intra_node_latency_s;
}

double CostModel::GemmTime(double flops, double sharded_dim) const {
  return GemmTimeAt(flops, sharded_dim, gemm_peak_flops_);
}

double CostModel::GemmTimeAt(double flops, double sharded_dim, double peak) const {
  if (flops <= 0) return 0;
  // Narrow GEMMs (a dimension cut thin by tensor parallelism) keep fewer tensor cores busy.
  const Efficiency& e = constants_.eff;
  const double eff = e.gemm * sharded_dim / (sharded_dim + e.gemm_half_dim);
  return flops / (peak * eff);
}

// Each local expert's GEMM sees `rows` rows. Its last row tile runs part-empty: half a tile on
// average, as a trained router's counts vary from micro-batch to micro-batch. And it reads the
// expert's weights once (the FP8 copy in FP8 training), which at few rows costs more than the
// multiply: the time is the larger of the two (a roofline; the activations' traffic grows with
// the rows like the multiply and is left out).
double CostModel::ExpertGemmTime(double flops, double sharded_dim, double rows) const {
  if (flops <= 0 || rows <= 0) return GemmTime(flops, sharded_dim);
  const double multiply =
      GemmTime(flops, sharded_dim) * (rows + 0.5 * grouped_gemm_tile_rows_) / rows;
  const double weight_bytes = (fp8_ ? 1.0 : element_bytes_) * flops / (2 * rows);
  return std::max(multiply, MemoryBoundTime(weight_bytes));
}

double CostModel::AttentionTime(double flops) const {
  return flops / (attention_peak_flops_ * constants_.eff.attention);
}

double CostModel::MemoryBoundTime(double bytes) const {
  return bytes / (cluster_.gpu.hbm_bandwidth * constants_.eff.memory_bound);
}

// ---- memory (docs/models.md §3) ----

MemoryBreakdown CostModel::Memory(const ParallelConfig& c) const {
  // The peak over the stages: the first holds the most micro-batches in flight, the last the
  // logits, and an uneven split moves layers between them.
  const LayerBytes bytes = LayerBytesOf(c);
  MemoryBreakdown peak;
  int64_t before = 0;
  for (int64_t stage = 0; stage < c.pp; ++stage) {
    const StageLayout layout = LayoutOf(model_, c, stage, before);
    before += layout.per_chunk;
    const MemoryBreakdown mem = StageMemory(c, bytes, layout, stage);
    if (stage == 0 || mem.total() > peak.total()) peak = mem;
  }
  return peak;
}

LayerBytes CostModel::LayerBytesOf(const ParallelConfig& c) const {
  const ModelSpec& m = model_;
  const StackOptions& stack = constants_.stack;
  const double elem = element_bytes_;
  const double t = c.tp;
  // The routed rows a rank's experts hold, as a share of the tensor-parallel region's: each rank
  // routes its 1/tp and the etp all-gather brings etp such shares (1 at etp = tp).
  const double gathered = c.expert_tp() / t;
  // Activation bytes of one layer for one micro-batch (Korthikanti et al. 2022, generalised to
  // GQA, gated MLPs, MoE and sequence splitting).
  const double tokens = static_cast<double>(c.mbs) * train_.seq_length / (c.cp * c.up);
  const double h = m.hidden_size;
  const double a = m.num_attention_heads;
  const double d = m.is_mla() ? m.qk_head_dim + m.qk_pos_emb_head_dim : m.head_dim();
  const double g = m.is_mla() ? a : m.num_query_groups;
  const double up = c.up;
  // Heads per rank: query heads split by tp; kv heads split by tp (replicated when fewer). The
  // Ulysses all-to-all scatters both over up, which divides them (the space's UlyssesKvReason,
  // Transformer Engine's rule), so the up ranks together hold the tp rank's kv heads.
  const double tp_heads = a / t;
  const double tp_kv = std::max(g / t, 1.0);
  // Saved per layer: the inputs and outputs of both norms (replicated over tp unless SP shards
  // them) and dropout masks; q, k, v (with Ulysses, the all-to-all's output) and the attention
  // output (with Ulysses, also its head-sharded form before the all-to-all back, unless selective
  // recompute reruns it); the MLP's fc1 output (gate and up for SwiGLU) and activation output.
  const double replicated = (4 * elem + (stack.dropout ? 2 : 0)) * tokens * h;
  const bool core_attn = c.Recomputes(kRecomputeCoreAttn);
  // With --qk-layernorm the norm's input (the projection's q and k) is kept too, with its f32
  // statistics per head (rstd, and the mean of a LayerNorm).
  const double qk_norm_saved =
      m.has_qk_head_norms()
          ? tokens * (tp_heads + tp_kv) * (elem * d + (m.norm == NormKind::kLayerNorm ? 8 : 4))
          : 0.0;
  const double attention_saved =
      elem * tokens * d * (2 * tp_heads + 2 * tp_kv + (up > 1 && !core_attn ? tp_heads : 0)) +
      qk_norm_saved;
  const double gated = elem * (m.activation == Activation::kSwiGLU ? 3 : 2);
  const double scores =
      stack.flash_attention || core_attn
          ? 0
          : ((stack.dropout ? 1 + 2 * elem : elem)) * c.mbs * (a / c.up) *
                // NOLINTNEXTLINE(bugprone-integer-division): cp divides the sequence (the space)
                (train_.seq_length / c.cp) * train_.seq_length;
  // A MoE layer's routed part (dropless, balanced routing): each tp rank routes its 1/tp of the
  // rows to top-k experts; the expert-parallel all-to-all and the etp all-gather (experts are
  // etp-sharded) bring every rank tokens·k·etp/tp rows, kept as the experts' input with their
  // etp-sharded fc1 and activation outputs (tokens·k·etp/tp rows of width ffn/etp); each token's
  // k expert outputs ([tokens·k/tp, h]) are kept for the gates' gradient, except by the flex
  // dispatcher, which applies the gates beside the experts to the activation they keep.
  const double k = m.moe_router_topk;
  const double outputs = c.flex_dispatcher ? 0.0 : 1 / t;
  const double routed =
      elem * tokens * k * h * (gathered + outputs) + gated * tokens * k * m.moe_ffn_hidden_size / t;
  // One layer without its routed experts (what the backward pass's buffers are sized for).
  auto layer_ws = [&](bool moe) {
    const double ffn = moe ? m.moe_shared_expert_intermediate_size : m.ffn_hidden_size;
    return replicated / (c.sp ? t : 1) + attention_saved + (gated * tokens * ffn + scores) / t;
  };
  // FP8 training keeps FP8 copies of the GEMM inputs instead of (or besides) BF16 ones (fp8.cc);
  // the backward's gradient buffers stay BF16, so the working set keeps layer_ws.
  auto fp8_saved = [&](bool moe) {
    if (!fp8_) return 0.0;
    const Fp8LayerTraffic q = Fp8Layer(m, c, tokens, elem, fp8_transposed_copy_, moe);
    return q.saved_delta_bytes + q.routed_saved_delta_bytes;
  };
  // Selective recompute's other modules (Megatron's --recompute-modules) keep less and rebuild
  // it in the layer's backward: layernorm both norms' outputs; mlp a dense layer's fc1 and
  // activation outputs; moe a MoE layer's routed and shared-expert activations (its input is the
  // norm's output, kept or rebuilt by layernorm); moe_act the routed experts' activation output;
  // shared_experts the shared experts' fc1 and activation outputs. (FP8 copies of their inputs
  // are still counted.)
  const double norms =
      c.Recomputes(kRecomputeLayernorm) ? 2 * elem * tokens * h / (c.sp ? t : 1) : 0.0;
  const double shared = gated * tokens * m.moe_shared_expert_intermediate_size / t;
  const double dense_rerun =
      c.Recomputes(kRecomputeMlp) ? gated * tokens * m.ffn_hidden_size / t : 0.0;
  const double moe_rerun =
      c.Recomputes(kRecomputeMoe)
          ? routed + shared
          : (c.Recomputes(kRecomputeMoeAct) ? elem * tokens * k * m.moe_ffn_hidden_size / t : 0.0) +
                (c.Recomputes(kRecomputeSharedExperts) ? shared : 0.0);
  auto layer_bytes = [&](bool moe) {
    return layer_ws(moe) + (moe ? routed - moe_rerun : -dense_rerun) - norms + fp8_saved(moe);
  };
  // Transient buffers of a MoE layer's backward: dispatch and combine ping-pong buffers
  // ([tokens·k·etp/tp, h] each), the experts' input gradient and their fc1 / activation
  // gradients (with flex one buffer more for the row sums, and the gated activation); and the
  // router's input gradient [tokens / tp, h].
  const double moe_transient =
      elem * tokens * (k * (c.flex_dispatcher ? 4 : 3) * h * gathered + h / t) +
      (gated + (c.flex_dispatcher ? elem : 0.0)) * tokens * k * m.moe_ffn_hidden_size / t;
  LayerBytes out;
  out.tokens = tokens;
  out.dense_ws = layer_ws(false);
  out.moe_ws = layer_ws(true);
  out.dense = layer_bytes(false);
  out.moe = layer_bytes(true);
  // An MTP module keeps a layer's activations and its input projection's ([tokens, 2h]).
  out.mtp = (m.is_moe() ? out.moe : out.dense) + elem * tokens * 2 * h / (c.sp ? t : 1);
  out.moe_transient = moe_transient;
  out.context_ws = ContextWorkspaceBytes(c, tokens, d, tp_heads, tp_kv);
  out.layer_input = elem * tokens * h / (c.sp ? t : 1);  // what full recompute keeps
  out.dense_rerun = dense_rerun + norms;
  out.moe_rerun = moe_rerun + norms;
  return out;
}

double CostModel::ContextWorkspaceBytes(const ParallelConfig& c, double tokens, double d,
                                        double tp_heads, double tp_kv) const {
  // The sequence-split attention's workspaces (ContextAttention): the Ulysses send and receive
  // buffers and the head-sharded output and QKV gradients; the ring's K/V blocks (the own one,
  // two in flight) and their gradients (two being summed, one arriving), or with all-gathered K
  // and V the own block and its gradient and every rank's three ways (as gathered, in sequence
  // order, their gradients); and a merge buffer.
  const double up = c.up;
  double context_ws = 0;
  if (c.cp > 1 || c.up > 1) {
    const double rows = tokens * up, ul_cols = d * (tp_heads + 2 * tp_kv) / up;
    const double kv_cols = 2 * d * tp_kv / up;
    context_ws = rows * ul_cols;
    if (c.up > 1) context_ws += 2 * rows * ul_cols + rows * d * tp_heads / up;
    if (c.cp > 1) {
      const double kv_blocks = c.cp_allgather ? 2 + 3.0 * c.cp : 6;
      context_ws += kv_blocks * rows * kv_cols + rows / 2 * d * tp_heads / up;
    }
    if (c.up > 1 && c.Recomputes(kRecomputeCoreAttn)) context_ws += tokens * d * tp_heads;
    context_ws *= element_bytes_;
  }
  return context_ws;
}

void CostModel::StageParameterBytes(const ParallelConfig& c, const StageLayout& layout,
                                    int64_t stage, MemoryBreakdown& mem) const {
  const ModelSpec& m = model_;
  // Mixed precision keeps 16-bit weights and activations, fp32 main gradients and an fp32
  // master copy with Adam's moments (Megatron's 18 bytes per parameter); fp32 training (the CPU
  // backend) has 4-byte everything and the weights are their own master copy.
  const bool fp32 = train_.precision == Precision::kFP32;
  const double elem = element_bytes_;
  const double weight_bytes = elem;
  const double optimizer_bytes = fp32 ? 8 : 12;
  const double t = c.tp, ep = c.ep, et = c.expert_tp(), h = m.hidden_size;
  // Every rank of the up·cp·dp block holds the same dense weights (the gradient reduction and
  // the distributed optimizer span them all); the experts are split over ep of them.
  const double replicas = static_cast<double>(c.dp) * c.cp * c.up;
  const int64_t dense_layers = layout.all.dense_total();
  const int64_t moe_layers = layout.all.moe_total();
  // Parameters held by this rank: dense ones split by tp, experts by etp·ep.
  double dense = dense_layers * static_cast<double>(params_.dense_layer()) +
                 moe_layers * static_cast<double>(params_.moe_layer_non_expert());
  if (stage == 0) dense += params_.embedding;
  // Multi-token-prediction modules follow the last layer on the last stage.
  const double mtp = stage == c.pp - 1 ? static_cast<double>(m.mtp_num_layers) : 0.0;
  if (stage == c.pp - 1) {
    dense += params_.final_norm;
    // A tied embedding (or the one MTP reads) is duplicated on the last stage when the
    // pipeline splits them.
    dense += params_.output_layer > 0 ? params_.output_layer : (c.pp > 1 ? m.vocab_size * h : 0);
    if (mtp > 0) {
      dense += mtp * static_cast<double>(params_.mtp_non_expert());
      if (c.pp > 1 && params_.output_layer > 0) dense += m.vocab_size * h;
    }
  }
  dense /= t;
  const double experts = (moe_layers * static_cast<double>(params_.expert_per_layer) +
                          mtp * static_cast<double>(params_.mtp_experts())) /
                         (et * ep);
  mem.weights = weight_bytes * (dense + experts);
  // FP8: Transformer Engine's cached FP8 weights (and transposes), kept across the micro-batches.
  // FP8 parameters (fp8_param_gather) are those FP8 weights (and their transposes): the layers'
  // linear weights have no 16-bit copy.
  if (fp8_) {
    const double fp8_weights = Fp8StageWeights(m, params_, c, layout, stage).total();
    mem.weights += Fp8WeightCacheBytes(fp8_transposed_copy_) * fp8_weights -
                   (c.fp8_param_gather ? weight_bytes * fp8_weights : 0.0);
  }
  // Megatron's main-gradient buffers are fp32, or in the parameters' dtype with
  // --grad-reduce-in-bf16 (DistributedDataParallelConfig.grad_reduce_in_fp32 off).
  const double grad_bytes = c.grad_reduce_dtype == GradReduceDtype::kFP32 ? 4 : elem;
  mem.gradients = grad_bytes * (dense + experts);
  // The distributed optimizer shards the experts over their expert-data-parallel ranks,
  // tp·replicas / (etp·ep) (replicas / ep at etp = tp).
  const double expert_replicas = static_cast<double>(c.expert_dp());
  mem.optimizer = optimizer_bytes *
                  (c.dist_opt ? dense / replicas + experts / expert_replicas : dense + experts);
}

namespace {
// Chunk forwards alive at the peak of stage `stage`: the warm-up and the one after it.
int64_t ChunkForwardsInFlight(const ParallelConfig& c, int64_t microbatches, int64_t stage) {
  return std::min(microbatches * c.vpp,
                  PipelineWarmupForwards(c.pp, c.vpp, stage, microbatches) + 1);
}

// The stage's transformer layers whose activations are alive at its peak, over its layers
// (MicrobatchesInFlight where its chunks are equal). Only a counted split makes a stage's
// chunks differ (its first or last chunk short), and then which chunks are in flight matters:
// the interleaved schedule (InterleavedChunk) is walked through its warm-up and two groups of
// its steady state, after which it repeats.
double LayerWeightedInFlight(const ParallelConfig& c, int64_t num_layers, int64_t microbatches,
                             int64_t stage) {
  const bool short_chunk = (c.split_embedding && stage == 0) || (c.split_loss && stage == c.pp - 1);
  if (c.vpp <= 1 || !short_chunk) return MicrobatchesInFlight(c, microbatches, stage);
  std::vector<int64_t> chunk_layers(static_cast<size_t>(c.vpp));
  int64_t layers = 0;
  for (int64_t k = 0; k < c.vpp; ++k) {
    chunk_layers[static_cast<size_t>(k)] = ChunkLayers(c, num_layers, stage, k);
    layers += chunk_layers[static_cast<size_t>(k)];
  }
  const int64_t group = int64_t{c.pp} * c.vpp, total = microbatches * c.vpp;
  const int64_t warmup = ChunkForwardsInFlight(c, microbatches, stage) - 1;
  auto layers_of = [&](int64_t k, bool backward) {
    return chunk_layers[static_cast<size_t>(InterleavedChunk(c.pp, c.vpp, k, backward))];
  };
  int64_t alive = 0, peak = 0;
  for (int64_t k = 0; k < warmup; ++k) alive += layers_of(k, false);
  peak = alive;
  for (int64_t k = 0; k < std::min(total - warmup, 2 * group); ++k) {
    alive += layers_of(warmup + k, false);
    peak = std::max(peak, alive);
    alive -= layers_of(k, true);
  }
  return static_cast<double>(peak) / static_cast<double>(layers);
}
}  // namespace

double MicrobatchesInFlight(const ParallelConfig& c, int64_t microbatches, int64_t stage) {
  return static_cast<double>(ChunkForwardsInFlight(c, microbatches, stage)) / c.vpp;
}

MemoryBreakdown CostModel::StageMemory(const ParallelConfig& c, const LayerBytes& x,
                                       const StageLayout& layout, int64_t stage) const {
  const ModelSpec& m = model_;
  const bool fp32 = train_.precision == Precision::kFP32;
  const double elem = element_bytes_;
  const double t = c.tp;
  const int64_t microbatches = train_.global_batch_size / (int64_t{c.dp} * c.mbs);
  const double tokens = x.tokens, h = m.hidden_size;
  MemoryBreakdown mem;
  StageParameterBytes(c, layout, stage, mem);
  const int64_t layers_per_stage = layout.layers();
  const int64_t dense_layers = layout.all.dense_total();
  const int64_t moe_layers = layout.all.moe_total();
  // Multi-token-prediction modules follow the last layer on the last stage.
  const double mtp = stage == c.pp - 1 ? static_cast<double>(m.mtp_num_layers) : 0.0;

  const double in_flight = LayerWeightedInFlight(c, m.num_layers, microbatches, stage);
  const double dense_layer_bytes = x.dense, moe_layer_bytes = x.moe, mtp_layer_bytes = x.mtp;
  const double layer_input = x.layer_input;
  double per_microbatch =
      dense_layers * dense_layer_bytes + moe_layers * moe_layer_bytes + mtp * mtp_layer_bytes;
  // The backward pass works on one layer at a time: its activation gradients are about the
  // size of the layer's activations, plus the gathered input and partial sums of the
  // tensor-parallel region ([s·b, h] each) and the residual-stream gradients and pipeline
  // send/recv buffers (local [s·b, h] each). A fully recomputed layer rebuilds its activations
  // first.
  double working =
      std::max(dense_layers > 0 ? x.dense_ws : 0.0, moe_layers > 0 ? x.moe_ws : 0.0) +
      elem * tokens * h * (2 + 6 / (c.sp ? t : 1)) + x.context_ws +
      (moe_layers > 0 ? x.moe_transient : 0.0) +
      std::max(dense_layers > 0 ? x.dense_rerun : 0.0, moe_layers > 0 ? x.moe_rerun : 0.0);
  if (c.recompute == Recompute::kFull) {
    // Megatron's block method recomputes the first N layers of every model chunk: they keep
    // only their input; the others (and MTP modules) keep their activations.
    const LayerMix& rerun = layout.recomputed;
    per_microbatch -= rerun.dense_total() * (dense_layer_bytes - layer_input) +
                      rerun.moe_total() * (moe_layer_bytes - layer_input);
    if (rerun.dense_total() + rerun.moe_total() == layers_per_stage) {
      per_microbatch -= mtp * (mtp_layer_bytes - layer_input);
    }
    working += std::max(dense_layer_bytes, moe_layers > 0 ? moe_layer_bytes : 0.0);
  }
  mem.activations = in_flight * per_microbatch + working;
  if (stage == c.pp - 1) {
    // 16-bit logits plus the fp32 copy the vocab-parallel cross-entropy works on (in fp32 the
    // loss works on the logits themselves).
    mem.logits = (fp32 ? 4 : elem + 4) * tokens * m.vocab_size / t * (1 + m.mtp_num_layers);
  }
  const double tensors = mem.weights + mem.gradients + mem.optimizer + mem.activations + mem.logits;
  mem.overhead =
      constants_.mem.runtime_overhead_gib * kGiB + constants_.mem.fragmentation * tensors;
  return mem;
}

}  // namespace autopar
