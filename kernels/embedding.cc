#include "kernels/embedding.h"

namespace autopar::kernels::ref {

template <typename T>
void EmbeddingForward(const T* table, const std::int32_t* ids, std::int64_t tokens,
                      std::int64_t hidden, std::int64_t vocab, std::int64_t vocab_start, T* out) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t local = std::int64_t{ids[t]} - vocab_start;
    const bool mine = local >= 0 && local < vocab;
    for (std::int64_t i = 0; i < hidden; ++i) {
      out[t * hidden + i] = mine ? table[local * hidden + i] : T{0};
    }
  }
}

template <typename T>
void EmbeddingBackward(const T* dout, const std::int32_t* ids, std::int64_t tokens,
                       std::int64_t hidden, std::int64_t vocab, std::int64_t vocab_start,
                       T* dtable) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t local = std::int64_t{ids[t]} - vocab_start;
    if (local < 0 || local >= vocab) continue;
    for (std::int64_t i = 0; i < hidden; ++i) dtable[local * hidden + i] += dout[t * hidden + i];
  }
}

template void EmbeddingForward<float>(const float*, const std::int32_t*, std::int64_t, std::int64_t,
                                      std::int64_t, std::int64_t, float*);
template void EmbeddingForward<double>(const double*, const std::int32_t*, std::int64_t,
                                       std::int64_t, std::int64_t, std::int64_t, double*);
template void EmbeddingBackward<float>(const float*, const std::int32_t*, std::int64_t,
                                       std::int64_t, std::int64_t, std::int64_t, float*);
template void EmbeddingBackward<double>(const double*, const std::int32_t*, std::int64_t,
                                        std::int64_t, std::int64_t, std::int64_t, double*);

}  // namespace autopar::kernels::ref
