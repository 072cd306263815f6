// Host-side launchers of the FP8 quantization kernels (kernels/fp8.cu), for the CUDA device's
// cuBLASLt FP8 GEMM. Per-tensor current scaling: see kernels/fp8_scale.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda_kernels.cuh"

namespace autopar::kernels::cuda {

enum class Fp8Format : std::uint8_t { kE4M3, kE5M2 };

// Device-side state of one quantized operand: the amax as float bits (|x| of a finite float
// orders like its bits), then scale and scale_inv.
struct Fp8Scales {
  unsigned int amax_bits;
  float scale;
  float scale_inv;
  float pad;
};

// Quantizes the row-major [rows, cols] view x (leading dimension ld, Storage t) into `out` as fp8
// in `format`: the amax of x, then scales->scale = Fp8ScaleFromAmax(amax), then
// out = saturate(x * scale), written [rows, cols] row-major, or [cols, rows] when `transpose`.
// scales->scale_inv is what the GEMM multiplies by. All on `stream`, no host wait.
cudaError_t QuantizeFp8(cudaStream_t stream, Storage t, const void* x, std::int64_t rows,
                        std::int64_t cols, std::int64_t ld, bool transpose, Fp8Format format,
                        Fp8Scales* scales, void* out);

}  // namespace autopar::kernels::cuda
