#include "autopar/cli/inputs.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

#include "autopar/cli/pipeline_stages.h"
#include "autopar/common/status.h"
#include "autopar/spec/parse.h"

namespace autopar::cli {
namespace {

// The cores this process may run on: the CPU backend's ranks share them.
int64_t HostCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    throw std::runtime_error(std::string("sched_getaffinity: ") + std::strerror(errno));
  }
  return std::max(1, CPU_COUNT(&set));
}

// Validate(ClusterSpec)'s bound on gpus_per_node, checked where the flag is read.
constexpr int64_t kMaxGpusPerNode = 1024;

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool IsFlag(const std::string& s) {
  // "-5" is a value, "--x" a flag.
  return s.size() > 2 && s[0] == '-' && s[1] == '-';
}

// A script's `$NAME` that nothing set stays as written (SplitCommandLine): say so.
void RefuseUnsetVariable(const std::string& flag, const std::string& text) {
  if (text.empty() || text[0] != '$') return;
  throw InputError(flag, "'" + text +
                             "' is a shell variable nothing sets: give its value with "
                             "--megatron-env NAME=VALUE (or in the environment)");
}

// An integer in [min_value, max_value]: out of range (of the bound or of int64) is refused with
// the range, never wrapped.
int64_t ToInt(const std::string& flag, const std::string& text, int64_t min_value,
              int64_t max_value = kMaxIntFlag) {
  RefuseUnsetVariable(flag, text);
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end || v < min_value || v > max_value) {
    throw InputError(flag, "expected an integer from " + std::to_string(min_value) + " to " +
                               std::to_string(max_value) + ", got '" + text + "'");
  }
  return v;
}

// A finite number in [0, max_value].
double ToDouble(const std::string& flag, const std::string& text, double max_value = 1e15) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used != text.size() || !(v >= 0) || !(v <= max_value)) throw std::invalid_argument(text);
    return v;
  } catch (const std::exception&) {
    std::ostringstream bound;
    bound << max_value;
    throw InputError(flag, "expected a number from 0 to " + bound.str() + ", got '" + text + "'");
  }
}

ModelSpec LoadModel(const std::string& value) {
  if (HasModelPreset(value)) return ModelPreset(value);
  const bool is_file = EndsWith(value, ".json") || EndsWith(value, ".yaml") ||
                       EndsWith(value, ".yml");
  if (!is_file) return ModelPreset(value);  // throws, listing the presets
  const std::string text = ReadTextFile("--model", value);
  return EndsWith(value, ".json") ? ModelFromHfConfig(text) : ModelFromYaml(text);
}

GpuSpec LoadGpu(const std::string& value) {
  if (HasGpuPreset(value)) return GpuPreset(value);
  if (!EndsWith(value, ".yaml") && !EndsWith(value, ".yml")) return GpuPreset(value);
  return GpuFromYaml(ReadTextFile("--gpu", value));
}

