#include "autopar/cli/megatron_command.h"

#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

namespace autopar::cli {
namespace {

enum class Arity { kSwitch, kOne, kList };

struct Item {
  std::string name;  // "" for a word no flag takes
  std::vector<std::string> values;
  std::vector<std::string> words;
};

// launcher/autopar-train's tables (REPLACED, WHEN_GIVEN, CONDITIONAL, OTHERS), Megatron-LM
// d98e8a6's arities. Keep the two in step: the megatron_backend fault test compares them.
const std::map<std::string, Arity>& ParallelArity() {
  static const std::map<std::string, Arity> table = {
      {"--tensor-model-parallel-size", Arity::kOne},
      {"--pipeline-model-parallel-size", Arity::kOne},
      {"--context-parallel-size", Arity::kOne},
      {"--expert-model-parallel-size", Arity::kOne},
      {"--expert-tensor-parallel-size", Arity::kOne},
      {"--sequence-parallel", Arity::kSwitch},
      {"--cp-comm-type", Arity::kList},
      {"--hierarchical-context-parallel-sizes", Arity::kList},
      {"--num-layers-per-virtual-pipeline-stage", Arity::kOne},
      {"--num-virtual-stages-per-pipeline-rank", Arity::kOne},
      {"--microbatch-group-size-per-virtual-pipeline-stage", Arity::kOne},
      {"--decoder-first-pipeline-num-layers", Arity::kOne},
      {"--decoder-last-pipeline-num-layers", Arity::kOne},
      {"--pipeline-model-parallel-layout", Arity::kOne},
      {"--account-for-embedding-in-pipeline-split", Arity::kSwitch},
      {"--account-for-loss-in-pipeline-split", Arity::kSwitch},
      {"--micro-batch-size", Arity::kOne},
      {"--global-batch-size", Arity::kOne},
      {"--recompute-activations", Arity::kSwitch},
      {"--recompute-granularity", Arity::kOne},
      {"--recompute-method", Arity::kOne},
      {"--recompute-num-layers", Arity::kOne},
      {"--recompute-modules", Arity::kList},
      {"--distribute-saved-activations", Arity::kSwitch},
      {"--moe-layer-recompute", Arity::kSwitch},
      {"--use-distributed-optimizer", Arity::kSwitch},
      {"--num-distributed-optimizer-instances", Arity::kOne},
      {"--overlap-grad-reduce", Arity::kSwitch},
      {"--overlap-param-gather", Arity::kSwitch},
      {"--virtual-pipeline-model-parallel-size", Arity::kOne},
      {"--model-parallel-size", Arity::kOne},
      {"--batch-size", Arity::kOne},
      {"--checkpoint-activations", Arity::kSwitch},
  };
  return table;
}

const std::map<std::string, Arity>& OtherArity() {
  static const std::map<std::string, Arity> table = {
      // WHEN_GIVEN and CONDITIONAL
      {"--moe-token-dispatcher-type", Arity::kOne},
      {"--tp-comm-overlap", Arity::kSwitch},
      {"--overlap-param-gather-with-optimizer-step", Arity::kSwitch},
      {"--no-overlap-p2p-communication", Arity::kSwitch},
      // OTHERS (read by autopar-train's conflict checks)
      {"--num-layers", Arity::kOne},
      {"--decoder-num-layers", Arity::kOne},
      {"--hybrid-layer-pattern", Arity::kOne},
      {"--optimizer", Arity::kOne},
      {"--use-megatron-fsdp", Arity::kSwitch},
      {"--use-torch-fsdp2", Arity::kSwitch},
      {"--fp8-param-gather", Arity::kSwitch},
      {"--hybrid-context-parallel", Arity::kSwitch},
      {"--tensor-parallel-num-weight-shards", Arity::kOne},
      {"--expert-tensor-parallel-num-weight-shards", Arity::kOne},
  };
  return table;
}

// The flags a trial sets itself (training length, logging, evaluation, checkpoints), and the data
// sources mock data replaces: Megatron-LM d98e8a6 arguments.py and training_config.py.
const std::map<std::string, Arity>& TrialArity() {
  static const std::map<std::string, Arity> table = {
      {"--train-iters", Arity::kOne},
      {"--train-samples", Arity::kOne},
      {"--lr-decay-samples", Arity::kOne},
      {"--lr-warmup-samples", Arity::kOne},
      {"--lr-wsd-decay-samples", Arity::kOne},
      {"--log-interval", Arity::kOne},
      {"--eval-iters", Arity::kOne},
      {"--eval-interval", Arity::kOne},
      {"--exit-interval", Arity::kOne},
      {"--exit-duration-in-mins", Arity::kOne},
      {"--log-throughput", Arity::kSwitch},
      {"--save", Arity::kOne},
      {"--load", Arity::kOne},
      {"--skip-train", Arity::kSwitch},
  };
  return table;
}

const std::map<std::string, Arity>& DataArity() {
  static const std::map<std::string, Arity> table = {
      {"--mock-data", Arity::kSwitch},
      {"--data-path", Arity::kList},
      {"--split", Arity::kOne},
      {"--train-data-path", Arity::kList},
      {"--valid-data-path", Arity::kList},
      {"--test-data-path", Arity::kList},
      {"--data-args-path", Arity::kOne},
      {"--per-split-data-args-path", Arity::kOne},
  };
  return table;
}

// argparse reads "-1" and "-0.5" as values, not options.
bool IsOption(const std::string& word) {
  if (word.size() < 2 || word[0] != '-') return false;
  char* end = nullptr;
  std::strtod(word.c_str(), &end);
  return !(end != nullptr && *end == '\0');
}

// autopar-train's split_options: a flag takes the values its arity says (one after `=`); an
// unknown flag every word up to the next option.
std::vector<Item> SplitOptions(const std::vector<std::string>& words,
                               const std::map<std::string, Arity>& arity) {
  std::vector<Item> items;
  size_t i = 0;
  while (i < words.size()) {
    const std::string& word = words[i];
    if (!IsOption(word)) {
      items.push_back({"", {word}, {word}});
      ++i;
      continue;
    }
    const size_t eq = word.find('=');
    Item item;
    item.name = word.substr(0, eq);
    const auto found = arity.find(item.name);
    const Arity kind = found == arity.end() ? Arity::kList : found->second;
    size_t end = i + 1;
    if (eq != std::string::npos) {
      item.values = {word.substr(eq + 1)};
    } else {
      if (kind == Arity::kOne && end < words.size() && !IsOption(words[end])) {
        ++end;
      } else if (kind == Arity::kList) {
        while (end < words.size() && !IsOption(words[end])) ++end;
      }
      item.values.assign(words.begin() + static_cast<long>(i) + 1,
                         words.begin() + static_cast<long>(end));
    }
    item.words.assign(words.begin() + static_cast<long>(i), words.begin() + static_cast<long>(end));
    items.push_back(std::move(item));
    i = end;
  }
  return items;
}

// autopar-train's allowed(): why the configuration refuses a CONDITIONAL flag, "" when it does
// not. The new command's parallel flags are the configuration's alone (the user's are replaced).
std::string Refused(const std::string& flag, const ParallelConfig& c) {
  if (flag == "--tp-comm-overlap") {
    if (c.tp <= 1) return "tp communication overlap needs tp > 1";
    if (!c.sp) return "tp communication overlap needs sequence parallelism";
  } else if (flag == "--overlap-param-gather-with-optimizer-step") {
    if (!c.dist_opt) return "it needs --use-distributed-optimizer";
    if (!c.overlap_param_gather) return "it needs --overlap-param-gather";
    if (c.vpp <= 1) return "it needs virtual pipeline stages";
  } else if (flag == "--no-overlap-p2p-communication") {
    if (c.vpp > 1 && c.pp <= 2) return "virtual pipeline stages without p2p overlap need pp > 2";
  }
  return "";
}

std::map<std::string, Arity> Merged(std::initializer_list<const std::map<std::string, Arity>*> l) {
  std::map<std::string, Arity> out;
  for (const auto* m : l) out.insert(m->begin(), m->end());
  return out;
}

}  // namespace

size_t MegatronScriptStart(const std::vector<std::string>& command) {
  for (size_t i = 0; i < command.size(); ++i) {
    const std::string& w = command[i];
    if (w.size() >= 3 && w.compare(w.size() - 3, 3, ".py") == 0) return i + 1;
  }
  return command.empty() ? 0 : 1;
}

std::vector<std::string> ReplaceParallelFlags(const std::vector<std::string>& user,
                                              const std::vector<std::string>& parallel_flags,
                                              const ParallelConfig& config,
                                              std::vector<std::string>* notes) {
  const std::map<std::string, Arity> known = Merged({&ParallelArity(), &OtherArity()});
  const std::vector<Item> best = SplitOptions(parallel_flags, known);
  std::set<std::string> given;
  std::map<std::string, Arity> arity;
  for (const Item& b : best) {
    given.insert(b.name);
    arity[b.name] = b.values.empty()       ? Arity::kSwitch
                    : b.values.size() == 1 ? Arity::kOne
                                           : Arity::kList;
  }
  for (const auto& [name, kind] : known) arity[name] = kind;  // the tables win, as in Python
  std::vector<std::string> out;
  for (const Item& item : SplitOptions(user, arity)) {
    if (ParallelArity().count(item.name) || given.count(item.name)) continue;
    const std::string why = OtherArity().count(item.name) ? Refused(item.name, config) : "";
    if (!why.empty()) {
      if (notes) notes->push_back("dropped " + item.name + ": " + why);
      continue;
    }
    out.insert(out.end(), item.words.begin(), item.words.end());
  }
  for (const Item& b : best) out.insert(out.end(), b.words.begin(), b.words.end());
  return out;
}

std::vector<std::string> MegatronTrialCommand(const std::vector<std::string>& train_command,
                                              const std::vector<std::string>& user_args,
                                              const std::vector<std::string>& parallel_flags,
                                              const ParallelConfig& config,
                                              const MegatronTrialSettings& settings,
                                              std::vector<std::string>* notes) {
  const std::vector<std::string> script(
      user_args.begin() + static_cast<long>(MegatronScriptStart(user_args)), user_args.end());
  // The flags the trial owns go first, read with every table's arity so their values go too.
  const std::map<std::string, Arity> arity =
      Merged({&ParallelArity(), &OtherArity(), &TrialArity(), &DataArity()});
  std::vector<std::string> rest;
  for (const Item& item : SplitOptions(script, arity)) {
    const bool owned =
        TrialArity().count(item.name) || (settings.mock_data && DataArity().count(item.name));
    if (!owned) rest.insert(rest.end(), item.words.begin(), item.words.end());
  }
  std::vector<std::string> out = train_command;
  const std::vector<std::string> replaced =
      ReplaceParallelFlags(rest, parallel_flags, config, notes);
  out.insert(out.end(), replaced.begin(), replaced.end());
  for (const std::string& w :
       {std::string("--train-iters"), std::to_string(settings.train_iters),
        std::string("--log-interval"), std::string("1"), std::string("--eval-iters"),
        std::string("0"), std::string("--log-throughput"), std::string("--exit-duration-in-mins"),
        std::to_string(settings.exit_duration_mins)}) {
    out.push_back(w);
  }
  if (settings.mock_data) out.push_back("--mock-data");
  return out;
}

bool NeedsOneDeviceConnection(const ParallelConfig& config, const std::vector<std::string>& args) {
  if (config.tp <= 1 && config.cp * config.up <= 1) return false;
  for (const std::string& a : args) {
    if (a == "--use-torch-fsdp2" || a == "--use-megatron-fsdp" ||
        a == "--overlap-moe-expert-parallel-comm") {
      return false;
    }
  }
  return true;
}

std::vector<std::string> SplitWords(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  std::string w;
  while (in >> w) words.push_back(w);
  return words;
}

}  // namespace autopar::cli
