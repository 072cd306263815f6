// Deterministic test and initialisation data.
//
// Every value is a pure function of (seed, index) (STYLE: nccl-tests), computed with integer
// arithmetic and one exact float conversion, so a CUDA kernel, the host and any shard of a tensor
// produce the same bits without sharing state.
#pragma once

#include <cstdint>

namespace autopar::kernels::ref {

// SplitMix64 finaliser (Steele, Lea & Flood 2014): a bijective 64-bit mix.
constexpr std::uint64_t SplitMix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform on [-1, 1) with 24-bit resolution; exact in float.
constexpr float HashUniform(std::uint64_t seed, std::uint64_t index) {
  const std::uint64_t h = SplitMix64(SplitMix64(seed) + index);
  return static_cast<float>(h >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

// Hidden dropout's mask: element `index` of a mask drawn with `seed` is dropped when its 24-bit
// uniform falls below `threshold` (DropoutThreshold(p) = ⌊p·2^24⌋). Counter-based like the
// Philox stream of Megatron's dropout (not its bits), so the host and a CUDA kernel agree, and
// a recomputed forward draws the mask it drew the first time.
constexpr std::uint32_t DropoutThreshold(float p) {
  return static_cast<std::uint32_t>(p * 16777216.0f);
}
// The kept elements' scale, 1/(1 − p), one float division wherever it is computed.
constexpr float DropoutScale(float p) { return 1.0f / (1.0f - p); }
constexpr bool DropoutKeeps(std::uint64_t seed, std::uint64_t index, std::uint32_t threshold) {
  return (SplitMix64(SplitMix64(seed) + index) >> 40) >= threshold;
}

}  // namespace autopar::kernels::ref
