#include "autopar/cli/plan_format.h"

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <sstream>

#include "autopar/cli/json.h"
#include "autopar/cli/pipeline_stages.h"
#include "autopar/perf/accuracy.h"
#include "autopar/spec/units.h"

namespace autopar::cli {
namespace {

std::string Fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

// Megatron's --moe-token-dispatcher-type of the dispatch the model timed.
const char* DispatcherName(const ParallelConfig& c) {
  return c.flex_dispatcher ? "flex" : "alltoall";
}

void WriteMemoryJson(JsonWriter& j, const MemoryBreakdown& m) {
  j.Key("memory_gib").BeginObject();
  j.Field("weights", m.weights / kGiB).Field("gradients", m.gradients / kGiB);
  j.Field("optimizer", m.optimizer / kGiB).Field("activations", m.activations / kGiB);
  j.Field("logits", m.logits / kGiB).Field("overhead", m.overhead / kGiB);
  j.EndObject();
}

void WriteTimeJson(JsonWriter& j, const TimeBreakdown& t) {
  j.Key("time_s").BeginObject();
  for (int k = 0; k < kNumFeatures; ++k) j.Field(FeatureName(k), t.features[k]);
  j.EndObject();
  j.Field("microbatches", t.microbatches).Field("bubble_fraction", t.bubble_fraction);
  j.Field("forward_per_microbatch_s", t.forward_per_microbatch_s);
  j.Field("backward_per_microbatch_s", t.backward_per_microbatch_s);
  j.Field("layer_forward_s", t.layer_forward_s).Field("layer_backward_s", t.layer_backward_s);
}

void WriteJson(std::ostream& out, const Inputs& in, const PlanSummary& summary,
               const std::vector<Ranked>& ranked, bool with_breakdown) {
  JsonWriter j(out);
  j.BeginObject();
  j.Field("model", in.model.name).Field("gpu", in.cluster.gpu.name);
  j.Field("nnodes", in.cluster.nnodes).Field("gpus_per_node", in.cluster.gpus_per_node);
  j.Field("nvlink_domain_gpus", in.cluster.NvlinkDomainGpus());
  j.Field("global_batch_size", in.train.global_batch_size).Field("seq_length", in.train.seq_length);
  j.Field("candidates", summary.candidates).Field("feasible", summary.feasible);
  j.Field("elapsed_s", summary.elapsed_s);
  const PredictionSpread spread = SpreadOf(in.train, in.constants.stack);
  if (spread.rows > 0) {
    j.Key("prediction_spread").BeginObject();
    j.Field("relative", spread.relative).Field("rows", int64_t{spread.rows});
    j.Field("like", std::string(spread.like));
    j.EndObject();
  }
  j.Key("configs").BeginArray();
  for (const Ranked& r : ranked) {
    const Estimate& e = r.estimate;
    j.BeginObject();
    j.Field("config", ToSpec(r.config));
    j.Field("step_time_s", e.time.step_time_s).Field("tokens_per_s", e.tokens_per_s);
    if (spread.rows > 0) {
      j.Field("step_time_low_s", e.time.step_time_s * (1 - spread.relative));
      j.Field("step_time_high_s", e.time.step_time_s * (1 + spread.relative));
    }
    j.Field("model_tflops_per_gpu", e.model_tflops_per_gpu).Field("mfu", e.mfu);
    j.Field("peak_memory_gib", e.peak_memory_gib).Field("fits", e.fits);
    j.Field("megatron_args", MegatronFlags(r.config, in.model, in.train));
    if (with_breakdown) {
      j.Key("breakdown").BeginObject();
      WriteTimeJson(j, e.time);
      WriteMemoryJson(j, e.memory);
      j.EndObject();
    }
    j.EndObject();
  }
  j.EndArray().EndObject();
  out << "\n";
}

void WriteTable(std::ostream& out, const Inputs& in, const PlanSummary& summary,
                const std::vector<Ranked>& ranked, bool with_breakdown) {
  out << in.model.name << " on " << in.cluster.nnodes << " x " << in.cluster.gpus_per_node << " "
      << in.cluster.gpu.name << ", global batch " << in.train.global_batch_size << " x "
      << in.train.seq_length << " tokens (" << ToString(in.train.precision) << ")\n";
  if (in.cluster.NvlinkDomainGpus() > in.cluster.gpus_per_node) {
    out << "NVLink domains of " << in.cluster.NvlinkDomainGpus() << " GPUs ("
        << in.cluster.NvlinkDomainGpus() / in.cluster.gpus_per_node
        << " nodes): groups inside one are costed on NVLink\n";
  }
  if (summary.candidates > 0) {
    out << summary.candidates << " configurations satisfy the constraints, " << summary.feasible
        << " fit in " << Fixed(in.cluster.gpu.memory_gib, 1) << " GiB; ranked in "
        << Fixed(summary.elapsed_s * 1e3, 1) << " ms\n";
  }
  out << "\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-4s %-86s %9s %11s %8s %6s %8s\n", "rank", "config",
                "step_s", "tokens/s", "TFLOP/s", "MFU", "mem_GiB");
  out << line;
  for (size_t i = 0; i < ranked.size(); ++i) {
    const Estimate& e = ranked[i].estimate;
    std::snprintf(line, sizeof line, "%-4zu %-86s %9.3f %11.0f %8.1f %5.1f%% %8.1f%s\n", i + 1,
                  ToSpec(ranked[i].config).c_str(), e.time.step_time_s, e.tokens_per_s,
                  e.model_tflops_per_gpu, 100 * e.mfu, e.peak_memory_gib, e.fits ? "" : " (OOM)");
    out << line;
  }
  if (const PredictionSpread spread = SpreadOf(in.train, in.constants.stack);
      spread.rows > 0 && !ranked.empty()) {
    out << "prediction interval: step_s ±" << Fixed(100 * spread.relative, 1)
        << "%, the model's mean error on " << spread.rows << " published " << spread.like
        << " (scripts/bench_accuracy.sh)\n";
  }
  if (!with_breakdown) return;
  for (const Ranked& r : ranked) {
    const Estimate& e = r.estimate;
    out << "\ntime breakdown (s per step, " << e.time.microbatches << " micro-batches, bubble "
        << Fixed(100 * e.time.bubble_fraction, 1) << "%):\n";
    for (int k = 0; k < kNumFeatures; ++k) {
      if (e.time.features[k] == 0) continue;
      std::snprintf(line, sizeof line, "  %-14s %10.4f  %5.1f%%\n", FeatureName(k),
                    e.time.features[k], 100 * e.time.features[k] / e.time.step_time_s);
      out << line;
    }
    const MemoryBreakdown& m = e.memory;
    out << "memory breakdown (GiB, most loaded rank):\n";
    const std::pair<const char*, double> parts[] = {
        {"weights", m.weights}, {"gradients", m.gradients}, {"optimizer", m.optimizer},
        {"activations", m.activations}, {"logits", m.logits}, {"overhead", m.overhead}};
    for (const auto& [name, bytes] : parts) {
      std::snprintf(line, sizeof line, "  %-14s %10.2f\n", name, bytes / kGiB);
      out << line;
    }
    std::snprintf(line, sizeof line, "  %-14s %10.2f of %.2f%s\n", "total", m.total() / kGiB,
                  in.cluster.gpu.memory_gib, e.fits ? "" : "  (does not fit)");
    out << line;
    out << "megatron: " << MegatronFlags(r.config, in.model, in.train) << "\n";
  }
}

// A CSV field, quoted when it holds a comma, a quote or a line break (RFC 4180).
std::string CsvField(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char ch : text) quoted += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return quoted + "\"";
}

