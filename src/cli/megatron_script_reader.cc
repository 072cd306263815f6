#include "src/cli/megatron_script_reader.h"

#include <unistd.h>

#include <algorithm>
#include <sstream>

#include "autopar/cli/pipeline_stages.h"
#include "autopar/common/errors.h"
#include "autopar/spec/bounds.h"
#include "src/cli/flag_values.h"

namespace autopar::cli {
namespace {

// Megatron's context parallel group of size c.cp (as read from --context-parallel-size) split
// into our ring (cp) and Ulysses (up) degrees by its communication type
// (megatron/training/arguments.py, megatron/core/model_parallel_config.py): p2p, the default, is
// the ring; a2a is Ulysses; a2a+p2p is both, --hierarchical-context-parallel-sizes giving the a2a
// group's size and then the p2p group's (Megatron asserts that they multiply to the cp size);
// all_gather is the ring's split with K and V all-gathered (cp_allgather). Megatron passes the
// value to Transformer Engine as given, which knows all_gather, not the "allgather" of
// arguments.py's help.
void SplitContextParallel(const std::vector<std::string>& comm_types,
                          const std::vector<std::string>& hierarchical, ParallelConfig& c) {
  const std::string comm_flag = "--cp-comm-type",
                    sizes_flag = "--hierarchical-context-parallel-sizes";
  std::string type = "p2p";
  if (!comm_types.empty()) {
    type = comm_types[0];
    for (const std::string& t : comm_types) {
      if (t != type) {
        throw InputError(
            comm_flag, "one type for every layer is modelled, got '" + type + "' and '" + t + "'");
      }
    }
  }
  std::vector<int32_t> sizes;
  int64_t product = 1;  // at most kMaxGpus², far inside int64: it stops growing past the bound
  for (const std::string& v : hierarchical) {
    sizes.push_back(static_cast<int32_t>(ToInt(sizes_flag, v, 1, bounds::kMaxGpus)));
    product = std::min(product * sizes.back(), bounds::kMaxGpus + 1);
  }
  if (!sizes.empty() && product != c.cp) {
    const std::string what = product > bounds::kMaxGpus
                                 ? "more than " + std::to_string(bounds::kMaxGpus)
                                 : std::to_string(product);
    throw InputError(sizes_flag, "the sizes multiply to " + what +
                                     " but --context-parallel-size is " + std::to_string(c.cp));
  }
  if (type == "p2p") return;  // the ring: cp as read, up = 1
  if (type == "all_gather") {
    c.cp_allgather = c.cp > 1;
  } else if (type == "a2a") {
    c.up = c.cp;
    c.cp = 1;
  } else if (type == "a2a+p2p") {
    if (sizes.size() != 2) {
      throw InputError(sizes_flag,
                       "a2a+p2p needs two sizes, the a2a (Ulysses) group's and then "
                       "the p2p (ring) group's, e.g. 2 4");
    }
    c.up = sizes[0];
    c.cp = sizes[1];
  } else {
    throw InputError(
        comm_flag,
        "allowed: p2p, a2a, a2a+p2p, all_gather; got '" + type + "'" +
            (type == "allgather" ? " (Megatron-LM passes it to Transformer Engine as given, which "
                                   "takes all_gather and raises 'Unsupported communication type')"
                                 : ""));
  }
}

// A Megatron flag's sizes are bounded where they are read (include/autopar/spec/bounds.h): a
// parallel size by the GPUs there can be, a layer count by the layers, a micro-batch by the
// batch, a DDP bucket (elements) by 2^40.
constexpr int64_t kGpus = bounds::kMaxGpus, kLayers = bounds::kMaxLayers;
constexpr int64_t kBucket = int64_t{1} << 40;

// What a Megatron-LM argument list says beyond the configuration's sizes, gathered while reading
// it and applied once every flag is known (FinishMegatronConfig).
struct MegatronReading {
  MegatronStageFlags stages;
  std::string recompute_method;
  // Megatron's context parallelism of size --context-parallel-size runs as our ring (p2p, the
  // default), Ulysses (a2a) or both (a2a+p2p, split by --hierarchical-context-parallel-sizes).
  std::vector<std::string> cp_comm_types;
  std::vector<std::string> hierarchical_cp_sizes;
  // Megatron defaults both overlaps off and reduces bf16 gradients in fp32: a script describes
  // exactly what it passes (arguments.py: --overlap-grad-reduce, --overlap-param-gather,
  // --grad-reduce-in-bf16, --accumulate-allreduce-grads-in-fp32).
  bool overlap_grad_reduce = false, overlap_param_gather = false;
  std::optional<bool> grad_reduce_in_fp32;
  // TransformerConfig's dropout defaults (megatron/core/transformer/transformer_config.py).
  std::optional<double> attention_dropout, hidden_dropout;
  std::optional<uint8_t> recompute_modules;  // canonical: 0 is core_attn alone
  std::optional<bool> flex_dispatcher;       // --moe-token-dispatcher-type flex
  bool fp8_param_gather = false;             // --fp8-param-gather
};

// --fp8-param-gather as the configuration takes it: refused without FP8 training (Megatron-core's
// TransformerConfig: fp8_param needs fp8 mode); with FSDP among the flags left (`rest`: the
// model does not express it), noted and left out.
bool Fp8ParamGather(const MegatronReading& r, const std::vector<std::string>& rest,
                    Precision precision, std::vector<std::string>& notes) {
  if (!r.fp8_param_gather) return false;
  if (precision != Precision::kFP8) {
    throw InputError("--fp8-param-gather",
                     "needs FP8 training (--fp8-format hybrid|e4m3): Megatron-core keeps "
                     "parameters in FP8 only in fp8 mode");
  }
  const auto fsdp = [](const std::string& w) {
    return w == "--use-megatron-fsdp" || w == "--use-torch-fsdp2";
  };
  if (std::any_of(rest.begin(), rest.end(), fsdp)) {
    notes.push_back("--fp8-param-gather with FSDP: not modelled, parameters costed in 16 bits");
    return false;
  }
  return true;
}

// The configuration read from the flags, completed with what the rest of them say: Megatron's
// defaults, its own corrections (with a note), the pipeline's stages (ApplyMegatronStages).
// Returns the flag that made the stages uneven ("" when even).
std::string FinishMegatronConfig(const MegatronReading& r, const ModelSpec& model,
                                 Precision precision, ParallelConfig& config,
                                 std::vector<std::string>& notes) {
  config.overlap_grad_reduce = r.overlap_grad_reduce;
  config.overlap_param_gather = r.overlap_param_gather;
  config.grad_reduce_dtype = r.grad_reduce_in_fp32.value_or(precision != Precision::kFP16)
                                 ? GradReduceDtype::kFP32
                                 : GradReduceDtype::kBF16;
  SplitContextParallel(r.cp_comm_types, r.hierarchical_cp_sizes, config);
  std::string uneven_flag = ApplyMegatronStages(r.stages, model, config);
  if (config.sp && config.tp == 1) {  // validate_args in arguments.py does the same
    config.sp = false;
    notes.push_back(
        "--sequence-parallel: off at --tensor-model-parallel-size 1, as Megatron-LM "
        "turns it off");
  }
  // Megatron-core's default expert tensor parallel size is tp (0, the canonical form); a
  // dense model has no experts for it to split.
  if (config.etp != 0 && config.etp != config.tp && !model.is_moe()) {
    notes.push_back("--expert-tensor-parallel-size " + std::to_string(config.etp) + ": ignored, " +
                    model.name + " has no experts");
    config.etp = 0;
  }
  if (config.etp == config.tp) config.etp = 0;
  // Megatron's dispatchers move a MoE model's tokens; a dense model has none.
  if (r.flex_dispatcher.value_or(false) && !model.is_moe()) {
    notes.push_back("--moe-token-dispatcher-type flex: ignored, " + model.name + " has no experts");
  }
  config.flex_dispatcher = r.flex_dispatcher.value_or(false) && model.is_moe();
  // Megatron-LM takes FP8 parameters with the distributed optimizer or FSDP (arguments.py; FSDP
  // is not modelled, and Fp8ParamGather has left it out there).
  config.fp8_param_gather = r.fp8_param_gather;
  if (config.fp8_param_gather && !config.dist_opt) {
    throw InputError("--fp8-param-gather",
                     "needs --use-distributed-optimizer (Megatron-LM asserts a sharded optimizer "
                     "for FP8 parameters)");
  }
  // Megatron reads the modules only with selective granularity.
  if (config.recompute == Recompute::kSelective) {
    config.recompute_modules = r.recompute_modules.value_or(0);
  }
  // `uniform` with N layers per checkpoint recomputes every layer; only `block` limits it.
  if (config.recompute == Recompute::kFull && r.recompute_method != "block") {
    config.recompute_layers = 0;
  }
  if (config.recompute != Recompute::kFull ||
      config.recompute_layers >= LargestStageLayers(config, model.num_layers)) {
    config.recompute_layers = 0;  // every layer
  }
  return uneven_flag;
}

// Megatron's token dispatcher flags: --moe-token-dispatcher-type (alltoall and flex modelled,
// allgather noted and costed as alltoall), --moe-enable-deepep (the old spelling of flex, no
// value) and --moe-flex-dispatcher-backend (every backend sends a token once per rank holding its
// experts: one cost). `next` gives a flag's value.
bool IsDispatcherFlag(const std::string& flag) {
  return flag == "--moe-token-dispatcher-type" || flag == "--moe-enable-deepep" ||
         flag == "--moe-flex-dispatcher-backend";
}
template <class Next>
void ReadDispatcher(const std::string& flag, Next& next, MegatronReading& r,
                    std::vector<std::string>& notes) {
  if (flag == "--moe-enable-deepep") {
    r.flex_dispatcher = true;
    return;
  }
  const std::string v = next();
  if (flag == "--moe-flex-dispatcher-backend") {
    if (v != "deepep" && v != "hybridep" && v != "ncclep") {
      throw InputError(flag, "allowed: deepep, hybridep, ncclep; got '" + v + "'");
    }
  } else if (v == "allgather") {
    notes.push_back(flag + " allgather is not modelled: costed as alltoall");
  } else if (v == "alltoall" || v == "flex") {
    r.flex_dispatcher = v == "flex";
  } else {
    throw InputError(flag, "allowed: alltoall, flex, allgather; got '" + v + "'");
  }
}

// --attention-backend: flash, fused (cuDNN) and auto keep no s² scores (AttnBackend); unfused
// and local do.
bool FlashBackend(const std::string& flag, const std::string& v) {
  if (v == "flash" || v == "fused" || v == "auto") return true;
  if (v == "unfused" || v == "local") return false;
  throw InputError(flag, "allowed: flash, fused, unfused, local, auto; got '" + v + "'");
}

// Dropout on or off from --attention-dropout and --hidden-dropout; a pasted script that defines
// the model (`script`) takes Megatron's default of 0.1 for each it does not give.
void ApplyDropout(const MegatronReading& r, bool script, StackOptions& stack) {
  if (!r.attention_dropout && !r.hidden_dropout && !script) return;
  const double default_dropout = script ? 0.1 : 0.0;
  stack.dropout = stack.dropout || r.attention_dropout.value_or(default_dropout) > 0 ||
                  r.hidden_dropout.value_or(default_dropout) > 0;
}

// What the flags said beside the configuration (`read`, `rest` the flags they left), and the
// configuration, if they gave one, finished.
void FinishReading(MegatronReading& r, const std::vector<std::string>& rest, const ModelSpec& model,
                   Precision precision, std::optional<ParallelConfig>& config,
                   std::vector<std::string>& notes, MegatronFlagsRead& read) {
  read.uneven_flag.clear();
  read.recompute_modules = r.recompute_modules;
  read.flex_dispatcher = r.flex_dispatcher;
  r.fp8_param_gather = Fp8ParamGather(r, rest, precision, notes);
  read.fp8_param_gather = r.fp8_param_gather;
  if (config) read.uneven_flag = FinishMegatronConfig(r, model, precision, *config, notes);
}

}  // namespace

std::optional<ParallelConfig> TakeMegatronParallelFlags(std::vector<std::string>& args,
                                                        const ModelSpec& model, Precision precision,
                                                        bool script, StackOptions& stack,
                                                        std::vector<std::string>& notes,
                                                        MegatronFlagsRead& read) {
  std::optional<ParallelConfig> config;
  auto cfg = [&]() -> ParallelConfig& {
    if (!config) config = ParallelConfig{};
    return *config;
  };
  MegatronReading r;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i];
    std::optional<std::string> value;
    if (const size_t eq = flag.find('='); IsFlag(flag) && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
    }
    auto next = [&]() -> std::string {
      if (value) return *value;
      if (i + 1 >= args.size() || IsFlag(args[i + 1])) throw InputError(flag, "needs a value");
      return args[++i];
    };
    auto next_int = [&](int64_t max) { return static_cast<int32_t>(ToInt(flag, next(), 1, max)); };
    // argparse's nargs='+': `--flag=a` is one value, `--flag a b` every word up to the next flag.
    auto next_list = [&]() {
      std::vector<std::string> values = {next()};
      while (!value && i + 1 < args.size() && !IsFlag(args[i + 1])) values.push_back(args[++i]);
      return values;
    };
    // One flag a line reads as the table it is.
    // clang-format off
    if (flag == "--tensor-model-parallel-size") cfg().tp = next_int(kGpus);
    else if (flag == "--pipeline-model-parallel-size") cfg().pp = next_int(kGpus);
    else if (flag == "--context-parallel-size") cfg().cp = next_int(kGpus);
    else if (flag == "--cp-comm-type") r.cp_comm_types = next_list();
    else if (flag == "--hierarchical-context-parallel-sizes") r.hierarchical_cp_sizes = next_list();
    else if (flag == "--expert-model-parallel-size") cfg().ep = next_int(kGpus);
    else if (flag == "--virtual-pipeline-model-parallel-size" ||
             flag == "--num-virtual-stages-per-pipeline-rank") {
      cfg().vpp = next_int(kLayers);
      r.stages.virtual_stages_flag = flag;
    } else if (flag == "--expert-tensor-parallel-size") cfg().etp = next_int(kGpus);
    else if (IsDispatcherFlag(flag)) ReadDispatcher(flag, next, r, notes);
    else if (flag == "--num-layers-per-virtual-pipeline-stage") {
      r.stages.layers_per_virtual_stage = next_int(kLayers);
    } else if (flag == "--decoder-first-pipeline-num-layers") {
      r.stages.first_layers = ToInt(flag, next(), 1, kLayers);
      cfg();
    } else if (flag == "--decoder-last-pipeline-num-layers") {
      r.stages.last_layers = ToInt(flag, next(), 1, kLayers);
      cfg();
    } else if (flag == "--pipeline-model-parallel-layout") {
      r.stages.layout = next();
      RefuseUnsetVariable(flag, *r.stages.layout);
      cfg();
    } else if (flag == "--account-for-embedding-in-pipeline-split") {
      r.stages.account_for_embedding = true;
    } else if (flag == "--account-for-loss-in-pipeline-split") r.stages.account_for_loss = true;
    else if (flag == "--micro-batch-size") cfg().mbs = next_int(bounds::kMaxBatch);
    else if (flag == "--sequence-parallel") cfg().sp = true;
    else if (flag == "--use-distributed-optimizer") cfg().dist_opt = true;
    else if (flag == "--recompute-activations") cfg().recompute = Recompute::kSelective;
    else if (flag == "--recompute-granularity") {
      const std::string v = next();
      if (v == "full") cfg().recompute = Recompute::kFull;
      else if (v == "selective") cfg().recompute = Recompute::kSelective;
      else throw InputError(flag, "allowed: full, selective; got '" + v + "'");
    } else if (flag == "--recompute-method") r.recompute_method = next();
    else if (flag == "--recompute-modules") {
      const uint8_t modules = ParseRecomputeModules(flag, next_list());
      r.recompute_modules = modules == kRecomputeCoreAttn ? 0 : modules;  // Megatron's default
    }
    else if (flag == "--recompute-num-layers") cfg().recompute_layers = next_int(kLayers);
    else if (flag == "--attention-dropout") r.attention_dropout = ToDouble(flag, next());
    else if (flag == "--hidden-dropout") r.hidden_dropout = ToDouble(flag, next());
    else if (flag == "--use-flash-attn") stack.flash_attention = true;
    else if (flag == "--attention-backend") stack.flash_attention = FlashBackend(flag, next());
    else if (flag == "--tp-comm-overlap") stack.tp_comm_overlap = true;
    else if (flag == "--cross-entropy-loss-fusion") stack.cross_entropy_fusion = true;
    else if (flag == "--overlap-grad-reduce") r.overlap_grad_reduce = true;
    else if (flag == "--overlap-param-gather") r.overlap_param_gather = true;
    else if (flag == "--grad-reduce-in-bf16") r.grad_reduce_in_fp32 = false;
    else if (flag == "--accumulate-allreduce-grads-in-fp32") r.grad_reduce_in_fp32 = true;
    else if (flag == "--ddp-bucket-size") stack.ddp_bucket_size = ToInt(flag, next(), 1, kBucket);
    else if (flag == "--fp8-param-gather") r.fp8_param_gather = true;
    else {
      rest.push_back(args[i]);
    }
    // clang-format on
  }
  args = rest;
  ApplyDropout(r, script, stack);
  FinishReading(r, args, model, precision, config, notes, read);
  return config;
}

