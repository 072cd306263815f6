#include "src/device/cuda/fp8_gemm.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "kernels/cuda_fp8.cuh"
#include "src/device/cuda/cuda_check.h"
#include "src/device/cuda/fp8_gemm_plan.h"

namespace autopar::device {
namespace kc = kernels::cuda;

namespace {

// What cuBLASLt may use besides the operands: NVIDIA recommends 32 MiB on Hopper (cuBLAS
// documentation, cublasSetWorkspace); smaller workspaces rule out some FP8 kernels.
constexpr std::size_t kLtWorkspaceBytes = std::size_t{32} << 20;
constexpr std::size_t kAlign = 256;  // cuBLASLt's default pointer-alignment assumption
constexpr std::size_t kLtScaleAlignment = 16;  // what an FP8 scale pointer needs (cuda_fp8.cuh)

constexpr std::size_t AlignUp(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// A weight's kept copy is one buffer: its Fp8Scales, then the quantized data.
constexpr std::size_t kCopyScalesBytes = AlignUp(sizeof(kc::Fp8Scales));
kc::Fp8Scales* CopyScales(const Buffer& copy) { return static_cast<kc::Fp8Scales*>(copy.data()); }
void* CopyData(const Buffer& copy) { return static_cast<char*>(copy.data()) + kCopyScalesBytes; }

// The largest power of two up to 256 that divides the address (what the heuristic may assume).
std::uint32_t Alignment(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

cudaDataType FpType(Fp8Operand f) {
  return f == Fp8Operand::kE5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3;
}
kc::Fp8Format KernelFormat(Fp8Operand f) {
  return f == Fp8Operand::kE5M2 ? kc::Fp8Format::kE5M2 : kc::Fp8Format::kE4M3;
}

// cuBLASLt descriptors, destroyed however Run returns.
struct LtDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  ~LtDescriptors() {
    // Destroying a descriptor only frees host memory; a failure has nothing left to release.
    if (preference != nullptr) (void)cublasLtMatmulPreferenceDestroy(preference);
    if (c != nullptr) (void)cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) (void)cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) (void)cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) (void)cublasLtMatmulDescDestroy(op);
  }
};

}  // namespace

void Fp8Gemm::Reset() {
  if (handle_ != nullptr) {
    const cublasStatus_t rc = cublasLtDestroy(handle_);
    if (rc != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "%s\n",
                   CublasError(rc, "cublasLtDestroy", __FILE__, __LINE__).ToString().c_str());
    }
    handle_ = nullptr;
  }
  workspace_.Reset();
  weights_.clear();
}

Status Fp8Gemm::Reserve(Device& device, std::size_t bytes) {
  if (bytes <= workspace_.bytes()) return OkStatus();
  // Grow geometrically, so a trial's few GEMM shapes settle after a reallocation or two. The old
  // workspace goes first (in stream order, after the GEMMs queued on it), so the two are never
  // both counted against the budget.
  const std::size_t want = std::max(bytes, 2 * workspace_.bytes());
  workspace_.Reset();
  StatusOr<Buffer> grown = device.Allocate(want);
  if (!grown.ok()) {
    return Status::Error(grown.status().outcome(),
                         "the FP8 GEMM workspace: " + grown.status().message(), __FILE__, __LINE__);
  }
  workspace_ = std::move(grown).value();
  return OkStatus();
}

StatusOr<const Fp8Gemm::WeightCopy*> Fp8Gemm::WeightOperand(Device& device, cudaStream_t stream,
                                                            kc::Storage t, const void* b,
                                                            std::int64_t rows, std::int64_t cols,
                                                            std::int64_t ld, bool transpose,
                                                            Fp8Operand format) {
  for (const WeightCopy& w : weights_) {
    if (w.source == b && w.rows == rows && w.cols == cols && w.ld == ld &&
        w.transpose == transpose && w.format == format) {
      return &w;
    }
  }
  StatusOr<Buffer> copy =
      device.Allocate(kCopyScalesBytes + AlignUp(static_cast<std::size_t>(rows * cols)));
  if (!copy.ok()) {
    return Status::Error(copy.status().outcome(),
                         "the FP8 copy of a weight: " + copy.status().message(), __FILE__,
                         __LINE__);
  }
  WeightCopy w{b, rows, cols, ld, transpose, format, std::move(copy).value()};
  AUTOPAR_CHECK_CUDA(kc::QuantizeFp8(stream, t, b, rows, cols, ld, transpose, KernelFormat(format),
                                     CopyScales(w.copy), CopyData(w.copy)));
  weights_.push_back(std::move(w));
  return &weights_.back();
}

