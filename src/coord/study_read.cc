#include "autopar/coord/study_read.h"

#include <map>

#include "autopar/coord/files.h"
#include "autopar/coord/journal.h"
#include "autopar/coord/study.h"

namespace autopar::coord {
namespace {

template <class T>
T OneOf(const std::string& field, const std::string& value,
        std::initializer_list<std::pair<const char*, T>> names) {
  for (const auto& [name, v] : names) {
    if (value == name) return v;
  }
  throw StudyError("study.pb: " + field + " '" + value + "' is not a value autopar-tune writes");
}

}  // namespace

StudySpecs SpecsOf(const pb::StudyDescription& d) {
  StudySpecs s;
  const pb::ModelDesc& m = d.model();
  ModelSpec& model = s.model;
  model.name = m.name();
  model.num_layers = m.num_layers();
  model.hidden_size = m.hidden_size();
  model.ffn_hidden_size = m.ffn_hidden_size();
  model.num_attention_heads = m.num_attention_heads();
  model.num_query_groups = m.num_query_groups();
  model.kv_channels = m.kv_channels();
  model.vocab_size = m.vocab_size();
  model.max_position_embeddings = m.max_position_embeddings();
  model.activation = OneOf<Activation>("model.activation", m.activation(),
                                       {{"swiglu", Activation::kSwiGLU},
                                        {"gelu", Activation::kGeLU}});
  model.norm = OneOf<NormKind>("model.norm", m.norm(),
                               {{"RMSNorm", NormKind::kRMSNorm}, {"LayerNorm", NormKind::kLayerNorm}});
  model.position_embedding = OneOf<PositionEmbedding>(
      "model.position_embedding", m.position_embedding(),
      {{"rope", PositionEmbedding::kRope}, {"learned_absolute", PositionEmbedding::kLearned}});
  model.untie_embeddings = m.untie_embeddings();
  model.add_bias_linear = m.add_bias_linear();
  model.qk_layernorm = m.qk_layernorm();
  model.q_lora_rank = m.q_lora_rank();
  model.kv_lora_rank = m.kv_lora_rank();
  model.qk_head_dim = m.qk_head_dim();
  model.qk_pos_emb_head_dim = m.qk_pos_emb_head_dim();
  model.v_head_dim = m.v_head_dim();
  model.num_experts = m.num_experts();
  model.moe_router_topk = m.moe_router_topk();
  model.moe_ffn_hidden_size = m.moe_ffn_hidden_size();
  model.moe_shared_expert_intermediate_size = m.moe_shared_expert_intermediate_size();
  model.moe_first_dense_layers = m.moe_first_dense_layers();
  model.window_size = m.window_size();
  model.window_attn_skip_freq = m.window_attn_skip_freq();
  model.mtp_num_layers = m.mtp_num_layers();

  s.train.global_batch_size = d.train().global_batch_size();
  s.train.seq_length = d.train().seq_length();
  s.train.precision = OneOf<Precision>("train.precision", d.train().precision(),
                                       {{"bf16", Precision::kBF16}, {"fp16", Precision::kFP16},
                                        {"fp8", Precision::kFP8}, {"fp32", Precision::kFP32}});

  const pb::ClusterDesc& c = d.cluster();
  s.cluster.nnodes = c.nnodes();
  s.cluster.gpus_per_node = c.gpus_per_node();
  GpuSpec& g = s.cluster.gpu;
  g.name = c.gpu().name();
  g.memory_gib = c.gpu().memory_gib();
  g.peak_flops_bf16 = c.gpu().peak_flops_bf16();
  g.peak_flops_fp16 = c.gpu().peak_flops_fp16();
  g.peak_flops_fp8 = c.gpu().peak_flops_fp8();
  g.peak_flops_fp32 = c.gpu().peak_flops_fp32();
  g.hbm_bandwidth = c.gpu().hbm_bandwidth();
  g.intra_node_bandwidth = c.gpu().intra_node_bandwidth();
  g.intra_node_latency_s = c.gpu().intra_node_latency_s();
  g.inter_node_bandwidth = c.gpu().inter_node_bandwidth();
  g.inter_node_latency_s = c.gpu().inter_node_latency_s();
  g.nvlink_domain_gpus = c.gpu().nvlink_domain_gpus();

  const pb::PerfDesc& p = d.perf();
  PerfConstants& k = s.constants;
  k.eff.gemm = p.gemm();
  k.eff.gemm_half_dim = p.gemm_half_dim();
  k.eff.attention = p.attention();
  k.eff.attention_unfused = p.attention_unfused();
  k.eff.memory_bound = p.memory_bound();
  k.eff.intra_node_bus = p.intra_node_bus();
  k.eff.inter_node_bus = p.inter_node_bus();
  k.eff.dp_overlap = p.dp_overlap();
  k.mem.runtime_overhead_gib = p.runtime_overhead_gib();
  k.mem.fragmentation = p.fragmentation();
  k.stack.flash_attention = p.flash_attention();
  k.stack.dropout = p.dropout();
  k.stack.ddp_bucket_size = p.ddp_bucket_size();
  k.stack.tp_comm_overlap = p.tp_comm_overlap();
  k.stack.cross_entropy_fusion = p.cross_entropy_fusion();
  k.stack.async_tp_backward = !p.no_async_tp_backward();
  return s;
}

pb::StudyDescription ReadStudyDescription(const std::string& dir) {
  const std::string path = dir + "/study.pb";
  const std::string bytes = ReadFile(path);
  pb::StudyDescription d;
  if (!d.ParseFromString(bytes)) throw StudyError("'" + path + "' does not parse");
  return d;
}

JournalSummary ReadJournal(const std::string& dir, const pb::StudyDescription& description) {
  JournalSummary s;
  const std::string path = dir + "/journal";
  if (!FileExists(path)) return s;
  const std::string bytes = ReadFile(path);
  std::vector<pb::JournalRecord> records;
  int64_t bad = -1;
  s.file_bytes = bytes.size();
  s.valid_bytes = ParseFrames(bytes, &records, &bad, path, JournalFingerprint(description));
  if (bad >= 0) {
    throw StudyError("'" + path + "' has a record that does not parse at byte " +
                     std::to_string(bad));
  }
  std::map<int64_t, JournaledTrial> trials;
  for (const pb::JournalRecord& r : records) {
    switch (r.kind_case()) {
      case pb::JournalRecord::kSession:
        ++s.sessions;
        break;
      case pb::JournalRecord::kTrialStarted: {
        const pb::TrialStarted& t = r.trial_started();
        JournaledTrial& j = trials[t.trial_index()];
        j.index = t.trial_index();
        j.attempts = std::max(j.attempts, t.attempt());
        j.spec = t.spec();
        j.finished = false;
        j.predicted_step_time_s = t.predicted_step_time_s();
        j.predicted_memory_gib = t.predicted_memory_gib();
        j.p_oom = t.p_oom();
        break;
      }
      case pb::JournalRecord::kTrialFinished: {
        const pb::TrialFinished& f = r.trial_finished();
        JournaledTrial& j = trials[f.result().trial_index()];
        j.index = f.result().trial_index();
        j.finished = true;
        j.result = f.result();
        j.attempts = std::max(j.attempts, f.result().attempt());
        if (j.spec.empty()) j.spec = f.result().spec();
        j.elapsed_s = f.elapsed_s();
        s.elapsed_s = std::max(s.elapsed_s, f.elapsed_s());
        if (!f.best_spec().empty()) {
          s.best_spec = f.best_spec();
          s.best_step_time_s = f.best_step_time_s();
        }
        break;
      }
      case pb::JournalRecord::kFinished:
        s.stop_reason = r.finished().stop_reason();
        s.elapsed_s = std::max(s.elapsed_s, r.finished().elapsed_s());
        break;
      default:
        break;
    }
  }
  for (auto& [index, t] : trials) s.trials.push_back(std::move(t));
  return s;
}

}  // namespace autopar::coord
