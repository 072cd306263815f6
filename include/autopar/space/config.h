// ParallelConfig: one point of the search space (docs/architecture.md §3), and its canonical text
// form.
//
// The text form is
// `tp=8,pp=4,dp=2,cp=1,up=1,ep=1,vpp=1,mbs=1,sp=on,recompute=selective,dist_opt=on`, with
// `pp_first=F` and `pp_last=L` after `pp` where the pipeline's stages are uneven (StageLayers),
// `split_embedding=on` and `split_loss=on` after `vpp` where the embedding and the loss count in
// the split of virtual stages,
// `cp_comm=allgather` after `up` where the ring's attention gathers K and V instead,
// `etp=N` after `ep` where the experts' tensor parallel size differs from tp,
// `dispatcher=flex` after `etp` where the experts' tokens travel by Megatron's flex dispatcher,
// `recompute_modules=layernorm+moe` after `recompute` where selective recompute reruns other
// modules than core_attn alone, followed by
// `overlap_grad_reduce=off`, `overlap_param_gather=off` or `grad_reduce_dtype=bf16` only where they
// differ from their defaults (so the text of every earlier configuration keeps its meaning). Print
// → parse is the identity; omitted keys take defaults, and an omitted `dp` is derived from the
// world size by Complete().
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace autopar {

enum class Recompute : uint8_t { kNone, kSelective, kFull };
const char* ToString(Recompute r);

// What selective recompute reruns in the backward pass: Megatron-core's --recompute-modules
// (TransformerConfig.recompute_modules, NVIDIA/Megatron-LM d98e8a6), bits of
// ParallelConfig::recompute_modules. Megatron's default is core_attn alone.
enum RecomputeModule : uint8_t {
  kRecomputeCoreAttn = 1 << 0,       // core_attn: the attention core (scores, softmax, ·V)
  kRecomputeLayernorm = 1 << 1,      // layernorm: input_layernorm's and pre_mlp_layernorm's outputs
  kRecomputeMlp = 1 << 2,            // mlp: a dense layer's MLP (not a MoE layer's)
  kRecomputeMoe = 1 << 3,            // moe: a MoE layer whole (router, dispatch, experts, combine,
                                     //   shared experts)
  kRecomputeMoeAct = 1 << 4,         // moe_act: the routed experts' activation function
  kRecomputeSharedExperts = 1 << 5,  // shared_experts: a MoE layer's shared experts
};
inline constexpr uint8_t kRecomputeModulesAll = (1 << 6) - 1;
// Megatron's names of `modules`, in the order above; joined by '+' ("layernorm+moe", "" for none).
std::vector<std::string> RecomputeModuleNames(uint8_t modules);
std::string RecomputeModulesText(uint8_t modules);
// The bits of Megatron's names (0 for none); throws InputError(flag) naming the allowed ones (and
// saying which of Megatron's other modules the model does not run) for any other name.
uint8_t ParseRecomputeModules(const std::string& flag, const std::vector<std::string>& names);

// The dtype data-parallel gradients are accumulated and reduced in. Megatron-LM (bf16 training)
// reduces in fp32 unless `--grad-reduce-in-bf16` (megatron/training/arguments.py: without it,
// accumulate_allreduce_grads_in_fp32 is set), so fp32 is the default.
enum class GradReduceDtype : uint8_t { kFP32, kBF16 };
const char* ToString(GradReduceDtype d);

struct ParallelConfig {
  int32_t tp = 1;   // tensor parallel
  int32_t pp = 1;   // pipeline parallel
  int32_t dp = 0;   // data parallel; 0 = derive from the world size
  int32_t cp = 1;   // context parallel (ring attention)
  int32_t up = 1;   // Ulysses sequence parallel (all-to-all over heads)
  int32_t ep = 1;   // expert parallel (etp·ep divides tp·cp·dp: docs/architecture.md §3)
  int32_t vpp = 1;  // virtual pipeline stages (model chunks) per pipeline rank
  int32_t mbs = 1;  // micro-batch size
  bool sp = false;  // Megatron sequence parallelism (needs tp > 1)
  Recompute recompute = Recompute::kNone;
  // With full recompute: layers per pipeline stage that are recomputed (Megatron
  // `--recompute-method block --recompute-num-layers N`); 0 = every layer.
  int32_t recompute_layers = 0;
  bool dist_opt = false;  // distributed optimizer (ZeRO-1 over dp·cp)
  // Data-parallel overlap as Megatron-core runs it (NVIDIA/Megatron-LM d98e8a6, 2026-08-22:
  // megatron/core/distributed/, megatron/training/arguments.py): the gradients are
  // reduced per bucket during the last micro-batch's backward (`--overlap-grad-reduce`), and the
  // distributed optimizer's parameter all-gather runs per bucket under the next forward
  // (`--overlap-param-gather`, which Megatron allows only with the distributed optimizer and
  // --overlap-grad-reduce). Off: one reduction after the pipeline flush, one gather after Adam.
  // Defaults: on wherever allowed (ParseSpec and the search space derive overlap_param_gather).
  bool overlap_grad_reduce = true;
  bool overlap_param_gather = false;
  GradReduceDtype grad_reduce_dtype = GradReduceDtype::kFP32;
  // Expert tensor parallel (Megatron's --expert-tensor-parallel-size): the ranks one routed
  // expert's weights are split over. 0 = tp, Megatron-core's default when the flag is unset; the
  // canonical form (ParseSpec, the search space) keeps 0 wherever etp equals tp, so that two
  // spellings of one configuration compare equal. Read it through expert_tp().
  // (Last, so that positional initialisers of the earlier fields keep their meaning.)
  int32_t etp = 0;
  // Uneven pipeline stages, as Megatron's --decoder-first-pipeline-num-layers and
  // --decoder-last-pipeline-num-layers give them: the transformer layers of the first and of the
  // last pipeline stage, 0 where not given. The stages not given share the other layers evenly
  // (StageLayers); both 0 is the even split. The canonical form (CanonicalStages) gives the
  // fewest of the two that describe the split.
  int32_t pp_first = 0;
  int32_t pp_last = 0;
  // Megatron's --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split
  // with virtual stages (vpp > 1): the embedding (the loss) counts as one layer of the even split
  // over the pp·vpp model chunks, so the first chunk of the first stage (the last chunk of the
  // last stage) holds one transformer layer fewer than the others (ChunkLayers): none where the
  // chunks hold one (the embedding or the loss alone, Llama 3's layout). Without virtual
  // stages the same split is pp_first/pp_last, the canonical form (CanonicalStages). Not with
  // pp_first/pp_last.
  bool split_embedding = false;
  bool split_loss = false;
  // With selective recompute, the modules it reruns (RecomputeModule bits). 0 = Megatron's
  // default, core_attn alone; the canonical form (ParseSpec, the search space) keeps 0 there and
  // wherever recompute is not selective. Read it through selective_modules().
  uint8_t recompute_modules = 0;
  // Megatron's flex token dispatcher (--moe-token-dispatcher-type flex: DeepEP, HybridEP or
  // NCCL-EP over the etp·ep ranks) instead of its all-to-all one: a token travels once to every
  // rank holding one of its experts, not once per expert, and the gate-weighted sum of a rank's
  // experts comes back as one row (docs/models.md §4.2, docs/trial.md §8). Needs a MoE model and
  // etp·ep > 1 (Megatron asserts TPxEP > 1); false in the canonical form elsewhere.
  bool flex_dispatcher = false;
  // Context parallelism by an all-gather of K and V over the cp group (Megatron's
  // --cp-comm-type all_gather, Transformer Engine's AttnFuncWithCPAndKVAllGather) instead of the
  // ring's p2p passes (docs/models.md §4.2, docs/trial.md §7). Needs cp > 1 and up = 1 (Megatron
  // combines Ulysses with the ring alone, a2a+p2p); false in the canonical form elsewhere.
  bool cp_allgather = false;
  // FP8 parameters (Megatron's --fp8-param-gather, DistributedDataParallelConfig.fp8_param_gather):
  // the transformer layers' linear weights are kept in FP8 alone (no BF16 copy), the distributed
  // optimizer casts its FP32 master shard into them after Adam and all-gathers them in FP8
  // (docs/models.md §3.1, §4.5). Needs FP8 training and dist_opt=on (Megatron asserts a sharded
  // optimizer); false in the canonical form elsewhere.
  bool fp8_param_gather = false;

  // The modules selective recompute reruns; 0 when recompute is none or full.
  uint8_t selective_modules() const {
    if (recompute != Recompute::kSelective) return 0;
    return recompute_modules != 0 ? recompute_modules : uint8_t{kRecomputeCoreAttn};
  }
  bool Recomputes(RecomputeModule m) const { return (selective_modules() & m) != 0; }

  int32_t expert_tp() const { return etp > 0 ? etp : tp; }
  // The ranks holding the same experts (Megatron's expert data parallel size, world / (etp·ep·pp)).
  int64_t expert_dp() const {
    return SizeProduct({tp, up, cp, dp}) / SizeProduct({expert_tp(), ep});
  }

  // GPUs one model replica's activations are split over (the tp·cp·up·pp block).
  int64_t model_parallel_size() const { return SizeProduct({tp, cp, up, pp}); }
  int64_t world_size() const { return SizeProduct({tp, cp, up, pp, dp}); }

  // A product of sizes that saturates at INT64_MAX rather than wrap: five int32 sizes read from
  // input can pass 64 bits, and a saturated product matches no cluster, so it is refused where it
  // is compared with one (Complete, the space's checks).
  static int64_t SizeProduct(std::initializer_list<int64_t> sizes) {
    int64_t product = 1;
    for (const int64_t s : sizes) {
      if (__builtin_mul_overflow(product, s, &product)) return INT64_MAX;
    }
    return product;
  }

  friend bool operator==(const ParallelConfig&, const ParallelConfig&) = default;
};

// Whether Megatron-LM accepts --overlap-param-gather with `c` (arguments.py asserts the
// distributed optimizer and --overlap-grad-reduce): the default of overlap_param_gather.
inline bool OverlapParamGatherAllowed(const ParallelConfig& c) {
  return c.dist_opt && c.overlap_grad_reduce;
}

// Megatron-core's default DDP bucket size in parameters when `--ddp-bucket-size` is not given:
// max(40M, 1M·dp) (megatron/core/distributed/distributed_data_parallel.py), so that a ring's
// per-rank chunks stay bandwidth-bound at large dp. Buckets are filled in reverse order of the
// parameters and one closes once it holds at least this many (param_and_grad_buffer.py).
inline int64_t MegatronDdpBucketSize(int64_t dp) {
  return dp * 1000000 > 40000000 ? dp * 1000000 : 40000000;
}
// The bucket size a run uses: `configured` (--ddp-bucket-size) when positive, else Megatron's.
inline int64_t DdpBucketSize(int64_t configured, int64_t dp) {
  return configured > 0 ? configured : MegatronDdpBucketSize(dp);
}

// ---- pipeline stages (Megatron-core's uneven split, transformer_config.py and
// get_transformer_layer_offset) ----

// Empty when Megatron-core accepts the split of `num_layers` over c's pp stages and vpp model
// chunks, else why: pp_first/pp_last need pp > 1 and are multiples of vpp; the stages not given
// get the remaining layers evenly, a whole number that is a multiple of vpp; a split with no
// middle stage leaves no layer over. The even split needs pp·vpp to divide num_layers.
std::string StageSplitError(const ParallelConfig& c, int64_t num_layers);
// Transformer layers on pipeline stage `stage` (0-based). The split must be valid.
int64_t StageLayers(const ParallelConfig& c, int64_t num_layers, int64_t stage);
// Global index of the first layer of model chunk `chunk` on `stage`. Chunks are laid out
// chunk-major: chunk 0 of every stage in stage order, then chunk 1, ...; each of a stage's vpp
// chunks holds StageLayers / vpp consecutive layers.
int64_t ChunkFirstLayer(const ParallelConfig& c, int64_t num_layers, int64_t stage, int64_t chunk);
// `c` with pp_first/pp_last in canonical form: both 0 when the split is even, else the fewest
// given (the first stage's count dropped where it equals the middle stages', likewise the
// last's). The split must be valid.
ParallelConfig CanonicalStages(ParallelConfig c, int64_t num_layers);
// Whether the stages hold different numbers of layers.
inline bool UnevenStages(const ParallelConfig& c) {
  return c.pp_first != 0 || c.pp_last != 0 || c.split_embedding || c.split_loss;
}
// ---- Megatron-core's pipeline schedules (schedules.py), for the trial and the cost model ----

// Forwards pipeline rank `rank` runs before its first backward: 1F1B min(pp − rank − 1, m);
// interleaved (vpp > 1) 2·(pp − rank − 1) + (vpp − 1)·pp chunk forwards, at most m·vpp, and
// all of them where m = pp.
inline int64_t PipelineWarmupForwards(int64_t pp, int64_t vpp, int64_t rank, int64_t microbatches) {
  if (vpp <= 1) return microbatches < pp - rank - 1 ? microbatches : pp - rank - 1;
  const int64_t total = microbatches * vpp, warmup = 2 * (pp - rank - 1) + (vpp - 1) * pp;
  return microbatches == pp || total < warmup ? total : warmup;
}
// The model chunk of the interleaved schedule's k-th forward, (k mod pp·vpp)/pp; its k-th
// backward visits the chunks in reverse.
inline int64_t InterleavedChunk(int64_t pp, int64_t vpp, int64_t k, bool backward) {
  const int64_t chunk = (k % (pp * vpp)) / pp;
  return backward ? vpp - 1 - chunk : chunk;
}

// The splits of `num_layers` over c's pp stages and vpp > 1 model chunks that count the embedding
// and the loss (both, the embedding alone, the loss alone: Megatron-core's
// --account-for-embedding/loss-in-pipeline-split) and that Megatron-core accepts, in that order:
// `c` with split_embedding/split_loss set and pp_first/pp_last 0. None with vpp = 1 (there they
// are pp_first/pp_last splits).
std::vector<ParallelConfig> CountedSplits(const ParallelConfig& c, int64_t num_layers);
// Transformer layers of model chunk `chunk` on pipeline stage `stage`: StageLayers / vpp, but
// one fewer in the first chunk of the first stage (split_embedding) and in the last chunk of the
// last stage (split_loss). The split must be valid.
int64_t ChunkLayers(const ParallelConfig& c, int64_t num_layers, int64_t stage, int64_t chunk);

// Canonical text. Every key is printed; `recompute_layers` only when it is non-zero, the overlap
// and dtype keys only when they differ from their defaults.
std::string ToSpec(const ParallelConfig& c);

// Parses SPEC text. Throws InputError("--config", ...) naming the key and the allowed values. An
// omitted overlap_param_gather is on where allowed (OverlapParamGatherAllowed).
ParallelConfig ParseSpec(const std::string& text);

// Fills a derived dp (dp == 0) from the world size. Throws InputError("--config") when the product
// of the given degrees does not divide the world size or does not equal it.
ParallelConfig Complete(ParallelConfig c, int64_t world_size);

}  // namespace autopar
