#include "autopar/space/config.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <sstream>
#include <vector>

#include "autopar/common/errors.h"

namespace autopar {
namespace {

constexpr const char* kFlag = "--config";
constexpr const char* kKeys =
    "tp, pp, pp_first, pp_last, dp, cp, up, cp_comm, ep, etp, dispatcher, vpp, split_embedding, "
    "split_loss, "
    "mbs, sp, "
    "recompute, recompute_modules, recompute_layers, dist_opt, "
    "overlap_grad_reduce, overlap_param_gather, grad_reduce_dtype, fp8_param_gather";

int32_t ParsePositive(const std::string& key, const std::string& value, bool allow_zero) {
  int32_t v = 0;
  const char* end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, v);
  if (ec != std::errc() || ptr != end || v < (allow_zero ? 0 : 1)) {
    throw InputError(kFlag, "key '" + key + "' needs " +
                                (allow_zero ? "a non-negative" : "a positive") +
                                " integer, got '" + value + "'");
  }
  return v;
}

bool ParseOnOff(const std::string& key, const std::string& value) {
  if (value == "on" || value == "true" || value == "1") return true;
  if (value == "off" || value == "false" || value == "0") return false;
  throw InputError(kFlag, "key '" + key + "' takes on|off, got '" + value + "'");
}

// `dispatcher=alltoall|flex`: Megatron's --moe-token-dispatcher-type, of the two modelled.
bool ParseDispatcher(const std::string& value) {
  if (value == "alltoall" || value == "flex") return value == "flex";
  throw InputError(kFlag,
                   "key 'dispatcher' takes alltoall|flex, got '" + value + "'" +
                       (value == "allgather" ? " (the allgather dispatcher is not modelled)" : ""));
}

// `cp_comm=p2p|allgather`: how the ring's attention crosses the cp group (Megatron's
// --cp-comm-type; its a2a and a2a+p2p are the up key).
bool ParseCpComm(const std::string& value) {
  if (value == "p2p" || value == "allgather") return value == "allgather";
  throw InputError(
      kFlag,
      "key 'cp_comm' takes p2p|allgather, got '" + value + "'" +
          (value == "a2a" || value == "a2a+p2p" ? " (Megatron's a2a is Ulysses: the key up)" : ""));
}

// `recompute_modules=layernorm+moe`: one or more of Megatron's module names joined by '+'.
uint8_t ParseModules(const std::string& value) {
  std::vector<std::string> names;
  std::istringstream in(value);
  for (std::string name; std::getline(in, name, '+');) names.push_back(name);
  const uint8_t modules =
      ParseRecomputeModules(std::string(kFlag) + " key 'recompute_modules'", names);
  if (modules == 0) {
    throw InputError(
        kFlag, "key 'recompute_modules' needs module names joined by '+', got '" + value + "'");
  }
  return modules;
}

}  // namespace

const char* ToString(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}

namespace {

// Megatron's module names, in the order of the RecomputeModule bits.
constexpr std::array<const char*, 6> kModuleNames = {"core_attn", "layernorm", "mlp",
                                                     "moe",       "moe_act",   "shared_experts"};

}  // namespace

std::vector<std::string> RecomputeModuleNames(uint8_t modules) {
  std::vector<std::string> names;
  for (size_t i = 0; i < kModuleNames.size(); ++i) {
    if ((modules >> i & 1) != 0) names.emplace_back(kModuleNames[i]);
  }
  return names;
}

std::string RecomputeModulesText(uint8_t modules) {
  std::string out;
  for (const std::string& name : RecomputeModuleNames(modules)) {
    out += (out.empty() ? "" : "+") + name;
  }
  return out;
}

uint8_t ParseRecomputeModules(const std::string& flag, const std::vector<std::string>& names) {
  const std::string allowed = "allowed: core_attn, layernorm, mlp, moe, moe_act, shared_experts";
  uint8_t modules = 0;
  for (const std::string& name : names) {
    const auto* it = std::find(kModuleNames.begin(), kModuleNames.end(), name);
    if (it != kModuleNames.end()) {
      modules |= static_cast<uint8_t>(1 << (it - kModuleNames.begin()));
    } else if (name == "mla_up_proj" || name == "mhc" || name.rfind("gd", 0) == 0) {
      throw InputError(flag, "Megatron-LM's '" + name +
                                 "' recompute is not modelled (nor run by a trial); " + allowed);
    } else {
      throw InputError(flag, allowed + "; got '" + name + "'");
    }
  }
  return modules;
}

const char* ToString(GradReduceDtype d) { return d == GradReduceDtype::kBF16 ? "bf16" : "fp32"; }

