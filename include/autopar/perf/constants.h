// Efficiency and overhead constants of the analytic model, one set per GPU family.
//
// The analytic model predicts with *nominal* efficiencies; the online tuner learns correction
// factors θ on top (docs/search.md §2). These defaults were set once against the published measurements
// in shared/calibration (scripts/bench_accuracy.sh) and are never fitted per configuration.
#pragma once

#include <cstdint>
#include <string>

namespace autopar {

struct Efficiency {
  double gemm = 0.75;              // of the dense tensor peak, for large GEMMs
  double gemm_half_dim = 96;       // a GEMM whose sharded dimension is this reaches half of `gemm`
  double attention = 0.55;         // flash attention core, of the dense peak
  double attention_unfused = 0.35; // unfused QKᵀ / softmax·V GEMMs (no flash attention)
  double memory_bound = 0.7;       // of HBM bandwidth, for norms, activations, softmax, Adam
  double intra_node_bus = 0.8;     // of NVLink bandwidth reached by NCCL collectives
  double inter_node_bus = 0.85;    // of the NIC bandwidth
  // With overlap on (ParallelConfig::overlap_grad_reduce / overlap_param_gather), at most this
  // fraction of the DP communication hides under compute, however many buckets: the collectives'
  // kernels slow the passes they run under. (The last bucket's exposure is modelled apart.)
  double dp_overlap = 0.85;
};

struct MemoryConstants {
  double runtime_overhead_gib = 1.5;  // CUDA context, cuBLAS workspace, NCCL buffers
  double fragmentation = 0.05;        // allocator slack, as a fraction of the tensors
};

// The software stack the prediction assumes. Modern Megatron-core defaults. (Data-parallel
// overlap and the gradient reduction dtype are knobs of the configuration: ParallelConfig.)
struct StackOptions {
  bool flash_attention = true;      // no s² attention matrices stored or moved
  bool dropout = false;             // GPT-3-era models keep dropout masks (Korthikanti's sbh terms)
  // Megatron's --ddp-bucket-size in parameters; 0 = its default, MegatronDdpBucketSize(dp).
  int64_t ddp_bucket_size = 0;
  // Megatron's --tp-comm-overlap: Transformer Engine's userbuffers overlap the tensor-parallel
  // all-gathers and reduce-scatters with the linear layers' GEMMs (docs/models.md §4.3). Megatron
  // allows it only with sequence parallelism, so it applies to configurations with tp > 1 and sp.
  bool tp_comm_overlap = false;
  // Megatron's asynchronous tensor-parallel backward (Megatron-LM since September 2021, always on
  // in Megatron-core and Transformer Engine): a column-parallel linear's input-gradient
  // all-reduce (reduce-scatter with SP) runs under its weight-gradient GEMM, and with SP the
  // re-gather of its input under its input-gradient GEMM (docs/models.md §4.3). Off
  // (--no-async-tp-backward): the Megatron-LM of 2020-2021, every backward collective exposed.
  bool async_tp_backward = true;
  // Megatron's --cross-entropy-loss-fusion (NeMo's default): the vocab-parallel loss's passes
  // fused into fewer kernels (docs/models.md §4.4).
  bool cross_entropy_fusion = false;
};

struct PerfConstants {
  Efficiency eff;
  MemoryConstants mem;
  StackOptions stack;
};

// Defaults for a GPU family, by preset name (`a100-80gb`, `h100`, `v100`, ...).
PerfConstants DefaultConstants(const std::string& gpu_name);

// How FP8 training runs on a GPU family (docs/models.md §5). Derived from the GPU's name, which
// a study stores, rather than kept with the efficiencies above, so that a resumed study models
// FP8 as the one that started it.
struct Fp8Traits {
  // An FP8 GEMM's efficiency (of the FP8 dense peak) over a BF16 GEMM's (of the BF16 peak), on
  // the same large shapes with the operands already quantized (the casts are modelled apart).
  double gemm_ratio = 1;
  // FP8 GEMMs take TN operands only (Hopper's cuBLAS): Transformer Engine writes a transposed
  // FP8 copy of each operand besides the row-wise one. Blackwell's take any layout.
  bool transposed_copy = true;
};
Fp8Traits Fp8TraitsOf(const std::string& gpu_name);

// How a flash attention kernel's efficiency depends on its shape (docs/models.md §4.2): a kernel
// call over `keys` keys per query with head dim `d` runs at
//   Efficiency::attention · keys/(keys + half_keys) · g(d)/g(128),  g(d) = d/(d + half_head_dim),
// so `attention` is the efficiency of long calls at head dim 128. Short calls cannot amortize a
// tile's prologue (loading Q, the first K/V tiles) and the softmax's epilogue; small heads do
// less MMA work per byte and per exponential. Derived from the GPU's name (which a study stores)
// rather than kept with the efficiencies, like Fp8Traits. Hopper and Blackwell only, the families
// whose attention efficiency is set with it; elsewhere both are 0 (factor 1).
//
// With dropout in the attention (StackOptions::dropout), the fused kernel draws its mask in-kernel
// (Philox) forward and again backward: its time grows by `dropout_forward` / `dropout_backward`
// (1 where not measured). The engine is Transformer Engine's choice: cuDNN's fused attention on
// compute capability 9.0 and later (TE's get_attention_backend: "Disabling FlashAttention to give
// FusedAttention preference on Hopper+"), flash-attn 2 before.
struct AttentionShapeLaw {
  double half_keys = 0;
  double half_head_dim = 0;
  double dropout_forward = 1;
  double dropout_backward = 1;
};
AttentionShapeLaw AttentionShapeLawOf(const std::string& gpu_name);

// The rows of a grouped GEMM's output tile on the GPU (docs/models.md §4.2): Megatron-core runs a
// rank's local experts as one grouped GEMM (Transformer Engine's GroupedLinear, cuBLAS or
// CUTLASS kernels), each expert's rows cut into tiles of this many rows, the last one part-empty.
// NVIDIA's families: 128, the M tile of the Ampere, Hopper and Blackwell BF16 and FP8 kernels
// (DeepGEMM's contiguous layout aligns each expert to it: get_mk_alignment_for_contiguous_layout).
// 0 (no padding modelled) elsewhere: the CPU backend's OpenBLAS, other vendors not stated.
// Derived from the GPU's name, like Fp8Traits.
double GroupedGemmTileRows(const std::string& gpu_name);

// The factor above; 1 where the law is off.
inline double AttentionShapeFactor(const AttentionShapeLaw& law, double keys, double head_dim) {
  const double reference_head_dim = 128;
  const double by_keys = law.half_keys > 0 ? keys / (keys + law.half_keys) : 1.0;
  const double by_head = law.half_head_dim > 0
                             ? head_dim / (head_dim + law.half_head_dim) /
                                   (reference_head_dim / (reference_head_dim + law.half_head_dim))
                             : 1.0;
  return by_keys * by_head;
}

}  // namespace autopar
