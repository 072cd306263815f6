// Host-side launchers of the CUDA kernels in kernels/*.cu.
//
// Each launcher enqueues its kernels on `stream` and returns the launch status (cudaGetLastError),
// so a bad configuration is reported at the call; faults while running surface at the next
// synchronisation. Launchers do not validate shapes or sizes: the CUDA device checks its
// arguments (src/device/validate.h) before calling them. A count of zero launches nothing.
//
// Every kernel has a host reference in autopar::kernels::ref with the same semantics; see the
// matching header (norms.h, rope.h, ...). Data of the "compute" class are float or bf16 in
// memory (Storage), always float in arithmetic; statistics and gradients of parameters are float.
// This header needs only the CUDA runtime API, so plain C++ code can include it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace autopar::kernels::cuda {

enum class Storage : std::uint8_t { kF32, kBF16 };

// ---- elementwise.cu ----
cudaError_t Fill(cudaStream_t stream, Storage t, void* x, std::int64_t n, float value);
// Element (r, c) of a [rows, cols] block = scale * ref::HashUniform(seed,
// (row_offset + r) * global_cols + col_offset + c), bit-identical to the host.
cudaError_t FillHash(cudaStream_t stream, Storage t, void* x, std::uint64_t seed, float scale,
                     std::int64_t rows, std::int64_t cols, std::int64_t global_cols,
                     std::int64_t row_offset, std::int64_t col_offset);
// dst = src converted (round to nearest even into bf16).
cudaError_t Convert(cudaStream_t stream, Storage dst_t, void* dst, Storage src_t, const void* src,
                    std::int64_t n);
cudaError_t Add(cudaStream_t stream, Storage t, const void* a, const void* b, void* out,
                std::int64_t n);
cudaError_t Axpy(cudaStream_t stream, Storage t, float alpha, const void* x, void* y,
                 std::int64_t n);
cudaError_t Scale(cudaStream_t stream, Storage t, void* x, std::int64_t n, float alpha);
// Hidden dropout: out[i] = residual[i] + (keep ? x[i]·scale : 0), mask[i] = keep (u8), keep =
// ref::DropoutKeeps(seed, i, threshold); and dx[i] = mask[i] ? dy[i]·scale : 0. Bit-identical to
// CpuDevice::DropoutAdd / DropoutBackward in f32 (no fused multiply-add).
cudaError_t DropoutAdd(cudaStream_t stream, Storage t, const void* x, const void* residual,
                       void* out, std::uint8_t* mask, std::int64_t n, std::uint64_t seed,
                       std::uint32_t threshold, float scale);
cudaError_t DropoutBackward(cudaStream_t stream, Storage t, const void* dy,
                            const std::uint8_t* mask, void* dx, std::int64_t n, float scale);
// c[i] = beta * c[i] over a strided batch of [rows, cols] matrices (beta == 0 writes zeros, so
// garbage in c does not survive): a GEMM with k == 0.
cudaError_t ScaleMatrix(cudaStream_t stream, Storage t, void* c, std::int64_t batch,
                        std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t stride,
                        float beta);
// sum[0] += sum of x^2 in double, in a fixed order (deterministic); `partials` is scratch of
// kSumSquaresPartials doubles.
inline constexpr int kSumSquaresPartials = 1024;
cudaError_t SumSquares(cudaStream_t stream, Storage t, const void* x, std::int64_t n, float* sum,
                       double* partials);
// *first_bad = index of the first non-finite element, or UINT64_MAX when all are finite.
cudaError_t FindNonfinite(cudaStream_t stream, Storage t, const void* x, std::int64_t n,
                          unsigned long long* first_bad);

// ---- norms.cu (ref::NormLayout semantics; strides resolved. x, gamma, beta, y, dy, dx: Storage t;
// statistics, rows * vectors of them, and dgamma/dbeta: float) ----
struct NormArgs {
  std::int64_t rows, hidden, vectors, x_stride, y_stride;
};
cudaError_t RmsNormForward(cudaStream_t stream, Storage t, const NormArgs& args, const void* x,
                           const void* gamma, float eps, void* y, float* rstd);
// dx may alias dy (the same layout).
cudaError_t RmsNormBackward(cudaStream_t stream, Storage t, const NormArgs& args, const void* dy,
                            const void* x, const void* gamma, const float* rstd, void* dx,
                            float* dgamma);
cudaError_t LayerNormForward(cudaStream_t stream, Storage t, const NormArgs& args, const void* x,
                             const void* gamma, const void* beta, float eps, void* y, float* mean,
                             float* rstd);
cudaError_t LayerNormBackward(cudaStream_t stream, Storage t, const NormArgs& args, const void* dy,
                              const void* x, const void* gamma, const float* mean,
                              const float* rstd, void* dx, float* dgamma, float* dbeta);