std::string ToSpec(const ParallelConfig& c) {
  std::ostringstream out;
  out << "tp=" << c.tp << ",pp=" << c.pp;
  if (c.pp_first != 0) out << ",pp_first=" << c.pp_first;
  if (c.pp_last != 0) out << ",pp_last=" << c.pp_last;
  out << ",dp=" << c.dp << ",cp=" << c.cp << ",up=" << c.up;
  if (c.cp_allgather) out << ",cp_comm=allgather";
  out << ",ep=" << c.ep;
  if (c.expert_tp() != c.tp) out << ",etp=" << c.etp;
  if (c.flex_dispatcher) out << ",dispatcher=flex";
  out << ",vpp=" << c.vpp;
  if (c.split_embedding) out << ",split_embedding=on";
  if (c.split_loss) out << ",split_loss=on";
  out << ",mbs=" << c.mbs << ",sp=" << (c.sp ? "on" : "off")
      << ",recompute=" << ToString(c.recompute);
  if (c.recompute_modules != 0)
    out << ",recompute_modules=" << RecomputeModulesText(c.recompute_modules);
  if (c.recompute_layers != 0) out << ",recompute_layers=" << c.recompute_layers;
  out << ",dist_opt=" << (c.dist_opt ? "on" : "off");
  if (!c.overlap_grad_reduce) out << ",overlap_grad_reduce=off";
  if (c.overlap_param_gather != OverlapParamGatherAllowed(c)) {
    out << ",overlap_param_gather=" << (c.overlap_param_gather ? "on" : "off");
  }
  if (c.grad_reduce_dtype != GradReduceDtype::kFP32) {
    out << ",grad_reduce_dtype=" << ToString(c.grad_reduce_dtype);
  }
  if (c.fp8_param_gather) out << ",fp8_param_gather=on";
  return out.str();
}

ParallelConfig ParseSpec(const std::string& text) {
  ParallelConfig c;
  bool param_gather_given = false;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      throw InputError(kFlag, "'" + item + "' is not key=value; keys: " + kKeys);
    }
    const std::string key = item.substr(0, eq);
    const std::string value = item.substr(eq + 1);
    if (key == "tp") c.tp = ParsePositive(key, value, false);
    else if (key == "pp") c.pp = ParsePositive(key, value, false);
    else if (key == "pp_first")
      c.pp_first = ParsePositive(key, value, true);
    else if (key == "pp_last")
      c.pp_last = ParsePositive(key, value, true);
    else if (key == "dp") c.dp = ParsePositive(key, value, false);
    else if (key == "cp") c.cp = ParsePositive(key, value, false);
    else if (key == "up") c.up = ParsePositive(key, value, false);
    else if (key == "ep") c.ep = ParsePositive(key, value, false);
    else if (key == "etp") c.etp = ParsePositive(key, value, false);
    else if (key == "vpp") c.vpp = ParsePositive(key, value, false);
    else if (key == "dispatcher")
      c.flex_dispatcher = ParseDispatcher(value);
    else if (key == "cp_comm")
      c.cp_allgather = ParseCpComm(value);
    else if (key == "mbs") c.mbs = ParsePositive(key, value, false);
    else if (key == "recompute_layers") c.recompute_layers = ParsePositive(key, value, true);
    else if (key == "recompute_modules")
      c.recompute_modules = ParseModules(value);
    else if (key == "sp") c.sp = ParseOnOff(key, value);
    else if (key == "dist_opt") c.dist_opt = ParseOnOff(key, value);
    else if (key == "split_embedding")
      c.split_embedding = ParseOnOff(key, value);
    else if (key == "split_loss")
      c.split_loss = ParseOnOff(key, value);
    else if (key == "overlap_grad_reduce") c.overlap_grad_reduce = ParseOnOff(key, value);
    else if (key == "overlap_param_gather") {
      c.overlap_param_gather = ParseOnOff(key, value);
      param_gather_given = true;
    } else if (key == "grad_reduce_dtype") {
      if (value == "fp32") c.grad_reduce_dtype = GradReduceDtype::kFP32;
      else if (value == "bf16") c.grad_reduce_dtype = GradReduceDtype::kBF16;
      else throw InputError(kFlag, "key 'grad_reduce_dtype' takes fp32|bf16, got '" + value + "'");
    } else if (key == "fp8_param_gather") {
      c.fp8_param_gather = ParseOnOff(key, value);
    } else if (key == "recompute") {
      if (value == "none") c.recompute = Recompute::kNone;
      else if (value == "selective") c.recompute = Recompute::kSelective;
      else if (value == "full") c.recompute = Recompute::kFull;
      else throw InputError(kFlag, "key 'recompute' takes none|selective|full, got '" + value + "'");
    } else {
      throw InputError(kFlag, "unknown key '" + key + "'; keys: " + kKeys);
    }
  }
  if (c.recompute_layers != 0 && c.recompute != Recompute::kFull) {
    throw InputError(kFlag, "recompute_layers needs recompute=full");
  }
  if (c.recompute_modules != 0 && c.recompute != Recompute::kSelective) {
    throw InputError(kFlag, "recompute_modules needs recompute=selective");
  }
  if (c.recompute_modules == kRecomputeCoreAttn) c.recompute_modules = 0;  // Megatron's default
  if (c.etp == c.tp) c.etp = 0;  // the canonical form: 0 is "as tp"
  if (UnevenStages(c) && c.pp == 1) {
    throw InputError(kFlag, "pp_first, pp_last, split_embedding and split_loss need pp > 1");
  }
  if ((c.split_embedding || c.split_loss) && (c.pp_first != 0 || c.pp_last != 0)) {
    throw InputError(kFlag,
                     "split_embedding and split_loss not with pp_first or pp_last (Megatron-LM "
                     "takes uneven stages one way)");
  }
  if (!param_gather_given) c.overlap_param_gather = OverlapParamGatherAllowed(c);
  return c;
}

