#include "kernels/cross_entropy.h"

#include <cmath>
#include <limits>

namespace autopar::kernels::ref {

template <typename T>
void CrossEntropyMax(const T* logits, std::int64_t rows, std::int64_t vocab, T* row_max) {
  for (std::int64_t r = 0; r < rows; ++r) {
    T m = -std::numeric_limits<T>::infinity();
    for (std::int64_t j = 0; j < vocab; ++j)
      m = logits[r * vocab + j] > m ? logits[r * vocab + j] : m;
    row_max[r] = m;
  }
}

template <typename T>
void CrossEntropyPartials(const T* logits, const std::int32_t* targets, std::int64_t rows,
                          std::int64_t vocab, std::int64_t vocab_start, const T* row_max,
                          T* partials) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* lr = logits + r * vocab;
    double sum_exp = 0.0;
    for (std::int64_t j = 0; j < vocab; ++j)
      sum_exp += std::exp(double{lr[j]} - double{row_max[r]});
    const std::int64_t local = std::int64_t{targets[r]} - vocab_start;
    partials[r] = static_cast<T>(sum_exp);
    partials[rows + r] = (local >= 0 && local < vocab) ? lr[local] : T{0};
  }
}

template <typename T>
void CrossEntropyLoss(const T* row_max, const T* partials, std::int64_t rows, T* loss) {
  for (std::int64_t r = 0; r < rows; ++r) {
    loss[r] = static_cast<T>(double{row_max[r]} + std::log(double{partials[r]}) -
                             double{partials[rows + r]});
  }
}

template <typename T>
void CrossEntropyBackward(const T* logits, const std::int32_t* targets, const T* row_max,
                          const T* partials, const T* dloss, std::int64_t rows, std::int64_t vocab,
                          std::int64_t vocab_start, T* dlogits) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t local = std::int64_t{targets[r]} - vocab_start;
    const double inv_sum = 1.0 / double{partials[r]};
    const double d = dloss[r];
    for (std::int64_t j = 0; j < vocab; ++j) {
      const double p = std::exp(double{logits[r * vocab + j]} - double{row_max[r]}) * inv_sum;
      dlogits[r * vocab + j] = static_cast<T>(d * (j == local ? p - 1.0 : p));
    }
  }
}

#define AUTOPAR_INSTANTIATE_CROSS_ENTROPY(T)                                                       \
  template void CrossEntropyMax<T>(const T*, std::int64_t, std::int64_t, T*);                      \
  template void CrossEntropyPartials<T>(const T*, const std::int32_t*, std::int64_t, std::int64_t, \
                                        std::int64_t, const T*, T*);                               \
  template void CrossEntropyLoss<T>(const T*, const T*, std::int64_t, T*);                         \
  template void CrossEntropyBackward<T>(const T*, const std::int32_t*, const T*, const T*,         \
                                        const T*, std::int64_t, std::int64_t, std::int64_t, T*);
AUTOPAR_INSTANTIATE_CROSS_ENTROPY(float)
AUTOPAR_INSTANTIATE_CROSS_ENTROPY(double)
#undef AUTOPAR_INSTANTIATE_CROSS_ENTROPY

}  // namespace autopar::kernels::ref