// Megatron's context parallel group of size c.cp (as read from --context-parallel-size) split
// into our ring (cp) and Ulysses (up) degrees by its communication type
// (megatron/training/arguments.py, megatron/core/model_parallel_config.py): p2p, the default, is
// the ring; a2a is Ulysses; a2a+p2p is both, --hierarchical-context-parallel-sizes giving the a2a
// group's size and then the p2p group's (Megatron asserts that they multiply to the cp size).
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
  if (type == "a2a") {
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
    throw InputError(comm_flag, std::string("allowed: p2p, a2a, a2a+p2p (all-gather context ") +
                                    "parallelism is not modelled); got '" + type + "'");
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
};

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
  const std::string uneven_flag = ApplyMegatronStages(r.stages, model, config);
  if (config.sp && config.tp == 1) {  // validate_args in arguments.py does the same
    config.sp = false;
    notes.push_back("--sequence-parallel: off at --tensor-model-parallel-size 1, as Megatron-LM "
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

// Megatron-LM's parallelism and software-stack flags, taken out of `args` (argv items).
// Returns the configuration they describe, if any parallel flag was present, and in
// `uneven_flag` the flag that made its pipeline stages uneven. `precision` decides
// what an absent reduction-dtype flag means (Megatron reduces bf16 runs' gradients in fp32 and
// fp16 runs' in fp16 by default).
// From a pasted script that defines the model (`script`: no --model), Megatron's defaults apply
// where it is silent (dropout 0.1). Megatron's own corrections are made with a note (sequence
// parallelism off at tp = 1).
std::optional<ParallelConfig> TakeMegatronParallelFlags(std::vector<std::string>& args,
                                                        const ModelSpec& model, Precision precision,
                                                        bool script, StackOptions& stack,
                                                        std::vector<std::string>& notes,
                                                        std::string& uneven_flag) {
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
    else if (flag == "--moe-token-dispatcher-type") {
      const std::string v = next();  // the model's experts exchange tokens by all-to-all
      if (v != "alltoall") notes.push_back(flag + " " + v + " is not modelled: costed as alltoall");
    } else if (flag == "--num-layers-per-virtual-pipeline-stage") {
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
    else if (flag == "--recompute-num-layers") cfg().recompute_layers = next_int(kLayers);
    else if (flag == "--attention-dropout") r.attention_dropout = ToDouble(flag, next());
    else if (flag == "--hidden-dropout") r.hidden_dropout = ToDouble(flag, next());
    else if (flag == "--use-flash-attn") stack.flash_attention = true;
    else if (flag == "--attention-backend") {
      // AttnBackend: flash, fused (cuDNN) and auto keep no s² scores; unfused and local do.
      const std::string v = next();
      if (v == "flash" || v == "fused" || v == "auto") stack.flash_attention = true;
      else if (v == "unfused" || v == "local") stack.flash_attention = false;
      else throw InputError(flag, "allowed: flash, fused, unfused, local, auto; got '" + v + "'");
    } else if (flag == "--overlap-grad-reduce") r.overlap_grad_reduce = true;
    else if (flag == "--overlap-param-gather") r.overlap_param_gather = true;
    else if (flag == "--grad-reduce-in-bf16") r.grad_reduce_in_fp32 = false;
    else if (flag == "--accumulate-allreduce-grads-in-fp32") r.grad_reduce_in_fp32 = true;
    else if (flag == "--ddp-bucket-size") stack.ddp_bucket_size = ToInt(flag, next(), 1, kBucket);
    else {
      rest.push_back(args[i]);
    }
    // clang-format on
  }
  args = rest;
  const double default_dropout = script ? 0.1 : 0.0;
  if (r.attention_dropout || r.hidden_dropout || script) {
    stack.dropout = stack.dropout || r.attention_dropout.value_or(default_dropout) > 0 ||
                    r.hidden_dropout.value_or(default_dropout) > 0;
  }
  uneven_flag.clear();
  if (config) uneven_flag = FinishMegatronConfig(r, model, precision, *config, notes);
  return config;
}

// --megatron-env NAME=VALUE[,NAME=VALUE...] and this process's environment: what a pasted
// script's `$NAME` expands to.
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

// torchrun's --nnodes and --nproc-per-node (also spelt --nproc_per_node) in a launch script.
struct TorchrunShape {
  std::optional<int64_t> nnodes, nproc_per_node;
};

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

}  // namespace

std::string ReadTextFile(const std::string& flag, const std::string& path, int64_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(flag, "cannot read '" + path + "': " + std::strerror(errno));
  // Refused before it is read: the bound is on the work, not only on what is kept.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw InputError(flag, "cannot stat '" + path + "': " + std::strerror(errno));
  }
  if (S_ISREG(st.st_mode) && st.st_size > max_bytes) {
    throw InputError(flag, "'" + path + "' is " + std::to_string(st.st_size) + " bytes; at most " +
                               std::to_string(max_bytes >> 20) + " MiB is read");
  }
  // A pipe or device has no size to check first: read at most one byte past the bound.
  std::string text(static_cast<size_t>(max_bytes) + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw InputError(flag, "error reading '" + path + "'");
  text.resize(static_cast<size_t>(in.gcount()));
  if (static_cast<int64_t>(text.size()) > max_bytes) {
    throw InputError(flag, "'" + path + "' is larger than " + std::to_string(max_bytes >> 20) +
                               " MiB, the most that is read");
  }
  return text;
}

void WriteNotes(std::ostream& err, const std::string& command, const Inputs& in) {
  if (in.gpu_assumed) {
    err << "autopar-tune " << command << ": no --gpu or --cluster, assuming --gpu " << kAssumedGpu
        << " (" << in.cluster.gpu.memory_gib << " GiB); autopar-tune presets lists the others\n";
  }
  for (const std::string& note : in.notes) err << "autopar-tune " << command << ": note: " << note << "\n";
}

Format ParseFormat(const std::string& text) {
  if (text == "table") return Format::kTable;
  if (text == "json") return Format::kJson;
  if (text == "csv") return Format::kCsv;
  if (text == "megatron") return Format::kMegatron;
  if (text == "yaml") return Format::kYaml;
  if (text == "bridge") return Format::kBridge;
  throw InputError("--format",
                   "allowed: table, json, csv, megatron, yaml, bridge; got '" + text + "'");
}

Args::Args(const std::vector<std::string>& argv) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (!IsFlag(a)) throw InputError(a, "unexpected argument (flags start with --)");
    Item item;
    if (const size_t eq = a.find('='); eq != std::string::npos) {
      item.flag = a.substr(0, eq);
      item.value = a.substr(eq + 1);
    } else {
      item.flag = a;
      // A pasted argument list starts with "--" itself: its value is always the next item.
      const bool verbatim = a == "--megatron-args";
      if (i + 1 < argv.size() && (verbatim || !IsFlag(argv[i + 1]))) item.value = argv[++i];
    }
    items_.push_back(std::move(item));
  }
}

