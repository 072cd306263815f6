// Backward of every reference kernel against central finite differences, in double precision so
// the check is tight (step 1e-6, truncation and rounding errors ~1e-9).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <ostream>
#include <vector>

#include "kernels/activations.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/init.h"
#include "kernels/norms.h"
#include "kernels/rope.h"

namespace autopar::kernels::ref {
namespace {

using Vec = std::vector<double>;

Vec Random(std::uint64_t seed, std::size_t n, double scale = 1.0, double shift = 0.0) {
  Vec v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = shift + scale * HashUniform(seed, i);
  return v;
}

double Dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// d loss / d x_j by central differences, for the indices in `which` (all when empty).
Vec NumericGrad(Vec x, const std::function<double(const Vec&)>& loss,
                const std::vector<std::size_t>& which = {}) {
  constexpr double kStep = 1e-6;
  Vec grad(x.size(), 0.0);
  auto one = [&](std::size_t j) {
    const double saved = x[j];
    x[j] = saved + kStep;
    const double up = loss(x);
    x[j] = saved - kStep;
    const double down = loss(x);
    x[j] = saved;
    grad[j] = (up - down) / (2 * kStep);
  };
  if (which.empty()) {
    for (std::size_t j = 0; j < x.size(); ++j) one(j);
  } else {
    for (std::size_t j : which) one(j);
  }
  return grad;
}

void ExpectNear(const Vec& actual, const Vec& expected, double tol, const char* what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], tol * (1.0 + std::abs(expected[i])))
        << what << "[" << i << "]";
  }
}

TEST(KernelsGradcheck, RmsNorm) {
  const std::int64_t rows = 3, hidden = 8;
  const double eps = 1e-5;
  const Vec x = Random(1, rows * hidden), gamma = Random(2, hidden, 0.2, 1.0);
  const Vec w = Random(3, rows * hidden);
  auto forward = [&](const Vec& xx, const Vec& gg) {
    Vec y(xx.size()), rstd(rows);
    RmsNormForward(xx.data(), gg.data(), rows, hidden, eps, y.data(), rstd.data());
    return Dot(w, y);
  };
  Vec y(x.size()), rstd(rows), dx(x.size()), dgamma(hidden, 0.5);
  RmsNormForward(x.data(), gamma.data(), rows, hidden, eps, y.data(), rstd.data());
  RmsNormBackward(w.data(), x.data(), gamma.data(), rstd.data(), rows, hidden, dx.data(),
                  dgamma.data());
  ExpectNear(dx, NumericGrad(x, [&](const Vec& v) { return forward(v, gamma); }), 1e-7, "dx");
  Vec expected = NumericGrad(gamma, [&](const Vec& v) { return forward(x, v); });
  for (double& e : expected) e += 0.5;  // dgamma accumulates onto its initial value
  ExpectNear(dgamma, expected, 1e-7, "dgamma");
}

TEST(KernelsGradcheck, LayerNorm) {
  const std::int64_t rows = 3, hidden = 8;
  const double eps = 1e-5;
  const Vec x = Random(4, rows * hidden, 2.0, 0.3), gamma = Random(5, hidden, 0.2, 1.0);
  const Vec beta = Random(6, hidden, 0.1), w = Random(7, rows * hidden);
  auto forward = [&](const Vec& xx, const Vec& gg, const Vec& bb) {
    Vec y(xx.size()), mean(rows), rstd(rows);
    LayerNormForward(xx.data(), gg.data(), bb.data(), rows, hidden, eps, y.data(), mean.data(),
                     rstd.data());
    return Dot(w, y);
  };
  Vec y(x.size()), mean(rows), rstd(rows), dx(x.size()), dgamma(hidden, 0.0), dbeta(hidden, 0.0);
  LayerNormForward(x.data(), gamma.data(), beta.data(), rows, hidden, eps, y.data(), mean.data(),
                   rstd.data());
  LayerNormBackward(w.data(), x.data(), gamma.data(), mean.data(), rstd.data(), rows, hidden,
                    dx.data(), dgamma.data(), dbeta.data());
  ExpectNear(dx, NumericGrad(x, [&](const Vec& v) { return forward(v, gamma, beta); }), 1e-7, "dx");
  ExpectNear(dgamma, NumericGrad(gamma, [&](const Vec& v) { return forward(x, v, beta); }), 1e-7,
             "dgamma");
  ExpectNear(dbeta, NumericGrad(beta, [&](const Vec& v) { return forward(x, gamma, v); }), 1e-7,
             "dbeta");
}