// NeMo's auto-configurator summary columns first (its names: TP, PP, CP, EP, VP, MBS, Act Ckpt
// Layers, GBS, Time per Step, ...), then what it has no column for. CP is Megatron's context
// parallel size (cp·up, as --context-parallel-size and NeMo count it); UP says how much of it is
// Ulysses. Config is the SPEC (`predict --config` takes it back).
void WriteCsv(std::ostream& out, const Inputs& in, const std::vector<Ranked>& ranked) {
  out << "Rank,Model Name,Seq Length,TP,PP,CP,EP,VP,MBS,Act Ckpt Layers,Num Layers,GBS,Nodes,"
         "GPUs per Node,Time per Step,Samples per Second,Model TFLOPS / GPU,"
         "Model TFLOPS Aggregate,MFU,Peak Memory GiB,Fits,DP,UP,ETP,SP,Recompute,Dist Opt,Config\n";
  const int64_t gpus = in.cluster.world_size();
  for (size_t i = 0; i < ranked.size(); ++i) {
    const ParallelConfig& c = ranked[i].config;
    const Estimate& e = ranked[i].estimate;
    // Fully recomputed layers per pipeline stage, as NeMo counts activation checkpointing: every
    // layer of the largest stage where recompute_layers is 0.
    int64_t ckpt_layers = 0;
    if (c.recompute == Recompute::kFull) {
      ckpt_layers =
          c.recompute_layers > 0 ? c.recompute_layers : LargestStageLayers(c, in.model.num_layers);
    }
    const double step_s = e.time.step_time_s;
    out << i + 1 << ',' << CsvField(in.model.name) << ',' << in.train.seq_length << ',' << c.tp
        << ',' << c.pp << ',' << c.cp * c.up << ',' << c.ep << ',' << c.vpp << ',' << c.mbs << ','
        << ckpt_layers << ',' << in.model.num_layers << ',' << in.train.global_batch_size << ','
        << in.cluster.nnodes << ',' << in.cluster.gpus_per_node << ',' << step_s << ','
        << (step_s > 0 ? static_cast<double>(in.train.global_batch_size) / step_s : 0) << ','
        << e.model_tflops_per_gpu << ',' << e.model_tflops_per_gpu * static_cast<double>(gpus)
        << ',' << e.mfu << ',' << e.peak_memory_gib << ',' << (e.fits ? "true" : "false") << ','
        << c.dp << ',' << c.up << ',' << c.expert_tp() << ',' << (c.sp ? "on" : "off") << ','
        << ToString(c.recompute) << ',' << (c.dist_opt ? "on" : "off") << ',' << CsvField(ToSpec(c))
        << '\n';
  }
}