// StageSplitError of a split with the embedding or the loss counted (split_embedding, split_loss).
std::string CountedSplitError(const ParallelConfig& c, int64_t num_layers) {
  if (c.pp < 2) return "split_embedding and split_loss need pp > 1";
  if (c.pp_first != 0 || c.pp_last != 0) {
    return "split_embedding and split_loss not with pp_first or pp_last";
  }
  const int64_t counted = num_layers + c.split_embedding + c.split_loss;
  const int64_t chunks = int64_t{c.pp} * c.vpp;
  if (counted % chunks != 0) {
    return "the " + std::to_string(counted) +
           " layers counting the embedding and the loss do not split evenly over pp·vpp = " +
           std::to_string(chunks) + " model chunks";
  }
  // A chunk of one counted layer leaves the very first (last) chunk the embedding (loss) alone,
  // as Megatron-core builds it (get_num_layers_to_build asserts only >= 0) and Llama 3's 405B ran
  // it; a stage needs some transformer layer.
  if (counted / chunks * c.vpp < 2) {
    return "a pipeline stage of " + std::to_string(counted / chunks * c.vpp) +
           " counted layer leaves the first or the last stage without a transformer layer";
  }
  return {};
}

std::string StageSplitError(const ParallelConfig& c, int64_t num_layers) {
  const std::string vpp = std::to_string(c.vpp);
  if (c.split_embedding || c.split_loss) return CountedSplitError(c, num_layers);
  if (!UnevenStages(c)) {
    if (num_layers % c.pp != 0) {
      return "pp=" + std::to_string(c.pp) +
             " does not divide num_layers=" + std::to_string(num_layers) +
             " (pp_first/pp_last give uneven stages)";
    }
    if (num_layers / c.pp % c.vpp != 0) {
      return "vpp=" + vpp + " does not divide the " + std::to_string(num_layers / c.pp) +
             " layers per pipeline stage";
    }
    return {};
  }
  if (c.pp < 2) return "pp_first and pp_last need pp > 1";
  int64_t rest = num_layers, middle_stages = c.pp;
  for (const auto& [key, given] : {std::pair{"pp_first", c.pp_first}, {"pp_last", c.pp_last}}) {
    if (given == 0) continue;
    if (given % c.vpp != 0) {
      return std::string(key) + "=" + std::to_string(given) + " is not a multiple of vpp=" + vpp;
    }
    rest -= given;
    --middle_stages;
  }
  if (rest < 0 || (rest > 0) != (middle_stages > 0)) {
    return "pp_first=" + std::to_string(c.pp_first) + " and pp_last=" + std::to_string(c.pp_last) +
           " leave " + std::to_string(rest) + " of num_layers=" + std::to_string(num_layers) +
           " for " + std::to_string(middle_stages) + " other stages";
  }
  if (middle_stages > 0 && (rest % middle_stages != 0 || rest / middle_stages % c.vpp != 0)) {
    return "the " + std::to_string(rest) + " layers left by pp_first/pp_last do not split into " +
           std::to_string(middle_stages) + " equal stages of a multiple of vpp=" + vpp + " layers";
  }
  return {};
}

int64_t StageLayers(const ParallelConfig& c, int64_t num_layers, int64_t stage) {
  if (c.split_embedding || c.split_loss) {
    return (num_layers + c.split_embedding + c.split_loss) / c.pp -
           (stage == 0 ? c.split_embedding : 0) - (stage == c.pp - 1 ? c.split_loss : 0);
  }
  if (stage == 0 && c.pp_first != 0) return c.pp_first;
  if (stage == c.pp - 1 && c.pp_last != 0) return c.pp_last;
  const int64_t middle_stages = c.pp - (c.pp_first != 0) - (c.pp_last != 0);
  return (num_layers - c.pp_first - c.pp_last) / middle_stages;
}

