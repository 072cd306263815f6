// Megatron-LM arguments → ModelSpec and TrainSpec.
//
// A user pastes the flags of a Megatron-LM training script. Two cases:
//  - `base` is an empty ModelSpec: the flags describe the model from scratch, and every flag they
//    leave out takes Megatron-LM's default (GeLU, LayerNorm, learned absolute positions, tied
//    embeddings, biases, ffn_hidden_size from hidden_size, ...), as Megatron itself would train.
//  - `base` is a model (a preset): flags override its fields; the rest keep the base's values.
// Flags we do not model (--lr, --tensor-model-parallel-size, ...) come back in `unused`.
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "autopar/common/errors.h"
#include "autopar/spec/parse.h"
#include "internal.h"

namespace autopar {
namespace {

using spec_internal::ParseInt;

struct IntFlag {
  const char* flag;
  int64_t ModelSpec::*member;
  bool allow_zero;  // 0 is meaningful ("none") rather than a missing size
  int64_t max;      // the field's bound (include/autopar/spec/bounds.h), checked as it is read
};

using namespace bounds;
constexpr IntFlag kModelIntFlags[] = {
    {"--num-layers", &ModelSpec::num_layers, false, kMaxLayers},
    {"--hidden-size", &ModelSpec::hidden_size, false, kMaxWidth},
    {"--ffn-hidden-size", &ModelSpec::ffn_hidden_size, false, kMaxFfn},
    {"--num-attention-heads", &ModelSpec::num_attention_heads, false, kMaxWidth},
    {"--num-query-groups", &ModelSpec::num_query_groups, false, kMaxWidth},
    {"--kv-channels", &ModelSpec::kv_channels, false, kMaxWidth},
    {"--max-position-embeddings", &ModelSpec::max_position_embeddings, false, kMaxSequence},
    {"--vocab-size", &ModelSpec::vocab_size, false, kMaxVocabulary},
    {"--q-lora-rank", &ModelSpec::q_lora_rank, true, kMaxWidth},
    {"--kv-lora-rank", &ModelSpec::kv_lora_rank, false, kMaxWidth},
    {"--qk-head-dim", &ModelSpec::qk_head_dim, false, kMaxWidth},
    {"--qk-pos-emb-head-dim", &ModelSpec::qk_pos_emb_head_dim, false, kMaxWidth},
    {"--v-head-dim", &ModelSpec::v_head_dim, false, kMaxWidth},
    {"--num-experts", &ModelSpec::num_experts, false, kMaxExperts},
    {"--moe-router-topk", &ModelSpec::moe_router_topk, false, kMaxExperts},
    {"--moe-ffn-hidden-size", &ModelSpec::moe_ffn_hidden_size, false, kMaxFfn},
    {"--moe-shared-expert-intermediate-size", &ModelSpec::moe_shared_expert_intermediate_size, true,
     kMaxFfn},
    {"--window-attn-skip-freq", &ModelSpec::window_attn_skip_freq, false, kMaxLayers},
    {"--mtp-num-layers", &ModelSpec::mtp_num_layers, true, kMaxLayers},
};

// Megatron-LM's defaults for what a from-scratch command line leaves out (arguments.py).
ModelSpec MegatronDefaults() {
  ModelSpec m;
  m.name = "megatron";
  m.activation = Activation::kGeLU;
  m.norm = NormKind::kLayerNorm;
  m.position_embedding = PositionEmbedding::kLearned;
  m.untie_embeddings = false;
  m.add_bias_linear = true;
  return m;
}

bool IsEmpty(const ModelSpec& m) {
  return m.num_layers == 0 && m.hidden_size == 0 && m.num_attention_heads == 0;
}

// A count read from a flag: positive (or zero where `allow_zero`) and at most `max`, so that
// what is derived from it before Validate (4·hidden, the vocabulary's padding) cannot overflow.
int64_t PositiveInt(const std::string& text, const std::string& flag, bool allow_zero,
                    int64_t max) {
  const int64_t value = ParseInt(text, flag);
  if (value < 0 || (value == 0 && !allow_zero)) {
    throw InputError(flag, std::string("must be a ") + (allow_zero ? "non-negative" : "positive") +
                               " integer, got " + text);
  }
  spec_internal::RequireAtMost(value, max, flag.c_str());
  return value;
}

// --moe-layer-freq: an integer (only 1, every layer MoE, is representable) or Megatron's Python
// list expression, e.g. "([0]*3+[1]*58)" for DeepSeek-V3. Returns the leading dense layer count and
// the pattern length (0 for the integer form).
struct LayerFreq {
  int64_t first_dense = 0;
  int64_t length = 0;
};

LayerFreq ParseMoeLayerFreq(const std::string& raw) {
  const std::string flag = "--moe-layer-freq";
  const std::string expected = "; expected 1 or a list such as [0]*3+[1]*58";
  std::string text;
  for (char c : raw) {
    if (c != ' ' && c != '"' && c != '\'') text += c;
  }
  if (text.size() >= 2 && text.front() == '(' && text.back() == ')') {
    text = text.substr(1, text.size() - 2);
  }
  if (text.empty() || text.front() != '[') {
    const int64_t every = ParseInt(text, flag);
    if (every != 1) {
      throw InputError(flag, "MoE on every " + text +
                                 "-th layer cannot be modelled (only leading dense layers)" +
                                 expected);
    }
    return {};
  }

  std::vector<int64_t> pattern;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t close = text.find(']', pos);
    if (text[pos] != '[' || close == std::string::npos) {
      throw InputError(flag, "cannot parse '" + raw + "'" + expected);
    }
    std::vector<int64_t> items;
    size_t start = pos + 1;
    while (start < close) {
      if (static_cast<int64_t>(items.size() + pattern.size()) >= kMaxLayers) {
        throw InputError(flag, "the pattern lists more than " + std::to_string(kMaxLayers) +
                                   " layers (the bound on num_layers)");
      }
      size_t comma = text.find(',', start);
      if (comma == std::string::npos || comma > close) comma = close;
      const int64_t item = ParseInt(text.substr(start, comma - start), flag);
      if (item != 0 && item != 1) {
        throw InputError(flag, "entries must be 0 (dense) or 1 (MoE), got " + std::to_string(item));
      }
      items.push_back(item);
      start = comma + 1;
    }
    pos = close + 1;
    int64_t repeat = 1;
    if (pos < text.size() && text[pos] == '*') {
      const size_t end = text.find('+', pos);
      const size_t stop = end == std::string::npos ? text.size() : end;
      repeat = ParseInt(text.substr(pos + 1, stop - pos - 1), flag);
      if (repeat < 0) throw InputError(flag, "a repeat count must be non-negative" + expected);
      pos = stop;
    }
    // Bounded before it is expanded: a pattern lists one entry per layer.
    const int64_t room = kMaxLayers - static_cast<int64_t>(pattern.size());
    if (!items.empty() && repeat > room / static_cast<int64_t>(items.size())) {
      throw InputError(flag, "the pattern lists more than " + std::to_string(kMaxLayers) +
                                 " layers (the bound on num_layers)");
    }
    for (int64_t r = 0; r < repeat; ++r) pattern.insert(pattern.end(), items.begin(), items.end());
    if (pos < text.size()) {
      if (text[pos] != '+') throw InputError(flag, "cannot parse '" + raw + "'" + expected);
      ++pos;
    }
  }