// One YAML document per configuration, each a Megatron-Bridge override file, with the estimate
// in a comment above it.
void WriteYaml(std::ostream& out, const Inputs& in, const std::vector<Ranked>& ranked) {
  for (size_t i = 0; i < ranked.size(); ++i) {
    const Ranked& r = ranked[i];
    const Estimate& e = r.estimate;
    if (i > 0) out << "---\n";
    out << "# " << i + 1 << ": " << ToSpec(r.config) << "\n# " << in.model.name << " on "
        << in.cluster.nnodes << " x " << in.cluster.gpus_per_node << " " << in.cluster.gpu.name
        << ": predicted " << Fixed(e.time.step_time_s, 4) << " s per step, "
        << Fixed(e.peak_memory_gib, 1) << " GiB" << (e.fits ? "" : " (does not fit)") << ", MFU "
        << Fixed(100 * e.mfu, 1) << "%\n";
    WriteBridgeYaml(out, BridgeOverrides(r.config, in.model, in.train));
  }
}

std::string BridgeValue(const BridgeOverride& o, bool yaml) {
  if (!o.list.empty()) {
    std::string text = "[";
    for (size_t i = 0; i < o.list.size(); ++i) {
      text += (i ? (yaml ? ", " : ",") : "") + o.list[i];
    }
    return text + "]";
  }
  return o.value;
}

}  // namespace

