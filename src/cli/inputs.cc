#include "autopar/cli/inputs.h"

#include <sched.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "autopar/common/errors.h"
#include "autopar/spec/parse.h"
#include "src/cli/flag_values.h"
#include "src/cli/megatron_script_reader.h"

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

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
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

Args::Args(const std::vector<std::string>& argv, const std::string& command)
    : command_(FindCommand(command)) {
  if (command_ == nullptr) throw std::logic_error("Args: no command '" + command + "'");
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
      const FlagHelp* row = FindFlag(*command_, item.flag);
      if (item.value && row != nullptr && row->type == FlagType::kMegatron &&
          std::string(row->value).find(' ') != std::string::npos) {
        while (i + 1 < argv.size() && !IsFlag(argv[i + 1])) item.more.push_back(argv[++i]);
      }
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

const FlagHelp* Args::Row(const std::string& flag, std::initializer_list<FlagType> types) const {
  if (!AnyCommandTakes(flag)) {
    throw std::logic_error("Args: " + flag + " is read but no command's flag table lists it");
  }
  const FlagHelp* row = FindFlag(*command_, flag);
  if (row != nullptr && std::find(types.begin(), types.end(), row->type) == types.end()) {
    throw std::logic_error("Args: " + flag + " is read as another type than " + command_->name +
                           "'s flag table gives it");
  }
  return row;
}

std::optional<std::string> Args::Value(const std::string& flag) {
  const FlagHelp* row = Row(flag, {FlagType::kText, FlagType::kChoice, FlagType::kInt,
                                   FlagType::kUnsigned, FlagType::kNumber, FlagType::kDuration});
  if (row == nullptr) return std::nullopt;  // not this command's: left for Finish() to refuse
  Item* item = Find(flag);
  if (item == nullptr) return std::nullopt;
  if (!item->value) throw InputError(flag, "needs a value");
  for (Item& i : items_) {
    if (i.flag == flag) i.used = true;
  }
  const std::string& value = *item->value;
  if (row->type == FlagType::kChoice) {
    std::string allowed;
    bool found = false;
    std::istringstream words(row->value);
    for (std::string word; std::getline(words, word, '|');) {
      found = found || word == value;
      allowed += (allowed.empty() ? "" : ", ") + word;
    }
    if (!found) throw InputError(flag, "allowed: " + allowed + "; got '" + value + "'");
  }
  return value;
}

bool Args::Switch(const std::string& flag) {
  if (Row(flag, {FlagType::kSwitch}) == nullptr) return false;
  Item* item = Find(flag);
  if (item == nullptr) return false;
  if (item->value) throw InputError(flag, "takes no value, got '" + *item->value + "'");
  item->used = true;
  return true;
}

int64_t Args::IntOf(const std::string& flag, const std::string& text) const {
  const FlagHelp* row = Row(flag, {FlagType::kInt});
  if (row == nullptr) throw std::logic_error("Args: " + flag + " is not " + command_->name + "'s");
  return ToInt(flag, text, row->min, row->max);
}

double Args::DoubleOf(const std::string& flag, const std::string& text) const {
  const FlagHelp* row = Row(flag, {FlagType::kNumber});
  if (row == nullptr) throw std::logic_error("Args: " + flag + " is not " + command_->name + "'s");
  return ToDouble(flag, text, row->max_number);
}

int64_t Args::Int(const std::string& flag, int64_t fallback) {
  if (Row(flag, {FlagType::kInt}) == nullptr) return fallback;
  const auto v = Value(flag);
  return v ? IntOf(flag, *v) : fallback;
}

std::optional<uint64_t> Args::Unsigned(const std::string& flag) {
  if (Row(flag, {FlagType::kUnsigned}) == nullptr) return std::nullopt;
  const auto v = Value(flag);
  if (!v) return std::nullopt;
  return ToUnsigned(flag, *v);
}

double Args::Double(const std::string& flag, double fallback) {
  if (Row(flag, {FlagType::kNumber}) == nullptr) return fallback;
  const auto v = Value(flag);
  return v ? DoubleOf(flag, *v) : fallback;
}

double Args::Duration(const std::string& flag, const std::string& fallback) {
  if (Row(flag, {FlagType::kDuration}) == nullptr) return ParseDuration(flag, fallback);
  return ParseDuration(flag, Value(flag).value_or(fallback));
}

std::vector<std::string> Args::Remaining() const {
  std::vector<std::string> out;
  for (const Item& item : items_) {
    if (item.used) continue;
    out.push_back(item.flag);
    if (item.value) out.push_back(*item.value);
    out.insert(out.end(), item.more.begin(), item.more.end());
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

device::P2PSemantics ReadP2PSemantics(Args& args, const std::string& backend) {
  const auto value = args.Value("--p2p-semantics");
  if (backend == "replay" && value) {
    throw InputError("--p2p-semantics", "not with --backend replay: it runs no trials");
  }
  const std::string name = value.value_or(backend == "cuda" ? "nccl" : "mpi");
  const device::StatusOr<device::P2PSemantics> semantics = device::ParseP2PSemantics(name);
  if (!semantics.ok()) throw InputError("--p2p-semantics", "allowed: mpi, nccl; got '" + name + "'");
  if (backend == "cuda" && *semantics != device::P2PSemantics::kNccl) {
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
  space.max_mbs = static_cast<int32_t>(args.Int("--max-mbs", space.max_mbs));
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

// --attention-efficiency: a share of the peak, above 0 (the flag table bounds it by 1).
double AttentionEfficiency(const Args& args, const std::string& text) {
  const double v = args.DoubleOf("--attention-efficiency", text);
  if (!(v > 0)) {
    throw InputError("--attention-efficiency",
                     "expected a number above 0 and at most 1, got '" + text + "'");
  }
  return v;
}

// A pasted script's parallel flags are its configuration; the rest of a script is Megatron's
// business (learning rate, data paths, ...): what could change the step and is not modelled is
// named in one note. On our command line, parallel flags pin the space and an unknown flag is an
// error.
void ReadMegatronParallel(std::vector<std::string> script_rest, std::vector<std::string> rest,
                          bool script, Inputs& in) {
  StackOptions& stack = in.constants.stack;
  MegatronFlagsRead script_read, read;
  in.script_config = TakeMegatronParallelFlags(script_rest, in.model, in.train.precision, script,
                                               stack, in.notes, script_read);
  if (const auto note = IgnoredNote(script_rest)) in.notes.push_back(*note);
  in.megatron_config =
      TakeMegatronParallelFlags(rest, in.model, in.train.precision, false, stack, in.notes, read);
  if (!rest.empty()) throw InputError(rest[0], "unknown flag (see autopar-tune --help)");
  in.megatron_uneven_flag = read.uneven_flag;
  // What selective recompute reruns in a search: the command line's modules, else the script's
  // (else --fix recompute_modules=..., already read).
  if (const auto modules =
          read.recompute_modules ? read.recompute_modules : script_read.recompute_modules) {
    in.space.recompute_modules = *modules;
  }
  // The dispatcher of every candidate: the command line's (refused for a dense model), else the
  // script's (which Megatron ignores for a dense model, as the note says).
  if (read.flex_dispatcher) {
    in.space.flex_dispatcher = *read.flex_dispatcher;
  } else if (script_read.flex_dispatcher && in.model.is_moe()) {
    in.space.flex_dispatcher = *script_read.flex_dispatcher;
  }
  // The script's numerics beside its precision, in every candidate (unless --fix says
  // otherwise): its gradient reduction dtype (Megatron's default where it names none), and FP8
  // parameters, the script's or the command line's.
  if (in.script_config && in.space.grad_reduce_dtype.empty()) {
    in.space.grad_reduce_dtype = {in.script_config->grad_reduce_dtype};
  }
  if ((read.fp8_param_gather || script_read.fp8_param_gather) &&
      in.space.fp8_param_gather.empty()) {
    in.space.fp8_param_gather = {true};
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
  const bool no_async_tp = args.Switch("--no-async-tp-backward");
  const auto attention_efficiency = args.Value("--attention-efficiency");
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
  if (nnodes) in.cluster.nnodes = args.IntOf("--nnodes", *nnodes);
  if (nproc) in.cluster.gpus_per_node = args.IntOf("--nproc-per-node", *nproc);
  if (memory) in.cluster.gpu.memory_gib = args.DoubleOf("--device-memory-gib", *memory);
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
    in.host_cores = args.IntOf("--host-cores", *host_cores);
    ShareHostCores(*in.host_cores, in.cluster);
  }

  // ---- the software stack the estimate assumes ----
  in.constants = DefaultConstants(in.cluster.gpu.name);
  if (attention_efficiency) {
    in.constants.eff.attention = AttentionEfficiency(args, *attention_efficiency);
  }
  ReadMegatronParallel(from_script.unused, megatron.unused,
                       /*script=*/!pasted.empty() && !model_value, in);
  if (no_flash) in.constants.stack.flash_attention = false;
  if (no_async_tp) in.constants.stack.async_tp_backward = false;
  return in;
}

}  // namespace autopar::cli
