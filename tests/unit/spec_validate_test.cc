// Validate(), ToString() and GpuSpec::PeakFlops: errors name the field at fault.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "autopar/common/errors.h"
#include "autopar/spec/cluster.h"
#include "autopar/spec/model.h"
#include "autopar/spec/parse.h"
#include "autopar/spec/train.h"
#include "spec_test_util.h"

namespace autopar {
namespace {

std::string ModelErrorField(const std::function<void(ModelSpec&)>& edit) {
  ModelSpec m = ModelPreset("tiny");
  edit(m);
  return ErrorField([&] { Validate(m); });
}

TEST(SpecToString, SpellingsMatchMegatronFlags) {
  EXPECT_STREQ(ToString(Activation::kSwiGLU), "swiglu");
  EXPECT_STREQ(ToString(Activation::kGeLU), "gelu");
  EXPECT_STREQ(ToString(NormKind::kRMSNorm), "RMSNorm");
  EXPECT_STREQ(ToString(NormKind::kLayerNorm), "LayerNorm");
  EXPECT_STREQ(ToString(PositionEmbedding::kRope), "rope");
  EXPECT_STREQ(ToString(PositionEmbedding::kLearned), "learned_absolute");
  EXPECT_STREQ(ToString(Precision::kBF16), "bf16");
  EXPECT_STREQ(ToString(Precision::kFP16), "fp16");
  EXPECT_STREQ(ToString(Precision::kFP8), "fp8");
}

TEST(SpecValidateModel, AcceptsAValidModel) {
  EXPECT_NO_THROW(Validate(ModelPreset("tiny")));
  EXPECT_NO_THROW(Validate(ModelPreset("tiny-moe")));
}

TEST(SpecValidateModel, ZeroOrNegativeSizesNameTheField) {
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) { m.num_layers = 0; }), "num_layers");
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) { m.hidden_size = -64; }), "hidden_size");
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) { m.ffn_hidden_size = 0; }), "ffn_hidden_size");
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) { m.num_attention_heads = 0; }),
            "num_attention_heads");
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) { m.num_query_groups = 0; }), "num_query_groups");
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) { m.vocab_size = 0; }), "vocab_size");
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) { m.kv_channels = -1; }), "kv_channels");
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) { m.max_position_embeddings = -1; }),
            "max_position_embeddings");
}

// Sizes past the stated bounds are refused at the boundary, naming the field and the bound, so
// nothing the models multiply from them can overflow.
TEST(SpecValidate, SizesPastTheirBoundsNameTheFieldAndTheBound) {
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) { m.num_layers = 100'001; }), "num_layers");
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) { m.num_layers = 100'000; }), "");
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) { m.hidden_size = 4'000'000; }), "hidden_size");
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) { m.vocab_size = int64_t{1} << 40; }), "vocab_size");
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) {
              m.num_experts = 70'000;
              m.moe_router_topk = 2;
              m.moe_ffn_hidden_size = 64;
            }),
            "num_experts");
  std::string message;
  TrainSpec t{16, (int64_t{1} << 24) + 1};
  EXPECT_EQ(ErrorField([&] { Validate(t); }, &message), "seq_length");
  EXPECT_NE(message.find("at most 16777216"), std::string::npos) << message;
  t = {int64_t{1} << 22, int64_t{1} << 22};  // 2^44 tokens per step
  EXPECT_EQ(ErrorField([&] { Validate(t); }, &message), "global_batch_size");
  EXPECT_NE(message.find("tokens per step"), std::string::npos) << message;
  t = {4096, 4096};
  EXPECT_EQ(ErrorField([&] { Validate(t); }), "");
  ClusterSpec c{int64_t{1} << 22, 8, GpuPreset("h100")};  // 2^25 GPUs
  EXPECT_EQ(ErrorField([&] { Validate(c); }, &message), "nnodes");
  EXPECT_NE(message.find("16777216 GPUs"), std::string::npos) << message;
  c = {131'072, 8, GpuPreset("h100")};  // a million GPUs plan
  EXPECT_EQ(ErrorField([&] { Validate(c); }), "");
  c = {1, 4096, GpuPreset("h100")};
  EXPECT_EQ(ErrorField([&] { Validate(c); }), "gpus_per_node");
}