std::string MegatronFlags(const ParallelConfig& c, const ModelSpec& model, const TrainSpec& train) {
  std::ostringstream f;
  f << "--tensor-model-parallel-size " << c.tp << " --pipeline-model-parallel-size " << c.pp;
  // Megatron-LM's uneven split: the first and last stages' transformer layers where they differ
  // from the middle ones' (TransformerConfig.num_layers_in_first/last_pipeline_stage); the
  // --account-for-*-in-pipeline-split switches only where the configuration counts the embedding
  // or the loss in its split of virtual stages (elsewhere they would change what an even split
  // means).
  if (c.pp_first != 0) f << " --decoder-first-pipeline-num-layers " << c.pp_first;
  if (c.pp_last != 0) f << " --decoder-last-pipeline-num-layers " << c.pp_last;
  if (c.split_embedding) f << " --account-for-embedding-in-pipeline-split";
  if (c.split_loss) f << " --account-for-loss-in-pipeline-split";
  // Virtual stages as a count per rank, which Megatron-LM takes with even and uneven stages alike
  // (--num-layers-per-virtual-pipeline-stage it refuses with uneven ones; arguments.py).
  if (c.vpp > 1) f << " --num-virtual-stages-per-pipeline-rank " << c.vpp;
  // Megatron-LM's context parallelism is both of our sequence splits: its size is cp·up, and
  // --cp-comm-type says how attention crosses it: p2p (the default) is the ring, a2a is Ulysses,
  // a2a+p2p is Ulysses inside rings, with --hierarchical-context-parallel-sizes listing the a2a
  // group's size first (megatron/core/model_parallel_config.py; the a2a groups are the
  // consecutive ranks of the cp group, up next to tp as in our rank order); all_gather gathers K
  // and V over the ring's group instead, spelt as Transformer Engine compares it (Megatron passes
  // the value through; its help's "allgather" raises TE's "Unsupported communication type").
  if (c.cp * c.up > 1) f << " --context-parallel-size " << c.cp * c.up;
  if (c.cp_allgather) f << " --cp-comm-type all_gather";
  if (c.up > 1 && c.cp == 1) f << " --cp-comm-type a2a";
  if (c.up > 1 && c.cp > 1) {
    f << " --cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes " << c.up << ' ' << c.cp;
  }
  if (c.ep > 1) f << " --expert-model-parallel-size " << c.ep;
  // The dispatcher the cost model timed (Megatron's default all-gathers the tokens).
  if (c.ep > 1 || c.flex_dispatcher) f << " --moe-token-dispatcher-type " << DispatcherName(c);
  // Always for a MoE model, even at Megatron's default (tp): a recipe's own value (often 1)
  // would otherwise stay in a command these flags are pasted into.
  if (model.is_moe()) f << " --expert-tensor-parallel-size " << c.expert_tp();
  f << " --micro-batch-size " << c.mbs << " --global-batch-size " << train.global_batch_size;
  if (c.sp) f << " --sequence-parallel";
  // The modules always, even Megatron's default (core_attn): a recipe's own list would otherwise
  // stay in a command these flags are pasted into.
  if (c.recompute == Recompute::kSelective) {
    f << " --recompute-granularity selective --recompute-modules";
    for (const std::string& name : RecomputeModuleNames(c.selective_modules())) f << ' ' << name;
  }
  if (c.recompute == Recompute::kFull) {
    f << " --recompute-granularity full";
    if (c.recompute_layers == 0) f << " --recompute-method uniform --recompute-num-layers 1";
    else f << " --recompute-method block --recompute-num-layers " << c.recompute_layers;
  }
  if (c.dist_opt) f << " --use-distributed-optimizer";
  // Megatron defaults both overlaps off, and reduces gradients in fp32 when training in bf16 but
  // in fp16 when training in fp16 (megatron/training/arguments.py), so the flags say what the
  // configuration runs.
  if (c.overlap_grad_reduce) f << " --overlap-grad-reduce";
  if (c.overlap_param_gather) f << " --overlap-param-gather";
  // 16-bit reduction is in the parameters' dtype: bf16 asks for it, fp16 does it by default.
  const bool fp32_reduce = c.grad_reduce_dtype == GradReduceDtype::kFP32;
  const bool bf16_params =
      train.precision == Precision::kBF16 || train.precision == Precision::kFP8;
  if (!fp32_reduce && bf16_params) f << " --grad-reduce-in-bf16";
  if (fp32_reduce && train.precision == Precision::kFP16) {
    f << " --accumulate-allreduce-grads-in-fp32";
  }
  if (c.fp8_param_gather) f << " --fp8-param-gather";
  return f.str();
}

