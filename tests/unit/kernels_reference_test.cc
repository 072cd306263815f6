// Reference kernels against hand computations and against themselves under sharding: the
// properties the parallel trial runner relies on (vocab shards combine, chunked attention merges,
// strided norms norm each vector as the packed norm does).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/adam.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/init.h"
#include "kernels/norms.h"

namespace autopar::kernels::ref {
namespace {

std::vector<float> Random(std::uint64_t seed, std::size_t n, float scale = 1.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * HashUniform(seed, i);
  return v;
}

std::vector<double> RandomD(std::uint64_t seed, std::size_t n) {
  const std::vector<float> f = Random(seed, n);
  return std::vector<double>(f.begin(), f.end());
}

TEST(KernelsInit, HashUniformIsDeterministicExactAndInRange) {
  for (std::uint64_t i = 0; i < 10000; ++i) {
    const float u = HashUniform(7, i);
    ASSERT_GE(u, -1.0f);
    ASSERT_LT(u, 1.0f);
    const float scaled = (u + 1.0f) * 8388608.0f;  // an integer in [0, 2^24) by construction
    ASSERT_EQ(scaled, std::floor(scaled));
    ASSERT_EQ(u, HashUniform(7, i));
  }
  EXPECT_NE(HashUniform(7, 0), HashUniform(8, 0));
  EXPECT_NE(HashUniform(7, 0), HashUniform(7, 1));
}

TEST(KernelsCrossEntropy, HandComputedLoss) {
  // Row 0: logits {0, 0}, target 0 -> ln 2. Row 1: {ln 3, 0}, target 1 -> ln 4.
  const std::vector<float> logits = {0.0f, 0.0f, std::log(3.0f), 0.0f};
  const std::vector<std::int32_t> targets = {0, 1};
  std::vector<float> row_max(2), partials(4), loss(2);
  CrossEntropyMax(logits.data(), 2, 2, row_max.data());
  CrossEntropyPartials(logits.data(), targets.data(), 2, 2, 0, row_max.data(), partials.data());
  CrossEntropyLoss(row_max.data(), partials.data(), 2, loss.data());
  EXPECT_NEAR(loss[0], std::log(2.0f), 1e-6);
  EXPECT_NEAR(loss[1], std::log(4.0f), 1e-6);
}

TEST(KernelsCrossEntropy, TwoVocabShardsCombineToTheUnshardedLoss) {
  const std::int64_t rows = 6, vocab = 11, split = 4;  // shards [0, 4) and [4, 11)
  const std::vector<float> logits = Random(1, rows * vocab, 4.0f);
  const std::vector<std::int32_t> targets = {0, 3, 4, 10, 7, 2};
  const std::vector<float> dloss = Random(2, rows);

  std::vector<float> row_max(rows), partials(2 * rows), loss(rows), dlogits(rows * vocab);
  CrossEntropyMax(logits.data(), rows, vocab, row_max.data());
  CrossEntropyPartials(logits.data(), targets.data(), rows, vocab, 0, row_max.data(),
                       partials.data());
  CrossEntropyLoss(row_max.data(), partials.data(), rows, loss.data());
  CrossEntropyBackward(logits.data(), targets.data(), row_max.data(), partials.data(), dloss.data(),
                       rows, vocab, 0, dlogits.data());

  // Each shard sees only its columns, as a tensor-parallel rank does.
  const std::int64_t widths[2] = {split, vocab - split};
  const std::int64_t starts[2] = {0, split};
  std::vector<float> shard[2];
  std::vector<float> shard_max[2];
  for (int s = 0; s < 2; ++s) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < widths[s]; ++j) {
        shard[s].push_back(logits[r * vocab + starts[s] + j]);
      }
    }
    shard_max[s].resize(rows);
    CrossEntropyMax(shard[s].data(), rows, widths[s], shard_max[s].data());
  }
  std::vector<float> combined_max(rows), combined(2 * rows, 0.0f), combined_loss(rows);
  for (std::int64_t r = 0; r < rows; ++r) {  // the all-reduce MAX
    combined_max[r] = std::max(shard_max[0][r], shard_max[1][r]);
  }
  for (int s = 0; s < 2; ++s) {  // the all-reduce SUM
    std::vector<float> part(2 * rows);
    CrossEntropyPartials(shard[s].data(), targets.data(), rows, widths[s], starts[s],
                         combined_max.data(), part.data());
    for (std::int64_t i = 0; i < 2 * rows; ++i) combined[i] += part[i];
  }
  CrossEntropyLoss(combined_max.data(), combined.data(), rows, combined_loss.data());
  for (std::int64_t r = 0; r < rows; ++r) EXPECT_NEAR(combined_loss[r], loss[r], 1e-5) << r;

  for (int s = 0; s < 2; ++s) {
    std::vector<float> dshard(rows * widths[s]);
    CrossEntropyBackward(shard[s].data(), targets.data(), combined_max.data(), combined.data(),
                         dloss.data(), rows, widths[s], starts[s], dshard.data());
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < widths[s]; ++j) {
        EXPECT_NEAR(dshard[r * widths[s] + j], dlogits[r * vocab + starts[s] + j], 1e-6);
      }
    }
  }
}