int64_t ChunkLayers(const ParallelConfig& c, int64_t num_layers, int64_t stage, int64_t chunk) {
  if (!c.split_embedding && !c.split_loss) return StageLayers(c, num_layers, stage) / c.vpp;
  const int64_t even = (num_layers + c.split_embedding + c.split_loss) / (int64_t{c.pp} * c.vpp);
  return even - (stage == 0 && chunk == 0 ? c.split_embedding : 0) -
         (stage == c.pp - 1 && chunk == c.vpp - 1 ? c.split_loss : 0);
}

int64_t ChunkFirstLayer(const ParallelConfig& c, int64_t num_layers, int64_t stage, int64_t chunk) {
  if (c.split_embedding || c.split_loss) {
    // Chunk-major: the chunks before are chunk·pp + stage, the very first one a layer short.
    const int64_t before = chunk * c.pp + stage;
    const int64_t even = (num_layers + c.split_embedding + c.split_loss) / (int64_t{c.pp} * c.vpp);
    return before * even - (before > 0 ? c.split_embedding : 0);
  }
  // Chunk k of every stage holds 1/vpp of the stage's layers, so chunk k starts after the
  // num_layers/vpp layers of the earlier chunks and the earlier stages' chunk k.
  int64_t before = 0;
  for (int64_t s = 0; s < stage; ++s) before += StageLayers(c, num_layers, s) / c.vpp;
  return chunk * (num_layers / c.vpp) + before;
}

std::vector<ParallelConfig> CountedSplits(const ParallelConfig& c, int64_t num_layers) {
  std::vector<ParallelConfig> out;
  if (c.pp < 2 || c.vpp < 2) return out;
  for (const auto& [embedding, loss] : {std::pair{true, true}, {true, false}, {false, true}}) {
    ParallelConfig split = c;
    split.pp_first = split.pp_last = 0;
    split.split_embedding = embedding;
    split.split_loss = loss;
    if (CountedSplitError(split, num_layers).empty()) out.push_back(split);
  }
  return out;
}

ParallelConfig CanonicalStages(ParallelConfig c, int64_t num_layers) {
  if (c.pp < 2) return c;
  if (c.split_embedding || c.split_loss) {
    if (c.vpp > 1) return c;
    // Without virtual stages the counted split is whole stages: pp_first/pp_last below.
    const int64_t first = StageLayers(c, num_layers, 0),
                  last = StageLayers(c, num_layers, c.pp - 1);
    c.split_embedding = c.split_loss = false;
    c.pp_first = static_cast<int32_t>(first);
    c.pp_last = static_cast<int32_t>(last);
  }
  const int64_t first = StageLayers(c, num_layers, 0), last = StageLayers(c, num_layers, c.pp - 1);
  if (c.pp == 2) {  // one given count fixes the other: the first stage's, unless they are even
    c.pp_first = first == last ? 0 : static_cast<int32_t>(first);
    c.pp_last = 0;
    return c;
  }
  const int64_t middle = StageLayers(c, num_layers, 1);
  c.pp_first = first == middle ? 0 : static_cast<int32_t>(first);
  c.pp_last = last == middle ? 0 : static_cast<int32_t>(last);
  return c;
}

ParallelConfig Complete(ParallelConfig c, int64_t world_size) {
  const int64_t mp = c.model_parallel_size();
  if (c.tp < 1 || c.cp < 1 || c.up < 1 || c.pp < 1 || c.dp < 0) {
    throw InputError(kFlag,
                     "tp, cp, up and pp must be positive and dp non-negative, got " + ToSpec(c));
  }
  if (mp > world_size) {  // also a product past int64 (saturated)
    throw InputError(
        kFlag,
        "tp·cp·up·pp = " + (mp == INT64_MAX ? std::string("more than 2^63") : std::to_string(mp)) +
            " is more than the world size " + std::to_string(world_size));
  }
  if (c.dp == 0) {
    if (world_size % mp != 0) {
      throw InputError(kFlag, "tp·cp·up·pp = " + std::to_string(mp) +
                                  " does not divide the world size " + std::to_string(world_size));
    }
    c.dp = static_cast<int32_t>(world_size / mp);
  }
  if (c.world_size() != world_size) {
    throw InputError(kFlag, "tp·cp·up·dp·pp = " +
                                (c.world_size() == INT64_MAX ? std::string("more than 2^63")
                                                             : std::to_string(c.world_size())) +
                                " but the world size (--nnodes × --nproc-per-node) is " +
                                std::to_string(world_size));
  }
  return c;
}

}  // namespace autopar
