// Host-side launchers of the FP8 quantization kernels (kernels/fp8.cu), for the CUDA device's
// cuBLASLt FP8 GEMM. Per-tensor current scaling: see kernels/fp8_scale.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda_kernels.cuh"

namespace autopar::kernels::cuda {

enum class Fp8Format : std::uint8_t { kE4M3, kE5M2 };

// Device-side state of one quantized operand: scale_inv (what the GEMM multiplies by), scale, and
// the amax as float bits (|x| of a finite float orders like its bits). scale_inv comes first and
// the struct is 16-byte aligned because cuBLASLt refuses an FP8 matmul whose A/B scale pointer is
// not 16-byte aligned (CUBLAS_STATUS_NOT_SUPPORTED from cublasLtMatmul, though the heuristic finds
// an algorithm: seen with cuBLASLt 13.1 on an H200 at offsets 4, 8 and 24; 0 and 16 run).
struct alignas(16) Fp8Scales {
  float scale_inv;
  float scale;
  unsigned int amax_bits;
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
