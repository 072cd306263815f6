// Vocabulary-parallel softmax cross-entropy in per-row pieces (ref: kernels/cross_entropy.h).
//
// The row reductions (max, sum of exponentials) run one block per row; the loss and the gradient
// are elementwise. Sums are float: each thread adds ~vocab/256 terms no larger than 1, then a
// tree, which keeps the relative error near 1e-6 for any vocabulary shard.
#include "kernels/cuda_common.cuh"

namespace AUTOPAR_CUDA_KERNELS_NS {
namespace {

template <typename T>
__global__ void CrossEntropyMaxKernel(const T* logits, std::int64_t vocab, float* row_max) {
  __shared__ float scratch[kThreads / kWarpSize];
  const std::int64_t row = blockIdx.x;
  const T* lr = logits + row * vocab;
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) m = fmaxf(m, ToFloat(lr[j]));
  m = BlockMax(m, scratch);
  if (threadIdx.x == 0) row_max[row] = m;
}

template <typename T>
__global__ void CrossEntropyPartialsKernel(const T* logits, const std::int32_t* targets,
                                           std::int64_t rows, std::int64_t vocab,
                                           std::int64_t vocab_start, const float* row_max,
                                           float* partials) {
  __shared__ float scratch[kThreads / kWarpSize];
  const std::int64_t row = blockIdx.x;
  const T* lr = logits + row * vocab;
  const float m = row_max[row];
  float sum = 0.0f;
  for (std::int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(ToFloat(lr[j]) - m);
  sum = BlockSum(sum, scratch);
  if (threadIdx.x == 0) {
    const std::int64_t local = static_cast<std::int64_t>(targets[row]) - vocab_start;
    partials[row] = sum;
    partials[rows + row] = (local >= 0 && local < vocab) ? ToFloat(lr[local]) : 0.0f;
  }
}

__global__ void CrossEntropyLossKernel(const float* row_max, const float* partials,
                                       std::int64_t rows, float* loss) {
  for (std::int64_t r = GlobalThread(); r < rows; r += GridThreads()) {
    loss[r] = row_max[r] + logf(partials[r]) - partials[rows + r];
  }
}

// Each element is read and then written by the same thread, so dlogits may alias logits.
template <typename T>
__global__ void CrossEntropyBackwardKernel(const T* logits, const std::int32_t* targets,
                                           const float* row_max, const float* partials,
                                           const float* dloss, std::int64_t rows,
                                           std::int64_t vocab, std::int64_t vocab_start,
                                           T* dlogits) {
  const std::int64_t n = rows * vocab;
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const std::int64_t r = i / vocab;
    const std::int64_t j = i % vocab;
    const std::int64_t local = static_cast<std::int64_t>(targets[r]) - vocab_start;
    const float p = expf(ToFloat(logits[i]) - row_max[r]) * (1.0f / partials[r]);
    dlogits[i] = FromFloat<T>(dloss[r] * (j == local ? p - 1.0f : p));
  }
}

}  // namespace

cudaError_t CrossEntropyMax(cudaStream_t stream, Storage t, const void* logits, std::int64_t rows,
                            std::int64_t vocab, float* row_max) {
  if (rows <= 0 || vocab <= 0) return cudaSuccess;
  if (!FitsGridX(rows)) return cudaErrorInvalidConfiguration;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(CrossEntropyMaxKernel<T>, static_cast<unsigned>(rows), kThreads, 0, stream,
                  static_cast<const T*>(logits), vocab, row_max);
  });
}

cudaError_t CrossEntropyPartials(cudaStream_t stream, Storage t, const void* logits,
                                 const std::int32_t* targets, std::int64_t rows, std::int64_t vocab,
                                 std::int64_t vocab_start, const float* row_max, float* partials) {
  if (rows <= 0 || vocab <= 0) return cudaSuccess;
  if (!FitsGridX(rows)) return cudaErrorInvalidConfiguration;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(CrossEntropyPartialsKernel<T>, static_cast<unsigned>(rows), kThreads, 0, stream,
                  static_cast<const T*>(logits), targets, rows, vocab, vocab_start, row_max,
                  partials);
  });
}

cudaError_t CrossEntropyLoss(cudaStream_t stream, const float* row_max, const float* partials,
                             std::int64_t rows, float* loss) {
  if (rows <= 0) return cudaSuccess;
  return Launch(CrossEntropyLossKernel, GridFor(rows), kThreads, 0, stream, row_max, partials, rows,
                loss);
}

cudaError_t CrossEntropyBackward(cudaStream_t stream, Storage t, const void* logits,
                                 const std::int32_t* targets, const float* row_max,
                                 const float* partials, const float* dloss, std::int64_t rows,
                                 std::int64_t vocab, std::int64_t vocab_start, void* dlogits) {
  if (rows <= 0 || vocab <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(CrossEntropyBackwardKernel<T>, GridFor(rows * vocab), kThreads, 0, stream,
                  static_cast<const T*>(logits), targets, row_max, partials, dloss, rows, vocab,
                  vocab_start, static_cast<T*>(dlogits));
  });
}

}  // namespace AUTOPAR_CUDA_KERNELS_NS
