// The analytic time model of docs/models.md §4: compute, collectives on the links they cross, the
// pipeline schedule and the overlap of data-parallel communication.
#include <algorithm>
#include <cmath>
#include <vector>

#include "autopar/perf/cost_model.h"
#include "autopar/spec/units.h"
#include "fp8.h"
#include "stages.h"

namespace autopar {
namespace {

constexpr double kAdamBytesPerParam = 4 + 12 + 12 + 2 + 4;  // see Memory(): grad, m, v, master

// Megatron's bucket count over parameters fed in reverse layout order: a bucket closes once it
// holds at least `bucket_size`; what is left, with the first parameter of the layout (never
// tested: it is fed last), forms the last bucket. Allocation-free: Time runs per candidate.
class ReverseBucketCount {
 public:
  explicit ReverseBucketCount(double bucket_size) : bucket_size_(bucket_size) {}
  void Add(double size, int64_t times = 1) {
    for (int64_t i = 0; i < times; ++i) {
      if (fed_) Hold(pending_);
      pending_ = size;
      fed_ = true;
    }
  }
  int64_t buckets() const { return fed_ ? closed_ + 1 : 0; }

 private:
  void Hold(double size) {
    held_ += size;
    if (held_ >= bucket_size_) {
      ++closed_;
      held_ = 0;
    }
  }
  double bucket_size_, held_ = 0, pending_ = 0;
  int64_t closed_ = 0;
  bool fed_ = false;
};

// The first pipeline stage's buckets, tensor by tensor in reverse of the order the trial lays
// them out (embedding, then per layer norm, qkv, proj, qk norms, norm, MLP or router and shared
// experts, then the final norm and output layer on a single stage), the dense buffer and the routed
// experts' buffer each bucketed on its own (an empty dense list still forms one bucket).
int64_t FirstStageBuckets(const ModelSpec& m, const ParallelConfig& c, double bucket_size) {
  const double t = c.tp, et = c.expert_tp(), h = m.hidden_size, d = m.head_dim();
  const double fc1_factor = m.activation == Activation::kSwiGLU ? 2 : 1;
  ReverseBucketCount dense(bucket_size), experts(bucket_size);
  auto norm = [&] { dense.Add(h, m.norm == NormKind::kLayerNorm ? 2 : 1); };  // weight (+ bias)
  if (c.pp == 1) {
    if (m.untie_embeddings) dense.Add(static_cast<double>(m.vocab_size) / t * h);
    norm();
  }
  // The stage's chunks (ChunkFirstLayer, ChunkLayers), walked last layer to first.
  for (int64_t k = c.vpp; k-- > 0;) {
    const int64_t first = ChunkFirstLayer(c, m.num_layers, 0, k);
    for (int64_t j = ChunkLayers(c, m.num_layers, 0, k); j-- > 0;) {
      const int64_t layer = first + j;
      const bool moe = m.is_moe() && layer >= m.moe_first_dense_layers;
      if (moe) {
        for (int64_t e = 0; e < m.num_experts / c.ep; ++e) {
          experts.Add(static_cast<double>(m.moe_ffn_hidden_size) * h / et);
          experts.Add(fc1_factor * m.moe_ffn_hidden_size * h / et);
        }
      }
      const double ffn = moe ? m.moe_shared_expert_intermediate_size : m.ffn_hidden_size;
      if (ffn > 0) {
        dense.Add(ffn * h / t);
        dense.Add(fc1_factor * ffn * h / t);
      }
      if (moe) dense.Add(static_cast<double>(m.num_experts) * h);  // the router
      norm();
      if (m.has_qk_head_norms())
        dense.Add(d, int64_t{2} * (m.norm == NormKind::kLayerNorm ? 2 : 1));
      dense.Add(h * d * m.num_attention_heads / t);
      dense.Add(h * d * (m.num_attention_heads + 2.0 * m.num_query_groups) / t);
      norm();
    }
  }
  dense.Add(static_cast<double>(m.vocab_size) / t * h +
            (m.position_embedding == PositionEmbedding::kLearned
                 ? static_cast<double>(m.max_position_embeddings) * h
                 : 0.0));
  return dense.buckets() + experts.buckets();
}

// What a layer's overlapped tensor-parallel collectives expose with Megatron's --tp-comm-overlap,
// i.e. Transformer Engine's userbuffers with the methods TE gives each GEMM by default
// (transformer_engine/pytorch/module/base.py, initialize_ub): in forward the QKV and fc1 inputs
// are all-gathered by ring exchange, one chunk per rank under the GEMM of the chunk before
// (copy engines, one SM), and the projection's and fc2's outputs are reduce-scattered in 4
// pipelined chunks under the GEMM of the next chunk, on 16 SMs taken from it: the last chunk
// shows. In backward the output gradients' all-gathers are ring exchanges under the dgrad GEMMs
// and the dgrad reduce-scatters run in bulk under the wgrad GEMMs, on 16 SMs. A GEMM that runs
// beside a 16-SM collective loses those SMs (16 of Hopper's 132, kUserbufferSmShare) for the
// collective's time; nothing hides more than the GEMMs' own time (the layer's forward GEMMs,
// twice that in backward).
struct TpOverlap {
  double forward = 0;
  double backward = 0;
};
constexpr double kUserbufferSmShare = 16.0 / 132;
constexpr double kPipelinedChunks = 4;

// What a collective run beside a GEMM exposes (Megatron's asynchronous tensor-parallel backward):
// the part the GEMM does not cover, and at least the GEMM's loss of the SMs the collective's
// kernels hold meanwhile, taken as userbuffers' 16 of 132 (NCCL runs a ring or NVLS collective
// on one SM per channel, of that order on an NVSwitch node; not measured here).
double ExposedBeside(double collective, double gemm) {
  return std::max(kUserbufferSmShare * collective, collective - gemm);
}

TpOverlap UserbufferExposure(double gathers, double reduce_scatters, double gemm_forward) {
  const double total = gathers + reduce_scatters;
  const double last_chunk = reduce_scatters / kPipelinedChunks;
  TpOverlap o;
  o.forward = std::max(last_chunk + kUserbufferSmShare * (reduce_scatters - last_chunk),
                       total - gemm_forward);
  o.backward = std::max(kUserbufferSmShare * reduce_scatters, total - 2 * gemm_forward);
  return o;
}

// The copies of a token its dispatcher sends: one per chosen expert (k, the all-to-all
// dispatcher), or with Megatron's flex one, one per ep rank holding any of them, expected over a
// router that spreads tokens evenly (its experts a draw of k of the E without repetition, E/ep
// on each rank): ep·(1 − P(none on a given rank)); 1 at ep = 1, top-8 of 128 over ep 8: 5.26.
double TokenCopies(const ModelSpec& m, const ParallelConfig& c) {
  const int64_t experts = m.num_experts, k = m.moe_router_topk;
  if (!c.flex_dispatcher) return static_cast<double>(k);
  const double per_rank = static_cast<double>(experts) / c.ep;
  double missed = 1;
  for (int64_t i = 0; i < k; ++i) {
    missed *= std::max(
        0.0, (static_cast<double>(experts - i) - per_rank) / static_cast<double>(experts - i));
  }
  return c.ep * (1 - missed);
}

}  // namespace

LayerShape CostModel::ShapeOf(const ParallelConfig& c) const {
  const ModelSpec& m = model_;
  LayerShape x;
  x.t = c.tp;
  x.s = static_cast<double>(train_.seq_length);
  x.h = static_cast<double>(m.hidden_size);
  x.a = static_cast<double>(m.num_attention_heads);
  x.tokens = c.mbs * x.s / (c.cp * c.up);
  x.hbm = cluster_.gpu.hbm_bandwidth * constants_.eff.memory_bound;
  // Megatron-core rank order tp-up-cp-dp-pp: each group's stride decides its link.
  x.up_stride = c.tp;
  x.cp_stride = int64_t{c.tp} * c.up;
  // The expert grid etp-ep-edp (MoE parallel folding, docs/architecture.md §3) over the tp·cp·dp
  // ranks of an up slice, then the up slices: etp consecutive ranks, ep at stride etp.
  x.ex = ExpertGroupStrides(c);
  // Rows a rank's experts see, as a share of the routed rows of the tensor-parallel region: each
  // rank routes its 1/tp, the ep all-to-all balances them, the etp all-gather multiplies by etp.
  x.et = c.expert_tp();
  x.gathered = x.et / x.t;
  x.qk_dim = static_cast<double>(m.is_mla() ? m.qk_head_dim + m.qk_pos_emb_head_dim : m.head_dim());
  x.v_dim = static_cast<double>(m.is_mla() ? m.v_head_dim : m.head_dim());
  x.kv_heads = m.is_mla() ? x.a : static_cast<double>(m.num_query_groups);
  // Heads per rank: query heads split by tp; kv heads by tp (replicated when fewer). The Ulysses
  // all-to-all scatters both over up, which divides them (the space's UlyssesKvReason).
  x.tp_heads = x.a / x.t;
  x.tp_kv = std::max(x.kv_heads / x.t, 1.0);
  x.one_expert = m.is_moe() ? static_cast<double>(params_.expert_per_layer) / m.num_experts : 0;
  // A windowed layer's share of full causal attention's work (docs/models.md §4.2): flash
  // attention skips the blocks outside the band; the unfused path masks the whole square.
  x.window_share = constants_.stack.flash_attention && m.window_size > 0
                       ? CausalKeysPerQuery(x.s, static_cast<double>(m.window_size)) / (0.5 * x.s)
                       : 1.0;
  // The keys one attention kernel call iterates over: the whole sequence without CP; with the
  // ring's load-balanced halves (Transformer Engine's AttnFuncWithCP), every step's kernel pairs
  // the rank's s/cp rows with one half-chunk of s/(2·cp) (or the reverse); with all-gathered K
  // and V (AttnFuncWithCPAndKVAllGather) each of the rank's two chunks attends to the keys up to
  // its end, (i + 1) and (2·cp − i) chunks of s/(2·cp), (2·cp + 1)/(4·cp)·s on average; a
  // windowed layer's at most the window.
  const double keys = c.cp == 1        ? x.s
                      : c.cp_allgather ? x.s * (2.0 * c.cp + 1) / (4.0 * c.cp)
                                       : x.s / (2.0 * c.cp);
  x.attention_shape = AttentionShapeFactor(attention_law_, keys, x.qk_dim);
  x.attention_shape_windowed =
      m.window_size > 0
          ? AttentionShapeFactor(attention_law_, std::min(keys, static_cast<double>(m.window_size)),
                                 x.qk_dim)
          : x.attention_shape;
  return x;
}

CostModel::ComputeParts CostModel::LayerCompute(const ParallelConfig& c, const LayerShape& x,
                                                bool moe, bool windowed,
                                                std::array<double, kNumFeatures>& f) const {
  const ModelSpec& m = model_;
  const StackOptions& stack = constants_.stack;
  const Efficiency& e = constants_.eff;
  const double t = x.t, s = x.s, h = x.h, a = x.a, tokens = x.tokens, hbm = x.hbm;
  ComputeParts parts;
  // GEMMs: 2 FLOPs per parameter per token, split by tp. The column-parallel linears' share by
  // their output widths: QKV's against the projection's input, fc1's (two halves with SwiGLU)
  // against fc2's.
  f[kGemm] = GemmTime(2 * tokens * params_.attention_per_layer / t, a * x.qk_dim / t);
  const double qkv_width = a * x.qk_dim + x.kv_heads * (x.qk_dim + x.v_dim);
  parts.qkv_gemm = f[kGemm] * qkv_width / (qkv_width + a * x.v_dim);
  if (moe) {
    const double routed = 2 * tokens * m.moe_router_topk * x.one_expert / t;
    const double shared =
        2 * tokens * (params_.shared_expert_per_layer + params_.moe_router_per_layer) / t;
    // Rows per local expert: the ep·etp ranks' routed rows (each tp rank's 1/tp, all-gathered
    // over etp) spread over the experts.
    const double rows_per_expert =
        tokens * m.moe_router_topk * x.et * c.ep / (t * static_cast<double>(m.num_experts));
    parts.mlp_gemm = ExpertGemmTime(routed, m.moe_ffn_hidden_size / x.et, rows_per_expert) +
                     (shared > 0 ? GemmTime(shared, std::max<double>(h, 1) / t) : 0);
    parts.shared_gemm =
        params_.shared_expert_per_layer > 0
            ? GemmTime(2 * tokens * params_.shared_expert_per_layer / t, std::max<double>(h, 1) / t)
            : 0;
  } else {
    parts.mlp_gemm = GemmTime(2 * tokens * params_.dense_mlp_per_layer / t, m.ffn_hidden_size / t);
    parts.fc1_gemm = parts.mlp_gemm * (m.activation == Activation::kSwiGLU ? 2.0 / 3 : 0.5);
  }
  f[kGemm] += parts.mlp_gemm;
  // Attention core over the full key range; flash skips the masked half of a causal square.
  const double heads = a / (t * c.up);
  // A rank attends with its heads/(tp·up) heads for the cp rank's s/cp queries over all s keys
  // (after the Ulysses all-to-all); the load-balanced chunks give every rank the same share.
  const double attn_flops = 2 * c.mbs * (s / c.cp) * s * heads * (x.qk_dim + x.v_dim);
  double& softmax = parts.softmax;  // the unfused attention's passes over the score matrix
  if (stack.flash_attention) {
    f[kAttention] = 0.5 * attn_flops * (windowed ? x.window_share : 1.0) /
                    (attention_peak_flops_ * e.attention *
                     (windowed ? x.attention_shape_windowed : x.attention_shape)) *
                    (stack.dropout ? attention_law_.dropout_forward : 1.0);
  } else {
    f[kAttention] = attn_flops / (attention_peak_flops_ * e.attention_unfused);
    // Scale-mask-softmax and dropout over the score matrix, each one read and one write of an
    // element (+ a byte mask for dropout).
    const double score_elems = c.mbs * heads * (s / c.cp) * s;
    softmax = score_elems * (stack.dropout ? 4 * element_bytes_ + 1 : 2 * element_bytes_) / hbm;
    f[kMemoryBound] += softmax;
  }
  // Elementwise traffic: norms, residuals, bias and dropout on hidden-sized tensors (replicated
  // over tp unless SP shards them), RoPE and the qk norms on the rank's query and key heads, the
  // activation function on the MLP width. Two norms (read + write) and two residual adds (2 reads
  // + 1 write); bias and dropout are fused into the adds and cost only the dropout masks.
  const double hidden_passes = 10 + (stack.dropout ? 1 : 0);
  // Over q and k, sharded over tp by heads whatever SP: RoPE reads and writes them, and
  // --qk-layernorm keeps their copy for the backward (read + write) and norms them (read + write).
  const double head_passes =
      (m.position_embedding == PositionEmbedding::kRope ? 2 : 0) + (m.has_qk_head_norms() ? 4 : 0);
  const double width =
      moe ? m.moe_router_topk * m.moe_ffn_hidden_size + m.moe_shared_expert_intermediate_size
          : m.ffn_hidden_size;
  const double act_passes = m.activation == Activation::kSwiGLU ? 3 : 2;
  const double act = element_bytes_ * act_passes * tokens / t / hbm;  // per unit of width
  parts.norms = element_bytes_ * 4 * tokens * h / (c.sp ? t : 1) / hbm;
  parts.mlp_memory = act * width;
  if (moe) parts.mlp_memory += element_bytes_ * 4 * tokens * m.moe_router_topk * h / t / hbm;
  parts.moe_act = moe ? act * m.moe_router_topk * m.moe_ffn_hidden_size : 0;
  parts.shared_memory = moe ? act * m.moe_shared_expert_intermediate_size : 0;
  f[kMemoryBound] += element_bytes_ * hidden_passes * tokens * h / (c.sp ? t : 1) / hbm +
                     element_bytes_ * head_passes * tokens * (a + x.kv_heads) * x.qk_dim / t / hbm +
                     parts.mlp_memory;
  return parts;
}

CostModel::BackwardComm CostModel::LayerCommunication(const ParallelConfig& c, const LayerShape& x,
                                                      bool moe, ComputeParts& parts,
                                                      std::array<double, kNumFeatures>& f) const {
  const ModelSpec& m = model_;
  const double t = x.t, h = x.h, tokens = x.tokens, hbm = x.hbm;
  // Tensor parallel: two all-reduces of the layer's activations (or AG + RS with SP). In FP8
  // training TE all-gathers the quantized inputs of the QKV and fc1 GEMMs (a MoE layer's
  // dispatcher gathers BF16 rows) and, in backward, the FP8 output gradients of the
  // projection and fc2: one byte an element. The reduce-scatters stay BF16.
  const int64_t tp_stride = 1;
  const double act_bytes = element_bytes_ * tokens * h;
  const double fp8_gathers = fp8_ ? (moe ? 1 : 2) : 0;
  // Megatron's asynchronous backward of a column-parallel linear (QKV; fc1 in a dense layer):
  // the input gradient's all-reduce, or reduce-scatter with SP, runs under the weight-gradient
  // GEMM, and with SP the input is gathered again for that GEMM under the input-gradient GEMM
  // (megatron/core/tensor_parallel/layers.py, LinearWithGradAccumulationAndAsyncCommunication;
  // Transformer Engine's Linear and LayerNormLinear alike). Each of those GEMMs takes as long as
  // the linear's forward one. The output gradients' all-gathers before the projection's and
  // fc2's GEMMs stay exposed.
  const bool async = constants_.stack.async_tp_backward && c.tp > 1;
  const std::array<double, 2> column_gemms = {parts.qkv_gemm, parts.fc1_gemm};
  BackwardComm backward;
  if (c.sp) {
    const double gather = AllGatherTime(act_bytes, c.tp, tp_stride);  // = a reduce-scatter
    const double fp8_gather = AllGatherTime(tokens * h, c.tp, tp_stride);
    f[kTpComm] = (4 - fp8_gathers) * gather + fp8_gathers * fp8_gather;
    backward.tp = f[kTpComm];
    if (constants_.stack.tp_comm_overlap && c.tp > 1) {
      // The QKV/proj pair, and fc1/fc2 in a dense layer (a MoE layer's MLP collectives are the
      // token dispatcher's, which userbuffers do not overlap).
      const double pairs = moe ? 1 : 2;
      const double overlapped_gather = fp8_ ? fp8_gather : gather;
      const TpOverlap o = UserbufferExposure(pairs * overlapped_gather, pairs * gather, f[kGemm]);
      const double rest = f[kTpComm] - pairs * (overlapped_gather + gather);
      backward.tp = rest + o.backward;
      f[kTpComm] = rest + o.forward;
    } else if (async) {
      const double input_gather = fp8_ ? fp8_gather : gather;
      for (const double gemm : column_gemms) {
        if (gemm <= 0) continue;
        backward.tp += ExposedBeside(input_gather, gemm) + ExposedBeside(gather, gemm) - gather;
      }
    }
  } else {
    const double all_reduce = AllReduceTime(act_bytes, c.tp, tp_stride);
    f[kTpComm] = 2 * all_reduce;
    backward.tp = f[kTpComm];
    for (const double gemm : column_gemms) {
      if (async && gemm > 0) backward.tp += ExposedBeside(all_reduce, gemm) - all_reduce;
    }
  }
  SequenceSplitCommunication(c, x, f, backward);
  // Expert parallel (the trial's dropless dispatchers, Megatron's all-to-all and flex ones): each
  // tp rank routes its 1/tp of the rows; dispatch is an all-to-all over ep of their copies
  // (TokenCopies), then (experts being etp-sharded) an etp all-gather of what arrived; combine is
  // an etp reduce-scatter and the all-to-all back (flex: one gate-weighted sum per rank). The
  // per-rank counts travel first (a small all-to-all and a host round trip).
  if (moe) {
    const double routed = element_bytes_ * tokens * m.moe_router_topk * h;
    const double sent = element_bytes_ * tokens * TokenCopies(m, c) * h;
    f[kEpComm] = 2 * AllToAllTime(sent / t, c.ep, x.ex.ep) +
                 2 * AllGatherTime(sent * x.gathered, c.expert_tp(), x.ex.etp) +
                 (c.ep > 1 ? AllToAllTime(0, c.ep, x.ex.ep) : 0);
    parts.mlp_ep = f[kEpComm];
    // Row gathers of dispatch and combine (the rows sent), of sort and unsort (the experts' rows).
    const double gathers = 2 * (2 * sent / t + 2 * routed * x.gathered) / hbm;
    f[kMemoryBound] += gathers;
    parts.mlp_memory += gathers;
  }
  // The MLP block's half of the tensor-parallel collectives (its entry and exit), as its
  // forward reruns them under recompute.
  parts.mlp_tp = f[kTpComm] / 2;
  return backward;
}

void CostModel::SequenceSplitCommunication(const ParallelConfig& c, const LayerShape& x,
                                           std::array<double, kNumFeatures>& f,
                                           BackwardComm& backward) const {
  const double tokens = x.tokens, hbm = x.hbm;
  // Ulysses (as the trial runs it): one all-to-all of q, k and v into head shards, one of the
  // output back; backward mirrors them. The buffers are packed and unpacked by row gathers.
  if (c.up > 1) {
    const double qkv_bytes =
        element_bytes_ * tokens * (x.tp_heads * x.qk_dim + x.tp_kv * (x.qk_dim + x.v_dim));
    const double o_bytes = element_bytes_ * tokens * x.tp_heads * x.v_dim;
    f[kUlyssesComm] =
        AllToAllTime(qkv_bytes, c.up, x.up_stride) + AllToAllTime(o_bytes, c.up, x.up_stride);
    f[kMemoryBound] += 2 * (qkv_bytes + o_bytes) / hbm;
  }
  if (c.cp > 1 && c.cp_allgather) {
    // All-gathered K and V (Transformer Engine's AttnFuncWithCPAndKVAllGather): two all-gathers
    // (K, V) before the attention, nothing overlapping them; the backward gathers them again and
    // reduce-scatters dK and dV in the compute dtype. Memory-bound passes: the gathered blocks
    // put in sequence order (read + write); in the backward also dK/dV zeroed, accumulated per
    // query chunk over its key prefix (about the sequence: read the part, read and write the
    // sum) and put back in rank order.
    const double k_bytes = element_bytes_ * tokens * x.tp_kv * x.qk_dim;
    const double v_bytes = element_bytes_ * tokens * x.tp_kv * x.v_dim;
    const double gather = AllGatherTime(c.cp * k_bytes, c.cp, x.cp_stride) +
                          AllGatherTime(c.cp * v_bytes, c.cp, x.cp_stride);
    f[kCpComm] = gather;
    backward.cp = 2 * gather;
    const double sequence_kv = c.cp * (k_bytes + v_bytes);
    f[kMemoryBound] += 2 * sequence_kv / hbm;
    backward.memory_bound = (1 + 3 + 2) * sequence_kv / hbm;
  } else if (c.cp > 1) {
    // The ring (load-balanced chunks): cp − 1 steps pass the K/V block of the rank's rows, each
    // behind that step's attention; the blocks are merged by log-sum-exp. Backward passes K/V
    // and their gradients together, and the gradients take one more hop home after the last
    // step, which nothing hides.
    const double kv_block = element_bytes_ * tokens * x.tp_kv * (x.qk_dim + x.v_dim);
    const bool crosses = CrossesNodes(c.cp, x.cp_stride);
    const double step = P2PTime(kv_block, crosses), both = P2PTime(2 * kv_block, crosses);
    const double attention_step = f[kAttention] / c.cp;
    const double backward_step = AttentionBackwardRatio() * attention_step;
    f[kCpComm] = (c.cp - 1) * std::max(0.0, step - attention_step);
    backward.cp = (c.cp - 1) * std::max(0.0, both - backward_step) + step;
    // Merges: 2·cp − 1 partial results of half the rows each, read twice and written once.
    f[kMemoryBound] +=
        (2.0 * c.cp - 2) * 3 * element_bytes_ * tokens * x.tp_heads * x.v_dim / 2 / hbm;
  }
}

double CostModel::AttentionBackwardRatio() const {
  // Flash attention's backward recomputes the scores: 2.5 forwards' work; unfused, twice the
  // forward's GEMMs. With dropout the fused kernel's RNG costs the forward and the backward
  // differently (AttentionShapeLaw).
  const StackOptions& stack = constants_.stack;
  if (!stack.flash_attention) return 2.0;
  return 2.5 *
         (stack.dropout ? attention_law_.dropout_backward / attention_law_.dropout_forward : 1.0);
}

LayerCost CostModel::LayerTime(const ParallelConfig& c, const LayerShape& x, bool moe,
                               bool windowed) const {
  LayerCost lc;
  auto& f = lc.fwd;
  ComputeParts parts = LayerCompute(c, x, moe, windowed, f);
  const BackwardComm backward = LayerCommunication(c, x, moe, parts, f);
  // Backward: twice the GEMM FLOPs (input and weight gradients), the same collectives.
  auto& b = lc.bwd;
  b = f;
  b[kGemm] = 2 * f[kGemm];
  b[kAttention] = AttentionBackwardRatio() * f[kAttention];
  b[kMemoryBound] = 2 * f[kMemoryBound] + backward.memory_bound;
  if (fp8_) {  // Transformer Engine's casts of GEMM inputs and output gradients (fp8.cc)
    const Fp8LayerTraffic q =
        Fp8Layer(model_, c, x.tokens, element_bytes_, fp8_transposed_copy_, moe);
    f[kMemoryBound] += q.forward_bytes / x.hbm;
    b[kMemoryBound] += q.backward_bytes / x.hbm;
  }
  b[kCpComm] = backward.cp;
  b[kTpComm] = backward.tp;
  AddSelectiveRerun(c, moe, parts, f, b);
  return lc;
}

void CostModel::AddSelectiveRerun(const ParallelConfig& c, bool moe, const ComputeParts& parts,
                                  const std::array<double, kNumFeatures>& f,
                                  std::array<double, kNumFeatures>& b) const {
  if (c.Recomputes(kRecomputeCoreAttn)) {  // the attention core runs forward again
    b[kAttention] += f[kAttention];
    b[kMemoryBound] += parts.softmax;
    b[kCpComm] += f[kCpComm];
  }
  if (c.Recomputes(kRecomputeLayernorm)) b[kMemoryBound] += parts.norms;
  // The MLP block's forward again (Megatron's checkpoint of the module): a dense MLP under mlp,
  // a MoE layer under moe, with its collectives and the token dispatcher's all-to-alls.
  if (moe ? c.Recomputes(kRecomputeMoe) : c.Recomputes(kRecomputeMlp)) {
    b[kGemm] += parts.mlp_gemm;
    b[kMemoryBound] += parts.mlp_memory;
    b[kTpComm] += parts.mlp_tp;
    b[kEpComm] += parts.mlp_ep;
    return;
  }
  if (!moe) return;
  if (c.Recomputes(kRecomputeMoeAct)) b[kMemoryBound] += parts.moe_act;
  if (c.Recomputes(kRecomputeSharedExperts)) {
    b[kGemm] += parts.shared_gemm;
    b[kMemoryBound] += parts.shared_memory;
  }
}

StageTimeParts CostModel::TimeParts(const ParallelConfig& c) const {
  const ModelSpec& m = model_;
  const LayerShape x = ShapeOf(c);
  const bool windows = m.window_size > 0;
  StageTimeParts parts;
  parts.dense = LayerTime(c, x, false, false);
  if (m.is_moe()) parts.moe = LayerTime(c, x, true, false);
  if (windows) parts.dense_windowed = LayerTime(c, x, false, true);
  if (windows && m.is_moe()) parts.moe_windowed = LayerTime(c, x, true, true);

  // The last stage's logits and vocab-parallel cross-entropy; each multi-token-prediction module
  // adds the 2h → h projection (column-parallel) and its own logits and loss.
  const double t = x.t, h = x.h, tokens = x.tokens;
  const double v = static_cast<double>(m.vocab_size);
  const double mtp = static_cast<double>(m.mtp_num_layers);
  // The output layer is Megatron's ColumnParallelLinear, not a TE one: BF16 in FP8 training.
  const double logits_fwd = GemmTimeAt(2 * tokens * h * v / t, v / t, attention_peak_flops_);
  // Megatron's vocab-parallel cross-entropy passes over the rank's logits in FP32, bytes per
  // logit. Unfused (megatron/core/tensor_parallel/cross_entropy.py, Megatron's default): forward
  // the cast from the logits' dtype (e read, 4 written), the max (4), the in-place subtract and
  // exp (8 each), the sum (4) and the in-place division into the softmax kept for backward (8);
  // backward the in-place scaling by the loss gradient (8) and the cast back for the output
  // layer's GEMM (4 read, e written). Fused (--cross-entropy-loss-fusion,
  // megatron/core/fusions/fused_cross_entropy.py, one jit kernel per step): the cast with the
  // max (e + 4), the subtract, exp and sum (8), the division (8); backward one kernel (4 + e).
  const bool fused = constants_.stack.cross_entropy_fusion;
  const double ce_fwd = (element_bytes_ + (fused ? 20 : 36)) * tokens * v / t / x.hbm;
  const double ce_bwd = (element_bytes_ + (fused ? 4 : 12)) * tokens * v / t / x.hbm;
  const double mtp_fwd = mtp * (logits_fwd + GemmTime(2 * tokens * 2 * h * h / t, h / t));
  LayerCost& last = parts.last_extra;
  last.fwd[kGemm] = logits_fwd + mtp_fwd;
  last.bwd[kGemm] = 2 * (logits_fwd + mtp_fwd);
  last.fwd[kMemoryBound] = (1 + mtp) * ce_fwd;
  last.bwd[kMemoryBound] = (1 + mtp) * ce_bwd;
  if (c.sp) {  // the final norm's output is gathered for the logits GEMM
    last.fwd[kTpComm] = AllGatherTime(element_bytes_ * tokens * h, c.tp, 1);
    last.bwd[kTpComm] = last.fwd[kTpComm];
  }
  return parts;
}

LayerCost CostModel::StageTime(const StageTimeParts& parts, const ParallelConfig& c,
                               const StageLayout& layout, int64_t stage) const {
  // The stage's layers, then (block recompute) the forward of the recomputed ones once more in
  // backward: GEMMs, kernels and collectives.
  LayerCost cost;
  parts.AddMix(cost, layout.all);
  LayerCost rerun;
  parts.AddMix(rerun, layout.recomputed);
  AddScaled(cost.bwd, rerun.fwd, 1);
  if (stage == c.pp - 1) {
    // Multi-token-prediction modules follow the last layer (recomputed with the whole stage).
    const double mtp = static_cast<double>(model_.mtp_num_layers);
    const bool all_rerun =
        layout.recomputed.dense_total() + layout.recomputed.moe_total() == layout.layers();
    cost.Add(parts.mtp_layer(model_), mtp);
    if (all_rerun && c.recompute == Recompute::kFull) {
      AddScaled(cost.bwd, parts.mtp_layer(model_).fwd, mtp);
    }
    cost.Add(parts.last_extra, 1);
  }
  return cost;
}

std::vector<CostModel::StageEstimate> CostModel::Stages(const ParallelConfig& c) const {
  const LayerBytes bytes = LayerBytesOf(c);
  const StageTimeParts time_parts = TimeParts(c);
  std::vector<StageEstimate> out;
  int64_t before = 0;
  for (int64_t stage = 0; stage < c.pp; ++stage) {
    const StageLayout layout = LayoutOf(model_, c, stage, before);
    const LayerCost cost = StageTime(time_parts, c, layout, stage);
    out.push_back({layout.layers(), cost.forward() + cost.backward(),
                   StageMemory(c, bytes, layout, stage).total() / kGiB});
    before += layout.per_chunk;
  }
  return out;
}

StageSummary CostModel::SummarizeStages(const ParallelConfig& c,
                                        const StageTimeParts& parts) const {
  // The slowest stage paces the schedule. Each stage's dense parameters: its layers, plus the
  // embedding (first stage) or the final norm and output layer (last stage; a tied embedding's
  // copy when pp > 1, and the one MTP reads); its experts: its MoE layers' and the MTP modules'.
  // The stage whose gradient reduction takes longest sets the data-parallel and optimizer terms.
  const ModelSpec& m = model_;
  const double t = c.tp, et = c.expert_tp();
  const int64_t mtp = m.mtp_num_layers;
  const bool embedding_copy = c.pp > 1 && (params_.output_layer == 0 || mtp > 0);
  const double first_extra = static_cast<double>(params_.embedding);
  const double last_extra =
      static_cast<double>(params_.final_norm) + static_cast<double>(params_.output_layer) +
      (embedding_copy ? static_cast<double>(m.vocab_size) * m.hidden_size : 0.0) +
      static_cast<double>(mtp) * static_cast<double>(params_.mtp_non_expert());
  StageSummary out;
  double slowest_time = -1;
  int64_t before = 0;
  for (int64_t stage = 0; stage < c.pp; ++stage) {
    const StageLayout layout = LayoutOf(m, c, stage, before);
    before += layout.per_chunk;
    const LayerCost cost = StageTime(parts, c, layout, stage);
    const Fp8Weights fp8 = fp8_ ? Fp8StageWeights(m, params_, c, layout, stage) : Fp8Weights{};
    if (cost.forward() + cost.backward() > slowest_time) {
      out.slowest = cost;
      slowest_time = cost.forward() + cost.backward();
      out.recompute_share =
          static_cast<double>(layout.recomputed.dense_total() + layout.recomputed.moe_total()) /
          std::max<int64_t>(layout.layers(), 1);
      out.fp8_weights = fp8.total();
    }
    const double dense =
        (layout.all.dense_total() * static_cast<double>(params_.dense_layer()) +
         layout.all.moe_total() * static_cast<double>(params_.moe_layer_non_expert()) +
         (stage == 0 ? first_extra : 0.0) + (stage == c.pp - 1 ? last_extra : 0.0)) /
        t;
    const double experts =
        (layout.all.moe_total() * static_cast<double>(params_.expert_per_layer) +
         (stage == c.pp - 1 ? static_cast<double>(mtp) * params_.mtp_experts() : 0.0)) /
        (et * c.ep);
    // (Ties, e.g. with no data parallelism, go to the later stage: the last one's parameters.)
    if (const double g = GradReduceTime(c, dense, experts); g >= out.grad_time) {
      out.grad_time = g;
      out.dense_params = dense;
      out.expert_params = experts;
      if (c.fp8_param_gather) {
        out.fp8_dense_params = fp8.dense;
        out.fp8_expert_params = fp8.experts;
      }
    }
  }
  out.embedding_copy = embedding_copy;
  return out;
}

double CostModel::GradReduceTime(const ParallelConfig& c, double dense, double experts) const {
  // Over the up·cp·dp ranks that hold the same dense parameters (up fastest, at stride tp) and
  // the tp·up·cp·dp / (etp·ep) that hold the same experts (at stride etp·ep), in the reduction
  // dtype: fp32 (Megatron's default) or the 16-bit parameter dtype (--grad-reduce-in-bf16; fp32
  // training reduces its fp32 gradients either way). The distributed optimizer reduce-scatters.
  const double grad_bytes = c.grad_reduce_dtype == GradReduceDtype::kFP32 ? 4 : element_bytes_;
  const int64_t dp_group = int64_t{c.dp} * c.cp * c.up, edp_group = c.expert_dp();
  const int64_t edp_stride = ExpertGroupStrides(c).edp;
  return c.dist_opt ? AllGatherTime(grad_bytes * dense, dp_group, c.tp) +
                          AllGatherTime(grad_bytes * experts, edp_group, edp_stride)
                    : AllReduceTime(grad_bytes * dense, dp_group, c.tp) +
                          AllReduceTime(grad_bytes * experts, edp_group, edp_stride);
}

void CostModel::AddDataParallel(const ParallelConfig& c, const StageSummary& st,
                                TimeBreakdown& out) const {
  const ModelSpec& m = model_;
  const Efficiency& e = constants_.eff;
  const double hbm = cluster_.gpu.hbm_bandwidth * e.memory_bound;
  const double fwd = st.slowest.forward(), bwd = st.slowest.backward();
  const int64_t dp_group = int64_t{c.dp} * c.cp * c.up, edp_group = c.expert_dp();
  // The distributed optimizer's parameter all-gather, in the parameters' dtype: one byte for
  // FP8 parameters (fp8_param_gather), Megatron's uint8 buffers beside the 16-bit ones.
  const double fp8_saved = element_bytes_ - 1;
  double gather_time = 0;
  if (c.dist_opt) {
    gather_time =
        AllGatherTime(element_bytes_ * st.dense_params - fp8_saved * st.fp8_dense_params, dp_group,
                      c.tp) +
        AllGatherTime(element_bytes_ * st.expert_params - fp8_saved * st.fp8_expert_params,
                      edp_group, ExpertGroupStrides(c).edp);
  }
  // Megatron's overlap (megatron/core/distributed/): parameters go into buckets of
  // MegatronDdpBucketSize(dp) in reverse order, on the first pipeline stage only (later stages,
  // and every stage with the knob off, have one bucket). A bucket's reduction starts once the
  // last micro-batch's backward has produced all its gradients and they run one after another,
  // so with n equal buckets under a backward of b seconds the reduction of R seconds ends
  // max(R/n, R − b·(n−1)/n) after the backward: the last bucket never hides. With pp > 1 the
  // last stage's single bucket starts (pp − 1)/vpp backward slots before the first stage ends
  // its own. The parameter all-gather mirrors it under the first micro-batch's forward: the
  // first bucket's gather waits at the first layer, each later one is dispatched when the one
  // before it completes. No overlap hides more than dp_overlap of a collective.
  const int64_t bucket_size = DdpBucketSize(constants_.stack.ddp_bucket_size, c.dp);
  const bool gather_overlapped = c.overlap_param_gather && OverlapParamGatherAllowed(c);
  const int64_t buckets = c.overlap_grad_reduce || gather_overlapped
                              ? FirstStageBuckets(m, c, static_cast<double>(bucket_size))
                              : 1;  // unused without overlap
  auto exposed = [&](double comm, double window, int64_t n) {
    return std::max({comm * (1 - e.dp_overlap), comm / n, comm - window * (n - 1) / n});
  };
  const double grad_time = st.grad_time;
  double grad_exposed = grad_time;
  if (c.overlap_grad_reduce) {
    out.grad_reduce_buckets = buckets;
    grad_exposed = exposed(grad_time, bwd, buckets);
    if (c.pp > 1) {
      grad_exposed = std::max(grad_exposed, grad_time - (c.pp - 1.0) / c.vpp * bwd);
    }
  }
  double gather_exposed = gather_time;
  if (gather_overlapped) {
    out.param_gather_buckets = buckets;
    gather_exposed = exposed(gather_time, fwd, c.pp == 1 ? buckets : 1);
  }
  // Tied embeddings (or MTP's use of the embedding): first and last stage all-reduce the
  // embedding gradient once the DP reduction is done (finalize_model_grads), in the step's tail
  // where nothing hides it.
  double embedding_time = 0;
  if (st.embedding_copy) {
    const double grad_bytes = c.grad_reduce_dtype == GradReduceDtype::kFP32 ? 4 : element_bytes_;
    const int64_t pp_stride = int64_t{c.tp} * c.up * c.cp * c.dp;
    embedding_time =
        AllReduceTime(grad_bytes * m.vocab_size * m.hidden_size / c.tp, 2, pp_stride * (c.pp - 1));
  }
  out.dp_comm_s = grad_time + gather_time + embedding_time;
  out.features[kDpComm] = grad_exposed + gather_exposed + embedding_time;

  const double optimizer_params = c.dist_opt
                                      ? st.dense_params / dp_group + st.expert_params / edp_group
                                      : st.dense_params + st.expert_params;
  // FP8 parameters: the master shard goes to the parameter through a 16-bit copy that is then
  // quantized (Transformer Engine's cast_master_weights_to_fp8 under delayed scaling): e + 1
  // bytes more per element than the 16-bit copy alone.
  const double fp8_shard = st.fp8_dense_params / dp_group + st.fp8_expert_params / edp_group;
  out.features[kOptimizer] =
      (kAdamBytesPerParam * optimizer_params + (element_bytes_ + 1) * fp8_shard) / hbm;
}

TimeBreakdown CostModel::Time(const ParallelConfig& c) const {
  const ModelSpec& m = model_;
  const double hbm = cluster_.gpu.hbm_bandwidth * constants_.eff.memory_bound;
  const StageTimeParts parts = TimeParts(c);
  // ---- the pipeline stages (docs/models.md §4.4) ----
  const StageSummary st = SummarizeStages(c, parts);

  TimeBreakdown out;
  const int64_t microbatches = train_.global_batch_size / (int64_t{c.dp} * c.mbs);
  out.microbatches = microbatches;
  // 1F1B: (m + p − 1)·(t_f + t_b); interleaved: bubble (p − 1)/v instead of p − 1.
  const double slots = microbatches + (c.pp - 1.0) / c.vpp;
  out.bubble_fraction = 1.0 - microbatches / slots;
  for (int k = 0; k < kNumFeatures; ++k)
    out.features[k] = slots * (st.slowest.fwd[k] + st.slowest.bwd[k]);
  // FP8: TE quantizes a stage's weights (read BF16, write the cached FP8 copies) once a step, in
  // its first micro-batch's forward; Megatron passes is_first_microbatch, so later micro-batches
  // reuse them. FP8 parameters are already FP8: only their transposes are written (read and
  // write one byte each, where the GEMMs need them).
  const double fp8_cast_bytes = c.fp8_param_gather
                                    ? 2.0 * (Fp8WeightCacheBytes(fp8_transposed_copy_) - 1)
                                    : element_bytes_ + Fp8WeightCacheBytes(fp8_transposed_copy_);
  out.features[kMemoryBound] += fp8_cast_bytes * st.fp8_weights / hbm;
  out.layer_forward_s = parts.dense.forward();
  out.layer_backward_s = parts.dense.backward() + st.recompute_share * parts.dense.forward();
  out.forward_per_microbatch_s = st.slowest.forward();
  out.backward_per_microbatch_s = st.slowest.backward();

  // Pipeline p2p: every micro-batch crosses each virtual stage boundary forward and backward
  // (the activations' scatter-gather / SP shard by tp).
  if (c.pp > 1) {
    const double tokens = c.mbs * static_cast<double>(train_.seq_length) / (c.cp * c.up);
    const double bytes = element_bytes_ * tokens * m.hidden_size / c.tp;
    const int64_t pp_stride = int64_t{c.tp} * c.up * c.cp * c.dp;
    const double p2p = P2PTime(bytes, CrossesNodes(c.pp, pp_stride));
    out.features[kPpComm] = 2 * p2p * (microbatches * c.vpp + (c.pp - 1));
  }
  // ---- data-parallel gradient reduction, parameter gather and the optimizer (§4.5) ----
  AddDataParallel(c, st, out);
  for (double x : out.features) out.step_time_s += x;
  return out;
}

Estimate CostModel::Evaluate(const ParallelConfig& c) const {
  Estimate est;
  est.time = Time(c);
  est.memory = Memory(c);
  const double tokens = static_cast<double>(train_.global_batch_size) * train_.seq_length;
  est.tokens_per_s = tokens / est.time.step_time_s;
  est.model_tflops_per_gpu =
      model_flops_per_step_ / est.time.step_time_s / cluster_.world_size() / 1e12;
  est.mfu = est.model_tflops_per_gpu * 1e12 / peak_flops_;
  est.peak_memory_gib = est.memory.total() / kGiB;
  est.fits = est.peak_memory_gib <= cluster_.gpu.memory_gib;
  return est;
}

}  // namespace autopar