std::vector<BridgeOverride> BridgeOverrides(const ParallelConfig& c, const ModelSpec& model,
                                            const TrainSpec& train) {
  std::vector<BridgeOverride> o;
  auto add = [&](const char* key, const std::string& value) { o.push_back({key, value, {}}); };
  auto number = [&](const char* key, int64_t v) { add(key, std::to_string(v)); };
  auto boolean = [&](const char* key, bool v) { add(key, v ? "true" : "false"); };
  number("model.tensor_model_parallel_size", c.tp);
  number("model.pipeline_model_parallel_size", c.pp);
  // Megatron-Core reads None as "not interleaved".
  if (c.vpp > 1) {
    number("model.virtual_pipeline_model_parallel_size", c.vpp);
  } else {
    add("model.virtual_pipeline_model_parallel_size", "null");
  }
  // The stages as MegatronFlags gives them (TransformerConfig's fields; None: the even share), and
  // the recipe's other ways of splitting the layers undone, since Megatron-Core refuses them
  // with uneven stages and they change what an even split means.
  const auto stage_layers = [&](const char* key, int32_t layers) {
    add(key, layers != 0 ? std::to_string(layers) : "null");
  };
  stage_layers("model.num_layers_in_first_pipeline_stage", c.pp_first);
  stage_layers("model.num_layers_in_last_pipeline_stage", c.pp_last);
  add("model.pipeline_model_parallel_layout", "null");
  boolean("model.account_for_embedding_in_pipeline_split", c.split_embedding);
  boolean("model.account_for_loss_in_pipeline_split", c.split_loss);
  // Context parallelism as in MegatronFlags: size cp·up, the comm type says ring, Ulysses or both.
  number("model.context_parallel_size", int64_t{c.cp} * c.up);
  if (c.cp * c.up > 1) {
    add("model.cp_comm_type", c.cp_allgather ? "all_gather"
                              : c.up == 1    ? "p2p"
                              : c.cp == 1    ? "a2a"
                                             : "a2a+p2p");
  }
  if (c.up > 1 && c.cp > 1) {
    o.push_back({"model.hierarchical_context_parallel_sizes",
                 "",
                 {std::to_string(c.up), std::to_string(c.cp)}});
  }
  if (model.is_moe()) {
    number("model.expert_model_parallel_size", c.ep);
    // Always, as in MegatronFlags: recipes often set their own.
    number("model.expert_tensor_parallel_size", c.expert_tp());
    if (c.ep > 1 || c.flex_dispatcher) add("model.moe_token_dispatcher_type", DispatcherName(c));
  }
  boolean("model.sequence_parallel", c.sp);
  if (c.recompute == Recompute::kNone) {
    add("model.recompute_granularity", "null");
    add("model.recompute_method", "null");
    add("model.recompute_num_layers", "null");
  } else if (c.recompute == Recompute::kSelective) {
    add("model.recompute_granularity", "selective");
    add("model.recompute_method", "null");
    add("model.recompute_num_layers", "null");
    o.push_back({"model.recompute_modules", "", RecomputeModuleNames(c.selective_modules())});
  } else {
    add("model.recompute_granularity", "full");
    add("model.recompute_method", c.recompute_layers == 0 ? "uniform" : "block");
    number("model.recompute_num_layers", c.recompute_layers == 0 ? 1 : c.recompute_layers);
  }
  number("train.micro_batch_size", c.mbs);
  number("train.global_batch_size", train.global_batch_size);
  boolean("ddp.use_distributed_optimizer", c.dist_opt);
  boolean("ddp.overlap_grad_reduce", c.overlap_grad_reduce);
  boolean("ddp.overlap_param_gather", c.overlap_param_gather);
  // The precision preset (bf16_mixed: fp32 reduction; fp16_mixed: fp16) sets the reduction dtype
  // over the DDP config's, so a departure from the preset is written to both.
  const bool fp32_reduce = c.grad_reduce_dtype == GradReduceDtype::kFP32;
  const bool departs = fp32_reduce != (train.precision != Precision::kFP16);
  if (departs) boolean("ddp.grad_reduce_in_fp32", fp32_reduce);
  // Megatron-Bridge asserts that the DDP and optimizer configs agree on this one.
  boolean("optimizer.use_distributed_optimizer", c.dist_opt);
  if (departs) boolean("mixed_precision.grad_reduce_in_fp32", fp32_reduce);
  // FP8 parameters: Megatron-Bridge's FP8 presets turn them on (bf16_with_fp8_*_mixed), and the
  // mixed-precision config's value is copied over the model's, optimizer's and DDP's
  // (MixedPrecisionConfig.setup), so an FP8 run always says which it is.
  if (train.precision == Precision::kFP8) {
    boolean("mixed_precision.fp8_param_gather", c.fp8_param_gather);
  }
  return o;
}

