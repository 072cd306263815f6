#include "autopar/cli/pipeline_stages.h"

#include <algorithm>
#include <charconv>
#include <regex>

#include "autopar/common/errors.h"

namespace autopar::cli {
namespace {

constexpr const char* kFirstFlag = "--decoder-first-pipeline-num-layers";
constexpr const char* kLastFlag = "--decoder-last-pipeline-num-layers";
constexpr const char* kLayoutFlag = "--pipeline-model-parallel-layout";
constexpr const char* kEmbeddingFlag = "--account-for-embedding-in-pipeline-split";
constexpr const char* kLossFlag = "--account-for-loss-in-pipeline-split";
constexpr const char* kLayersPerVirtualFlag = "--num-layers-per-virtual-pipeline-stage";
constexpr const char* kPpFlag = "--pipeline-model-parallel-size";
// An unrolled layout longer than this is refused rather than built (`t*999999999`).
constexpr size_t kMaxLayoutLetters = size_t{1} << 20;

std::string Str(int64_t v) { return std::to_string(v); }

// One pass of Python's re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text), as
// parse_str_to_list runs it.
std::string Unroll(const std::string& text, const std::regex& pattern) {
  std::string out;
  size_t copied = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pattern);
       it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    out.append(text, copied, static_cast<size_t>(m.position(0)) - copied);
    const std::string digits = m[2].str(), unit = m[1].str();
    uint64_t times = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), times);
    if (ec != std::errc() || end != digits.data() + digits.size() ||
        (times > 0 && unit.size() > (kMaxLayoutLetters - out.size()) / times)) {
      throw InputError(kLayoutFlag, "'" + m[0].str() + "' unrolls to more than " +
                                        Str(kMaxLayoutLetters) + " letters");
    }
    for (uint64_t k = 0; k < times; ++k) out += unit;
    copied = static_cast<size_t>(m.position(0) + m.length(0));
  }
  out.append(text, copied, std::string::npos);
  return out;
}

// Megatron-LM's validate_layer_layout on the layout's layers in order (the stages joined).
void CheckLayoutLayers(const std::string& layers, const ModelSpec& model) {
  const auto count = [&](char letter) { return std::count(layers.begin(), layers.end(), letter); };
  if (layers.empty() || layers.front() != 'E' || layers.back() != 'L' || count('E') != 1 ||
      count('L') != 1) {
    throw InputError(kLayoutFlag,
                     "Megatron-LM needs the embedding E once, first, and the loss L once, last");
  }
  if (count('t') != model.num_layers) {
    throw InputError(kLayoutFlag, "it places " + Str(count('t')) +
                                      " transformer layers (t), the model has " +
                                      Str(model.num_layers) + " (--num-layers)");
  }
  if (count('m') != model.mtp_num_layers) {
    throw InputError(kLayoutFlag, "it places " + Str(count('m')) +
                                      " MTP layers (m), the model has " +
                                      Str(model.mtp_num_layers) + " (--mtp-num-layers)");
  }
  if (const size_t mtp = layers.find('m');
      mtp != std::string::npos && layers.find('t', mtp) != std::string::npos) {
    throw InputError(kLayoutFlag,
                     "Megatron-LM places the transformer layers before the MTP layers");
  }
}

// Whether `stages` (pp·vpp of them, vpp > 1) are Megatron's even split with the embedding or the
// loss counted as a layer: every model chunk the same number of transformer layers but the very
// first (last), one fewer beside the embedding (loss). Sets vpp, split_embedding and split_loss.
bool CountedSplit(const std::vector<std::string>& stages, int64_t pp, ParallelConfig& c) {
  const int64_t n = static_cast<int64_t>(stages.size());
  if (n / pp < 2 || n < 3) return false;
  std::vector<int64_t> t(stages.size());
  for (size_t v = 0; v < stages.size(); ++v) {
    t[v] = std::count(stages[v].begin(), stages[v].end(), 't');
  }
  const int64_t even = t[1];
  for (int64_t v = 1; v + 1 < n; ++v) {
    if (t[static_cast<size_t>(v)] != even) return false;
  }
  const bool first_short = t.front() == even - 1, last_short = t.back() == even - 1;
  if ((!first_short && t.front() != even) || (!last_short && t.back() != even) ||
      !(first_short || last_short)) {
    return false;
  }
  c.vpp = static_cast<int32_t>(n / pp);
  c.split_embedding = first_short;
  c.split_loss = last_short;
  return true;
}