Args::Item* Args::Find(const std::string& flag) {
  Item* found = nullptr;
  for (Item& item : items_) {
    if (item.flag == flag && !item.used) found = &item;  // the last one wins, as in argparse
  }
  return found;
}

std::optional<std::string> Args::Value(const std::string& flag) {
  Item* item = Find(flag);
  if (item == nullptr) return std::nullopt;
  if (!item->value) throw InputError(flag, "needs a value");
  for (Item& i : items_) {
    if (i.flag == flag) i.used = true;
  }
  return item->value;
}

bool Args::Switch(const std::string& flag) {
  Item* item = Find(flag);
  if (item == nullptr) return false;
  if (item->value) throw InputError(flag, "takes no value, got '" + *item->value + "'");
  item->used = true;
  return true;
}

int64_t Args::Int(const std::string& flag, int64_t fallback, int64_t min_value, int64_t max_value) {
  const auto v = Value(flag);
  return v ? ToInt(flag, *v, min_value, max_value) : fallback;
}

double Args::Double(const std::string& flag, double fallback) {
  const auto v = Value(flag);
  return v ? ToDouble(flag, *v) : fallback;
}

std::vector<std::string> Args::Remaining() const {
  std::vector<std::string> out;
  for (const Item& item : items_) {
    if (item.used) continue;
    out.push_back(item.flag);
    if (item.value) out.push_back(*item.value);
  }
  return out;
}

void Args::Finish() const {
  for (const Item& item : items_) {
    if (!item.used) throw InputError(item.flag, "unknown flag (see autopar-tune --help)");
  }
}

std::vector<std::string> WithCpuBackendDefaults(const std::vector<std::string>& argv) {
  bool cpu = true, has_gpu = false;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--gpu" || argv[i] == "--cluster" || argv[i].rfind("--gpu=", 0) == 0 ||
        argv[i].rfind("--cluster=", 0) == 0) {
      has_gpu = true;
    }
    const bool other_backend = (argv[i] == "--backend" && i + 1 < argv.size() &&
                                argv[i + 1] != "cpu") ||
                               (argv[i].rfind("--backend=", 0) == 0 && argv[i] != "--backend=cpu");
    if (other_backend || argv[i] == "--replay-table" || argv[i].rfind("--replay-table=", 0) == 0) {
      cpu = false;
    }
  }
  std::vector<std::string> out = argv;
  if (cpu && !has_gpu) {
    out.push_back("--gpu");
    out.push_back("cpu");
  }
  return out;
}

void ShareHostCores(int64_t host_cores, ClusterSpec& cluster) {
  const double share = std::min(
      1.0, static_cast<double>(host_cores) / static_cast<double>(cluster.world_size()));
  GpuSpec& g = cluster.gpu;
  g.peak_flops_fp32 *= share;
  g.peak_flops_bf16 *= share;
  g.peak_flops_fp16 *= share;
  g.hbm_bandwidth *= share;
}

namespace {
// The CPU computes in fp32: an fp8 run there would time something else than was asked, so
// --fp8-format is refused rather than dropped.
void RefuseFp8OnCpu(const TrainSpec& train) {
  if (train.precision != Precision::kFP8) return;
  throw InputError("--fp8-format",
                   "the cpu backend has no fp8 GEMMs; fp8 trials run on --backend cuda with a GPU "
                   "of compute capability 8.9 or newer (Ada, Hopper, Blackwell)");
}
}  // namespace

void ApplyCpuBackend(const std::string& backend, Inputs& in) {
  if (backend != "cpu") return;
  RefuseFp8OnCpu(in.train);
  in.train.precision = Precision::kFP32;
  // The CPU backend's budget counts the trial's own tensors, whatever --gpu describes.
  in.constants.mem.runtime_overhead_gib = 0;
  in.constants.mem.fragmentation = 0;
  if (!in.host_cores && in.cluster.gpu.name == "cpu") {
    in.host_cores = HostCores();
    ShareHostCores(*in.host_cores, in.cluster);
  }
}