TEST(SpecValidateModel, HeadsMustSplitIntoQueryGroups) {
  // tiny has 4 heads; 3 groups would leave heads without a key/value head.
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) { m.num_query_groups = 3; }), "num_query_groups");
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) { m.num_query_groups = 4; }), "");
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) { m.num_query_groups = 1; }), "");
}

TEST(SpecValidateModel, HiddenMustSplitIntoHeadsUnlessKvChannelsGiven) {
  const auto five_heads = [](ModelSpec& m) {
    m.num_attention_heads = 5;
    m.num_query_groups = 5;
  };
  EXPECT_EQ(ModelErrorField(five_heads), "num_attention_heads");
  EXPECT_EQ(ModelErrorField([&](ModelSpec& m) {
              five_heads(m);
              m.kv_channels = 16;
            }),
            "");
}

TEST(SpecValidateModel, LearnedPositionsNeedTheirTableSize) {
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) {
              m.position_embedding = PositionEmbedding::kLearned;
              m.max_position_embeddings = 0;
            }),
            "max_position_embeddings");
  // RoPE has no table, so an unknown context is fine.
  EXPECT_EQ(ModelErrorField([](ModelSpec& m) { m.max_position_embeddings = 0; }), "");
}

TEST(SpecValidateModel, MixtureOfExpertsMustBeConsistent) {
  const auto moe = [](const std::function<void(ModelSpec&)>& edit) {
    ModelSpec m = ModelPreset("tiny-moe");  // 4 experts, top-2, 4 layers, 1 dense
    edit(m);
    return ErrorField([&] { Validate(m); });
  };
  EXPECT_EQ(moe([](ModelSpec& m) { m.moe_router_topk = 5; }), "moe_router_topk");
  EXPECT_EQ(moe([](ModelSpec& m) { m.moe_router_topk = 0; }), "moe_router_topk");
  EXPECT_EQ(moe([](ModelSpec& m) { m.moe_router_topk = 4; }), "");
  EXPECT_EQ(moe([](ModelSpec& m) { m.moe_ffn_hidden_size = 0; }), "moe_ffn_hidden_size");
  EXPECT_EQ(moe([](ModelSpec& m) { m.moe_first_dense_layers = 4; }), "moe_first_dense_layers");
  EXPECT_EQ(moe([](ModelSpec& m) { m.moe_first_dense_layers = 3; }), "");
  EXPECT_EQ(moe([](ModelSpec& m) { m.moe_shared_expert_intermediate_size = -1; }),
            "moe_shared_expert_intermediate_size");
}

TEST(SpecValidateModel, LatentAttentionNeedsItsHeadDims) {
  const auto mla = [](ModelSpec& m) {
    m.kv_lora_rank = 32;
    m.qk_head_dim = 16;
    m.qk_pos_emb_head_dim = 8;
    m.v_head_dim = 16;
  };
  EXPECT_EQ(ModelErrorField(mla), "");
  EXPECT_EQ(ModelErrorField([&](ModelSpec& m) {
              mla(m);
              m.qk_pos_emb_head_dim = 0;
            }),
            "qk_pos_emb_head_dim");
  EXPECT_EQ(ModelErrorField([&](ModelSpec& m) {
              mla(m);
              m.v_head_dim = 0;
            }),
            "v_head_dim");
}

TEST(SpecGpu, PeakFlopsByPrecision) {
  const GpuSpec h100 = GpuPreset("h100");
  EXPECT_DOUBLE_EQ(h100.PeakFlops(Precision::kBF16), 989e12);
  EXPECT_DOUBLE_EQ(h100.PeakFlops(Precision::kFP16), 989e12);
  EXPECT_DOUBLE_EQ(h100.PeakFlops(Precision::kFP8), 1979e12);
}

TEST(SpecGpu, Fp8OnAGpuWithoutFp8IsBadInput) {
  const GpuSpec a100 = GpuPreset("a100-80gb");
  try {
    a100.PeakFlops(Precision::kFP8);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--fp8-format");
    EXPECT_NE(std::string(e.what()).find("a100-80gb"), std::string::npos) << e.what();
  }
}

