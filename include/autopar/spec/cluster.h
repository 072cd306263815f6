// GpuSpec and ClusterSpec: what the hardware can do, in the units the time model uses.
//
// Bandwidths are per GPU and per direction (bytes/s), which is what a ring collective's bus
// bandwidth is bounded by: NVLink inside an NVLink domain, the GPU's share of the NICs across
// domains. The domain is a node (an HGX board) unless the GPU's system joins several nodes into
// one (GB200/GB300 NVL72: 18 trays of 4 GPUs on one NVLink switch fabric); docs/models.md §4.1.
#pragma once

#include <cstdint>
#include <string>

namespace autopar {

// kFP32 is what the CPU backend trains in: fp32 weights with no separate master copy.
enum class Precision { kBF16, kFP16, kFP8, kFP32 };
const char* ToString(Precision p);

// The GPU as built into its system: its NVLink and NIC share are the system's, and so is the size
// of the NVLink domain it sits in.
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
  // GPUs that share one NVLink fabric, a whole number of nodes (72 on GB200/GB300 NVL72); 0 means
  // the node, whatever its size (HGX boards, and every study written before the field existed).
  int64_t nvlink_domain_gpus = 0;
  std::string source;             // where the figures come from

  double PeakFlops(Precision p) const;
};

struct ClusterSpec {
  int64_t nnodes = 0;
  int64_t gpus_per_node = 0;
  GpuSpec gpu;

  int64_t world_size() const { return nnodes * gpus_per_node; }
  // The ranks one NVLink domain holds: consecutive ranks [k·D, (k+1)·D), D this value, the last
  // domain possibly partial. The GPU's domain, or the node when it names none; never more than
  // the world (a job on two trays of a rack has an 8-GPU domain).
  int64_t NvlinkDomainGpus() const;
};

// Throws InputError naming the first field that is missing or non-positive, or
// `nvlink_domain_gpus` when it is not a whole number of nodes.
void Validate(const ClusterSpec& c);
// The GPU alone (Validate(ClusterSpec) calls it); fields are named as in GpuSpec.
void Validate(const GpuSpec& g);

}  // namespace autopar
