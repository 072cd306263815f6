// A rank's place in a configuration: coordinates, process groups, shapes, and what the trial
// runner can express.
#include "src/trial/groups.h"

#include <algorithm>

namespace autopar::trial {

using device::OkStatus;

Coordinates Coordinates::Of(int rank, const ParallelConfig& c) {
  Coordinates at;
  at.tp = rank % c.tp;
  rank /= c.tp;
  at.up = rank % c.up;
  rank /= c.up;
  at.cp = rank % c.cp;
  rank /= c.cp;
  at.dp = rank % c.dp;
  at.pp = rank / c.dp;
  const int q = at.tp + c.tp * (at.cp + c.cp * at.dp);  // place in the up slice's expert grid
  const int etp = c.expert_tp();
  at.etp = q % etp;
  at.ep = q / etp % c.ep;
  at.edp = at.up + c.up * (q / (etp * c.ep));
  return at;
}

GroupUse UsedGroups(const ParallelConfig& c, bool moe, bool tied_embedding) {
  GroupUse use;
  const int64_t replicas = int64_t{c.up} * c.cp * c.dp;  // ranks holding the same dense weights
  use.tp = c.tp > 1;
  use.up = c.up > 1;
  use.cp = c.cp > 1;
  use.pp = c.pp > 1;
  use.dp = replicas > 1;
  use.ep = moe && c.ep > 1;
  use.edp = moe && c.expert_dp() > 1;
  use.etp = moe && c.expert_tp() > 1 && c.expert_tp() != c.tp;
  use.seq = moe && int64_t{c.tp} * c.up * c.cp > 1;
  use.embedding = tied_embedding && c.pp > 1;
  return use;
}

StatusOr<ProcessGroups> ProcessGroups::Create(device::Platform& platform,
                                              const device::Group& world, const ParallelConfig& c,
                                              Deadline deadline, const GroupUse& use) {
  ProcessGroups g;
  const int rank = world.rank();
  const Coordinates at = Coordinates::Of(rank, c);
  g.at = at;
  const int TP = c.tp, UP = c.up, CP = c.cp, DP = c.dp;
  const int k = at.cp + CP * at.dp;
  // Split and ConnectSplit are collective over the world, so every rank makes every used group in
  // the same order (`use` depends on the configuration only, the same everywhere).
  std::vector<std::vector<int>> connected;  // the member sets of this rank's groups
  auto make = [&](bool used, int color, int key, Comm& out) -> Status {
    if (!used) return OkStatus();
    AUTOPAR_ASSIGN_OR_RETURN(device::Group group, world.Split(color, key));
    AUTOPAR_ASSIGN_OR_RETURN(auto collectives, platform.ConnectSplit(world, group));
    if (collectives != nullptr) out = Comm(std::move(collectives), deadline);
    if (!group.empty()) connected.push_back(group.world_ranks());
    return OkStatus();
  };
  const int tp_stride = 1, up_stride = TP, cp_stride = TP * UP, pp_stride = TP * UP * CP * DP;
  // A group along one dimension: the ranks that differ only in that coordinate.
  AUTOPAR_RETURN_IF_ERROR(make(use.tp, rank - at.tp * tp_stride, at.tp, g.tp));
  AUTOPAR_RETURN_IF_ERROR(make(use.up, rank - at.up * up_stride, at.up, g.up));
  AUTOPAR_RETURN_IF_ERROR(make(use.cp, rank - at.cp * cp_stride, at.cp, g.cp));
  AUTOPAR_RETURN_IF_ERROR(make(use.pp, rank - at.pp * pp_stride, at.pp, g.pp));
  // Dense replicas: same tp and pp; ranked by (up, cp, dp), the distributed optimizer's order.
  AUTOPAR_RETURN_IF_ERROR(make(use.dp, at.tp + TP * at.pp, at.up + UP * k, g.dp));
  // The expert grid of an up slice and stage, q = tp + TP·k: expert-tensor groups are etp
  // consecutive q, expert-parallel groups ep of them at stride etp; expert replicas (edp) share
  // the etp and ep rank and the stage.
  const int ETP = c.expert_tp(), q = at.tp + TP * k, slice = TP * CP * DP;
  const int up_pp = at.up + UP * at.pp;
  AUTOPAR_RETURN_IF_ERROR(make(use.etp, q / ETP + slice / ETP * up_pp, at.etp, g.etp));
  const int ep_groups = slice / (ETP * c.ep);
  AUTOPAR_RETURN_IF_ERROR(
      make(use.ep, at.etp + ETP * (q / (ETP * c.ep) + ep_groups * up_pp), at.ep, g.ep));
  AUTOPAR_RETURN_IF_ERROR(make(use.edp, at.etp + ETP * (at.ep + c.ep * at.pp), at.edp, g.edp));
  // The ranks of one sample: same dp and pp.
  AUTOPAR_RETURN_IF_ERROR(
      make(use.seq, at.dp + DP * at.pp, at.tp + TP * (at.up + UP * at.cp), g.seq));
  // The first and last pipeline stage share the (tied) word embedding; the other stages take
  // part in the split without a group.
  const bool end_stage = at.pp == 0 || at.pp == c.pp - 1;
  AUTOPAR_RETURN_IF_ERROR(
      make(use.embedding, end_stage ? rank - at.pp * pp_stride : -1, at.pp, g.embedding));
  // Communicators cached for earlier configurations go before this one allocates anything.
  platform.RetainGroups(connected);
  return g;
}

Shapes Shapes::Of(const ModelSpec& m, const TrainSpec& t, const ParallelConfig& c,
                  const Coordinates& at) {
  Shapes s{};
  s.tp = c.tp;
  s.pp = c.pp;
  s.vpp = c.vpp;
  s.mbs = c.mbs;
  s.cp = c.cp;
  s.up = c.up;
  s.cp_allgather = c.cp_allgather;
  s.seq = t.seq_length;
  s.seq_local = t.seq_length / (int64_t{c.cp} * c.up);
  s.chunk = t.seq_length / (2 * int64_t{c.cp});
  s.tokens = s.mbs * s.seq_local;
  s.sp = c.sp;
  s.local_tokens = c.sp ? s.tokens / c.tp : s.tokens;
  s.hidden = m.hidden_size;
  s.head_dim = m.head_dim();
  s.heads = m.num_attention_heads / c.tp;
  s.kv_heads = m.num_query_groups / c.tp;
  s.q_cols = s.heads * s.head_dim;
  s.kv_cols = s.kv_heads * s.head_dim;
  s.qkv_cols = s.q_cols + 2 * s.kv_cols;
  s.ul_heads = s.heads / c.up;
  s.ul_kv_heads = s.kv_heads >= c.up ? s.kv_heads / c.up : 1;
  s.ul_cols = (s.ul_heads + 2 * s.ul_kv_heads) * s.head_dim;
  s.rerun = c.selective_modules();
  s.swiglu = m.activation == Activation::kSwiGLU;
  s.ffn = m.ffn_hidden_size / c.tp;
  s.fc1_cols = s.swiglu ? 2 * s.ffn : s.ffn;
  s.vocab = m.vocab_size;
  s.vocab_shard = m.vocab_size / c.tp;
  s.vocab_start = at.tp * s.vocab_shard;
  s.rmsnorm = m.norm == NormKind::kRMSNorm;
  s.qk_norm = m.has_qk_head_norms();
  s.rope = m.position_embedding == PositionEmbedding::kRope;
  s.learned_positions = !s.rope;
  s.max_positions = std::max<int64_t>(m.max_position_embeddings, t.seq_length);
  s.tied = !m.untie_embeddings;
  s.layers_per_chunk = 0;
  for (int model_chunk = 0; model_chunk < c.vpp; ++model_chunk) {
    s.chunk_first_layer.push_back(ChunkFirstLayer(c, m.num_layers, at.pp, model_chunk));
    s.chunk_layers.push_back(ChunkLayers(c, m.num_layers, at.pp, model_chunk));
    s.layers_per_chunk = std::max(s.layers_per_chunk, s.chunk_layers.back());
  }
  if (t.precision == Precision::kFP8) {
    s.fp8.fwd = device::Fp8Operand::kE4M3;
    s.fp8.grad = t.fp8_format == TrainSpec::Fp8Format::kHybrid ? device::Fp8Operand::kE5M2
                                                               : device::Fp8Operand::kE4M3;
  }
  if (m.is_moe()) {
    s.experts = m.num_experts;
    s.local_experts = m.num_experts / c.ep;
    s.topk = m.moe_router_topk;
    s.etp = c.expert_tp();
    s.expert_ffn = m.moe_ffn_hidden_size / s.etp;
    s.shared_ffn = m.moe_shared_expert_intermediate_size / c.tp;
    s.first_dense = m.moe_first_dense_layers;
    s.flex = c.flex_dispatcher;
  }
  return s;
}

int64_t GlobalPosition(const Shapes& s, const Coordinates& at, int64_t s_local) {
  const int64_t q = at.up * s.seq_local + s_local;  // position within the cp rank's two chunks
  return q < s.chunk ? at.cp * s.chunk + q : (2 * s.cp - 1 - at.cp) * s.chunk + q - s.chunk;
}

std::string Fp8Unsupported(bool fp8, bool device_has_fp8, std::string_view device_name) {
  if (!fp8 || device_has_fp8) return {};
  return "--fp8-format: " + std::string(device_name) +
         " has no fp8 GEMMs; fp8 trials run on --backend cuda with a GPU of compute capability 8.9 "
         "or newer (Ada, Hopper, Blackwell)";
}

std::string Unsupported(const ModelSpec& m, const TrainSpec& t, const ParallelConfig& c) {
  if (m.is_mla()) return "multi-head latent attention is not in the trial runner yet";
  if (m.window_size > 0) return "sliding-window attention is not in the trial runner yet";
  if (m.mtp_num_layers > 0) return "multi-token prediction is not in the trial runner yet";
  if (m.num_query_groups % c.tp != 0) {
    return "the trial runner needs num_query_groups divisible by tp (no replicated kv heads)";
  }
  if (m.vocab_size % c.tp != 0) return "the trial runner needs vocab_size divisible by tp";
  if (c.sp && (int64_t{c.mbs} * t.seq_length / (int64_t{c.cp} * c.up)) % c.tp != 0) {
    return "sequence parallelism needs the micro-batch's tokens on a rank divisible by tp";
  }
  const int64_t seq_split = int64_t{c.cp} * c.up;
  if (seq_split > 1 && t.seq_length % (2 * seq_split) != 0) {
    return "context / Ulysses parallelism needs seq_length divisible by 2·cp·up";
  }
  // As the search space (Check): Megatron-LM gathers K and V over the ring's group alone.
  if (c.cp_allgather && (c.cp == 1 || c.up > 1)) return "cp_comm=allgather needs cp > 1 and up = 1";
  const int64_t kv = m.num_query_groups / c.tp, heads = m.num_attention_heads / c.tp;
  if (heads % c.up != 0) return "Ulysses needs the heads of a tp rank divisible by up";
  if (kv % c.up != 0 && c.up % kv != 0) {
    return "Ulysses needs the kv heads of a tp rank to divide up or be a multiple of it";
  }
  if (m.is_moe() || c.ep > 1 || c.expert_tp() != c.tp) {
    if (!m.is_moe()) return "ep > 1 or etp ≠ tp needs a mixture-of-experts model";
    if (m.num_experts % c.ep != 0 ||
        (int64_t{c.tp} * c.cp * c.dp) % (int64_t{c.expert_tp()} * c.ep) != 0) {
      return "ep must divide num_experts and etp·ep must divide tp·cp·dp";
    }
    if (m.moe_ffn_hidden_size % c.expert_tp() != 0) {
      return "etp must divide the experts' width";
    }
    if (m.moe_router_topk < 1 || m.moe_router_topk > m.num_experts) {
      return "moe_router_topk must be between 1 and num_experts";
    }
    if (m.moe_shared_expert_intermediate_size % c.tp != 0) {
      return "tp must divide the shared experts' width";
    }
    // Each tp rank routes its own slice of the rows (experts are etp-sharded).
    if ((int64_t{c.mbs} * t.seq_length / seq_split) % c.tp != 0) {
      return "MoE with tp > 1 needs the micro-batch's tokens on a rank divisible by tp";
    }
  }
  return {};
}

}  // namespace autopar::trial