TEST(KernelsEmbedding, ShardsSumToTheFullLookupAndBackwardAccumulates) {
  const std::int64_t vocab = 6, hidden = 3, tokens = 5;
  const std::vector<float> table = Random(3, vocab * hidden);
  const std::vector<std::int32_t> ids = {5, 0, 2, 5, 3};  // 5 appears twice
  std::vector<float> full(tokens * hidden), sum(tokens * hidden, 0.0f);
  EmbeddingForward(table.data(), ids.data(), tokens, hidden, vocab, 0, full.data());
  for (std::int64_t start : {0, 3}) {
    std::vector<float> part(tokens * hidden);
    EmbeddingForward(table.data() + start * hidden, ids.data(), tokens, hidden, 3, start,
                     part.data());
    for (std::size_t i = 0; i < part.size(); ++i) sum[i] += part[i];
  }
  EXPECT_EQ(sum, full);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t i = 0; i < hidden; ++i) {
      EXPECT_EQ(full[t * hidden + i], table[ids[t] * hidden + i]);
    }
  }
  std::vector<float> dout(tokens * hidden, 1.0f), dtable(vocab * hidden, 0.5f);
  EmbeddingBackward(dout.data(), ids.data(), tokens, hidden, vocab, 0, dtable.data());
  EXPECT_EQ(dtable[5 * hidden], 2.5f);  // two lookups of id 5 on top of 0.5
  EXPECT_EQ(dtable[1 * hidden], 0.5f);  // id 1 unused
  EXPECT_EQ(dtable[3 * hidden], 1.5f);
}

// ---- norms over strided vectors (Megatron's qk-layernorm: a norm per head inside fused rows) ----

// The norm's results: statistics, y and dx in their (strided) buffers, the accumulated weights.
struct NormResult {
  std::vector<double> y, mean, rstd, dx, dgamma, dbeta;
};

// RMSNorm (layernorm = false) or LayerNorm forward, then backward with dy, over `rows` rows laid
// out as `layout` says. y and dx start as `y_init` (their padding must keep it), dgamma and dbeta
// as `acc`; in_place runs the backward with dx on dy's own storage.
NormResult RunNorm(bool layernorm, const std::vector<double>& x, const std::vector<double>& dy,
                   const std::vector<double>& gamma, const std::vector<double>& beta,
                   std::int64_t rows, std::int64_t hidden, const NormLayout& layout,
                   const std::vector<double>& y_init, const std::vector<double>& acc,
                   bool in_place = false) {
  const auto stats = static_cast<std::size_t>(rows * layout.vectors);
  NormResult r{
      y_init, std::vector<double>(stats), std::vector<double>(stats), in_place ? dy : y_init, acc,
      acc};
  const double* pdy = in_place ? r.dx.data() : dy.data();
  if (layernorm) {
    LayerNormForward(x.data(), gamma.data(), beta.data(), rows, hidden, 1e-5, r.y.data(),
                     r.mean.data(), r.rstd.data(), layout);
    LayerNormBackward(pdy, x.data(), gamma.data(), r.mean.data(), r.rstd.data(), rows, hidden,
                      r.dx.data(), r.dgamma.data(), r.dbeta.data(), layout);
  } else {
    RmsNormForward(x.data(), gamma.data(), rows, hidden, 1e-5, r.y.data(), r.rstd.data(), layout);
    RmsNormBackward(pdy, x.data(), gamma.data(), r.rstd.data(), rows, hidden, r.dx.data(),
                    r.dgamma.data(), layout);
  }
  return r;
}

