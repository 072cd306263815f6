// FP8 per-tensor scaling: the arithmetic shared by the CUDA kernels (kernels/fp8.cu, on the
// device) and the host tests, and the "does this GPU have fp8" decision.
//
// Recipe: current scaling (TransformerEngine's Float8CurrentScaling): each GEMM operand is
// quantized with a scale from its own amax, taken just before the cast, so no amax history is
// kept between iterations (delayed scaling, Megatron-core's default recipe, would keep one and
// use the previous iterations' amax: its first iterations depend on the history's warm-up, and
// Transformer Engine then takes the amax inside the cast kernel, so current scaling reads each
// operand once more; trial.md §14.1 measures what that costs). The scale maps the tensor's largest
// magnitude onto the format's largest finite value: scale = fp8_max / amax
// (transformer_engine/common/recipe/recipe_common.cuh, compute_scale_from_amax, with epsilon 0 and
// no power-of-two rounding). The GEMM dequantizes with scale_inv = 1 / scale (cuBLASLt's
// A/B_SCALE_POINTER).
//
// Formats: e4m3 (largest finite 448) for activations and weights; with --fp8-format hybrid the
// gradients use e5m2 (largest finite 57344), with e4m3 everything does.
#pragma once

#include <cfloat>

#if defined(__CUDACC__)
#define AUTOPAR_FP8_HD __host__ __device__
#else
#define AUTOPAR_FP8_HD
#endif

namespace autopar::kernels {

inline constexpr float kFp8E4M3Max = 448.0f;
inline constexpr float kFp8E5M2Max = 57344.0f;

// The quantization scale for a tensor whose largest magnitude is `amax`: fp8_max / amax; 1 when
// amax is 0, infinite or NaN (nothing to scale, or a tensor the step's finiteness check will
// reject anyway), and FLT_MAX when the quotient overflows (a tiny amax).
AUTOPAR_FP8_HD constexpr float Fp8ScaleFromAmax(float amax, float fp8_max) {
  // NaN compares false with everything; an infinite amax is above FLT_MAX.
  if (!(amax > 0.0f) || !(amax <= FLT_MAX)) return 1.0f;
  const float scale = fp8_max / amax;
  return scale <= FLT_MAX ? scale : FLT_MAX;
}

// Whether a GPU of compute capability major.minor has fp8 tensor cores (Ada sm_89, Hopper sm_90
// and later; cuBLASLt's FP8 matmul needs compute capability 8.9 or above).
AUTOPAR_FP8_HD constexpr bool DeviceHasFp8(int major, int minor) {
  return major > 8 || (major == 8 && minor >= 9);
}

}  // namespace autopar::kernels

#undef AUTOPAR_FP8_HD
