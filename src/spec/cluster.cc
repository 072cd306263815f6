#include "autopar/spec/cluster.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "autopar/common/errors.h"
#include "internal.h"

namespace autopar {

const char* ToString(Precision p) {
  switch (p) {
    case Precision::kBF16:
      return "bf16";
    case Precision::kFP16:
      return "fp16";
    case Precision::kFP8:
      return "fp8";
    case Precision::kFP32:
      return "fp32";
  }
  return "unknown";
}

double GpuSpec::PeakFlops(Precision p) const {
  switch (p) {
    case Precision::kBF16:
      return peak_flops_bf16;
    case Precision::kFP16:
      return peak_flops_fp16;
    case Precision::kFP8:
      // Failing here, rather than returning 0, keeps a division by zero out of the time model.
      if (peak_flops_fp8 <= 0) {
        throw InputError("--fp8-format", "GPU '" + name +
                                             "' has no FP8 tensor cores; allowed precisions: "
                                             "--bf16, --fp16");
      }
      return peak_flops_fp8;
    case Precision::kFP32:
      return peak_flops_fp32;
  }
  return 0;
}

namespace {

// `!(value > 0)` is also true for NaN, which must not slip through as a size.
void RequirePositive(double value, const char* field) {
  if (!(value > 0) || !std::isfinite(value)) {
    throw InputError(field, "must be a positive finite number, got " + std::to_string(value));
  }
}

void RequireNonNegative(double value, const char* field) {
  if (!(value >= 0) || !std::isfinite(value)) {
    throw InputError(field, "must be a non-negative finite number, got " + std::to_string(value));
  }
}

// A device figure within what any device has (issue 17: 1e-300 FLOP/s gave 1e302 s steps, 1e308
// GiB an unbounded budget); 0 stays allowed where the caller allowed it.
void RequireWithin(double value, double lo, double hi, const char* field, const char* unit) {
  if (value != 0 && !(value >= lo && value <= hi)) {
    char text[160];
    std::snprintf(text, sizeof text, "must be from %g to %g %s, got %g", lo, hi, unit, value);
    throw InputError(field, text);
  }
}

}  // namespace

void Validate(const GpuSpec& g) {
  RequirePositive(g.memory_gib, "memory_gib");
  RequirePositive(g.peak_flops_bf16, "peak_flops_bf16");
  RequirePositive(g.peak_flops_fp16, "peak_flops_fp16");
  RequireNonNegative(g.peak_flops_fp8, "peak_flops_fp8");
  RequireNonNegative(g.peak_flops_fp32, "peak_flops_fp32");
  RequirePositive(g.hbm_bandwidth, "hbm_bandwidth");
  RequirePositive(g.intra_node_bandwidth, "intra_node_bandwidth");
  RequireNonNegative(g.intra_node_latency_s, "intra_node_latency_s");
  RequirePositive(g.inter_node_bandwidth, "inter_node_bandwidth");
  RequireNonNegative(g.inter_node_latency_s, "inter_node_latency_s");
  RequireWithin(g.memory_gib, 1e-6, 1e6, "memory_gib", "GiB");
  for (const auto& [value, field] : {std::pair{g.peak_flops_bf16, "peak_flops_bf16"},
                                     {g.peak_flops_fp16, "peak_flops_fp16"},
                                     {g.peak_flops_fp8, "peak_flops_fp8"},
                                     {g.peak_flops_fp32, "peak_flops_fp32"}}) {
    RequireWithin(value, 1e6, 1e19, field, "FLOP/s");
  }
  for (const auto& [value, field] : {std::pair{g.hbm_bandwidth, "hbm_bandwidth"},
                                     {g.intra_node_bandwidth, "intra_node_bandwidth"},
                                     {g.inter_node_bandwidth, "inter_node_bandwidth"}}) {
    RequireWithin(value, 1e3, 1e16, field, "bytes/s");
  }
  RequireWithin(g.intra_node_latency_s, 0, 1, "intra_node_latency_s", "s");
  RequireWithin(g.inter_node_latency_s, 0, 1, "inter_node_latency_s", "s");
  if (g.nvlink_domain_gpus < 0) {
    throw InputError("nvlink_domain_gpus",
                     "must be a positive number of GPUs (or 0 for the node), got " +
                         std::to_string(g.nvlink_domain_gpus));
  }
}

void Validate(const ClusterSpec& c) {
  if (c.nnodes <= 0) {
    throw InputError("nnodes", "must be a positive integer, got " + std::to_string(c.nnodes));
  }
  if (c.gpus_per_node <= 0) {
    throw InputError("gpus_per_node",
                     "must be a positive integer, got " + std::to_string(c.gpus_per_node));
  }
  spec_internal::RequireAtMost(c.nnodes, spec_internal::kMaxGpus, "nnodes");
  spec_internal::RequireAtMost(c.gpus_per_node, 1024, "gpus_per_node");
  if (c.nnodes * c.gpus_per_node > spec_internal::kMaxGpus) {
    throw InputError("nnodes", "nnodes x gpus_per_node must be at most " +
                                   std::to_string(spec_internal::kMaxGpus) + " GPUs, got " +
                                   std::to_string(c.nnodes) + " x " +
                                   std::to_string(c.gpus_per_node));
  }
  Validate(c.gpu);
  // A domain is whole nodes: the collectives' placement (docs/models.md §4.1) and the space's tp
  // rule count ranks in aligned blocks of it, and a node never straddles two NVLink fabrics.
  const int64_t domain = c.gpu.nvlink_domain_gpus;
  if (domain > 0 && domain % c.gpus_per_node != 0) {
    throw InputError("nvlink_domain_gpus",
                     "must be a whole number of nodes: a multiple of gpus_per_node=" +
                         std::to_string(c.gpus_per_node) + " (--nproc-per-node), got " +
                         std::to_string(domain) + " for GPU '" + c.gpu.name +
                         "' (an NVL72 rack's trays hold 4 GPUs each: --nproc-per-node 4)");
  }
}

int64_t ClusterSpec::NvlinkDomainGpus() const {
  const int64_t domain = gpu.nvlink_domain_gpus > 0 ? gpu.nvlink_domain_gpus : gpus_per_node;
  return std::min(domain, world_size());
}

}  // namespace autopar
