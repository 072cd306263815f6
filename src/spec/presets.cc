// Built-in model and GPU presets.
//
// Model figures are the published architectures (papers and the models' own config.json files);
// tests/unit/spec_parse_test.cc checks several against Hugging Face configs. GPU figures carry a
// `source` naming where each comes from; values marked "estimate" are ours and are what the
// start-up micro-benchmarks and the posterior are there to correct.
#include <string>
#include <vector>

#include "autopar/common/status.h"
#include "autopar/spec/parse.h"
#include "internal.h"

namespace autopar {
namespace {

using spec_internal::Join;
using spec_internal::Lower;

// LLaMA-style decoder: SwiGLU, RMSNorm, RoPE, separate output layer, no biases (ModelSpec's own
// defaults). groups == heads means plain multi-head attention.
ModelSpec Llama(std::string name, int64_t layers, int64_t hidden, int64_t ffn, int64_t heads,
                int64_t groups, int64_t vocab, int64_t max_positions) {
  ModelSpec m;
  m.name = std::move(name);
  m.num_layers = layers;
  m.hidden_size = hidden;
  m.ffn_hidden_size = ffn;
  m.num_attention_heads = heads;
  m.num_query_groups = groups;
  m.vocab_size = vocab;
  m.max_position_embeddings = max_positions;
  return m;
}

// GPT-3-style decoder: GeLU, LayerNorm, learned absolute positions, tied embeddings, biases.
ModelSpec Gpt(std::string name, int64_t layers, int64_t hidden, int64_t ffn, int64_t heads,
              int64_t vocab, int64_t max_positions) {
  ModelSpec m = Llama(std::move(name), layers, hidden, ffn, heads, heads, vocab, max_positions);
  m.activation = Activation::kGeLU;
  m.norm = NormKind::kLayerNorm;
  m.position_embedding = PositionEmbedding::kLearned;
  m.untie_embeddings = false;
  m.add_bias_linear = true;
  return m;
}

std::vector<ModelSpec> BuildModelPresets() {
  std::vector<ModelSpec> p;
  // LLaMA (Touvron et al. 2023, Table 2; 2048-token context, 32000-token SentencePiece vocab).
  p.push_back(Llama("llama-7b", 32, 4096, 11008, 32, 32, 32000, 2048));
  p.push_back(Llama("llama-13b", 40, 5120, 13824, 40, 40, 32000, 2048));
  p.push_back(Llama("llama-65b", 80, 8192, 22016, 64, 64, 32000, 2048));
  // Llama 2: 4096-token context; only 70B uses grouped-query attention (8 KV heads).
  p.push_back(Llama("llama2-7b", 32, 4096, 11008, 32, 32, 32000, 4096));
  p.push_back(Llama("llama2-13b", 40, 5120, 13824, 40, 40, 32000, 4096));
  p.push_back(Llama("llama2-70b", 80, 8192, 28672, 64, 8, 32000, 4096));
  // Llama 3: 128K tokenizer, GQA with 8 KV heads everywhere. 8B/70B as first released (8192
  // context); 405B exists only as Llama 3.1, whose config.json says 131072 positions.
  p.push_back(Llama("llama3-8b", 32, 4096, 14336, 32, 8, 128256, 8192));
  p.push_back(Llama("llama3-70b", 80, 8192, 28672, 64, 8, 128256, 8192));
  p.push_back(Llama("llama3-405b", 126, 16384, 53248, 128, 8, 128256, 131072));
  // Qwen2.5-72B has biases on the QKV projections; at 3 x 8192 + 2 x 1024 per layer they are
  // negligible and not modelled.
  p.push_back(Llama("qwen2.5-72b", 80, 8192, 29568, 64, 8, 152064, 32768));

  // GPT-3 175B (Brown et al. 2020), vocabulary padded to 51200 as Megatron-LM does.
  p.push_back(Gpt("gpt3-175b", 96, 12288, 49152, 96, 51200, 2048));

  // GLM-130B (Zeng et al. 2022): GeGLU MLP, which has SwiGLU's three-matrix shape; RoPE,
  // LayerNorm (DeepNorm), biases, embeddings shared with the output layer.
  ModelSpec glm = Llama("glm-130b", 70, 12288, 32768, 96, 96, 150528, 2048);
  glm.norm = NormKind::kLayerNorm;
  glm.untie_embeddings = false;
  glm.add_bias_linear = true;
  p.push_back(glm);

  // Galactica (Taylor et al. 2022): OPT-style with GeLU and no biases anywhere.
  ModelSpec galactica_30b = Gpt("galactica-30b", 48, 7168, 28672, 56, 50000, 2048);
  galactica_30b.add_bias_linear = false;
  p.push_back(galactica_30b);
  ModelSpec galactica_120b = Gpt("galactica-120b", 96, 10240, 40960, 80, 50000, 2048);
  galactica_120b.add_bias_linear = false;
  p.push_back(galactica_120b);

  // Mixtral 8x7B: every layer is MoE, 8 experts of width 14336, top-2 routing.
  ModelSpec mixtral = Llama("mixtral-8x7b", 32, 4096, 14336, 32, 8, 32000, 32768);
  mixtral.num_experts = 8;
  mixtral.moe_router_topk = 2;
  mixtral.moe_ffn_hidden_size = 14336;
  p.push_back(mixtral);

  // DeepSeek-V3 (DeepSeek-AI 2024 and its config.json): MLA, 3 dense layers then 58 MoE layers of
  // 256 routed experts (top-8) plus 1 shared expert, all 2048 wide. Pre-trained at 4K tokens;
  // config.json and Megatron-LM's recipe give 163840 positions. Megatron's recipe passes
  // --kv-channels 128 (= v_head_dim); MLA itself uses the qk/v head dims.
  ModelSpec deepseek = Llama("deepseek-v3", 61, 7168, 18432, 128, 128, 129280, 163840);
  deepseek.kv_channels = 128;
  deepseek.q_lora_rank = 1536;
  deepseek.kv_lora_rank = 512;
  deepseek.qk_head_dim = 128;
  deepseek.qk_pos_emb_head_dim = 64;
  deepseek.v_head_dim = 128;
  deepseek.num_experts = 256;
  deepseek.moe_router_topk = 8;
  deepseek.moe_ffn_hidden_size = 2048;
  deepseek.moe_shared_expert_intermediate_size = 2048;
  deepseek.moe_first_dense_layers = 3;
  p.push_back(deepseek);

  // Small models for CPU tests and the laptop demo.
  p.push_back(Llama("tiny", 4, 64, 176, 4, 2, 256, 64));
  p.push_back(Gpt("tiny-gpt", 4, 64, 256, 4, 256, 64));
  ModelSpec tiny_moe = Llama("tiny-moe", 4, 64, 176, 4, 2, 256, 64);
  tiny_moe.num_experts = 4;
  tiny_moe.moe_router_topk = 2;
  tiny_moe.moe_ffn_hidden_size = 64;
  tiny_moe.moe_shared_expert_intermediate_size = 64;
  tiny_moe.moe_first_dense_layers = 1;
  p.push_back(tiny_moe);
  return p;
}

// Latencies of one NCCL ring step. Not vendor figures: order-of-magnitude estimates that the
// start-up micro-benchmarks replace.
constexpr double kNvlinkLatencyS = 3e-6;
constexpr double kNetworkLatencyS = 8e-6;

constexpr char kLatencyNote[] = "latencies 3 us NVLink / 8 us network are estimates";

// Blackwell Ultra and the Grace-Blackwell racks. Dense FP4 (B300 13.5, GB200 10, GB300 15
// PFLOP/s) is not carried: no precision the model trains in uses it. GB200/GB300 come as NVL72
// racks: 18 compute trays of 4 GPUs, all 72 on one NVLink 5 switch fabric (9 switch trays).
std::vector<GpuSpec> BlackwellUltraAndRackPresets(const GpuSpec& b200) {
  std::vector<GpuSpec> p;
  GpuSpec b300 = b200;
  b300.name = "b300";
  b300.memory_gib = 267.69;
  b300.peak_flops_fp32 = 75e12;
  b300.hbm_bandwidth = 7.67e12;
  b300.inter_node_bandwidth = 100e9;
  b300.source =
      std::string(
          "B300 (Blackwell Ultra) in HGX/DGX B300. Peak dense bf16 2.25 / fp8 4.5 PFLOP/s: HGX "
          "B300 datasheet (36 / 72 PFLOP/s sparse for 8 GPUs), fp32 75 TFLOP/s: tabulated at "
          "glennklockwood.com/garden/processors/B300; HBM3e 7.67 TB/s: the 7680-bit bus and "
          "3996 MHz memory clock the driver reports on the B300 SXM6 AC (8 TB/s is the 8192-bit "
          "figure); NVLink5 1.8 TB/s total = 900 GB/s per direction, one 8-GPU domain per board; "
          "network: one 800 Gb/s ConnectX-8 SuperNIC per GPU (DGX B300); memory: 267.69 GiB total "
          "capacity in PyTorch OOM reports on the B300 SXM6 AC (nvidia-smi 275040 MiB; 15 of 16 "
          "memory controllers enabled, 270 of 288 GB); ") +
      kLatencyNote;
  p.push_back(b300);

  GpuSpec gb200 = b200;
  gb200.name = "gb200";
  gb200.memory_gib = 184.31;
  gb200.peak_flops_bf16 = 2.5e15;
  gb200.peak_flops_fp16 = 2.5e15;
  gb200.peak_flops_fp8 = 5e15;
  gb200.peak_flops_fp32 = 90e12;
  gb200.hbm_bandwidth = 8e12;
  gb200.inter_node_bandwidth = 50e9;
  gb200.nvlink_domain_gpus = 72;
  gb200.source =
      std::string(
          "B200 in GB200 NVL72 (1200 W). Peak dense bf16 2.5 / fp8 5 PFLOP/s: NVIDIA's GB200 "
          "NVL72 figures (360 / 720 PFLOP/s sparse for 72 GPUs), fp32 90 TFLOP/s: GB200 variant "
          "as tabulated at glennklockwood.com/garden/processors/B200; HBM3e 8 TB/s (576 TB/s per "
          "rack); NVLink5 1.8 TB/s total = 900 GB/s per direction across all 72 GPUs of the rack "
          "(18 trays of 4); network: one 400 Gb/s ConnectX-7 per GPU, 4 per compute tray (NVIDIA "
          "multi-node NVLink tuning guide); memory: 184.31 GiB total capacity in PyTorch OOM "
          "reports; ") +
      kLatencyNote;
  p.push_back(gb200);

  GpuSpec gb300 = gb200;
  gb300.name = "gb300";
  gb300.memory_gib = 276.50;
  gb300.peak_flops_fp32 = 80e12;
  gb300.inter_node_bandwidth = 100e9;
  gb300.source =
      std::string(
          "B300 (Blackwell Ultra) in GB300 NVL72 (1400 W). Peak dense bf16 2.5 / fp8 5 PFLOP/s: "
          "NVIDIA's GB300 NVL72 figures (180 / 360 PFLOP/s dense for 72 GPUs), fp32 80 TFLOP/s "
          "(vendor per-GPU tables, secondary); HBM3e 8 TB/s (576 TB/s per rack); NVLink5 900 GB/s "
          "per direction across all 72 GPUs of the rack (18 trays of 4); network: one 800 Gb/s "
          "ConnectX-8 per GPU, 4 per compute tray (NVIDIA GB300 NVL72 enterprise reference "
          "architecture); memory: 276.50 GiB total capacity in PyTorch OOM reports "
          "(NVIDIA-NeMo/Megatron-Bridge#2221); ") +
      kLatencyNote;
  p.push_back(gb300);
  return p;
}

// memory_gib is the total the CUDA runtime reports (PyTorch's "total capacity"), which is what
// allocations count against; marketing "80 GB" is neither 80e9 bytes nor 80 GiB.
std::vector<GpuSpec> BuildGpuPresets() {
  std::vector<GpuSpec> p;

  GpuSpec a100_40;
  a100_40.name = "a100-40gb";
  a100_40.memory_gib = 39.39;
  a100_40.peak_flops_bf16 = 312e12;
  a100_40.peak_flops_fp16 = 312e12;
  a100_40.peak_flops_fp8 = 0;
  a100_40.peak_flops_fp32 = 19.5e12;
  a100_40.hbm_bandwidth = 1.555e12;
  a100_40.intra_node_bandwidth = 300e9;
  a100_40.intra_node_latency_s = kNvlinkLatencyS;
  a100_40.inter_node_bandwidth = 25e9;
  a100_40.inter_node_latency_s = kNetworkLatencyS;
  a100_40.source =
      std::string(
          "A100 SXM4 40GB. Peak bf16/fp16 312 TFLOP/s dense: Narayanan et al. 2021 Sec 5 and the "
          "NVIDIA A100 datasheet; fp32 19.5 TFLOP/s and HBM2 1.555 TB/s: A100 datasheet; NVLink3 "
          "600 "
          "GB/s total = 300 GB/s per direction; network: one 200 Gb/s HDR InfiniBand HCA per GPU "
          "(DGX A100); memory: 42298834944 bytes reported by deviceQuery (nvidia-smi 40960 "
          "MiB); ") +
      kLatencyNote;
  p.push_back(a100_40);

  GpuSpec a100_80 = a100_40;
  a100_80.name = "a100-80gb";
  a100_80.memory_gib = 79.25;
  a100_80.hbm_bandwidth = 2.039e12;
  a100_80.source = std::string(
                       "A100 SXM4 80GB. As a100-40gb (312 TFLOP/s bf16, NVLink3 300 GB/s per "
                       "direction, 200 Gb/s "
                       "HDR per GPU) with HBM2e 2.039 TB/s (A100 datasheet); memory: 79.25 GiB "
                       "total capacity in "
                       "PyTorch OOM reports (nvidia-smi 81920 MiB); ") +
                   kLatencyNote;
  p.push_back(a100_80);

  GpuSpec a800 = a100_80;
  a800.name = "a800";
  a800.memory_gib = 79.33;
  a800.intra_node_bandwidth = 200e9;
  a800.source =
      std::string(
          "A800 SXM4 80GB, the export variant of the A100 80GB: same compute and HBM2e 2.039 TB/s, "
          "NVLink cut to 400 GB/s total = 200 GB/s per direction (vendor spec sheet, secondary); "
          "memory: 79.33 GiB total capacity in a PyTorch OOM report (nvidia-smi 81920 MiB); ") +
      kLatencyNote;
  p.push_back(a800);

  GpuSpec h100;
  h100.name = "h100";
  h100.memory_gib = 79.18;
  h100.peak_flops_bf16 = 989e12;
  h100.peak_flops_fp16 = 989e12;
  h100.peak_flops_fp8 = 1979e12;
  h100.peak_flops_fp32 = 67e12;
  h100.hbm_bandwidth = 3.35e12;
  h100.intra_node_bandwidth = 450e9;
  h100.intra_node_latency_s = kNvlinkLatencyS;
  h100.inter_node_bandwidth = 50e9;
  h100.inter_node_latency_s = kNetworkLatencyS;
  h100.source =
      std::string(
          "H100 SXM5 80GB. Peak bf16 989 / fp8 1979 TFLOP/s dense: NVIDIA dgxc-benchmarking "
          "READMEs; "
          "fp32 67 TFLOP/s, HBM3 3.35 TB/s, NVLink4 900 GB/s total = 450 GB/s per direction: "
          "NVIDIA "
          "H100 datasheet; network: one 400 Gb/s NDR port per GPU (DGX H100); memory: 79.18 GiB "
          "visible to PyTorch (nvidia-smi 81559 MiB); ") +
      kLatencyNote;
  p.push_back(h100);

  GpuSpec h800 = h100;
  h800.name = "h800";
  h800.intra_node_bandwidth = 200e9;
  h800.source =
      std::string(
          "H800 SXM5 80GB, the export variant of the H100: H100 compute and memory; NVLink 400 "
          "GB/s "
          "total = 200 GB/s per direction (vendor spec sheets, secondary; DeepSeek-V3 report Sec "
          "3.2.2 measures 160 GB/s usable); InfiniBand 50 GB/s per GPU (DeepSeek-V3 report); ") +
      kLatencyNote;
  p.push_back(h800);

  GpuSpec h200 = h100;
  h200.name = "h200";
  h200.memory_gib = 139.80;
  h200.hbm_bandwidth = 4.8e12;
  h200.source =
      std::string(
          "H200 SXM 141GB: H100 SXM5 compute and NVLink4 (NVIDIA H200 datasheet); HBM3e 4.8 TB/s; "
          "memory: 139.80 GiB total capacity in PyTorch OOM reports (nvidia-smi 143771 MiB); "
          "network as h100; ") +
      kLatencyNote;
  p.push_back(h200);

  GpuSpec b200;
  b200.name = "b200";
  b200.memory_gib = 178.35;
  b200.peak_flops_bf16 = 2.25e15;
  b200.peak_flops_fp16 = 2.25e15;
  b200.peak_flops_fp8 = 4.5e15;
  b200.peak_flops_fp32 = 80e12;
  b200.hbm_bandwidth = 8e12;
  b200.intra_node_bandwidth = 900e9;
  b200.intra_node_latency_s = kNvlinkLatencyS;
  b200.inter_node_bandwidth = 50e9;
  b200.inter_node_latency_s = kNetworkLatencyS;
  b200.source =
      std::string(
          "B200 in HGX B200 (1000 W). Peak dense bf16 2.25 / fp8 4.5 PFLOP/s, fp32 80 TFLOP/s: "
          "NVIDIA "
          "HGX B200 figures as tabulated at glennklockwood.com/garden/processors/B200; HBM3e 8 "
          "TB/s "
          "(datasheet; 7.67 TB/s from the bus width reported by the driver, pytorch/ao#4002); "
          "NVLink5 "
          "1.8 TB/s total = 900 GB/s per direction; network: one 400 Gb/s ConnectX-7 per GPU (DGX "
          "B200); memory: 178.35 GiB reported by the CUDA runtime (nvidia-smi 183359 MiB); ") +
      kLatencyNote;
  p.push_back(b200);

  for (const GpuSpec& g : BlackwellUltraAndRackPresets(b200)) p.push_back(g);

  GpuSpec ascend;
  ascend.name = "ascend-910b";
  ascend.memory_gib = 60.97;
  ascend.peak_flops_bf16 = 313e12;
  ascend.peak_flops_fp16 = 313e12;
  ascend.peak_flops_fp8 = 0;
  ascend.peak_flops_fp32 = 75e12;
  ascend.hbm_bandwidth = 1.6e12;
  ascend.intra_node_bandwidth = 196e9;
  ascend.intra_node_latency_s = kNvlinkLatencyS;
  ascend.inter_node_bandwidth = 25e9;
  ascend.inter_node_latency_s = kNetworkLatencyS;
  ascend.source = std::string(
      "Huawei Ascend 910B (Atlas 800T A2), secondary sources only: fp16/bf16 ~313 TFLOP/s, HBM2e "
      "64 GB at ~1.6 TB/s, HCCS 392 GB/s total = 196 GB/s per direction, RoCE 200 Gb/s per NPU; "
      "no FP8; fp32 75 TFLOP/s is an estimate; memory: 60.97 GiB total capacity in torch_npu OOM "
      "reports; latencies are estimates");
  p.push_back(ascend);

  // The CPU backend's stand-in device: one host core per rank with OpenBLAS fp32 GEMMs and MPI
  // over shared memory. Nominal figures for the analytic prior only; the probe measures the
  // machine and the tuner's posterior learns the rest.
  GpuSpec cpu;
  cpu.name = "cpu";
  cpu.memory_gib = 4;
  cpu.peak_flops_bf16 = cpu.peak_flops_fp16 = cpu.peak_flops_fp32 = 150e9;
  cpu.peak_flops_fp8 = 0;
  cpu.hbm_bandwidth = 7.5e9;
  cpu.intra_node_bandwidth = 4e9;
  cpu.intra_node_latency_s = 15e-6;
  cpu.inter_node_bandwidth = 3e9;  // "nodes" are rank groups on one host: the same transport
  cpu.inter_node_latency_s = 15e-6;
  cpu.source = std::string(
      "one x86-64 core per rank: ~150 GFLOP/s fp32 peak (AVX-512 FMA), ~7.5 GB/s of memory "
      "bandwidth, MPI over shared memory ~3-4 GB/s with ~15 us per step between ranks that share "
      "two cores; set from `autopar-tune probe` on the project's 2-core machine (tiny model, "
      "4 ranks); the prior only, the posterior learns the rest");
  p.push_back(cpu);
  return p;
}

const std::vector<ModelSpec>& ModelPresets() {
  static const std::vector<ModelSpec> presets = BuildModelPresets();
  return presets;
}

const std::vector<GpuSpec>& GpuPresets() {
  static const std::vector<GpuSpec> presets = BuildGpuPresets();
  return presets;
}

template <typename Spec>
const Spec* Find(const std::vector<Spec>& presets, const std::string& name) {
  const std::string wanted = Lower(name);
  for (const Spec& spec : presets) {
    if (spec.name == wanted) return &spec;
  }
  return nullptr;
}

}  // namespace

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const ModelSpec& m : ModelPresets()) names.push_back(m.name);
  return names;
}

std::vector<std::string> GpuPresetNames() {
  std::vector<std::string> names;
  for (const GpuSpec& g : GpuPresets()) names.push_back(g.name);
  return names;
}

bool HasModelPreset(const std::string& name) { return Find(ModelPresets(), name) != nullptr; }

bool HasGpuPreset(const std::string& name) { return Find(GpuPresets(), name) != nullptr; }

ModelSpec ModelPreset(const std::string& name) {
  if (const ModelSpec* m = Find(ModelPresets(), name)) return *m;
  throw InputError(
      "--model", "unknown model preset '" + name + "'; allowed: " + Join(ModelPresetNames(), ", "));
}

GpuSpec GpuPreset(const std::string& name) {
  if (const GpuSpec* g = Find(GpuPresets(), name)) return *g;
  throw InputError("--gpu",
                   "unknown GPU preset '" + name + "'; allowed: " + Join(GpuPresetNames(), ", "));
}

}  // namespace autopar