// Norms per head inside fused rows (qk-layernorm): 2 rows of 3 vectors of 4, x rows 14 apart and
// y (dy, dx) rows 17 apart. dx lies in y's layout; x's padding gets no gradient and dx's padding
// is not written.
TEST(KernelsGradcheck, StridedNormsOverHeads) {
  const std::int64_t rows = 2, vectors = 3, hidden = 4, x_stride = 14, y_stride = 17;
  const std::int64_t width = vectors * hidden;
  const NormLayout layout{vectors, x_stride, y_stride};
  const double eps = 1e-5;
  const Vec x = Random(10, rows * x_stride, 2.0, 0.3), gamma = Random(11, hidden, 0.2, 1.0);
  const Vec beta = Random(12, hidden, 0.1), w = Random(13, rows * y_stride);
  for (bool layernorm : {false, true}) {
    SCOPED_TRACE(layernorm ? "LayerNorm" : "RMSNorm");
    Vec mean(rows * vectors), rstd(rows * vectors);
    auto forward = [&](const Vec& xx, const Vec& gg, const Vec& bb) {
      Vec y(rows * y_stride, 0.0);
      if (layernorm) {
        LayerNormForward(xx.data(), gg.data(), bb.data(), rows, hidden, eps, y.data(), mean.data(),
                         rstd.data(), layout);
      } else {
        RmsNormForward(xx.data(), gg.data(), rows, hidden, eps, y.data(), rstd.data(), layout);
      }
      return Dot(w, y);
    };
    forward(x, gamma, beta);  // the statistics of x, for the backward
    Vec dx(rows * y_stride, 0.0), dgamma(hidden, 0.0), dbeta(hidden, 0.0);
    if (layernorm) {
      LayerNormBackward(w.data(), x.data(), gamma.data(), mean.data(), rstd.data(), rows, hidden,
                        dx.data(), dgamma.data(), dbeta.data(), layout);
    } else {
      RmsNormBackward(w.data(), x.data(), gamma.data(), rstd.data(), rows, hidden, dx.data(),
                      dgamma.data(), layout);
    }
    const Vec numeric = NumericGrad(x, [&](const Vec& v) { return forward(v, gamma, beta); });
    Vec dx_at_x(x.size(), 0.0);  // dx moved to x's layout, zero on its padding
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < width; ++j) dx_at_x[r * x_stride + j] = dx[r * y_stride + j];
      for (std::int64_t j = width; j < y_stride; ++j) {
        EXPECT_EQ(dx[r * y_stride + j], 0.0) << "dx's padding at row " << r << ", " << j;
      }
    }
    ExpectNear(dx_at_x, numeric, 1e-7, "dx");
    ExpectNear(dgamma, NumericGrad(gamma, [&](const Vec& v) { return forward(x, v, beta); }), 1e-7,
               "dgamma");
    if (layernorm) {
      ExpectNear(dbeta, NumericGrad(beta, [&](const Vec& v) { return forward(x, gamma, v); }), 1e-7,
                 "dbeta");
    }
  }
}

TEST(KernelsGradcheck, RopePartialRotaryStridedWithOffset) {
  RopeShape shape;
  shape.seq = 3;
  shape.batch = 2;
  shape.heads = 2;
  shape.head_dim = 8;
  shape.rotary_dim = 6;  // the last two features pass through
  shape.position_offset = 5;
  shape.row_stride = shape.heads * shape.head_dim + 4;  // padding as in a fused QKV row
  const std::size_t n = static_cast<std::size_t>(shape.seq * shape.batch * shape.row_stride);
  const Vec x = Random(8, n), w = Random(9, n);
  std::vector<std::size_t> used;  // the padding is neither read nor written
  for (std::size_t i = 0; i < n; ++i) {
    if (static_cast<std::int64_t>(i) % shape.row_stride < shape.heads * shape.head_dim) {
      used.push_back(i);
    }
  }
  auto loss = [&](const Vec& xx) {
    Vec y(n, 0.0);
    RopeForward(shape, xx.data(), y.data());
    double s = 0.0;
    for (std::size_t i : used) s += w[i] * y[i];
    return s;
  };
  Vec dx(n, 0.0);
  RopeBackward(shape, w.data(), dx.data());
  const Vec numeric = NumericGrad(x, loss, used);
  for (std::size_t i : used) EXPECT_NEAR(dx[i], numeric[i], 1e-7) << i;
}

TEST(KernelsGradcheck, SwiGlu) {
  const std::int64_t rows = 3, ffn = 5;
  const Vec x = Random(10, rows * 2 * ffn, 3.0), w = Random(11, rows * ffn);
  auto loss = [&](const Vec& xx) {
    Vec y(rows * ffn);
    SwiGluForward(xx.data(), rows, ffn, y.data());
    return Dot(w, y);
  };
  Vec dx(x.size());
  SwiGluBackward(w.data(), x.data(), rows, ffn, dx.data());
  ExpectNear(dx, NumericGrad(x, loss), 1e-7, "dx");
}

TEST(KernelsGradcheck, Gelu) {
  const Vec x = Random(12, 40, 4.0), w = Random(13, 40);
  auto loss = [&](const Vec& xx) {
    Vec y(xx.size());
    GeluForward(xx.data(), static_cast<std::int64_t>(xx.size()), y.data());
    return Dot(w, y);
  };
  Vec dx(x.size());
  GeluBackward(w.data(), x.data(), static_cast<std::int64_t>(x.size()), dx.data());
  ExpectNear(dx, NumericGrad(x, loss), 1e-7, "dx");
}

