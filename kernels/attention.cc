#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace autopar::kernels::ref {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Offsets of (s, b, head) rows in the three layouts.
struct Index {
  const AttentionShape& shape;
  std::int64_t q(std::int64_t s, std::int64_t b, std::int64_t h) const {
    return (s * shape.batch + b) * shape.resolved_q_stride() + h * shape.head_dim;
  }
  std::int64_t kv(std::int64_t s, std::int64_t b, std::int64_t h) const {
    return (s * shape.batch + b) * shape.resolved_kv_stride() + h * shape.head_dim;
  }
  std::int64_t o(std::int64_t s, std::int64_t b, std::int64_t h) const {
    return ((s * shape.batch + b) * shape.heads_q + h) * shape.head_dim;
  }
  std::int64_t stat(std::int64_t s, std::int64_t b, std::int64_t h) const {
    return (s * shape.batch + b) * shape.heads_q + h;
  }
};

// Scaled scores of query row i against every key, -inf where masked.
template <typename T>
void Scores(const AttentionShape& shape, const T* q, const T* k, std::int64_t b, std::int64_t h,
            std::int64_t i, std::vector<double>* scores) {
  const Index idx{shape};
  const std::int64_t g = h / (shape.heads_q / shape.heads_kv);
  const double scale = shape.resolved_scale();
  for (std::int64_t j = 0; j < shape.seq_kv; ++j) {
    if (!shape.visible(i, j)) {
      (*scores)[j] = kNegInf;
      continue;
    }
    double dot = 0.0;
    for (std::int64_t d = 0; d < shape.head_dim; ++d) {
      dot += double{q[idx.q(i, b, h) + d]} * double{k[idx.kv(j, b, g) + d]};
    }
    (*scores)[j] = dot * scale;
  }
}

}  // namespace

double AttentionShape::resolved_scale() const {
  return scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

template <typename T>
void AttentionForward(const AttentionShape& shape, const T* q, const T* k, const T* v, T* out,
                      T* lse) {
  const Index idx{shape};
  const std::int64_t group = shape.heads_q / shape.heads_kv;
  std::vector<double> scores(static_cast<std::size_t>(shape.seq_kv));
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    for (std::int64_t h = 0; h < shape.heads_q; ++h) {
      for (std::int64_t i = 0; i < shape.seq_q; ++i) {
        Scores(shape, q, k, b, h, i, &scores);
        const double m = *std::max_element(scores.begin(), scores.end());
        T* o = out + idx.o(i, b, h);
        if (m == kNegInf) {  // no visible key
          std::fill(o, o + shape.head_dim, T{0});
          lse[idx.stat(i, b, h)] = static_cast<T>(kNegInf);
          continue;
        }
        double sum = 0.0;
        for (double s : scores) sum += std::exp(s - m);
        for (std::int64_t d = 0; d < shape.head_dim; ++d) {
          double acc = 0.0;
          for (std::int64_t j = 0; j < shape.seq_kv; ++j) {
            acc += std::exp(scores[j] - m) * double{v[idx.kv(j, b, h / group) + d]};
          }
          o[d] = static_cast<T>(acc / sum);
        }
        lse[idx.stat(i, b, h)] = static_cast<T>(m + std::log(sum));
      }
    }
  }
}

template <typename T>
void AttentionBackward(const AttentionShape& shape, const T* q, const T* k, const T* v,
                       const T* out, const T* dout, const T* lse, T* dq, T* dk, T* dv) {
  const Index idx{shape};
  const std::int64_t group = shape.heads_q / shape.heads_kv;
  const std::int64_t dim = shape.head_dim;
  const double scale = shape.resolved_scale();
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    for (std::int64_t s = 0; s < shape.seq_q; ++s) {
      for (std::int64_t h = 0; h < shape.heads_q; ++h) std::fill_n(dq + idx.q(s, b, h), dim, T{0});
    }
    for (std::int64_t s = 0; s < shape.seq_kv; ++s) {
      for (std::int64_t g = 0; g < shape.heads_kv; ++g) {
        std::fill_n(dk + idx.kv(s, b, g), dim, T{0});
        std::fill_n(dv + idx.kv(s, b, g), dim, T{0});
      }
    }
  }
  std::vector<double> scores(static_cast<std::size_t>(shape.seq_kv));
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    for (std::int64_t h = 0; h < shape.heads_q; ++h) {
      const std::int64_t g = h / group;
      for (std::int64_t i = 0; i < shape.seq_q; ++i) {
        const double row_lse = lse[idx.stat(i, b, h)];
        if (row_lse == kNegInf) continue;  // saw no key: no gradient flows
        Scores(shape, q, k, b, h, i, &scores);
        const T* o = out + idx.o(i, b, h);
        const T* dout_i = dout + idx.o(i, b, h);
        // D_i = dout_i . out_i equals sum_j P_ij dP_ij, the softmax backward's row term.
        double delta = 0.0;
        for (std::int64_t d = 0; d < dim; ++d) delta += double{dout_i[d]} * double{o[d]};
        for (std::int64_t j = 0; j < shape.seq_kv; ++j) {
          if (scores[j] == kNegInf) continue;
          const double p = std::exp(scores[j] - row_lse);
          double dp = 0.0;
          for (std::int64_t d = 0; d < dim; ++d) {
            dp += double{dout_i[d]} * double{v[idx.kv(j, b, g) + d]};
          }
          const double ds = p * (dp - delta) * scale;
          for (std::int64_t d = 0; d < dim; ++d) {
            dv[idx.kv(j, b, g) + d] += static_cast<T>(p * double{dout_i[d]});
            dq[idx.q(i, b, h) + d] += static_cast<T>(ds * double{k[idx.kv(j, b, g) + d]});
            dk[idx.kv(j, b, g) + d] += static_cast<T>(ds * double{q[idx.q(i, b, h) + d]});
          }
        }
      }
    }
  }
}

template <typename T>
void AttentionMerge(std::int64_t rows, std::int64_t head_dim, T* out, T* lse, const T* part_out,
                    const T* part_lse) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const double a = lse[r];
    const double b = part_lse[r];
    const double m = std::max(a, b);
    if (m == kNegInf) continue;  // both empty
    const double wa = std::exp(a - m);
    const double wb = std::exp(b - m);
    const double total = wa + wb;
    for (std::int64_t d = 0; d < head_dim; ++d) {
      out[r * head_dim + d] = static_cast<T>(
          (wa * double{out[r * head_dim + d]} + wb * double{part_out[r * head_dim + d]}) / total);
    }
    lse[r] = static_cast<T>(m + std::log(total));
  }
}

#define AUTOPAR_INSTANTIATE_ATTENTION(T)                                                          \
  template void AttentionForward<T>(const AttentionShape&, const T*, const T*, const T*, T*, T*); \
  template void AttentionBackward<T>(const AttentionShape&, const T*, const T*, const T*,         \
                                     const T*, const T*, const T*, T*, T*, T*);                   \
  template void AttentionMerge<T>(std::int64_t, std::int64_t, T*, T*, const T*, const T*);
AUTOPAR_INSTANTIATE_ATTENTION(float)
AUTOPAR_INSTANTIATE_ATTENTION(double)
#undef AUTOPAR_INSTANTIATE_ATTENTION

}  // namespace autopar::kernels::ref