std::string BridgeOverrideLine(const std::vector<BridgeOverride>& overrides) {
  std::string line;
  for (const BridgeOverride& o : overrides) {
    line += (line.empty() ? "" : " ") + o.key + "=" + BridgeValue(o, /*yaml=*/false);
  }
  return line;
}

void WriteBridgeYaml(std::ostream& out, const std::vector<BridgeOverride>& overrides) {
  // Each section once (a YAML mapping has no repeated keys), in the order they first appear.
  std::vector<std::string> sections;
  for (const BridgeOverride& o : overrides) {
    const std::string head = o.key.substr(0, o.key.find('.'));
    if (std::find(sections.begin(), sections.end(), head) == sections.end()) {
      sections.push_back(head);
    }
  }
  for (const std::string& section : sections) {
    out << section << ":\n";
    for (const BridgeOverride& o : overrides) {
      if (o.key.compare(0, section.size() + 1, section + ".") != 0) continue;
      out << "  " << o.key.substr(section.size() + 1) << ": " << BridgeValue(o, /*yaml=*/true)
          << "\n";
    }
  }
}

void WriteRanked(std::ostream& out, Format format, const Inputs& in, const PlanSummary& summary,
                 const std::vector<Ranked>& ranked, bool with_breakdown) {
  switch (format) {
    case Format::kJson: return WriteJson(out, in, summary, ranked, with_breakdown);
    case Format::kCsv:
      return WriteCsv(out, in, ranked);
    case Format::kYaml: return WriteYaml(out, in, ranked);
    case Format::kBridge:
      for (const Ranked& r : ranked) {
        out << BridgeOverrideLine(BridgeOverrides(r.config, in.model, in.train)) << "\n";
      }
      return;
    case Format::kMegatron:
      for (const Ranked& r : ranked) out << MegatronFlags(r.config, in.model, in.train) << "\n";
      return;
    case Format::kTable: return WriteTable(out, in, summary, ranked, with_breakdown);
  }
}

}  // namespace autopar::cli