  LayerFreq result;
  result.length = static_cast<int64_t>(pattern.size());
  while (result.first_dense < result.length && pattern[result.first_dense] == 0) {
    ++result.first_dense;
  }
  for (int64_t i = result.first_dense; i < result.length; ++i) {
    if (pattern[i] != 1) {
      throw InputError(flag,
                       "dense layers after the first MoE layer cannot be modelled; only "
                       "leading dense layers such as [0]*3+[1]*58 are supported");
    }
  }
  return result;
}

// The vocabulary of a tokenizer Megatron-LM builds from files the tool does not read (its
// `--tokenizer-type`; a `--vocab-file` with a `--merge-file` is GPT-2's BPE), where it is fixed.
int64_t TokenizerVocabulary(const std::string& tokenizer, std::vector<std::string>& notes) {
  struct Known {
    const char* type;
    int64_t vocabulary;
    const char* whose;
  };
  constexpr Known kKnown[] = {
      {"GPT2BPETokenizer", 50257, "GPT-2's BPE"},
      {"Llama2Tokenizer", 32000, "Llama 2's SentencePiece model"},
  };
  const std::string type = tokenizer.empty() ? "GPT2BPETokenizer" : tokenizer;
  for (const Known& k : kKnown) {
    if (type != k.type) continue;
    notes.push_back("--vocab-size not given: " + std::to_string(k.vocabulary) + " tokens, " +
                    k.whose + (tokenizer.empty() ? " (no --tokenizer-type given)" : "") +
                    "; give --vocab-size to change it");
    return k.vocabulary;
  }
  throw InputError("--vocab-size", "required with --tokenizer-type " + tokenizer +
                                       ": its vocabulary comes from the tokenizer's files (known "
                                       "without them: GPT2BPETokenizer, Llama2Tokenizer)");
}

// --window-size LEFT,RIGHT (Megatron's tuple_type: "4096,0" or "(4096,0)"): the keys a query sees
// to its left; a causal model has RIGHT 0, and LEFT -1 means no window.
int64_t ParseWindowSize(const std::string& raw) {
  const std::string flag = "--window-size";
  std::string text;
  for (char c : raw) {
    if (c != ' ' && c != '"' && c != '\'' && c != '(' && c != ')') text += c;
  }
  const size_t comma = text.find(',');
  if (comma == std::string::npos) {
    throw InputError(flag, "expected LEFT,RIGHT such as 4096,0, got '" + raw + "'");
  }
  const int64_t left = ParseInt(text.substr(0, comma), flag);
  const int64_t right = ParseInt(text.substr(comma + 1), flag);
  if (right != 0) {
    throw InputError(flag, "only causal windows (RIGHT = 0) are modelled, got '" + raw + "'");
  }
  if (left == -1) return 0;
  if (left <= 0)
    throw InputError(flag, "LEFT must be positive or -1 (no window), got '" + raw + "'");
  return left;
}

// The Megatron flag for a ModelSpec field, so Validate's errors name what the user typed.
std::string FlagForField(const std::string& field) {
  if (field == "moe_first_dense_layers") return "--moe-layer-freq";
  std::string flag = "--" + field;
  for (char& c : flag) {
    if (c == '_') c = '-';
  }
  return flag;
}

// A Megatron-LM model flag applied to `m`, its value read through `value` (a switch checked
// through `switch_flag`); false when `flag` is not one.
bool ApplyModelFlag(const std::string& flag, const std::function<std::string()>& value,
                    const std::function<void()>& switch_flag, ModelSpec& m, LayerFreq& layer_freq) {
  const IntFlag* int_flag = nullptr;
  for (const IntFlag& f : kModelIntFlags) {
    if (flag == f.flag) int_flag = &f;
  }
  if (int_flag != nullptr) {
    m.*(int_flag->member) = PositiveInt(value(), flag, int_flag->allow_zero, int_flag->max);
  } else if (flag == "--swiglu") {
    switch_flag();
    m.activation = Activation::kSwiGLU;
  } else if (flag == "--normalization") {
    m.norm = spec_internal::ParseNorm(value(), flag);
  } else if (flag == "--position-embedding-type") {
    m.position_embedding = spec_internal::ParsePositionEmbedding(value(), flag);
  } else if (flag == "--use-rotary-position-embeddings") {  // older Megatron-LM spelling
    switch_flag();
    m.position_embedding = PositionEmbedding::kRope;
  } else if (flag == "--untie-embeddings-and-output-weights") {
    switch_flag();
    m.untie_embeddings = true;
  } else if (flag == "--disable-bias-linear") {
    switch_flag();
    m.add_bias_linear = false;
  } else if (flag == "--qk-layernorm") {
    switch_flag();
    m.qk_layernorm = true;
  } else if (flag == "--group-query-attention" || flag == "--multi-latent-attention") {
    switch_flag();
  } else if (flag == "--window-size") {
    m.window_size = ParseWindowSize(value());
  } else if (flag == "--moe-layer-freq") {
    layer_freq = ParseMoeLayerFreq(value());
    m.moe_first_dense_layers = layer_freq.first_dense;
  } else {
    return false;
  }
  return true;
}

// What the flag loop gathered for CompleteModel besides the model.
struct ReadState {
  std::string tokenizer;
  int64_t vocab_divisible_by, script_tp;
  LayerFreq layer_freq;
};

// What Megatron-LM derives where its flags were silent (arguments.py, the configs'
// __post_init__), for a model described from scratch or edited by `given` flags: the MLP width,
// positions and vocabulary with its padding, the query groups, MLA's and MoE's defaults; and the
// layer pattern's length checked against the layers.
void CompleteModel(const std::set<std::string>& given, bool from_scratch, const ModelSpec& base,
                   const ReadState& st, MegatronArgs& out) {
  ModelSpec& m = out.model;
  const std::string& tokenizer = st.tokenizer;
  const int64_t vocab_divisible_by = st.vocab_divisible_by, script_tp = st.script_tp;
  const LayerFreq& layer_freq = st.layer_freq;
  const auto was_given = [&](const char* flag) { return given.count(flag) > 0; };
  const bool gqa = was_given("--group-query-attention");

  if (from_scratch) {
    // Megatron keeps a SwiGLU MLP's parameter count near a 4h one, rounded down to 64.
    if (!was_given("--ffn-hidden-size")) {
      m.ffn_hidden_size =
          m.activation == Activation::kSwiGLU ? m.hidden_size / 24 * 64 : 4 * m.hidden_size;
    }
    if (!was_given("--max-position-embeddings")) m.max_position_embeddings = out.train.seq_length;
    if (!was_given("--vocab-size")) m.vocab_size = TokenizerVocabulary(tokenizer, out.notes);
  }
  if (from_scratch || was_given("--vocab-size")) {
    const int64_t multiple = vocab_divisible_by * script_tp;
    const int64_t padded = (m.vocab_size + multiple - 1) / multiple * multiple;
    if (padded != m.vocab_size) {
      out.notes.push_back(
          "vocabulary " + std::to_string(m.vocab_size) + " padded to " + std::to_string(padded) +
          " (a multiple of --make-vocab-size-divisible-by " + std::to_string(vocab_divisible_by) +
          " x tensor-parallel size " + std::to_string(script_tp) + "), as Megatron-LM pads it");
      m.vocab_size = padded;
    }
  }
  // Without --num-query-groups: Megatron's GQA default is 1 group; without GQA there is one
  // group per head, also when a base without GQA gets a new head count.
  const bool base_is_mha = from_scratch || base.num_query_groups == base.num_attention_heads;
  if (!was_given("--num-query-groups") && base_is_mha) {
    m.num_query_groups = gqa ? 1 : m.num_attention_heads;
  }
  if (was_given("--multi-latent-attention")) {
    // Megatron-LM's MLA defaults (MLATransformerConfig).
    if (m.kv_lora_rank == 0) m.kv_lora_rank = 32;
    if (m.qk_head_dim == 0) m.qk_head_dim = 128;
    if (m.qk_pos_emb_head_dim == 0) m.qk_pos_emb_head_dim = 64;
    if (m.v_head_dim == 0) m.v_head_dim = 128;
  }
  if (m.num_experts > 0) {
    if (m.moe_router_topk == 0) m.moe_router_topk = 2;  // Megatron's --moe-router-topk default
    if (m.moe_ffn_hidden_size == 0) m.moe_ffn_hidden_size = m.ffn_hidden_size;
  }
  if (layer_freq.length > 0 && layer_freq.length != m.num_layers) {
    throw InputError("--moe-layer-freq", "the pattern lists " + std::to_string(layer_freq.length) +
                                             " layers but the model has " +
                                             std::to_string(m.num_layers));
  }
}

}  // namespace

