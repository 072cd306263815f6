// What a `--backend megatron` trial reads from Megatron-LM's own output (docs/trial.md §17). Pure:
// text in, values out. The formats are those of NVIDIA/Megatron-LM d98e8a6 (Aug 2026), shown with
// their sources in tests/data/megatron/training_log_d98e8a6.txt:
//
//   training_log (megatron/training/training.py), printed by the last rank every --log-interval:
//     " [2026-...] iteration        3/       7 | consumed samples: ... | elapsed time per
//      iteration (ms): 812.4 | throughput per GPU (TFLOP/s/GPU): 401.2 | ... | lm loss:
//      1.034E+01 | ... | number of skipped iterations:   0 | number of nan iterations:   0 |"
//   report_memory (megatron/training/utils/common_utils.py), by each data-parallel rank 0 after
//     the first iterations:
//     "[Rank 3] (after 2 iterations) memory (MB) | allocated: ... | max allocated: 51234.56 |
//      reserved: ... | max reserved: 60012.00"
//   torch's out-of-memory errors ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate",
//     "CUDA error: out of memory", NCCL's "Cuda failure 'out of memory'", cuBLAS's
//     CUBLAS_STATUS_ALLOC_FAILED);
//   non-finite losses: a NaN loss is not printed (training_log prints a loss only when >= 0) but
//     counted ("number of nan iterations: N"), an infinite one prints as INF; with the rerun
//     state machine's check (on by default) the run stops with "Unexpected result nan
//     (message='found NaN in local forward loss calculation')" or a grad-norm "found NaN/Inf";
//   a Python error: "Traceback (most recent call last):" and the lines after it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace autopar::cli {

struct MegatronLog {
  std::vector<int> iterations;         // the iteration number of each timed line, in order
  std::vector<double> iteration_ms;    // "elapsed time per iteration (ms)", same order
  std::vector<double> tflops_per_gpu;  // "throughput per GPU (TFLOP/s/GPU)" where printed
  double max_allocated_mb = 0;         // the largest "max allocated" of any memory report
  double max_reserved_mb = 0;          // the largest "max reserved"
  bool out_of_memory = false;
  bool nonfinite_loss = false;
  bool python_error = false;
  std::string error_tail;  // the last lines of the output from the first traceback (≤ 12 lines)
};

// Parses a whole log (or the part written so far: a line without its newline is left out).
MegatronLog ParseMegatronLog(std::string_view text);

// The timed iterations' times in seconds: those after the first `warmup` logged iterations.
std::vector<double> TimedIterationSeconds(const MegatronLog& log, int warmup);

// Whether `times` (the timed iterations so far) give a stable median: at least `min_timed`
// of them, and the median of all of them within `tolerance` (relative) of the median without
// the last one and of the median without the last two. The trial stops the child once it holds.
bool MedianIsStable(const std::vector<double>& times, int min_timed, double tolerance);

double MedianOf(std::vector<double> values);

}  // namespace autopar::cli