TEST(KernelsNorms, StridedVectorsAreNormedExactlyAsPackedOnesAndPaddingIsKept) {
  // 3 rows of 4 vectors of 6, x rows 29 apart, y (dy, dx) rows 37 apart.
  const std::int64_t rows = 3, vectors = 4, hidden = 6, x_stride = 29, y_stride = 37;
  const std::int64_t width = vectors * hidden;
  const NormLayout layout{vectors, x_stride, y_stride};
  const std::vector<double> x = RandomD(1, rows * x_stride), dy = RandomD(2, rows * y_stride);
  const std::vector<double> gamma = RandomD(3, hidden), beta = RandomD(4, hidden);
  const std::vector<double> acc = RandomD(5, hidden);  // the weight gradients accumulate onto it
  const std::vector<double> y_init(rows * y_stride, 1234.5);
  // The vectors of a strided buffer, packed [rows * vectors, hidden].
  auto gather = [&](const std::vector<double>& buf, std::int64_t stride) {
    std::vector<double> packed;
    for (std::int64_t r = 0; r < rows; ++r) {
      packed.insert(packed.end(), buf.begin() + r * stride, buf.begin() + r * stride + width);
    }
    return packed;
  };
  for (bool layernorm : {false, true}) {
    SCOPED_TRACE(layernorm ? "LayerNorm" : "RMSNorm");
    const NormResult want =
        RunNorm(layernorm, gather(x, x_stride), gather(dy, y_stride), gamma, beta, rows * vectors,
                hidden, NormLayout{}, std::vector<double>(rows * width), acc);
    const NormResult got =
        RunNorm(layernorm, x, dy, gamma, beta, rows, hidden, layout, y_init, acc);
    EXPECT_EQ(got.mean, want.mean);
    EXPECT_EQ(got.rstd, want.rstd);
    EXPECT_EQ(gather(got.y, y_stride), want.y);
    EXPECT_EQ(gather(got.dx, y_stride), want.dx);
    EXPECT_EQ(got.dgamma, want.dgamma);
    EXPECT_EQ(got.dbeta, want.dbeta);
    for (std::int64_t i = 0; i < rows * y_stride; ++i) {
      if (i % y_stride < width) continue;
      EXPECT_EQ(got.y[i], y_init[i]) << "y's padding at " << i;
      EXPECT_EQ(got.dx[i], y_init[i]) << "dx's padding at " << i;
    }

    // dx over dy (the fused buffer's gradient in place): every element of dy is read before it
    // is overwritten, so dx and the weight gradients equal the out-of-place ones.
    const NormResult in_place =
        RunNorm(layernorm, x, dy, gamma, beta, rows, hidden, layout, y_init, acc, true);
    std::vector<double> want_dx = dy;  // dy's padding stays
    for (std::int64_t i = 0; i < rows * y_stride; ++i) {
      if (i % y_stride < width) want_dx[i] = got.dx[i];
    }
    EXPECT_EQ(in_place.dx, want_dx);
    EXPECT_EQ(in_place.dgamma, got.dgamma);
    EXPECT_EQ(in_place.dbeta, got.dbeta);
  }
}

