// Start-up micro-benchmarks (docs/trial.md §15, docs/search.md §5): the GEMM, attention and norm shapes of the model's
// layers under each tensor-parallel degree, and all-reduces on the groups a layout forms (inside a
// node and across nodes), each next to the analytic model's time for the same work. The ratios
// are the low-fidelity data that tighten the tuner's prior.
#pragma once

#include <string>
#include <vector>

#include "autopar/device/group.h"
#include "autopar/device/platform.h"
#include "autopar/perf/cost_model.h"

namespace autopar::trial {

struct ProbeSample {
  std::string name;     // "gemm qkv tp=2", "allreduce n=4 stride=1", ...
  Feature feature;      // the cost-model feature it calibrates
  double measured_s;    // median over repetitions of the slowest rank
  double predicted_s;   // the analytic model's nominal time
};

struct ProbeOptions {
  int repetitions = 5;
  std::vector<int> tp_values;  // empty: powers of two up to a node that divide the heads
};

// What the platform costs besides the work itself, measured by the probe (the slowest rank's, so
// the same on every rank): the analytic model assumes constants for these (runtime_overhead_gib).
struct ProbeOverheads {
  // Connecting the probe's all-reduce groups the first time (NCCL: the world communicator and
  // the splits), and the same groups again, which a platform that caches communicators serves
  // without set-up. Seconds, summed over the groups.
  double comm_setup_first_s = 0;
  double comm_setup_cached_s = 0;
  // Device memory held besides tensors after the probe (Device::NonTensorBytes: CUDA context,
  // cuBLAS workspaces, NCCL buffers), in GiB.
  double non_tensor_gib = 0;
};

// Collective over `world`; the same samples on every rank, and `overheads` when not null.
device::StatusOr<std::vector<ProbeSample>> RunProbe(
    device::Platform& platform, const device::Group& world, const ModelSpec& model,
    const TrainSpec& train, const ClusterSpec& cluster, const CostModel& cost,
    const ProbeOptions& options, ProbeOverheads* overheads = nullptr);

// Geometric mean of measured / predicted per feature (1 where nothing was probed).
std::array<double, kNumFeatures> ProbeRatios(const std::vector<ProbeSample>& samples);

}  // namespace autopar::trial