TEST(SpecValidateCluster, NamesTheFieldAtFault) {
  ClusterSpec c{2, 8, GpuPreset("h100")};
  EXPECT_EQ(c.world_size(), 16);
  EXPECT_NO_THROW(Validate(c));

  ClusterSpec no_nodes = c;
  no_nodes.nnodes = 0;
  EXPECT_EQ(ErrorField([&] { Validate(no_nodes); }), "nnodes");
  ClusterSpec no_gpus = c;
  no_gpus.gpus_per_node = -8;
  EXPECT_EQ(ErrorField([&] { Validate(no_gpus); }), "gpus_per_node");
  ClusterSpec no_memory = c;
  no_memory.gpu.memory_gib = 0;
  EXPECT_EQ(ErrorField([&] { Validate(no_memory); }), "memory_gib");
  ClusterSpec nan_bandwidth = c;
  nan_bandwidth.gpu.hbm_bandwidth = std::nan("");
  EXPECT_EQ(ErrorField([&] { Validate(nan_bandwidth); }), "hbm_bandwidth");
  ClusterSpec no_network = c;
  no_network.gpu.inter_node_bandwidth = 0;
  EXPECT_EQ(ErrorField([&] { Validate(no_network); }), "inter_node_bandwidth");
  ClusterSpec empty;
  EXPECT_EQ(ErrorField([&] { Validate(empty); }), "nnodes");
}

TEST(SpecValidateCluster, NvlinkDomainIsWholeNodesAndDefaultsToTheNode) {
  // An NVL72 rack as torchrun launches it: 18 trays of 4, one 72-GPU domain.
  ClusterSpec rack{18, 4, GpuPreset("gb200")};
  EXPECT_NO_THROW(Validate(rack));
  EXPECT_EQ(rack.NvlinkDomainGpus(), 72);
  ClusterSpec two_racks = rack;
  two_racks.nnodes = 36;
  EXPECT_EQ(two_racks.NvlinkDomainGpus(), 72);
  ClusterSpec two_trays = rack;  // a job on part of a rack: all of it is one domain
  two_trays.nnodes = 2;
  EXPECT_EQ(two_trays.NvlinkDomainGpus(), 8);
  // 0, the h100 preset's value, means the node.
  ClusterSpec hgx{4, 8, GpuPreset("h100")};
  EXPECT_EQ(hgx.gpu.nvlink_domain_gpus, 0);
  EXPECT_EQ(hgx.NvlinkDomainGpus(), 8);

  std::string message;
  // 8 ranks a "node" still tiles 72 (9 of them, a model of the rack); 16 does not.
  ClusterSpec eight_per_node = rack;
  eight_per_node.gpus_per_node = 8;
  EXPECT_NO_THROW(Validate(eight_per_node));
  ClusterSpec sixteen_per_node = rack;
  sixteen_per_node.gpus_per_node = 16;
  EXPECT_EQ(ErrorField([&] { Validate(sixteen_per_node); }, &message), "nvlink_domain_gpus");
  EXPECT_NE(message.find("multiple of gpus_per_node=16"), std::string::npos) << message;
  EXPECT_NE(message.find("--nproc-per-node 4"), std::string::npos) << message;
  ClusterSpec negative = hgx;
  negative.gpu.nvlink_domain_gpus = -72;
  EXPECT_EQ(ErrorField([&] { Validate(negative); }), "nvlink_domain_gpus");
}

