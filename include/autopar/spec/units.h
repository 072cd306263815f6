// Units more than one module converts between, defined once.
#pragma once

namespace autopar {

// Bytes in a GiB: memory is given in GiB (GpuSpec::memory_gib, Estimate::peak_memory_gib, the
// CLI's output) and counted in bytes.
inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace autopar
