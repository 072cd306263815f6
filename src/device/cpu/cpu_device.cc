// CPU device: memory, data movement, elementwise ops and GEMM.
#include "src/device/cpu/cpu_device.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/init.h"
#include "src/device/validate.h"

namespace autopar::device {
namespace {

// Cache-line alignment, so OpenBLAS and auto-vectorised loops get aligned rows.
constexpr std::size_t kAlignment = 64;

bool FitsBlasInt(std::int64_t v) { return v >= 0 && v <= INT_MAX; }

}  // namespace

CpuDevice::CpuDevice(const CpuPlatformOptions& options)
    : Device(options.memory_budget_bytes),
      block_q_(options.attention_block_q),
      block_kv_(options.attention_block_kv) {}

StatusOr<void*> CpuDevice::AllocateRaw(std::size_t bytes) {
  if (bytes > SIZE_MAX - kAlignment) {
    return Status::Error(Outcome::kOom, "request too large", __FILE__, __LINE__);
  }
  const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* data = std::aligned_alloc(kAlignment, rounded);
  if (data == nullptr) {
    return Status::Error(Outcome::kOom, "aligned_alloc(" + std::to_string(rounded) + ") failed",
                         __FILE__, __LINE__);
  }
  return data;
}

void CpuDevice::FreeRaw(void* data, std::size_t /*bytes*/) { std::free(data); }

Status CpuDevice::CopyFromHost(Tensor dst, const void* src, std::size_t bytes) {
  AUTOPAR_CHECK_ARG(dst.valid() && bytes <= dst.bytes(), "CopyFromHost: destination too small");
  AUTOPAR_CHECK_ARG(bytes == 0 || src != nullptr, "CopyFromHost: null source");
  if (bytes > 0) std::memcpy(dst.data, src, bytes);
  return OkStatus();
}

Status CpuDevice::CopyToHost(void* dst, Tensor src, std::size_t bytes) {
  AUTOPAR_CHECK_ARG(src.valid() && bytes <= src.bytes(), "CopyToHost: source too small");
  AUTOPAR_CHECK_ARG(bytes == 0 || dst != nullptr, "CopyToHost: null destination");
  if (bytes > 0) std::memcpy(dst, src.data, bytes);
  return OkStatus();
}

Status CpuDevice::Copy(Tensor dst, Tensor src) {
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("Copy", {{"src", src, dst.dtype, dst.numel}}));
  AUTOPAR_CHECK_ARG(dst.valid() && src.numel == dst.numel, "Copy: element counts differ");
  if (dst.numel > 0) std::memmove(dst.data, src.data, dst.bytes());
  return OkStatus();
}

Status CpuDevice::CopyRows(Tensor dst, std::int64_t dst_stride, Tensor src, std::int64_t src_stride,
                           std::int64_t rows, std::int64_t cols) {
  AUTOPAR_RETURN_IF_ERROR(CheckCopyRows(dst, dst_stride, src, src_stride, rows, cols));
  const std::size_t size = DTypeSize(src.dtype);
  const std::size_t row_bytes = static_cast<std::size_t>(cols) * size;
  auto* out = static_cast<char*>(dst.data);
  const auto* in = static_cast<const char*>(src.data);
  for (std::int64_t r = 0; r < rows && row_bytes > 0; ++r) {
    std::memcpy(out + static_cast<std::size_t>(r * dst_stride) * size,
                in + static_cast<std::size_t>(r * src_stride) * size, row_bytes);
  }
  return OkStatus();
}

Status CpuDevice::Fill(Tensor x, float value) {
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("Fill", {{"x", x, DType::kF32, 0}}));
  std::fill_n(x.as<float>(), x.numel, value);
  return OkStatus();
}

Status CpuDevice::FillHash(Tensor x, const HashFill& fill) {
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("FillHash", {{"x", x, DType::kF32, 0}}));
  AUTOPAR_ASSIGN_OR_RETURN(const HashFill f, ResolveHashFill(fill, x.numel));
  float* out = x.as<float>();
  for (std::int64_t r = 0; r < f.rows; ++r) {
    const std::uint64_t base =
        static_cast<std::uint64_t>((f.row_offset + r) * f.global_cols + f.col_offset);
    for (std::int64_t c = 0; c < f.cols; ++c) {
      out[r * f.cols + c] = f.scale * kernels::ref::HashUniform(f.seed, base + c);
    }
  }
  return OkStatus();
}

Status CpuDevice::Add(Tensor a, Tensor b, Tensor out) {
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("Add", {{"a", a, DType::kF32, out.numel},
                                            {"b", b, DType::kF32, out.numel},
                                            {"out", out, DType::kF32, 0}}));
  AUTOPAR_CHECK_ARG(a.numel == out.numel && b.numel == out.numel, "Add: element counts differ");
  const float* pa = a.as<float>();
  const float* pb = b.as<float>();
  float* po = out.as<float>();
  for (std::int64_t i = 0; i < out.numel; ++i) po[i] = pa[i] + pb[i];
  return OkStatus();
}

