// Row-major GEMMs (GemmDesc) as the column-major calls cuBLAS makes.
//
// A row-major [r, c] matrix with row stride ld is, byte for byte, the column-major [c, r] matrix
// with leading dimension ld: its transpose. So row-major C = op(A) op(B) is column-major
// C^T = op(B)^T op(A)^T: cuBLAS gets B as its first operand and A as its second, the dimensions
// m and n swap, and each operand keeps its own transpose flag and leading dimension (B's stored
// [k, n] is column-major [n, k] = op(B)^T already when not transposed). Pure and header-only, so
// the host tests check it against a naive row-major product without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "autopar/device/ops.h"

namespace autopar::device {

// Arguments of cublasGemmStridedBatchedEx(handle, trans_first, trans_second, m, n, k, alpha,
// first, ld_first, stride_first, second, ld_second, stride_second, beta, c, ld_c, stride_c, batch).
struct ColumnMajorGemm {
  bool trans_first = false;   // applies to B
  bool trans_second = false;  // applies to A
  std::int64_t m = 0;         // rows of column-major C^T = n of the row-major product
  std::int64_t n = 0;         // columns of C^T = m
  std::int64_t k = 0;
  std::int64_t ld_first = 0;   // B's
  std::int64_t ld_second = 0;  // A's
  std::int64_t ld_c = 0;
  std::int64_t stride_first = 0;
  std::int64_t stride_second = 0;
  std::int64_t stride_c = 0;
  std::int64_t batch = 1;
};

// The workspace a cuBLAS handle is given (cublasSetWorkspace) on a GPU of compute capability
// `major`.x: the size the cuBLAS documentation recommends (cublasSetWorkspace: 32 MiB on Hopper
// and later, 4 MiB before), which PyTorch (CUDABlas.cpp) and TransformerEngine
// (get_cublas_workspace_size_bytes) give theirs, so Megatron's GEMMs pick from the same kernels.
constexpr std::size_t CublasWorkspaceBytes(int major) {
  return major >= 9 ? std::size_t{32} << 20 : std::size_t{4} << 20;
}

// `d` must be resolved (ResolveGemm: leading dimensions and strides filled in).
constexpr ColumnMajorGemm ToColumnMajor(const GemmDesc& d) {
  ColumnMajorGemm g;
  g.trans_first = d.trans_b;
  g.trans_second = d.trans_a;
  g.m = d.n;
  g.n = d.m;
  g.k = d.k;
  g.ld_first = d.ldb;
  g.ld_second = d.lda;
  g.ld_c = d.ldc;
  g.stride_first = d.stride_b;
  g.stride_second = d.stride_a;
  g.stride_c = d.stride_c;
  g.batch = d.batch;
  return g;
}

}  // namespace autopar::device