bool MegatronFlagAccountedFor(const std::string& flag) {
  // Whole families by prefix: optimizer hyper-parameters, schedules, data, tokenizer files,
  // logging, evaluation, checkpoints, profiling, initialisation, the FP8 scaling recipe's
  // bookkeeping, the router's loss terms and its forced balance (the model assumes balance and
  // trials force it: docs/trial.md §8), kernels' fusions the model's efficiencies include,
  // grouped expert GEMMs, and torchrun's own flags (the cluster's shape is read from them apart).
  static const char* const kPrefixes[] = {"--lr",
                                          "--min-lr",
                                          "--decoupled-",
                                          "--weight-decay",
                                          "--adam-",
                                          "--sgd-",
                                          "--clip-grad",
                                          "--loss-scale",
                                          "--initial-loss-scale",
                                          "--init-method",
                                          "--train-",
                                          "--eval-",
                                          "--save",
                                          "--load",
                                          "--no-load-",
                                          "--no-save-",
                                          "--ckpt-",
                                          "--data-",
                                          "--split",
                                          "--mock-data",
                                          "--vocab-file",
                                          "--merge-file",
                                          "--tokenizer-",
                                          "--tiktoken-",
                                          "--log-",
                                          "--tensorboard-",
                                          "--wandb-",
                                          "--profile",
                                          "--seed",
                                          "--exit-",
                                          "--distributed-timeout-minutes",
                                          "--fp8-amax-",
                                          "--fp8-margin",
                                          "--moe-aux-loss-coeff",
                                          "--moe-z-loss-coeff",
                                          "--moe-router-load-balancing-type",
                                          "--moe-router-force-load-balancing",
                                          "--rotary-",
                                          "--use-checkpoint-args",
                                          "--num-workers",
                                          "--no-create-attention-mask-in-dataloader",
                                          "--no-mmap-bin-files",
                                          "--use-mcore-models",
                                          "--apply-layernorm-1p",
                                          "--no-masked-softmax-fusion",
                                          "--no-position-embedding",
                                          "--calculate-per-token-loss",
                                          "--step-batch-size-schedule",
                                          "--rampup-batch-size",
                                          "--moe-grouped-gemm",
                                          "--timing-log-",
                                          "--nproc_per_node",
                                          "--nproc-per-node",
                                          "--nnodes",
                                          "--node_rank",
                                          "--node-rank",
                                          "--master_addr",
                                          "--master-addr",
                                          "--master_port",
                                          "--master-port",
                                          "--rdzv"};
  for (const char* prefix : kPrefixes) {
    if (flag.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

MegatronArgs ApplyMegatronFlags(const std::vector<std::string>& args, const ModelSpec& base,
                                const TrainSpec& train) {
  const bool from_scratch = IsEmpty(base);
  MegatronArgs out{from_scratch ? MegatronDefaults() : base, train, {}, {}};
  ModelSpec& m = out.model;
  std::set<std::string> given;  // model flags seen
  bool fp8 = false;
  LayerFreq layer_freq;
  // What sets the vocabulary when --vocab-size does not (Megatron reads it from the tokenizer),
  // and its padding: to a multiple of --make-vocab-size-divisible-by × the tensor-parallel size.
  std::string tokenizer;
  int64_t vocab_divisible_by = 128, script_tp = 1;

  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.rfind("--", 0) != 0) {
      out.unused.push_back(arg);
      continue;
    }
    const size_t eq = arg.find('=');
    const std::string flag = arg.substr(0, eq);
    const bool has_inline = eq != std::string::npos;
    const auto value = [&]() -> std::string {
      if (has_inline) return arg.substr(eq + 1);
      if (i + 1 >= args.size() || args[i + 1].rfind("--", 0) == 0) {
        throw InputError(flag, "needs a value");
      }
      return args[++i];
    };
    const auto switch_flag = [&]() {
      if (has_inline) throw InputError(flag, "takes no value, got '" + arg.substr(eq + 1) + "'");
    };

    if (ApplyModelFlag(flag, value, switch_flag, m, layer_freq)) {
      given.insert(flag);
      continue;
    }
    if (flag == "--tokenizer-type") {
      tokenizer = value();
    } else if (flag == "--vocab-file" || flag == "--merge-file") {
      if (tokenizer.empty()) tokenizer = "GPT2BPETokenizer";  // what a vocab and merge file are
      out.unused.push_back(arg);
    } else if (flag == "--make-vocab-size-divisible-by") {
      vocab_divisible_by = PositiveInt(value(), flag, false, kMaxVocabulary);
    } else if (flag == "--tensor-model-parallel-size") {
      // Left for the caller's parallel flags; the vocabulary's padding follows it.
      const std::string text = value();
      script_tp = PositiveInt(text, flag, false, kMaxGpus);
      out.unused.push_back(flag);
      out.unused.push_back(text);
    } else if (flag == "--global-batch-size") {
      out.train.global_batch_size = PositiveInt(value(), flag, false, kMaxBatch);
    } else if (flag == "--seq-length") {
      out.train.seq_length = PositiveInt(value(), flag, false, kMaxSequence);
    } else if (flag == "--bf16" || flag == "--fp16") {
      switch_flag();
      out.train.precision = flag == "--bf16" ? Precision::kBF16 : Precision::kFP16;
    } else if (flag == "--fp8-format") {
      const std::string format = value();
      if (format != "e4m3" && format != "hybrid") {
        throw InputError(flag, "unknown format '" + format + "'; allowed: e4m3|hybrid");
      }
      fp8 = true;
      out.train.fp8_format =
          format == "e4m3" ? TrainSpec::Fp8Format::kE4M3 : TrainSpec::Fp8Format::kHybrid;
    } else {
      out.unused.push_back(arg);
    }
  }
  // Megatron-LM trains in FP8 with --fp8-format alongside --bf16, whatever their order.
  if (fp8) out.train.precision = Precision::kFP8;

  if (given.empty()) {
    out.model = base;  // train flags only: the model is whatever the caller had
    return out;
  }
  CompleteModel(given, from_scratch, base,
                ReadState{tokenizer, vocab_divisible_by, script_tp, layer_freq}, out);
  try {
    Validate(m);
  } catch (const InputError& e) {
    throw spec_internal::Rename(e, FlagForField(e.field()));
  }
  return out;
}

}  // namespace autopar