ShellVariables ScriptVariables(const std::optional<std::string>& overrides) {
  ShellVariables v;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) v.environment[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  if (!overrides) return v;
  std::istringstream items(*overrides);
  std::string item;
  while (std::getline(items, item, ',')) {
    const size_t eq = item.find('=');
    if (eq == 0 || eq == std::string::npos) {
      throw InputError("--megatron-env", "expected NAME=VALUE[,NAME=VALUE...], got '" + item + "'");
    }
    v.overrides[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return v;
}

TorchrunShape TakeTorchrunShape(const std::vector<std::string>& words) {
  TorchrunShape shape;
  for (size_t i = 0; i + 1 < words.size(); ++i) {
    const std::string& flag = words[i];
    if (flag == "--nnodes") {
      shape.nnodes = ToInt("--nnodes (torchrun's)", words[i + 1], 1, bounds::kMaxGpus);
    }
    if (flag == "--nproc_per_node" || flag == "--nproc-per-node") {
      shape.nproc_per_node = ToInt(flag + " (torchrun's)", words[i + 1], 1, kMaxGpusPerNode);
    }
  }
  return shape;
}

std::optional<std::string> IgnoredNote(const std::vector<std::string>& script_rest) {
  std::vector<std::string> ignored;
  for (const std::string& word : script_rest) {
    const std::string flag = word.substr(0, word.find('='));
    if (IsFlag(flag) && !MegatronFlagAccountedFor(flag) &&
        std::find(ignored.begin(), ignored.end(), flag) == ignored.end()) {
      ignored.push_back(flag);
    }
  }
  if (ignored.empty()) return std::nullopt;
  std::string line = "ignored (not modelled):";
  for (const std::string& flag : ignored) line += " " + flag;
  return line;
}

}  // namespace autopar::cli