// Issue 17: values read from flags and documents are bounded where they are read, before what
// is derived from them (4·hidden, the vocabulary's padding, a layer pattern) can overflow or
// expand without bound.
TEST(SpecValidate, ReadersRefuseOverflowingAndUnboundedInputBeforeTheWork) {
  const ModelSpec none;
  const TrainSpec train;
  auto flags = [&](std::vector<std::string> args, std::string* message = nullptr) {
    return ErrorField([&] { ApplyMegatronFlags(args, none, train); }, message);
  };
  std::string message;
  EXPECT_EQ(flags({"--num-layers", "2147483648"}, &message), "--num-layers");
  EXPECT_NE(message.find("at most 100000"), std::string::npos) << message;
  EXPECT_EQ(flags({"--num-layers", "2", "--hidden-size", "4611686018427387904",
                   "--num-attention-heads", "2", "--vocab-size", "128"}),
            "--hidden-size");
  EXPECT_EQ(flags({"--q-lora-rank", "9223372036854775807"}), "--q-lora-rank");
  EXPECT_EQ(flags({"--q-lora-rank", "9223372036854775808"}, &message), "--q-lora-rank");
  EXPECT_NE(message.find("out of range"), std::string::npos) << message;
  EXPECT_EQ(flags({"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2",
                   "--vocab-size", "100", "--make-vocab-size-divisible-by", "4611686018427387904",
                   "--tensor-model-parallel-size", "4611686018427387904"}),
            "--make-vocab-size-divisible-by");
  // A layer pattern is bounded before it is expanded (it was a 10^9-entry vector).
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(flags({"--moe-layer-freq", "[0]*1000000000"}, &message), "--moe-layer-freq");
  EXPECT_NE(message.find("more than 100000 layers"), std::string::npos) << message;
  EXPECT_EQ(flags({"--moe-layer-freq", "[0]*4611686018427387904+[1]*4611686018427387904"}),
            "--moe-layer-freq");
  EXPECT_EQ(flags({"--moe-layer-freq", "[0]*-3+[1]*2"}), "--moe-layer-freq");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(1));
  // A MoE family with no experts would import a dense model under its name.
  const std::string mixtral = ReadFixture("mixtral-8x7b-v0.1.config.json");
  // A list as a key (YAML reads the file; the fuzzer found it ended in std::terminate).
  const std::string list_key = std::regex_replace(mixtral, std::regex("\"num_local_experts\": 8"),
                                                  "[]: 1, \"num_local_experts\": 8");
  ASSERT_NE(list_key, mixtral);
  EXPECT_EQ(ErrorField([&] { ModelFromHfConfig(list_key); }, &message), "config.json");
  EXPECT_NE(message.find("every key must be a string"), std::string::npos) << message;
  const std::string zero = std::regex_replace(mixtral, std::regex("\"num_local_experts\": 8"),
                                              "\"num_local_experts\": 0");
  ASSERT_NE(zero, mixtral);
  EXPECT_EQ(ErrorField([&] { ModelFromHfConfig(zero); }, &message), "num_local_experts");
  EXPECT_NE(message.find("1 to 65536"), std::string::npos) << message;
  // A device figure no device has (1e-300 FLOP/s made 1e302-second steps).
  EXPECT_EQ(
      ErrorField([&] { GpuFromYaml("base: a100-80gb\npeak_tflops_bf16: 1e-300\n"); }, &message),
      "peak_tflops_bf16");
  EXPECT_NE(message.find("from 1e+06 to 1e+19 FLOP/s"), std::string::npos) << message;
  EXPECT_EQ(ErrorField([&] { GpuFromYaml("base: a100-80gb\nmemory_gib: 1e308\n"); }), "memory_gib");
  EXPECT_EQ(ErrorField([&] { GpuFromYaml("base: a100-80gb\nhbm_bandwidth_gbps: 1e-300\n"); }),
            "hbm_bandwidth_gbps");
  EXPECT_EQ(ErrorField([&] { GpuFromYaml("base: a100-80gb\ninter_node_latency_us: 1e300\n"); }),
            "inter_node_latency_us");
  for (const std::string& name : GpuPresetNames()) {
    EXPECT_EQ(ErrorField([&] { Validate(GpuPreset(name)); }), "") << name;
  }
  // A document past 1 MiB is refused before it is parsed.
  std::string big = "name: x\n";
  while (big.size() <= (size_t{1} << 20)) big += "k" + std::to_string(big.size()) + ": 1\n";
  EXPECT_EQ(ErrorField([&] { ModelFromYaml(big); }, &message), "model YAML");
  EXPECT_NE(message.find("at most 1 MiB"), std::string::npos) << message;
}

TEST(SpecValidateTrain, NamesTheFieldAtFault) {
  EXPECT_NO_THROW(Validate(TrainSpec{512, 4096, Precision::kBF16}));
  EXPECT_EQ(ErrorField([] {
              Validate(TrainSpec{0, 4096, Precision::kBF16});
            }),
            "global_batch_size");
  EXPECT_EQ(ErrorField([] { Validate(TrainSpec{512, -1, Precision::kBF16}); }), "seq_length");
}

}  // namespace
}  // namespace autopar