TEST(KernelsAdam, MatchesHandComputationOverTwoSteps) {
  AdamHyper hyper;
  hyper.lr = 0.1;
  hyper.beta1 = 0.9;
  hyper.beta2 = 0.999;
  hyper.eps = 1e-8;
  hyper.weight_decay = 0.01;
  std::vector<double> p = {1.0, -2.0}, m = {0.0, 0.0}, v = {0.0, 0.0};

  // Step 1: m = 0.1 g, v = 0.001 g^2, so m_hat = g, v_hat = g^2 and the step is lr * sign(g).
  hyper.step = 1;
  const std::vector<double> g1 = {0.5, -0.1};
  AdamStep(hyper, 2, p.data(), g1.data(), m.data(), v.data());
  // eps shortens the step by a relative 2e-8 for |g| = 0.5 and 1e-7 for |g| = 0.1.
  EXPECT_NEAR(p[0], 1.0 * (1 - 0.001) - 0.1 * 0.5 / (0.5 + 1e-8), 1e-12);   // 0.899000002
  EXPECT_NEAR(p[1], -2.0 * (1 - 0.001) + 0.1 * 0.1 / (0.1 + 1e-8), 1e-12);  // -1.89799999
  EXPECT_NEAR(m[0], 0.05, 1e-15);
  EXPECT_NEAR(v[1], 0.00001, 1e-15);

  // Step 2 by hand for element 0: g = 0.2.
  hyper.step = 2;
  const std::vector<double> g2 = {0.2, 0.3};
  AdamStep(hyper, 2, p.data(), g2.data(), m.data(), v.data());
  const double m2 = 0.9 * 0.05 + 0.1 * 0.2;          // 0.065
  const double v2 = 0.999 * 0.00025 + 0.001 * 0.04;  // 0.00028975
  const double m_hat = m2 / (1 - 0.9 * 0.9);         // 0.3421052631...
  const double v_hat = v2 / (1 - 0.999 * 0.999);     // 0.1449474737...
  const double p2 = (0.899 + 2e-9) * (1 - 0.001) - 0.1 * m_hat / (std::sqrt(v_hat) + 1e-8);
  EXPECT_NEAR(m[0], m2, 1e-15);
  EXPECT_NEAR(v[0], v2, 1e-15);
  EXPECT_NEAR(p[0], p2, 1e-8);
  EXPECT_NEAR(p[0], 0.80824348, 1e-8);  // the same, as a number worked on paper
}

TEST(KernelsAdam, GradScaleActsLikeAScaledGradient) {
  AdamHyper scaled;
  scaled.grad_scale = 0.25;
  scaled.weight_decay = 0.1;
  AdamHyper plain = scaled;
  plain.grad_scale = 1.0;
  std::vector<float> p1 = {0.3f, -0.7f}, p2 = p1, m1(2, 0.0f), m2(2, 0.0f), v1(2, 0.0f),
                     v2(2, 0.0f);
  const std::vector<float> g = {0.8f, -0.4f}, g_quarter = {0.2f, -0.1f};
  AdamStep(scaled, 2, p1.data(), g.data(), m1.data(), v1.data());
  AdamStep(plain, 2, p2.data(), g_quarter.data(), m2.data(), v2.data());
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(m1, m2);
}

