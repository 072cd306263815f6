// Vocabulary-parallel embedding lookup and its backward (ref: kernels/embedding.h).
//
// The backward scatters token gradients into the fp32 table gradient with atomicAdd: repeated
// ids in a batch hit the same row, and the addition order across them is not fixed.
#include "kernels/cuda_common.cuh"

namespace AUTOPAR_CUDA_KERNELS_NS {
namespace {

template <typename T>
__global__ void EmbeddingForwardKernel(const T* table, const std::int32_t* ids, std::int64_t tokens,
                                       std::int64_t hidden, std::int64_t vocab,
                                       std::int64_t vocab_start, T* out) {
  const std::int64_t n = tokens * hidden;
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const std::int64_t t = i / hidden;
    const std::int64_t c = i % hidden;
    const std::int64_t local = static_cast<std::int64_t>(ids[t]) - vocab_start;
    out[i] = (local >= 0 && local < vocab) ? table[local * hidden + c] : FromFloat<T>(0.0f);
  }
}

template <typename T>
__global__ void EmbeddingBackwardKernel(const T* dout, const std::int32_t* ids, std::int64_t tokens,
                                        std::int64_t hidden, std::int64_t vocab,
                                        std::int64_t vocab_start, float* dtable) {
  const std::int64_t n = tokens * hidden;
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const std::int64_t t = i / hidden;
    const std::int64_t c = i % hidden;
    const std::int64_t local = static_cast<std::int64_t>(ids[t]) - vocab_start;
    if (local >= 0 && local < vocab) atomicAdd(dtable + local * hidden + c, ToFloat(dout[i]));
  }
}

}  // namespace

cudaError_t EmbeddingForward(cudaStream_t stream, Storage t, const void* table,
                             const std::int32_t* ids, std::int64_t tokens, std::int64_t hidden,
                             std::int64_t vocab, std::int64_t vocab_start, void* out) {
  if (tokens <= 0 || hidden <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(EmbeddingForwardKernel<T>, GridFor(tokens * hidden), kThreads, 0, stream,
                  static_cast<const T*>(table), ids, tokens, hidden, vocab, vocab_start,
                  static_cast<T*>(out));
  });
}

cudaError_t EmbeddingBackward(cudaStream_t stream, Storage t, const void* dout,
                              const std::int32_t* ids, std::int64_t tokens, std::int64_t hidden,
                              std::int64_t vocab, std::int64_t vocab_start, float* dtable) {
  if (tokens <= 0 || hidden <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(EmbeddingBackwardKernel<T>, GridFor(tokens * hidden), kThreads, 0, stream,
                  static_cast<const T*>(dout), ids, tokens, hidden, vocab, vocab_start, dtable);
  });
}

}  // namespace AUTOPAR_CUDA_KERNELS_NS
