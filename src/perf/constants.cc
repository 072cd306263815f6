#include "autopar/perf/constants.h"

#include <algorithm>
#include <cctype>

namespace autopar {
namespace {

// GPU family names compare in lower case (a preset's or a user's spelling).
std::string LowerCase(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return name;
}

// The families, by their lower-case names.
bool IsAmpere(const std::string& name) { return name.rfind("a100", 0) == 0 || name == "a800"; }
bool IsHopper(const std::string& name) {
  return name == "h100" || name == "h800" || name == "h200";
}
bool IsBlackwell(const std::string& name) {
  return name == "b200" || name == "b300" || name == "gb200" || name == "gb300";
}

}  // namespace

PerfConstants DefaultConstants(const std::string& gpu_name) {
  const std::string name = LowerCase(gpu_name);
  PerfConstants k;
  // One set of efficiencies per GPU generation, set against shared/calibration (see
  // scripts/bench_accuracy.sh); never per configuration.
  if (name.rfind("v100", 0) == 0) {
    k.eff.gemm = 0.82;
    k.eff.attention = 0.45;
    k.eff.attention_unfused = 0.35;
    k.eff.memory_bound = 0.7;
    k.stack.flash_attention = false;  // flash attention needs sm80+
  } else if (IsAmpere(name)) {
    k.eff.gemm = 0.75;
    k.eff.attention = 0.55;
    k.eff.attention_unfused = 0.35;
  } else if (IsHopper(name)) {
    // Attention (long calls, head dim 128, fwd + bwd) as today's stack runs it: cuDNN's fused
    // attention, measured at 0.54 of the BF16 peak on an H100 SXM5 (cuDNN 9.19, causal, 16k keys)
    // and, through the trial's own cuDNN graph on an H200 (gpu_bench, GQA 8:1, 4k-32k tokens),
    // 0.61-0.65 forward and 0.49-0.54 backward. The NeMo 24.03 long-context rows on H100
    // (shared/calibration) ran flash-attn 2, about a third of the peak: an older stack, which
    // the benchmark states with --attention-efficiency (docs/models.md §5.1).
    k.eff.gemm = 0.70;
    k.eff.attention = 0.50;
    k.eff.attention_unfused = 0.30;
  } else if (IsBlackwell(name)) {
    // Blackwell and Blackwell Ultra share b200's set until published runs on them say otherwise.
    // Attention: the NeMo 25.04 long-context runs on B200 (shared/calibration).
    k.eff.gemm = 0.65;
    k.eff.attention = 0.43;
  } else if (name == "cpu") {
    // The CPU backend: OpenBLAS keeps its efficiency on narrow GEMMs; the blockwise fp32
    // attention runs far below the GEMM peak (both from `autopar-tune probe`). Its budget counts
    // the trial's own tensors: no runtime context to add.
    k.eff.gemm = 0.65;
    k.eff.gemm_half_dim = 8;
    k.eff.attention = 0.065;
    k.mem.runtime_overhead_gib = 0;
    k.mem.fragmentation = 0;
  } else if (name == "ascend-910b") {
    k.eff.gemm = 0.60;
    k.eff.attention = 0.40;
  }
  return k;
}

Fp8Traits Fp8TraitsOf(const std::string& gpu_name) {
  const std::string name = LowerCase(gpu_name);
  // Kernels: Transformer Engine's GEMM profiling tutorial (docs/examples/gemm_profiling,
  // 5B-model shapes, --pre-quantize: kernels only): per-layer GEMM time BF16 31.968 ms against
  // FP8 current scaling 16.785 ms on an H200 NVL, 1.90x of the 2x the peaks promise; on a B300,
  // 13.102 ms against 6.812 ms, 1.92x (MXFP8: 7.161 ms, 1.83x).
  // Hopper's FP8 tensor cores accumulate in reduced precision, so TE runs dgrad and wgrad with
  // split accumulation (promotion to FP32 in the CUDA cores; recipe.py fp8_gemm_dgrad/wgrad
  // use_split_accumulator=True, fprop False), which costs throughput. Measured on an H100 SXM5
  // (cuBLASLt through torch._scaled_mm, CUDA 13.0) at Llama-2-7B's shapes (4096 rows; 4096x4096,
  // x12288, x22016, 11008x4096): FP8 with split accumulation 0.871 of BF16's efficiency, with
  // fast accumulation 0.934 (the tutorial's 0.95); one fprop to two backward GEMMs: 0.89.
  // Blackwell: the tutorial's ratio (split accumulation there not measured here).
  Fp8Traits f;
  if (IsHopper(name)) {
    f.gemm_ratio = 0.89;
  } else if (IsBlackwell(name)) {
    f.gemm_ratio = 1.92 / 2;
    f.transposed_copy = false;  // nvte_is_non_tn_fp8_gemm_supported: sm100
  }
  return f;
}

AttentionShapeLaw AttentionShapeLawOf(const std::string& gpu_name) {
  const std::string name = LowerCase(gpu_name);
  AttentionShapeLaw law;
  // cuDNN's BF16 flash attention forward on an H100 SXM5 (Shah et al. 2024, FlashAttention-3,
  // Fig. 5, 16k tokens per batch): head dim 128 at 512, 1k, 2k, 4k, 8k, 16k keys: 315, 410,
  // 484, 518, 529, 539 TFLOP/s, within 2.5% of 560·n/(n + 380); at 16k keys head dim 64, 128,
  // 256: 413, 539, 581, within 6% of d/(d + 40). Applied to the families whose attention
  // efficiency is set with it against shared/calibration (Hopper, and Blackwell's cuDNN kernels
  // of the same design); the others (A100's flash-attn 2, V100's unfused attention, other
  // vendors, the CPU backend's blockwise attention) keep a flat efficiency until a published
  // curve of theirs is taken in.
  //
  // Dropout 0.1 against none, causal, BF16, head dim 128, batch 1, forward and forward+backward
  // (torch 2.11 scaled_dot_product_attention on one H200, session 16; 16, 32, 56 heads at 4k
  // tokens, 32 at 8k): cuDNN 9.19's fused attention forward 2.14-2.19x, backward 1.17-1.20x
  // (2.15, 1.19 taken); flash-attn 2 (torch's flash backend, the same shapes) forward
  // 1.14-1.18x, backward 1.13-1.15x (1.17, 1.14 taken; measured on Hopper, taken for the A100's
  // flash-attn 2 as well). Blackwell's cuDNN kernels: Hopper's figures, not measured there.
  const bool hopper = IsHopper(name);
  const bool blackwell = IsBlackwell(name);
  if (IsAmpere(name)) {
    law.dropout_forward = 1.17;
    law.dropout_backward = 1.14;
  }
  if (!hopper && !blackwell) return law;
  law.half_keys = 380;
  law.half_head_dim = 40;
  law.dropout_forward = 2.15;
  law.dropout_backward = 1.19;
  return law;
}

double GroupedGemmTileRows(const std::string& gpu_name) {
  const std::string name = LowerCase(gpu_name);
  return IsAmpere(name) || IsHopper(name) || IsBlackwell(name) ? 128 : 0;
}

}  // namespace autopar