TEST(KernelsGradcheck, CrossEntropyOnAShard) {
  const std::int64_t rows = 4, vocab = 7, vocab_start = 3;
  const std::vector<std::int32_t> targets = {3, 9, 5, 20};  // 20 lives on another shard
  const Vec logits = Random(14, rows * vocab, 3.0), dloss = Random(15, rows, 1.0, 0.5);
  auto loss = [&](const Vec& l) {
    Vec row_max(rows), partials(2 * rows), out(rows);
    CrossEntropyMax(l.data(), rows, vocab, row_max.data());
    CrossEntropyPartials(l.data(), targets.data(), rows, vocab, vocab_start, row_max.data(),
                         partials.data());
    CrossEntropyLoss(row_max.data(), partials.data(), rows, out.data());
    return Dot(dloss, out);
  };
  Vec row_max(rows), partials(2 * rows), dlogits(logits.size());
  CrossEntropyMax(logits.data(), rows, vocab, row_max.data());
  CrossEntropyPartials(logits.data(), targets.data(), rows, vocab, vocab_start, row_max.data(),
                       partials.data());
  CrossEntropyBackward(logits.data(), targets.data(), row_max.data(), partials.data(), dloss.data(),
                       rows, vocab, vocab_start, dlogits.data());
  ExpectNear(dlogits, NumericGrad(logits, loss), 1e-7, "dlogits");
}

struct AttentionCase {
  const char* name;
  AttentionShape shape;
};

// Names the case in failure messages instead of dumping its bytes.
void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }

class KernelsAttentionGradcheck : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(KernelsAttentionGradcheck, MatchesFiniteDifferences) {
  const AttentionShape& s = GetParam().shape;
  const std::size_t nq = static_cast<std::size_t>(s.seq_q * s.batch * s.resolved_q_stride());
  const std::size_t nkv = static_cast<std::size_t>(s.seq_kv * s.batch * s.resolved_kv_stride());
  const std::size_t no = static_cast<std::size_t>(s.seq_q * s.batch * s.heads_q * s.head_dim);
  const std::size_t nstat = static_cast<std::size_t>(s.seq_q * s.batch * s.heads_q);
  const Vec q = Random(20, nq, 1.5), k = Random(21, nkv, 1.5), v = Random(22, nkv);
  const Vec w = Random(23, no);
  auto loss = [&](const Vec& qq, const Vec& kk, const Vec& vv) {
    Vec out(no), lse(nstat);
    AttentionForward(s, qq.data(), kk.data(), vv.data(), out.data(), lse.data());
    return Dot(w, out);
  };
  Vec out(no), lse(nstat), dq(nq, 0.0), dk(nkv, 0.0), dv(nkv, 0.0);
  AttentionForward(s, q.data(), k.data(), v.data(), out.data(), lse.data());
  AttentionBackward(s, q.data(), k.data(), v.data(), out.data(), w.data(), lse.data(), dq.data(),
                    dk.data(), dv.data());
  ExpectNear(dq, NumericGrad(q, [&](const Vec& x) { return loss(x, k, v); }), 1e-6, "dq");
  ExpectNear(dk, NumericGrad(k, [&](const Vec& x) { return loss(q, x, v); }), 1e-6, "dk");
  ExpectNear(dv, NumericGrad(v, [&](const Vec& x) { return loss(q, k, x); }), 1e-6, "dv");
}

AttentionShape Shape(std::int64_t hq, std::int64_t hkv, std::int64_t sq, std::int64_t skv,
                     bool causal, std::int64_t q_offset, std::int64_t kv_offset,
                     std::int64_t q_pad = 0) {
  AttentionShape s;
  s.batch = 2;
  s.heads_q = hq;
  s.heads_kv = hkv;
  s.head_dim = 4;
  s.seq_q = sq;
  s.seq_kv = skv;
  s.causal = causal;
  s.q_offset = q_offset;
  s.kv_offset = kv_offset;
  if (q_pad) {
    s.q_stride = hq * s.head_dim + q_pad;
    s.kv_stride = hkv * s.head_dim + q_pad;
  }
  return s;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, KernelsAttentionGradcheck,
    ::testing::Values(AttentionCase{"causal_gqa", Shape(4, 2, 5, 5, true, 0, 0)},
                      AttentionCase{"full_mqa", Shape(2, 1, 4, 6, false, 0, 0)},
                      AttentionCase{"later_query_chunk", Shape(4, 2, 3, 5, true, 5, 1)},
                      AttentionCase{"masked_rows", Shape(2, 2, 5, 4, true, 0, 2)},
                      AttentionCase{"strided_qkv", Shape(4, 1, 4, 4, true, 0, 0, 3)}),
    [](const ::testing::TestParamInfo<AttentionCase>& param_info) {
      return param_info.param.name;
    });

}  // namespace
}  // namespace autopar::kernels::ref
