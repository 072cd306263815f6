// A row-major GemmDesc as cuBLASLt's FP8 matmul wants it. Pure and header-only (no CUDA headers),
// so the host tests check the mapping and the refusals.
//
// cuBLASLt runs FP8 only in the "TN" form: column-major D[M, N] = op(A)[M, K] · op(B)[K, N] with A
// transposed and B not, i.e. both operands stored K-contiguous, leading dimensions multiples of 16
// bytes (cuBLAS documentation, cublasLtMatmul, FP8 requirements; TransformerEngine's
// cublaslt_gemm.cu checks lda % 16 and ldb % 16 the same way). As for the bf16 path
// (gemm_mapping.h), the row-major C[m, n] = op(a) op(b) is the column-major C^T = op(b)^T op(a)^T,
// so cuBLASLt's A is our b side quantized as [n, k] and its B our a side quantized as [m, k]:
// the quantizer transposes an operand exactly when its storage is not already K-contiguous.
#pragma once

#include <cstdint>
#include <string>

#include "autopar/device/ops.h"

namespace autopar::device {

struct Fp8GemmPlan {
  // cuBLASLt's sizes: M = n, N = m, K = k; lda = ldb = K (the quantized copies are packed).
  std::int64_t lt_m = 0, lt_n = 0, lt_k = 0;
  // The quantizer's source views (row-major rows x cols, leading dimension ld) and whether it
  // writes them transposed, for our a side (-> [m, k]) and b side (-> [n, k]).
  std::int64_t a_rows = 0, a_cols = 0, a_ld = 0;
  bool a_transpose = false;
  std::int64_t b_rows = 0, b_cols = 0, b_ld = 0;
  bool b_transpose = false;
  std::int64_t ld_d = 0;  // C's row stride = column-major D's leading dimension
  // CUBLASLT_MATMUL_DESC_FAST_ACCUM (an int8_t): 1 for GemmDesc::fp8_fast_accumulate.
  std::int8_t fast_accumulate = 0;
};

// `d` must be resolved (ResolveGemm). Assumes the checks of Fp8GemmUnsupported passed.
constexpr Fp8GemmPlan PlanFp8Gemm(const GemmDesc& d) {
  Fp8GemmPlan p;
  p.lt_m = d.n;
  p.lt_n = d.m;
  p.lt_k = d.k;
  // a is stored [m, k] (ld lda), or [k, m] when trans_a: then transposed into [m, k].
  p.a_rows = d.trans_a ? d.k : d.m;
  p.a_cols = d.trans_a ? d.m : d.k;
  p.a_ld = d.lda;
  p.a_transpose = d.trans_a;
  // b is stored [n, k] when trans_b (already [n, k]), else [k, n]: then transposed.
  p.b_rows = d.trans_b ? d.n : d.k;
  p.b_cols = d.trans_b ? d.k : d.n;
  p.b_ld = d.ldb;
  p.b_transpose = !d.trans_b;
  p.ld_d = d.ldc;
  p.fast_accumulate = d.fp8_fast_accumulate ? 1 : 0;
  return p;
}

// Empty when cuBLASLt can run `d` (resolved) in FP8 with an output of `c_bytes` per element;
// else why not, for a kInvalid naming the requirement.
inline std::string Fp8GemmUnsupported(const GemmDesc& d, std::int64_t c_bytes) {
  if (d.fp8_a == Fp8Operand::kNone || d.fp8_b == Fp8Operand::kNone) {
    return "an FP8 GEMM needs both operands in fp8";
  }
  if (d.fp8_a == Fp8Operand::kE5M2 && d.fp8_b == Fp8Operand::kE5M2) {
    return "cuBLASLt has no e5m2 x e5m2 GEMM (hybrid puts only gradients in e5m2)";
  }
  if (d.batch != 1) return "FP8 GEMMs are not batched here";
  if (d.m % 16 != 0 || d.n % 16 != 0 || d.k % 16 != 0) {
    return "FP8 GEMMs need m, n and k multiples of 16 (cuBLASLt's 16-byte leading dimensions), "
           "got m=" +
           std::to_string(d.m) + " n=" + std::to_string(d.n) + " k=" + std::to_string(d.k);
  }
  if ((d.ldc * c_bytes) % 16 != 0) return "FP8 GEMMs need C's row stride a multiple of 16 bytes";
  return {};
}

}  // namespace autopar::device