// pp_first, pp_last and vpp from a layout (c.pp given), where the layout is such a split.
void ApplyLayout(const std::string& text, const ModelSpec& model, ParallelConfig& c) {
  const std::vector<std::string> stages = ParseMegatronLayout(text);
  const int64_t pp = c.pp, n = static_cast<int64_t>(stages.size());
  if (n % pp != 0) {
    throw InputError(kLayoutFlag, "its " + Str(n) + " stages do not divide by " + kPpFlag + " " +
                                      Str(pp) + " (Megatron-LM: pp x virtual stages)");
  }
  const int64_t vpp = n / pp;
  if (vpp > 1 && pp == 1) {
    throw InputError(kLayoutFlag, "its " + Str(n) + " stages at " + kPpFlag +
                                      " 1 are virtual stages, which need pp > 1");
  }
  std::string joined;
  for (const std::string& s : stages) joined += s;
  CheckLayoutLayers(joined, model);
  const std::string modelled =
      ": only a first and a last stage that differ from the even middle ones are modelled "
      "(as --decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers give them)";
  if (stages.front().empty() || stages.front()[0] != 'E') {
    throw InputError(kLayoutFlag, "the embedding is not on the first stage" + modelled);
  }
  if (std::count(stages.back().begin(), stages.back().end(), 'm') != model.mtp_num_layers) {
    throw InputError(kLayoutFlag, "MTP layers off the last stage (standalone MTP)" + modelled);
  }
  if (CountedSplit(stages, pp, c)) return;
  std::vector<int64_t> layers(static_cast<size_t>(pp), 0);  // transformer layers per rank
  for (int64_t rank = 0; rank < pp; ++rank) {
    const auto in_chunk = [&](int64_t v) {
      const std::string& s = stages[static_cast<size_t>(v * pp + rank)];
      return static_cast<int64_t>(std::count(s.begin(), s.end(), 't'));
    };
    for (int64_t v = 0; v < vpp; ++v) {
      if (in_chunk(v) != in_chunk(0)) {
        throw InputError(kLayoutFlag, "the model chunks of pipeline rank " + Str(rank) + " hold " +
                                          Str(in_chunk(0)) + " and " + Str(in_chunk(v)) +
                                          " transformer layers" + modelled);
      }
      layers[static_cast<size_t>(rank)] += in_chunk(v);
    }
    if (layers[static_cast<size_t>(rank)] == 0) {
      throw InputError(kLayoutFlag,
                       "pipeline rank " + Str(rank) + " holds no transformer layer" + modelled);
    }
    if (rank > 1 && rank < pp - 1 && layers[static_cast<size_t>(rank)] != layers[1]) {
      throw InputError(kLayoutFlag, "pipeline ranks 1 and " + Str(rank) + " hold " +
                                        Str(layers[1]) + " and " +
                                        Str(layers[static_cast<size_t>(rank)]) +
                                        " transformer layers" + modelled);
    }
  }
  c.vpp = static_cast<int32_t>(vpp);
  if (pp > 1) {
    c.pp_first = static_cast<int32_t>(layers.front());
    c.pp_last = static_cast<int32_t>(layers.back());
  }
}

