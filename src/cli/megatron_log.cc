#include "autopar/cli/megatron_log.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <deque>

namespace autopar::cli {
namespace {

bool Has(std::string_view line, std::string_view what) {
  return line.find(what) != std::string_view::npos;
}

// The number after `key` in `line` (Megatron prints "key: 812.4 |"); NaN when absent.
double NumberAfter(std::string_view line, std::string_view key) {
  const size_t at = line.find(key);
  if (at == std::string_view::npos) return std::nan("");
  const std::string rest(line.substr(at + key.size(), 40));
  const char* begin = rest.c_str();
  while (*begin == ' ') ++begin;
  char* end = nullptr;
  const double v = std::strtod(begin, &end);
  return end == begin ? std::nan("") : v;
}

bool OutOfMemory(std::string_view line) {
  return Has(line, "CUDA out of memory") || Has(line, "OutOfMemoryError") ||
         Has(line, "CUDA error: out of memory") || Has(line, "Cuda failure 'out of memory'") ||
         Has(line, "CUBLAS_STATUS_ALLOC_FAILED");
}

bool NonfiniteLoss(std::string_view line) {
  if (Has(line, "Unexpected result nan") || Has(line, "Unexpected result inf") ||
      Has(line, "found NaN in local") || Has(line, "found Inf in local") ||
      Has(line, "lm loss: NAN") || Has(line, "lm loss: INF") || Has(line, "lm loss: -INF")) {
    return true;
  }
  const double nan_iterations = NumberAfter(line, "number of nan iterations:");
  return std::isfinite(nan_iterations) && nan_iterations > 0;
}

void ReadIteration(std::string_view line, MegatronLog& log) {
  const double ms = NumberAfter(line, "elapsed time per iteration (ms):");
  const double iteration = NumberAfter(line, " iteration ");
  if (!std::isfinite(ms) || !std::isfinite(iteration)) return;
  log.iterations.push_back(static_cast<int>(iteration));
  log.iteration_ms.push_back(ms);
  const double tflops = NumberAfter(line, "throughput per GPU (TFLOP/s/GPU):");
  if (std::isfinite(tflops)) log.tflops_per_gpu.push_back(tflops);
}

void ReadMemory(std::string_view line, MegatronLog& log) {
  const double allocated = NumberAfter(line, "| max allocated:");
  const double reserved = NumberAfter(line, "| max reserved:");
  if (std::isfinite(allocated)) log.max_allocated_mb = std::max(log.max_allocated_mb, allocated);
  if (std::isfinite(reserved)) log.max_reserved_mb = std::max(log.max_reserved_mb, reserved);
}

}  // namespace

MegatronLog ParseMegatronLog(std::string_view text) {
  constexpr size_t kTailLines = 12;
  MegatronLog log;
  std::deque<std::string_view> tail;  // the last lines since the first traceback
  size_t start = 0;
  for (size_t nl = text.find('\n'); nl != std::string_view::npos;
       start = nl + 1, nl = text.find('\n', start)) {
    std::string_view line = text.substr(start, nl - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (Has(line, "elapsed time per iteration (ms):")) ReadIteration(line, log);
    if (Has(line, "memory (MB)") && Has(line, "max allocated:")) ReadMemory(line, log);
    log.out_of_memory = log.out_of_memory || OutOfMemory(line);
    log.nonfinite_loss = log.nonfinite_loss || NonfiniteLoss(line);
    if (Has(line, "Traceback (most recent call last):")) log.python_error = true;
    if (log.python_error) {
      tail.push_back(line);
      if (tail.size() > kTailLines) tail.pop_front();
    }
  }
  for (std::string_view l : tail) {
    log.error_tail += std::string(l);
    log.error_tail += '\n';
  }
  return log;
}

std::vector<double> TimedIterationSeconds(const MegatronLog& log, int warmup) {
  std::vector<double> out;
  for (size_t i = 0; i < log.iteration_ms.size(); ++i) {
    if (log.iterations[i] > warmup) out.push_back(log.iteration_ms[i] / 1e3);
  }
  return out;
}

double MedianOf(std::vector<double> values) {
  if (values.empty()) return std::nan("");
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<long>(mid), values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  return 0.5 * (upper + *std::max_element(values.begin(), values.begin() + static_cast<long>(mid)));
}

bool MedianIsStable(const std::vector<double>& times, int min_timed, double tolerance) {
  if (times.size() < static_cast<size_t>(std::max(min_timed, 3))) return false;
  const double all = MedianOf(times);
  for (size_t drop = 1; drop <= 2; ++drop) {
    const double before = MedianOf({times.begin(), times.end() - static_cast<long>(drop)});
    if (!(std::abs(all - before) <= tolerance * all)) return false;
  }
  return true;
}

}  // namespace autopar::cli
