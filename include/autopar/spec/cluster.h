// GpuSpec and ClusterSpec: what the hardware can do, in the units the time model uses.
//
// Bandwidths are per GPU and per direction (bytes/s), which is what a ring collective's bus
// bandwidth is bounded by: NVLink inside a node, the GPU's share of the NICs across nodes.
#pragma once

#include <cstdint>
#include <string>

namespace autopar {

// kFP32 is what the CPU backend trains in: fp32 weights with no separate master copy.
enum class Precision { kBF16, kFP16, kFP8, kFP32 };
const char* ToString(Precision p);

struct GpuSpec {
  std::string name;
  double memory_gib = 0;          // usable device memory
  double peak_flops_bf16 = 0;     // dense tensor-core peak, FLOP/s
  double peak_flops_fp16 = 0;
  double peak_flops_fp8 = 0;      // 0 when the device has no FP8 tensor cores
  double peak_flops_fp32 = 0;     // non-tensor FP32
  double hbm_bandwidth = 0;       // bytes/s
  double intra_node_bandwidth = 0;  // NVLink/HCCS per GPU per direction, bytes/s
  double intra_node_latency_s = 0;
  double inter_node_bandwidth = 0;  // NIC share per GPU per direction, bytes/s
  double inter_node_latency_s = 0;
  std::string source;             // where the figures come from

  double PeakFlops(Precision p) const;
};

struct ClusterSpec {
  int64_t nnodes = 0;
  int64_t gpus_per_node = 0;
  GpuSpec gpu;

  int64_t world_size() const { return nnodes * gpus_per_node; }
};

// Throws InputError naming the first field that is missing or non-positive.
void Validate(const ClusterSpec& c);
// The GPU alone (Validate(ClusterSpec) calls it); fields are named as in GpuSpec.
void Validate(const GpuSpec& g);

}  // namespace autopar