// Megatron-LM's even split with the embedding and the loss counted as a layer each
// (get_num_layers_to_build): (num_layers + e + l) / pp per rank, the first rank building one
// transformer layer fewer for the embedding, the last one fewer for the loss. With virtual stages
// only the first (last) model chunk is short: split_embedding / split_loss.
void ApplyAccountFor(const MegatronStageFlags& f, int64_t num_layers, ParallelConfig& c) {
  const char* flag = f.account_for_embedding ? kEmbeddingFlag : kLossFlag;
  const int64_t e = f.account_for_embedding, l = f.account_for_loss;
  if (c.pp == 1) return;  // one stage builds every layer
  const int64_t counted = num_layers + e + l;
  if (counted % c.pp != 0 || counted / c.pp % c.vpp != 0) {
    throw InputError(flag, "Megatron-LM splits the " + Str(num_layers) + " layers with the " +
                               (e && l ? "embedding and the loss"
                                : e    ? "embedding"
                                       : "loss") +
                               ", " + Str(counted) + " in all, evenly over " + kPpFlag + " " +
                               Str(c.pp) +
                               (c.vpp > 1 ? " x " + Str(c.vpp) + " virtual stages" : "") +
                               ": they do not divide");
  }
  const int64_t per_rank = counted / c.pp;
  if (c.vpp > 1) {
    c.split_embedding = e != 0;
    c.split_loss = l != 0;
    if (const std::string reason = StageSplitError(c, num_layers); !reason.empty()) {
      throw InputError(flag, "Megatron-LM refuses this split: " + reason);
    }
    return;
  }
  if (per_rank - e == 0 || per_rank - l == 0) {
    throw InputError(flag, "it leaves the " + std::string(per_rank - e == 0 ? "first" : "last") +
                               " stage without transformer layers: not modelled");
  }
  c.pp_first = e ? static_cast<int32_t>(per_rank - e) : 0;
  c.pp_last = l ? static_cast<int32_t>(per_rank - l) : 0;
}

// --decoder-first/last-pipeline-num-layers as given (each >= 1, read so).
void ApplyFirstLast(const MegatronStageFlags& f, int64_t num_layers, ParallelConfig& c) {
  for (const auto& [flag, given] :
       {std::pair{kFirstFlag, f.first_layers}, {kLastFlag, f.last_layers}}) {
    if (given && *given > num_layers) {
      throw InputError(flag,
                       "more than the model's " + Str(num_layers) + " layers, got " + Str(*given));
    }
    // One stage holds every layer: Megatron-LM accepts the count only where it says so.
    if (given && c.pp == 1 && *given != num_layers) {
      throw InputError(flag, "at " + std::string(kPpFlag) + " 1 the one stage holds all " +
                                 Str(num_layers) + " layers, got " + Str(*given));
    }
  }
  if (c.pp == 1) return;
  c.pp_first = static_cast<int32_t>(f.first_layers.value_or(0));
  c.pp_last = static_cast<int32_t>(f.last_layers.value_or(0));
}

// The combinations Megatron-LM refuses (arguments.py's validate_args; TransformerConfig).
void RefuseConflicts(const MegatronStageFlags& f) {
  std::vector<std::string> virtual_flags;
  if (f.layers_per_virtual_stage > 0) virtual_flags.push_back(kLayersPerVirtualFlag);
  if (!f.virtual_stages_flag.empty()) virtual_flags.push_back(f.virtual_stages_flag);
  if (f.layout) virtual_flags.push_back(kLayoutFlag);
  if (virtual_flags.size() > 1) {
    throw InputError(virtual_flags[1], "not with " + virtual_flags[0] +
                                           ": Megatron-LM takes one of "
                                           "--num-layers-per-virtual-pipeline-stage, "
                                           "--num-virtual-stages-per-pipeline-rank, " +
                                           kLayoutFlag);
  }
  std::vector<const char*> uneven, account;
  if (f.first_layers) uneven.push_back(kFirstFlag);
  if (f.last_layers) uneven.push_back(kLastFlag);
  if (f.account_for_embedding) account.push_back(kEmbeddingFlag);
  if (f.account_for_loss) account.push_back(kLossFlag);
  if (f.layout && (!uneven.empty() || !account.empty())) {
    throw InputError(kLayoutFlag, std::string("not with ") +
                                      (uneven.empty() ? account[0] : uneven[0]) +
                                      ": the layout places every layer itself (Megatron-LM)");
  }
  if (!uneven.empty() && !account.empty()) {
    throw InputError(account[0], std::string("not with ") + uneven[0] +
                                     ": Megatron-LM takes uneven stages one way");
  }
  if (!uneven.empty() && f.layers_per_virtual_stage > 0) {
    throw InputError(kLayersPerVirtualFlag,
                     std::string("not with ") + uneven[0] +
                         ": Megatron-LM takes the virtual stages of uneven stages from "
                         "--num-virtual-stages-per-pipeline-rank");
  }
}

}  // namespace