// ---- rope.cu (ref::RopeShape semantics; rotary_dim and row_stride resolved) ----
struct RopeArgs {
  std::int64_t seq, batch, heads, head_dim, rotary_dim, position_offset, row_stride;
  double base;
};
// sign +1 rotates forward, -1 backward; y may alias x.
cudaError_t Rope(cudaStream_t stream, Storage t, const RopeArgs& args, const void* x, void* y,
                 double sign);

// ---- activations.cu ----
cudaError_t SwiGluForward(cudaStream_t stream, Storage t, const void* x, std::int64_t rows,
                          std::int64_t ffn, void* y);
cudaError_t SwiGluBackward(cudaStream_t stream, Storage t, const void* dy, const void* x,
                           std::int64_t rows, std::int64_t ffn, void* dx);
cudaError_t GeluForward(cudaStream_t stream, Storage t, const void* x, std::int64_t n, void* y);
cudaError_t GeluBackward(cudaStream_t stream, Storage t, const void* dy, const void* x,
                         std::int64_t n, void* dx);

// ---- attention_*.cu (ref::AttentionShape semantics; scale and strides resolved) ----
struct AttentionArgs {
  std::int64_t batch, heads_q, heads_kv, head_dim, seq_q, seq_kv;
  bool causal;
  std::int64_t q_offset, kv_offset;
  float scale;
  std::int64_t q_stride, kv_stride;
};
// q, k, v, out: Storage t; lse float. `max_smem_bytes` is the device's opt-in shared memory per
// block; the caller has checked PlanAttentionTiles against it.
cudaError_t AttentionForward(cudaStream_t stream, Storage t, const AttentionArgs& args,
                             const void* q, const void* k, const void* v, void* out, float* lse,
                             int max_smem_bytes);
// dq, dk, dv overwritten (accumulate = false) or added to; only their head slots are written.
cudaError_t AttentionBackward(cudaStream_t stream, Storage t, const AttentionArgs& args,
                              const void* q, const void* k, const void* v, const void* out,
                              const void* dout, const float* lse, void* dq, void* dk, void* dv,
                              bool accumulate, int max_smem_bytes);
// out, part_out: Storage t, rows x head_dim; lse, part_lse float.
cudaError_t AttentionMerge(cudaStream_t stream, Storage t, std::int64_t rows, std::int64_t head_dim,
                           void* out, float* lse, const void* part_out, const float* part_lse);

// ---- cross_entropy.cu (logits, dlogits: Storage t; the rest float, targets i32) ----
cudaError_t CrossEntropyMax(cudaStream_t stream, Storage t, const void* logits, std::int64_t rows,
                            std::int64_t vocab, float* row_max);
cudaError_t CrossEntropyPartials(cudaStream_t stream, Storage t, const void* logits,
                                 const std::int32_t* targets, std::int64_t rows, std::int64_t vocab,
                                 std::int64_t vocab_start, const float* row_max, float* partials);
cudaError_t CrossEntropyLoss(cudaStream_t stream, const float* row_max, const float* partials,
                             std::int64_t rows, float* loss);
// dlogits may alias logits.
cudaError_t CrossEntropyBackward(cudaStream_t stream, Storage t, const void* logits,
                                 const std::int32_t* targets, const float* row_max,
                                 const float* partials, const float* dloss, std::int64_t rows,
                                 std::int64_t vocab, std::int64_t vocab_start, void* dlogits);

// ---- embedding.cu (table, out, dout: Storage t; dtable float, +=) ----
cudaError_t EmbeddingForward(cudaStream_t stream, Storage t, const void* table,
                             const std::int32_t* ids, std::int64_t tokens, std::int64_t hidden,
                             std::int64_t vocab, std::int64_t vocab_start, void* out);
cudaError_t EmbeddingBackward(cudaStream_t stream, Storage t, const void* dout,
                              const std::int32_t* ids, std::int64_t tokens, std::int64_t hidden,
                              std::int64_t vocab, std::int64_t vocab_start, float* dtable);

// ---- adam.cu: ref::AdamStep on float state; the per-step scalars come from the host ----
struct AdamScalars {
  float decay;         // 1 - lr * weight_decay
  float beta1, beta2;  // as given
  float one_minus_beta1, one_minus_beta2;
  float step_size;              // lr / (1 - beta1^t)
  float sqrt_bias_correction2;  // sqrt(1 - beta2^t)
  float eps;
  float grad_scale;
};
// model (Storage model_t) receives the updated master converted, unless it is null.
cudaError_t AdamStep(cudaStream_t stream, const AdamScalars& s, std::int64_t n, float* master,
                     const float* grad, float* exp_avg, float* exp_avg_sq, Storage model_t,
                     void* model);

}  // namespace autopar::kernels::cuda
