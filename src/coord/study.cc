#include "autopar/coord/study.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/util/message_differencer.h>

#include "autopar/coord/convert.h"
#include "autopar/search/rng.h"

namespace autopar::coord {
namespace {

std::string DeterministicBytes(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  m.SerializeToCodedStream(&coded);
  coded.Trim();
  return out;
}

void Compare(const char* part, const google::protobuf::Message& stored,
             const google::protobuf::Message& given) {
  google::protobuf::util::MessageDifferencer differ;
  std::string report;
  differ.ReportDifferencesToString(&report);
  if (!differ.Compare(stored, given)) {
    if (report.size() > 600) report = report.substr(0, 600) + "...";
    throw StudyError(std::string("the ") + part +
                     " differs from the study's (study.pb → flags):\n" + report +
                     "resume with the flags the study was started with, or start a new --study");
  }
}

}  // namespace

pb::ModelDesc Describe(const ModelSpec& m) {
  pb::ModelDesc d;
  d.set_name(m.name);
  d.set_num_layers(m.num_layers);
  d.set_hidden_size(m.hidden_size);
  d.set_ffn_hidden_size(m.ffn_hidden_size);
  d.set_num_attention_heads(m.num_attention_heads);
  d.set_num_query_groups(m.num_query_groups);
  d.set_kv_channels(m.kv_channels);
  d.set_vocab_size(m.vocab_size);
  d.set_max_position_embeddings(m.max_position_embeddings);
  d.set_activation(ToString(m.activation));
  d.set_norm(ToString(m.norm));
  d.set_position_embedding(ToString(m.position_embedding));
  d.set_untie_embeddings(m.untie_embeddings);
  d.set_add_bias_linear(m.add_bias_linear);
  d.set_qk_layernorm(m.qk_layernorm);
  d.set_q_lora_rank(m.q_lora_rank);
  d.set_kv_lora_rank(m.kv_lora_rank);
  d.set_qk_head_dim(m.qk_head_dim);
  d.set_qk_pos_emb_head_dim(m.qk_pos_emb_head_dim);
  d.set_v_head_dim(m.v_head_dim);
  d.set_num_experts(m.num_experts);
  d.set_moe_router_topk(m.moe_router_topk);
  d.set_moe_ffn_hidden_size(m.moe_ffn_hidden_size);
  d.set_moe_shared_expert_intermediate_size(m.moe_shared_expert_intermediate_size);
  d.set_moe_first_dense_layers(m.moe_first_dense_layers);
  d.set_window_size(m.window_size);
  d.set_window_attn_skip_freq(m.window_attn_skip_freq);
  d.set_mtp_num_layers(m.mtp_num_layers);
  return d;
}

pb::TrainDesc Describe(const TrainSpec& t) {
  pb::TrainDesc d;
  d.set_global_batch_size(t.global_batch_size);
  d.set_seq_length(t.seq_length);
  d.set_precision(ToString(t.precision));
  return d;
}

pb::ClusterDesc Describe(const ClusterSpec& c) {
  pb::ClusterDesc d;
  d.set_nnodes(c.nnodes);
  d.set_gpus_per_node(c.gpus_per_node);
  pb::GpuDesc& g = *d.mutable_gpu();
  g.set_name(c.gpu.name);
  g.set_memory_gib(c.gpu.memory_gib);
  g.set_peak_flops_bf16(c.gpu.peak_flops_bf16);
  g.set_peak_flops_fp16(c.gpu.peak_flops_fp16);
  g.set_peak_flops_fp8(c.gpu.peak_flops_fp8);
  g.set_peak_flops_fp32(c.gpu.peak_flops_fp32);
  g.set_hbm_bandwidth(c.gpu.hbm_bandwidth);
  g.set_intra_node_bandwidth(c.gpu.intra_node_bandwidth);
  g.set_intra_node_latency_s(c.gpu.intra_node_latency_s);
  g.set_inter_node_bandwidth(c.gpu.inter_node_bandwidth);
  g.set_inter_node_latency_s(c.gpu.inter_node_latency_s);
  g.set_nvlink_domain_gpus(c.gpu.nvlink_domain_gpus);
  return d;
}

pb::SpaceDesc Describe(const SpaceOptions& s, const search::CandidateSet& candidates) {
  pb::SpaceDesc d;
  for (int32_t v : s.tp) d.add_tp(v);
  for (int32_t v : s.pp) d.add_pp(v);
  for (int32_t v : s.dp) d.add_dp(v);
  for (int32_t v : s.cp) d.add_cp(v);
  for (int32_t v : s.up) d.add_up(v);
  for (int32_t v : s.ep) d.add_ep(v);
  for (int32_t v : s.etp) d.add_etp(v);
  for (int32_t v : s.vpp) d.add_vpp(v);
  for (int32_t v : s.mbs) d.add_mbs(v);
  for (int32_t v : s.recompute_layers) d.add_recompute_layers(v);
  for (bool v : s.sp) d.add_sp(v);
  for (bool v : s.dist_opt) d.add_dist_opt(v);
  for (bool v : s.overlap_grad_reduce) d.add_overlap_grad_reduce(v);
  for (bool v : s.overlap_param_gather) d.add_overlap_param_gather(v);
  for (bool v : s.cp_allgather) d.add_cp_allgather(v);
  for (bool v : s.fp8_param_gather) d.add_fp8_param_gather(v);
  for (GradReduceDtype v : s.grad_reduce_dtype) {
    ParallelConfig c;
    c.grad_reduce_dtype = v;
    d.add_grad_reduce_dtype(ToProto(c).grad_reduce_dtype());
  }
  for (Recompute r : s.recompute) {
    ParallelConfig c;
    c.recompute = r;
    d.add_recompute(ToProto(c).recompute());
  }
  d.set_tp_across_nodes(s.tp_across_nodes);
  d.set_max_mbs(s.max_mbs);
  d.set_sweep_recompute_layers(s.sweep_recompute_layers);
  d.set_long_sequence_threshold(s.long_sequence_threshold);
  d.set_recompute_modules(s.recompute_modules);
  d.set_flex_dispatcher(s.flex_dispatcher);
  d.set_candidates(candidates.size());
  d.set_candidates_fingerprint(candidates.fingerprint());
  return d;
}

pb::PerfDesc Describe(const PerfConstants& k) {
  pb::PerfDesc d;
  d.set_gemm(k.eff.gemm);
  d.set_gemm_half_dim(k.eff.gemm_half_dim);
  d.set_attention(k.eff.attention);
  d.set_attention_unfused(k.eff.attention_unfused);
  d.set_memory_bound(k.eff.memory_bound);
  d.set_intra_node_bus(k.eff.intra_node_bus);
  d.set_inter_node_bus(k.eff.inter_node_bus);
  d.set_dp_overlap(k.eff.dp_overlap);
  d.set_runtime_overhead_gib(k.mem.runtime_overhead_gib);
  d.set_fragmentation(k.mem.fragmentation);
  d.set_flash_attention(k.stack.flash_attention);
  d.set_dropout(k.stack.dropout);
  d.set_ddp_bucket_size(k.stack.ddp_bucket_size);
  d.set_tp_comm_overlap(k.stack.tp_comm_overlap);
  d.set_cross_entropy_fusion(k.stack.cross_entropy_fusion);
  d.set_no_async_tp_backward(!k.stack.async_tp_backward);
  return d;
}

void CheckSameStudy(const pb::StudyDescription& stored, const pb::StudyDescription& given) {
  if (stored.format_version() != given.format_version()) {
    throw StudyError("study.pb has format version " + std::to_string(stored.format_version()) +
                     ", this build reads version " + std::to_string(given.format_version()));
  }
  Compare("model", stored.model(), given.model());
  Compare("training job (--global-batch-size, --seq-length, precision)", stored.train(),
          given.train());
  Compare("cluster", stored.cluster(), given.cluster());
  // A replay table is identified by its bytes, not by the path it was given as.
  pb::SpaceDesc stored_space = stored.space(), given_space = given.space();
  stored_space.clear_replay_table();
  given_space.clear_replay_table();
  Compare("search space (restrictions, replay table or the analytic model's candidates)",
          stored_space, given_space);
  Compare("performance constants", stored.perf(), given.perf());
  // The search's identity: what the sequence of proposals depends on. Stop-rule knobs may change.
  pb::SearchDesc a = stored.search(), b = given.search();
  for (pb::SearchDesc* s : {&a, &b}) {
    s->clear_stop_draws();
    s->clear_stop_fraction();
    s->clear_stop_epsilon();
    s->clear_stop_delta();
    s->clear_min_measured();
  }
  Compare("search (--searcher, --seed, --backend, --max-p-oom)", a, b);
}

uint64_t Fingerprint(const pb::StudyDescription& d) {
  pb::StudyDescription trial_relevant = d;
  trial_relevant.clear_search();
  trial_relevant.clear_created_by();
  trial_relevant.mutable_space()->clear_replay_table();
  const std::string bytes = DeterministicBytes(trial_relevant);
  search::Hasher h;
  h.Add(bytes.data(), bytes.size());
  return h.value();
}

uint64_t JournalFingerprint(const pb::StudyDescription& d) {
  pb::SearchDesc search = d.search();
  search.clear_stop_draws();
  search.clear_stop_fraction();
  search.clear_stop_epsilon();
  search.clear_stop_delta();
  search.clear_min_measured();
  const std::string bytes = DeterministicBytes(search);
  search::Hasher h;
  h.Add(Fingerprint(d));
  h.Add(static_cast<uint64_t>(d.format_version()));
  h.Add(bytes.data(), bytes.size());
  return h.value() != 0 ? h.value() : 1;
}

const std::string& StudyDir::Created(const std::string& dir) {
  MakeDirectory(dir);
  return dir;
}

StudyDir::StudyDir(const std::string& dir) : dir_(dir), lock_(Created(dir)) {}

bool StudyDir::HasDescription() const { return FileExists(Path("study.pb")); }

pb::StudyDescription StudyDir::ReadDescription() const {
  const std::string path = Path("study.pb");
  const std::string bytes = ReadFile(path);
  pb::StudyDescription d;
  if (!d.ParseFromString(bytes)) {
    throw StudyError("'" + path + "' is not a study description (does not parse)");
  }
  return d;
}

void StudyDir::WriteDescription(const pb::StudyDescription& d) const {
  WriteFileAtomic(Path("study.pb"), DeterministicBytes(d));
}

}  // namespace autopar::coord