Status CpuDevice::Axpy(float alpha, Tensor x, Tensor y) {
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("Axpy", {{"x", x, DType::kF32, y.numel}, {"y", y, DType::kF32, 0}}));
  AUTOPAR_CHECK_ARG(x.numel == y.numel, "Axpy: element counts differ");
  const float* px = x.as<float>();
  float* py = y.as<float>();
  for (std::int64_t i = 0; i < y.numel; ++i) py[i] += alpha * px[i];
  return OkStatus();
}

Status CpuDevice::Scale(Tensor x, float alpha) {
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("Scale", {{"x", x, DType::kF32, 0}}));
  float* px = x.as<float>();
  for (std::int64_t i = 0; i < x.numel; ++i) px[i] *= alpha;
  return OkStatus();
}

Status CpuDevice::SumSquares(Tensor x, Tensor sum) {
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("SumSquares", {{"x", x, DType::kF32, 0}, {"sum", sum, DType::kF32, 1}}));
  const float* px = x.as<float>();
  double acc = 0.0;
  for (std::int64_t i = 0; i < x.numel; ++i) acc += double{px[i]} * double{px[i]};
  sum.as<float>()[0] += static_cast<float>(acc);
  return OkStatus();
}

Status CpuDevice::CheckFinite(Tensor x) {
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("CheckFinite", {{"x", x, DType::kF32, 0}}));
  const float* px = x.as<float>();
  for (std::int64_t i = 0; i < x.numel; ++i) {
    if (!std::isfinite(px[i])) {
      return Status::Error(Outcome::kNonfinite,
                           "element " + std::to_string(i) + " of " + std::to_string(x.numel) +
                               " is " + std::to_string(px[i]),
                           __FILE__, __LINE__);
    }
  }
  return OkStatus();
}

Status CpuDevice::DropoutAdd(const DropoutDesc& d, Tensor x, Tensor residual, Tensor out,
                             Tensor mask) {
  AUTOPAR_RETURN_IF_ERROR(CheckDropout("DropoutAdd", d));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("DropoutAdd", {{"x", x, DType::kF32, out.numel},
                                                   {"residual", residual, DType::kF32, out.numel},
                                                   {"out", out, DType::kF32, 0},
                                                   {"mask", mask, DType::kU8, out.numel}}));
  const std::uint32_t threshold = kernels::ref::DropoutThreshold(d.p);
  const float scale = kernels::ref::DropoutScale(d.p);
  const float* px = x.as<float>();
  const float* pr = residual.as<float>();
  float* po = out.as<float>();
  auto* pm = static_cast<std::uint8_t*>(mask.data);
  for (std::int64_t i = 0; i < out.numel; ++i) {
    const bool keep = kernels::ref::DropoutKeeps(d.seed, static_cast<std::uint64_t>(i), threshold);
    pm[i] = keep ? 1 : 0;
    po[i] = pr[i] + (keep ? px[i] * scale : 0.0f);
  }
  return OkStatus();
}

Status CpuDevice::DropoutBackward(const DropoutDesc& d, Tensor dy, Tensor mask, Tensor dx) {
  AUTOPAR_RETURN_IF_ERROR(CheckDropout("DropoutBackward", d));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("DropoutBackward", {{"dy", dy, DType::kF32, dx.numel},
                                                        {"mask", mask, DType::kU8, dx.numel},
                                                        {"dx", dx, DType::kF32, 0}}));
  const float scale = kernels::ref::DropoutScale(d.p);
  const float* pd = dy.as<float>();
  const auto* pm = static_cast<const std::uint8_t*>(mask.data);
  float* po = dx.as<float>();
  for (std::int64_t i = 0; i < dx.numel; ++i) po[i] = pm[i] != 0 ? pd[i] * scale : 0.0f;
  return OkStatus();
}

Status CpuDevice::Gemm(const GemmDesc& desc, Tensor a, Tensor b, Tensor c) {
  AUTOPAR_ASSIGN_OR_RETURN(const GemmDesc d, ResolveGemm(desc, a, b, c, DType::kF32));
  AUTOPAR_CHECK_ARG(FitsBlasInt(d.m) && FitsBlasInt(d.n) && FitsBlasInt(d.k) &&
                        FitsBlasInt(d.lda) && FitsBlasInt(d.ldb) && FitsBlasInt(d.ldc),
                    "Gemm: a dimension exceeds the 32-bit BLAS interface");
  if (d.m == 0 || d.n == 0) return OkStatus();
  const float* pa = a.as<float>();
  const float* pb = b.as<float>();
  float* pc = c.as<float>();
  for (std::int64_t i = 0; i < d.batch; ++i) {
    // BLAS leaves C unread when beta == 0 (reference BLAS contract; OpenBLAS zero-fills).
    cblas_sgemm(CblasRowMajor, d.trans_a ? CblasTrans : CblasNoTrans,
                d.trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(d.m), static_cast<int>(d.n),
                static_cast<int>(d.k), d.alpha, pa + i * d.stride_a, static_cast<int>(d.lda),
                pb + i * d.stride_b, static_cast<int>(d.ldb), d.beta, pc + i * d.stride_c,
                static_cast<int>(d.ldc));
  }
  return OkStatus();
}

}  // namespace autopar::device