void ApplyBackend(const std::string& backend, Inputs& in) {
  if ((backend == "cuda" || backend == "megatron") && in.gpu_assumed) {
    std::string names;
    for (const std::string& n : GpuPresetNames()) names += (names.empty() ? "" : ", ") + n;
    throw InputError("--gpu", "required with --backend " + backend +
                                  ": the GPU the trials run on, which the "
                                  "model predicts and the memory budget is (a preset: " +
                                  names + "; a GPU YAML file; or --cluster FILE.yaml)");
  }
  ApplyCpuBackend(backend, in);
}

backend::P2PSemantics ReadP2PSemantics(Args& args, const std::string& backend) {
  const auto value = args.Value("--p2p-semantics");
  if (backend == "replay" && value) {
    throw InputError("--p2p-semantics", "not with --backend replay: it runs no trials");
  }
  const std::string name = value.value_or(backend == "cuda" ? "nccl" : "mpi");
  const backend::StatusOr<backend::P2PSemantics> semantics = backend::ParseP2PSemantics(name);
  if (!semantics.ok()) throw InputError("--p2p-semantics", "allowed: mpi, nccl; got '" + name + "'");
  if (backend == "cuda" && *semantics != backend::P2PSemantics::kNccl) {
    throw InputError("--p2p-semantics", "--backend cuda runs NCCL; allowed: nccl; got '" + name +
                                            "'");
  }
  return *semantics;
}

namespace {

// The user's restrictions of the space (docs/cli.md §3).
void ReadSpaceOptions(Args& args, SpaceOptions& space) {
  auto list = [&](const char* flag, std::vector<int32_t>& to) {
    if (const auto v = args.Value(flag)) to = ParseIntList(flag, *v);
  };
  list("--tp", space.tp);
  list("--pp", space.pp);
  list("--dp", space.dp);
  list("--cp", space.cp);
  list("--up", space.up);
  list("--ep", space.ep);
  list("--etp", space.etp);
  list("--vpp", space.vpp);
  list("--mbs", space.mbs);
  list("--recompute-layers", space.recompute_layers);
  if (const auto v = args.Value("--recompute")) {
    std::istringstream items(*v);
    std::string r;
    while (std::getline(items, r, ',')) {
      SpaceOptions one;
      try {
        ApplyFix("recompute=" + r, one);
      } catch (const InputError&) {
        throw InputError("--recompute", "allowed: none, selective, full; got '" + r + "'");
      }
      space.recompute.push_back(one.recompute.at(0));
    }
  }
  if (const auto v = args.Value("--fix")) ApplyFix(*v, space);
  // The earlier spellings of `--fix overlap_grad_reduce=off` / `overlap_param_gather=off`.
  if (args.Switch("--no-overlap-grad-reduce")) space.overlap_grad_reduce = {false};
  if (args.Switch("--no-overlap-param-gather")) space.overlap_param_gather = {false};
  space.tp_across_nodes = args.Switch("--tp-across-nodes");
  space.sweep_recompute_layers = args.Switch("--sweep-recompute-layers");
  space.max_mbs = static_cast<int32_t>(args.Int("--max-mbs", space.max_mbs, 1, bounds::kMaxBatch));
}

// One note naming every flag of a pasted script that could change the step and that the model
// does not read (MegatronFlagAccountedFor lists those that change nothing costed).
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

// A model and a batch are required; the sequence defaults to the positions (at most 4096).
void RequireModelAndBatch(Inputs& in) {
  if (in.model.num_layers == 0) {
    std::string names;
    for (const std::string& n : ModelPresetNames()) names += (names.empty() ? "" : ", ") + n;
    throw InputError("--model",
                     "required (a preset, a .yaml file or a config.json, or Megatron "
                     "flags such as --num-layers); presets: " +
                         names);
  }
  if (in.train.seq_length == 0) {
    in.train.seq_length = std::min<int64_t>(in.model.max_position_embeddings, 4096);
  }
  if (in.train.global_batch_size == 0) {
    throw InputError("--global-batch-size", "required (sequences per optimizer step)");
  }
}

}  // namespace