std::vector<std::string> ParseMegatronLayout(const std::string& text) {
  std::string unrolled;
  for (char ch : text) {
    if (ch != ',') unrolled += ch;  // commas are cosmetic
  }
  static const std::regex kGroup(R"(\(([^)]+)\)\*(\d+))"), kLetter(R"((.)\*(\d+))");
  unrolled = Unroll(Unroll(unrolled, kGroup), kLetter);
  std::vector<std::string> stages(1);
  for (char ch : unrolled) {
    if (ch == '|') {
      stages.emplace_back();
    } else if (ch == 'E' || ch == 't' || ch == 'm' || ch == 'L') {
      stages.back() += ch;
    } else {
      throw InputError(kLayoutFlag, "'" + std::string(1, ch) + "' in '" + text +
                                        "' is not a layer: E (embedding), t (transformer layer), "
                                        "m (MTP layer), L (loss); `|` ends a stage, `(...)*n` "
                                        "and `x*n` repeat, commas are cosmetic");
    }
  }
  return stages;
}

std::string ApplyMegatronStages(const MegatronStageFlags& f, const ModelSpec& model,
                                ParallelConfig& c) {
  RefuseConflicts(f);
  const int64_t num_layers = model.num_layers;
  if (f.layers_per_virtual_stage > 0) {
    // arguments.py counts the embedding and the loss here too.
    const int64_t counted = num_layers + f.account_for_embedding + f.account_for_loss;
    if (counted % c.pp != 0 || counted / c.pp % f.layers_per_virtual_stage != 0) {
      throw InputError(kLayersPerVirtualFlag, "must divide the " + Str(counted) + " layers over " +
                                                  kPpFlag + " " + Str(c.pp) +
                                                  " into whole stages of whole virtual stages");
    }
    c.vpp = static_cast<int32_t>(counted / c.pp / f.layers_per_virtual_stage);
  }
  std::string flag;
  if (f.layout) {
    ApplyLayout(*f.layout, model, c);
    flag = kLayoutFlag;
  } else if (f.account_for_embedding || f.account_for_loss) {
    ApplyAccountFor(f, num_layers, c);
    flag = f.account_for_embedding ? kEmbeddingFlag : kLossFlag;
  } else if (f.first_layers || f.last_layers) {
    ApplyFirstLast(f, num_layers, c);
    flag = f.first_layers ? kFirstFlag : kLastFlag;
  }
  if (!UnevenStages(c)) return "";
  if (const std::string reason = StageSplitError(c, num_layers); !reason.empty()) {
    throw InputError(flag, "Megatron-LM refuses this split of the model's " + Str(num_layers) +
                               " layers over " + kPpFlag + " " + Str(c.pp) +
                               (c.vpp > 1 ? " x " + Str(c.vpp) + " virtual stages" : "") + ": " +
                               reason);
  }
  c = CanonicalStages(c, num_layers);
  return UnevenStages(c) ? flag : "";
}

int64_t LargestStageLayers(const ParallelConfig& c, int64_t num_layers) {
  int64_t largest = 0;
  for (int64_t stage = 0; stage < c.pp; ++stage) {
    largest = std::max(largest, StageLayers(c, num_layers, stage));
  }
  return largest;
}

}  // namespace autopar::cli
