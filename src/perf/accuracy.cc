#include "autopar/perf/accuracy.h"

namespace autopar {

PredictionSpread SpreadOf(const TrainSpec& train, const StackOptions& stack) {
  // scripts/bench_accuracy.sh, 2026-11-26 (issue 14: the flash kernels' shape law, Hopper's
  // split-accumulation FP8 GEMMs, B200's attention; H100's attention at today's cuDNN,
  // docs/models.md §4.2, §5; then each source's --tp-comm-overlap and cross-entropy fusion, and
  // Megatron's FP32 cross-entropy passes; the H100 NeMo source's flash-attn 2; the asynchronous
  // tensor-parallel backward, off for the runs that predate it; session 16: the fused attention's
  // dropout cost, measured; session 18: the MoE model zoo's Qwen3 rows, expressed with the flex
  // dispatcher; session 29: that source's --tp-comm-overlap and fused cross-entropy)
  // (docs/models.md §5.1 has the per-source table).
  if (train.precision == Precision::kFP32) return {};  // the CPU backend: no published runs
  if (!stack.flash_attention) {
    return {0.036, 35, "Megatron-LM runs of 2020-2022 (unfused attention, fp16)"};
  }
  if (train.precision == Precision::kFP8) {
    // NEMO_LONGCTX_H100 (9 rows, 3.0%, its stack's flash-attn 2 stated, docs/models.md §5.1) and
    // NEMO_LONGCTX_B200 (8 rows, 5.1%) pooled.
    return {0.040, 17, "NeMo long-context FP8 runs on H100 and B200"};
  }
  // MEGATRON_README_2024 (9 rows, 8.2%) and MOE_MODELZOO_QWEN3_LC (8 rows, 8.3%) pooled.
  return {0.083, 17,
          "Megatron-core bf16 runs on H100 (Megatron-LM README 2024, dense; Megatron-core MoE "
          "model zoo 2025-2026, Qwen3-235B)"};
}

}  // namespace autopar