Inputs ReadInputs(Args& args) {
  Inputs in;
  // Our own flags first; whatever is left is Megatron-LM's (model and train flags).
  const auto model_value = args.Value("--model");
  const auto cluster_file = args.Value("--cluster");
  const auto gpu_value = args.Value("--gpu");
  const auto nnodes = args.Value("--nnodes");
  const auto nproc = args.Value("--nproc-per-node");
  const auto memory = args.Value("--device-memory-gib");
  const auto host_cores = args.Value("--host-cores");
  const ShellVariables variables = ScriptVariables(args.Value("--megatron-env"));
  std::vector<std::string> pasted;
  if (const auto text = args.Value("--megatron-args")) pasted = SplitCommandLine(*text, variables);
  if (const auto file = args.Value("--megatron-args-file")) {
    pasted = SplitCommandLine(ReadTextFile("--megatron-args-file", *file), variables);
  }
  const bool no_flash = args.Switch("--no-flash-attention");
  ReadSpaceOptions(args, in.space);
  if (const auto f = args.Value("--format")) in.format = ParseFormat(*f);

  // ---- model and training job: preset or file, pasted script, then flags on the command line ----
  ModelSpec base;
  if (model_value) base = LoadModel(*model_value);
  TrainSpec train;
  train.global_batch_size = 0;
  in.megatron_words = pasted;
  MegatronArgs from_script = ApplyMegatronFlags(pasted, base, train);
  const std::vector<std::string> command_line = args.Remaining();
  args.ConsumeAll();
  MegatronArgs megatron = ApplyMegatronFlags(command_line, from_script.model, from_script.train);
  in.model = megatron.model;
  in.train = megatron.train;
  for (const auto* notes : {&from_script.notes, &megatron.notes}) {
    in.notes.insert(in.notes.end(), notes->begin(), notes->end());
  }
  RequireModelAndBatch(in);

  // ---- cluster ----
  if (cluster_file) {
    in.cluster = ClusterFromYaml(ReadTextFile("--cluster", *cluster_file));
  } else {
    in.cluster.gpu = GpuPreset(kAssumedGpu);
    in.cluster.nnodes = 1;
    in.cluster.gpus_per_node = 8;
    in.gpu_assumed = !gpu_value;
  }
  if (gpu_value) in.cluster.gpu = LoadGpu(*gpu_value);
  // A pasted launch script's torchrun flags give the cluster where our flags do not.
  const TorchrunShape launch = TakeTorchrunShape(from_script.unused);
  if (launch.nnodes && !nnodes) in.cluster.nnodes = *launch.nnodes;
  if (launch.nproc_per_node && !nproc) in.cluster.gpus_per_node = *launch.nproc_per_node;
  if (nnodes) in.cluster.nnodes = ToInt("--nnodes", *nnodes, 1, bounds::kMaxGpus);
  if (nproc) in.cluster.gpus_per_node = ToInt("--nproc-per-node", *nproc, 1, kMaxGpusPerNode);
  if (memory) in.cluster.gpu.memory_gib = ToDouble("--device-memory-gib", *memory, 1e6);
  // The `cpu` device is the CPU backend's rank, which trains in fp32 whatever a script asks: a
  // plan for it, or a replay of its measurements, must count 4-byte activations too.
  if (in.cluster.gpu.name == "cpu") {
    RefuseFp8OnCpu(in.train);
    in.train.precision = Precision::kFP32;
  }
  Validate(in.model);
  Validate(in.train);
  Validate(in.cluster);
  if (host_cores) {
    if (in.cluster.gpu.name != "cpu") {
      throw InputError("--host-cores", "only for --gpu cpu (the CPU backend's device), not '" +
                                           in.cluster.gpu.name + "'");
    }
    in.host_cores = ToInt("--host-cores", *host_cores, 1, 1 << 20);
    ShareHostCores(*in.host_cores, in.cluster);
  }

  // ---- the software stack the estimate assumes ----
  in.constants = DefaultConstants(in.cluster.gpu.name);
  StackOptions& stack = in.constants.stack;
  // A pasted script's parallel flags are its configuration; the rest of a script is Megatron's
  // business (learning rate, data paths, ...): what could change the step and is not modelled
  // is named in one note. On our command line, parallel flags pin the space and an unknown flag
  // is an error.
  std::vector<std::string> script_rest = from_script.unused;
  std::string script_uneven_flag;
  in.script_config = TakeMegatronParallelFlags(script_rest, in.model, in.train.precision,
                                               /*script=*/!pasted.empty() && !model_value,
                                               stack, in.notes, script_uneven_flag);
  if (const auto note = IgnoredNote(script_rest)) in.notes.push_back(*note);
  std::vector<std::string> rest = megatron.unused;
  in.megatron_config =
      TakeMegatronParallelFlags(rest, in.model, in.train.precision, false, stack, in.notes,
                                in.megatron_uneven_flag);
  if (!rest.empty()) throw InputError(rest[0], "unknown flag (see autopar-tune --help)");
  if (no_flash) stack.flash_attention = false;
  return in;
}

}  // namespace autopar::cli