// The context-parallel identity: attention over all keys equals merging attention over key
// chunks, and the backward splits over chunk pairs given the final out and lse.
TEST(KernelsAttention, ChunkedAttentionMergesToTheFullResult) {
  AttentionShape full;
  full.batch = 2;
  full.heads_q = 4;
  full.heads_kv = 2;
  full.head_dim = 5;
  full.seq_q = 9;
  full.seq_kv = 9;
  const std::int64_t tokens = full.seq_q * full.batch;
  const std::int64_t q_row = full.heads_q * full.head_dim, kv_row = full.heads_kv * full.head_dim;
  const std::vector<double> q = RandomD(4, tokens * q_row), k = RandomD(5, tokens * kv_row);
  const std::vector<double> v = RandomD(6, tokens * kv_row), dout = RandomD(7, tokens * q_row);
  std::vector<double> out(tokens * q_row), lse(tokens * full.heads_q);
  AttentionForward(full, q.data(), k.data(), v.data(), out.data(), lse.data());
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  AttentionBackward(full, q.data(), k.data(), v.data(), out.data(), dout.data(), lse.data(),
                    dq.data(), dk.data(), dv.data());

  // Keys in chunks [0, 4) and [4, 9); every query sees both through global positions.
  const std::int64_t starts[2] = {0, 4}, lengths[2] = {4, 5};
  std::vector<double> merged_out(out.size(), 0.0);
  std::vector<double> merged_lse(lse.size(), -std::numeric_limits<double>::infinity());
  for (int c = 0; c < 2; ++c) {
    AttentionShape chunk = full;
    chunk.seq_kv = lengths[c];
    chunk.kv_offset = starts[c];
    std::vector<double> part_out(out.size()), part_lse(lse.size());
    const std::int64_t kv0 = starts[c] * full.batch * kv_row;
    AttentionForward(chunk, q.data(), k.data() + kv0, v.data() + kv0, part_out.data(),
                     part_lse.data());
    AttentionMerge(tokens * full.heads_q, full.head_dim, merged_out.data(), merged_lse.data(),
                   part_out.data(), part_lse.data());
  }
  for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(merged_out[i], out[i], 1e-12);
  for (std::size_t i = 0; i < lse.size(); ++i) EXPECT_NEAR(merged_lse[i], lse[i], 1e-12);

  std::vector<double> dq_sum(dq.size(), 0.0);
  for (int c = 0; c < 2; ++c) {
    AttentionShape chunk = full;
    chunk.seq_kv = lengths[c];
    chunk.kv_offset = starts[c];
    const std::int64_t kv0 = starts[c] * full.batch * kv_row;
    const std::int64_t kv_n = lengths[c] * full.batch * kv_row;
    std::vector<double> dq_part(dq.size()), dk_part(kv_n), dv_part(kv_n);
    AttentionBackward(chunk, q.data(), k.data() + kv0, v.data() + kv0, out.data(), dout.data(),
                      lse.data(), dq_part.data(), dk_part.data(), dv_part.data());
    for (std::size_t i = 0; i < dq.size(); ++i) dq_sum[i] += dq_part[i];
    for (std::int64_t i = 0; i < kv_n; ++i) {
      EXPECT_NEAR(dk_part[i], dk[kv0 + i], 1e-12);
      EXPECT_NEAR(dv_part[i], dv[kv0 + i], 1e-12);
    }
  }
  for (std::size_t i = 0; i < dq.size(); ++i) EXPECT_NEAR(dq_sum[i], dq[i], 1e-12);
}

TEST(KernelsAttention, RowsThatSeeNoKeyAreEmptyAndMergeAsSuch) {
  AttentionShape s;
  s.batch = 1;
  s.heads_q = 1;
  s.heads_kv = 1;
  s.head_dim = 2;
  s.seq_q = 2;
  s.seq_kv = 2;
  s.q_offset = 0;
  s.kv_offset = 2;  // keys in the future of every query
  const std::vector<float> q = {1, 2, 3, 4}, k = {1, 1, 1, 1}, v = {5, 6, 7, 8};
  std::vector<float> out(4, 9.0f), lse(2, 9.0f);
  AttentionForward(s, q.data(), k.data(), v.data(), out.data(), lse.data());
  EXPECT_EQ(out, std::vector<float>(4, 0.0f));
  EXPECT_EQ(lse[0], -std::numeric_limits<float>::infinity());
  std::vector<float> acc_out = {1, 2, 3, 4}, acc_lse = {0.5f, 0.25f};
  AttentionMerge(2, 2, acc_out.data(), acc_lse.data(), out.data(), lse.data());
  EXPECT_EQ(acc_out, (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(acc_lse, (std::vector<float>{0.5f, 0.25f}));
}

}  // namespace
}  // namespace autopar::kernels::ref
