// The CPU device: host memory under a budget, fp32 compute, OpenBLAS GEMMs, the host reference
// kernels for pointwise and row-wise ops, and a blockwise (flash-style) attention.
#pragma once

#include <cstdint>
#include <string_view>

#include "autopar/device/device.h"
#include "autopar/device/platform.h"

namespace autopar::device {

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(const CpuPlatformOptions& options);

  std::string_view name() const override { return "cpu"; }
  DType compute_dtype() const override { return DType::kF32; }
  Status Synchronize() override { return OkStatus(); }  // ops complete before returning

  Status CopyFromHost(Tensor dst, const void* src, std::size_t bytes) override;
  Status CopyToHost(void* dst, Tensor src, std::size_t bytes) override;
  Status Copy(Tensor dst, Tensor src) override;
  Status CopyRows(Tensor dst, std::int64_t dst_stride, Tensor src, std::int64_t src_stride,
                  std::int64_t rows, std::int64_t cols) override;
  Status Fill(Tensor x, float value) override;
  Status FillHash(Tensor x, const HashFill& fill) override;
  Status Add(Tensor a, Tensor b, Tensor out) override;
  Status Axpy(float alpha, Tensor x, Tensor y) override;
  Status Scale(Tensor x, float alpha) override;
  Status SumSquares(Tensor x, Tensor sum) override;
  Status CheckFinite(Tensor x) override;
  Status DropoutAdd(const DropoutDesc& d, Tensor x, Tensor residual, Tensor out,
                    Tensor mask) override;
  Status DropoutBackward(const DropoutDesc& d, Tensor dy, Tensor mask, Tensor dx) override;

  Status Gemm(const GemmDesc& desc, Tensor a, Tensor b, Tensor c) override;

  Status RmsNormForward(const NormDesc& d, Tensor x, Tensor gamma, Tensor y, Tensor rstd) override;
  Status RmsNormBackward(const NormDesc& d, Tensor dy, Tensor x, Tensor gamma, Tensor rstd,
                         Tensor dx, Tensor dgamma) override;
  Status LayerNormForward(const NormDesc& d, Tensor x, Tensor gamma, Tensor beta, Tensor y,
                          Tensor mean, Tensor rstd) override;
  Status LayerNormBackward(const NormDesc& d, Tensor dy, Tensor x, Tensor gamma, Tensor mean,
                           Tensor rstd, Tensor dx, Tensor dgamma, Tensor dbeta) override;
  Status RopeForward(const RopeDesc& d, Tensor x, Tensor y) override;
  Status RopeBackward(const RopeDesc& d, Tensor dy, Tensor dx) override;
  Status SwiGluForward(std::int64_t rows, std::int64_t ffn, Tensor x, Tensor y) override;
  Status SwiGluBackward(std::int64_t rows, std::int64_t ffn, Tensor dy, Tensor x,
                        Tensor dx) override;
  Status GeluForward(Tensor x, Tensor y) override;
  Status GeluBackward(Tensor dy, Tensor x, Tensor dx) override;

  Status AttentionForward(const AttentionDesc& d, Tensor q, Tensor k, Tensor v, Tensor out,
                          Tensor lse) override;
  Status AttentionBackward(const AttentionDesc& d, Tensor q, Tensor k, Tensor v, Tensor out,
                           Tensor dout, Tensor lse, Tensor dq, Tensor dk, Tensor dv,
                           bool accumulate) override;
  Status AttentionMerge(std::int64_t rows, std::int64_t head_dim, Tensor out, Tensor lse,
                        Tensor part_out, Tensor part_lse) override;

  Status CrossEntropyMax(const CrossEntropyDesc& d, Tensor logits, Tensor row_max) override;
  Status CrossEntropyPartials(const CrossEntropyDesc& d, Tensor logits, Tensor targets,
                              Tensor row_max, Tensor partials) override;
  Status CrossEntropyLoss(const CrossEntropyDesc& d, Tensor row_max, Tensor partials,
                          Tensor loss) override;
  Status CrossEntropyBackward(const CrossEntropyDesc& d, Tensor logits, Tensor targets,
                              Tensor row_max, Tensor partials, Tensor dloss,
                              Tensor dlogits) override;

  Status EmbeddingForward(const EmbeddingDesc& d, Tensor table, Tensor ids, Tensor out) override;
  Status EmbeddingBackward(const EmbeddingDesc& d, Tensor dout, Tensor ids, Tensor dtable) override;

  Status AdamStep(const AdamParams& p, Tensor master, Tensor grad, Tensor exp_avg,
                  Tensor exp_avg_sq, Tensor model) override;

 protected:
  StatusOr<void*> AllocateRaw(std::size_t bytes) override;
  void FreeRaw(void* data, std::size_t bytes) override;

 private:
  std::int64_t block_q_;
  std::int64_t block_kv_;
};

}  // namespace autopar::device