Status Fp8Gemm::Run(Device& device, cudaStream_t stream, const GemmDesc& d, kc::Storage ab_t,
                    Tensor a, Tensor b, Tensor c) {
  const std::int64_t c_bytes = static_cast<std::int64_t>(DTypeSize(c.dtype));
  if (const std::string why = Fp8GemmUnsupported(d, c_bytes); !why.empty()) {
    return Status::Error(Outcome::kInvalid, "--fp8-format: " + why, __FILE__, __LINE__);
  }
  const Fp8GemmPlan p = PlanFp8Gemm(d);
  if (handle_ == nullptr) AUTOPAR_CHECK_CUBLAS(cublasLtCreate(&handle_));

  // A weight's copy is kept across calls (made here on its first use this step); otherwise the
  // b side is quantized into the workspace with the a side.
  const WeightCopy* weight = nullptr;
  if (d.fp8_b_is_weight) {
    AUTOPAR_ASSIGN_OR_RETURN(weight, WeightOperand(device, stream, ab_t, b.data, p.b_rows, p.b_cols,
                                                   p.b_ld, p.b_transpose, d.fp8_b));
  }
  // Workspace: the two operands' scales, the a side as [m, k], the b side as [n, k] (none for a
  // kept weight), cuBLASLt's.
  const std::size_t scales_bytes = AlignUp(2 * sizeof(kc::Fp8Scales));
  const std::size_t qa_bytes = AlignUp(static_cast<std::size_t>(d.m * d.k));
  const std::size_t qb_bytes = weight != nullptr ? 0 : AlignUp(static_cast<std::size_t>(d.n * d.k));
  AUTOPAR_RETURN_IF_ERROR(Reserve(device, scales_bytes + qa_bytes + qb_bytes + kLtWorkspaceBytes));
  auto* base = static_cast<char*>(workspace_.data());
  auto* scales = reinterpret_cast<kc::Fp8Scales*>(base);
  kc::Fp8Scales* a_scales = scales;
  kc::Fp8Scales* b_scales = scales + 1;
  void* qa = base + scales_bytes;
  void* qb = base + scales_bytes + qa_bytes;
  void* lt_workspace = base + scales_bytes + qa_bytes + qb_bytes;

  AUTOPAR_CHECK_CUDA(kc::QuantizeFp8(stream, ab_t, a.data, p.a_rows, p.a_cols, p.a_ld, p.a_transpose,
                                     KernelFormat(d.fp8_a), a_scales, qa));
  if (weight != nullptr) {
    b_scales = CopyScales(weight->copy);
    qb = CopyData(weight->copy);
  } else {
    AUTOPAR_CHECK_CUDA(kc::QuantizeFp8(stream, ab_t, b.data, p.b_rows, p.b_cols, p.b_ld,
                                       p.b_transpose, KernelFormat(d.fp8_b), b_scales, qb));
  }

  // cuBLASLt's A is our b side, its B our a side (fp8_gemm_plan.h).
  LtDescriptors lt;
  AUTOPAR_CHECK_CUBLAS(cublasLtMatmulDescCreate(&lt.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  AUTOPAR_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                                      sizeof(trans_a)));
  AUTOPAR_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                                      sizeof(trans_b)));
  // The scale pointers take the factor that brings the fp8 data back to range: scale_inv, at a
  // 16-byte aligned address (cuda_fp8.cuh says why).
  static_assert(offsetof(kc::Fp8Scales, scale_inv) % kLtScaleAlignment == 0 &&
                sizeof(kc::Fp8Scales) % kLtScaleAlignment == 0);
  const float* a_scale_inv = &b_scales->scale_inv;
  const float* b_scale_inv = &a_scales->scale_inv;
  AUTOPAR_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                      &a_scale_inv, sizeof(a_scale_inv)));
  AUTOPAR_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                      &b_scale_inv, sizeof(b_scale_inv)));
  // Fast accumulation for the forward GEMM, split accumulation (the attribute's default, the
  // accurate mode) for the gradient GEMMs, as TransformerEngine (GemmDesc::fp8_fast_accumulate).
  const std::int8_t fast_accum = p.fast_accumulate;
  AUTOPAR_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(lt.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                      &fast_accum, sizeof(fast_accum)));
  const cudaDataType c_type = c.dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  // Transposed A is stored K x M, B (not transposed) K x N, both packed (leading dimension K).
  AUTOPAR_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lt.a, FpType(d.fp8_b), p.lt_k, p.lt_m, p.lt_k));
  AUTOPAR_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lt.b, FpType(d.fp8_a), p.lt_k, p.lt_n, p.lt_k));
  AUTOPAR_CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&lt.c, c_type, p.lt_m, p.lt_n, p.ld_d));

  AUTOPAR_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&lt.preference));
  const std::size_t lt_bytes = kLtWorkspaceBytes;
  AUTOPAR_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      lt.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt_bytes, sizeof(lt_bytes)));
  // C may be a slice: tell the heuristic its real alignment (it assumes 256 bytes otherwise).
  const std::uint32_t c_alignment = Alignment(c.data);
  AUTOPAR_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      lt.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &c_alignment,
      sizeof(c_alignment)));
  AUTOPAR_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
      lt.preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &c_alignment,
      sizeof(c_alignment)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  AUTOPAR_CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(handle_, lt.op, lt.a, lt.b, lt.c, lt.c,
                                                      lt.preference, 1, &heuristic, &found));
  if (found == 0) {
    return Status::Error(
        Outcome::kInvalid,
        "--fp8-format: cuBLASLt has no FP8 algorithm for m=" + std::to_string(d.m) +
            " n=" + std::to_string(d.n) + " k=" + std::to_string(d.k),
        __FILE__, __LINE__);
  }
  const float alpha = d.alpha, beta = d.beta;
  AUTOPAR_CHECK_CUBLAS(cublasLtMatmul(handle_, lt.op, &alpha, qb, lt.a, qa, lt.b, &beta, c.data,
                                      lt.c, c.data, lt.c, &heuristic.algo, lt_workspace, lt_bytes,
                                      stream));
  return OkStatus();
}

}  // namespace autopar::device
