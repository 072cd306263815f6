// The host-side decisions of the cuDNN attention path, checked without a GPU: which calls it takes
// (and why not), plan-cache keys, the [b, h, s, d] strides it gives cuDNN for our [s, b, h, d]
// tensors, the stats transpose it relies on, and the scratch layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "src/device/cuda/cuda_check.h"
#include "src/device/cuda/cudnn_attention_plan.h"
#include "tests/unit/device_test_util.h"

namespace autopar::device {
namespace {

AttentionDesc Resolved(std::int64_t batch, std::int64_t hq, std::int64_t hkv, std::int64_t dim,
                       std::int64_t sq, std::int64_t skv, bool causal, std::int64_t q_off = 0,
                       std::int64_t kv_off = 0, std::int64_t q_stride = 0,
                       std::int64_t kv_stride = 0) {
  AttentionDesc d = test_util::Desc(batch, hq, hkv, dim, sq, skv, causal, q_off, kv_off);
  d.scale = 0.125f;
  d.q_stride = q_stride ? q_stride : hq * dim;
  d.kv_stride = kv_stride ? kv_stride : hkv * dim;
  return d;
}

SdpaDecision Decide(const AttentionDesc& d, DType dtype = DType::kBF16, bool aligned = true,
                    bool accumulate = false) {
  return DecideSdpa(d, dtype, SdpaDirection::kForward, aligned, accumulate);
}

TEST(CudnnAttentionEngine, ParsesItsSpellings) {
  EXPECT_EQ(ParseAttentionEngine("").value(), AttentionEngine::kAuto);
  EXPECT_EQ(ParseAttentionEngine("auto").value(), AttentionEngine::kAuto);
  EXPECT_EQ(ParseAttentionEngine("kernel").value(), AttentionEngine::kKernel);
  EXPECT_EQ(ParseAttentionEngine("cudnn").value(), AttentionEngine::kCudnn);
  const StatusOr<AttentionEngine> bad = ParseAttentionEngine("flash");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().outcome(), Outcome::kInvalid);
}

TEST(CudnnAttentionDecision, TakesAlignedCausalGqaAndFullAttention) {
  const SdpaDecision causal = Decide(Resolved(2, 32, 4, 128, 256, 256, true, 512, 512));
  ASSERT_TRUE(causal.use_cudnn) << causal.reason;
  EXPECT_EQ(causal.key.mask, SdpaMask::kCausalTopLeft);
  EXPECT_EQ(causal.key.heads_q, 32);
  EXPECT_EQ(causal.key.heads_kv, 4);
  EXPECT_EQ(causal.key.q_stride, 32 * 128);
  EXPECT_EQ(causal.key.kv_stride, 4 * 128);

  // Equal offsets mean key j is visible to query i iff j <= i whatever the lengths.
  const SdpaDecision ragged = Decide(Resolved(1, 8, 8, 64, 96, 40, true));
  ASSERT_TRUE(ragged.use_cudnn) << ragged.reason;
  EXPECT_EQ(ragged.key.mask, SdpaMask::kCausalTopLeft);

  const SdpaDecision full = Decide(Resolved(1, 8, 2, 64, 33, 65, false, 7, 100));
  ASSERT_TRUE(full.use_cudnn) << full.reason;
  EXPECT_EQ(full.key.mask, SdpaMask::kNone);

  const SdpaDecision f16 = Decide(Resolved(1, 8, 1, 64, 64, 64, true), DType::kF16);
  EXPECT_TRUE(f16.use_cudnn) << f16.reason;
  EXPECT_EQ(f16.key.dtype, DType::kF16);
}

// A context-parallel pair whose key chunk lies wholly before the query chunk sees every key.
TEST(CudnnAttentionDecision, KeyBlockBeforeQueriesNeedsNoMask) {
  const SdpaDecision before = Decide(Resolved(1, 8, 2, 64, 64, 64, true, 64, 0));
  ASSERT_TRUE(before.use_cudnn) << before.reason;
  EXPECT_EQ(before.key.mask, SdpaMask::kNone);
  // Its last key at position 63 + 1 = 64 is the first query's own position: still all visible.
  const SdpaDecision touching = Decide(Resolved(1, 8, 2, 64, 64, 65, true, 64, 0));
  ASSERT_TRUE(touching.use_cudnn) << touching.reason;
  EXPECT_EQ(touching.key.mask, SdpaMask::kNone);
}

TEST(CudnnAttentionDecision, LeavesEverythingElseToTheKernel) {
  struct Case {
    const char* what;
    SdpaDecision decision;
    const char* reason_has;
  };
  const std::vector<Case> cases = {
      {"partial overlap", Decide(Resolved(1, 8, 2, 64, 64, 66, true, 64, 0)), "overlapping"},
      {"keys after queries", Decide(Resolved(1, 2, 2, 64, 40, 40, true, 0, 20)), "overlapping"},
      {"f32", Decide(Resolved(1, 8, 2, 64, 64, 64, true), DType::kF32), "f32"},
      {"head_dim 17", Decide(Resolved(1, 4, 2, 17, 13, 13, true)), "head_dim 17"},
      {"head_dim 256", Decide(Resolved(1, 4, 2, 256, 20, 50, false)), "head_dim 256"},
      {"stride off 16 bytes", Decide(Resolved(1, 4, 2, 48, 50, 50, true, 0, 0, 387, 387)),
       "16-byte"},
      {"unaligned pointer", Decide(Resolved(1, 4, 2, 64, 50, 50, true), DType::kBF16, false),
       "aligned"},
      {"one by one", Decide(Resolved(1, 4, 2, 64, 1, 1, true)), "seq_q = seq_kv = 1"},
      {"f16 accumulate",
       DecideSdpa(Resolved(1, 4, 2, 64, 32, 32, true), DType::kF16, SdpaDirection::kBackward, true,
                  true),
       "bf16"},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(c.decision.use_cudnn) << c.what;
    EXPECT_NE(c.decision.reason.find(c.reason_has), std::string::npos)
        << c.what << ": " << c.decision.reason;
  }
  // A fused-QKV stride that keeps rows 16-byte aligned is fine.
  EXPECT_TRUE(Decide(Resolved(1, 4, 2, 48, 50, 50, true, 0, 0, 392, 392)).use_cudnn);
}

// cudnn-frontend declines 9.10.0/9.10.1 outright and, up to 9.15.0, patches the backward with a
// padding mask when s_kv % 128 != 0; our graph has no such mask, so those calls stay on the kernel.
TEST(CudnnAttentionDecision, FollowsTheFrontendVersionRules) {
  const AttentionDesc odd = Resolved(1, 8, 2, 64, 200, 200, true);
  const AttentionDesc even = Resolved(1, 8, 2, 64, 256, 256, true);
  auto decide = [](const AttentionDesc& d, SdpaDirection dir, std::int64_t version) {
    return DecideSdpa(d, DType::kBF16, dir, true, false, version);
  };
  for (const std::int64_t buggy : {91000, 91001}) {
    for (const SdpaDirection dir : {SdpaDirection::kForward, SdpaDirection::kBackward}) {
      const SdpaDecision no = decide(even, dir, buggy);
      EXPECT_FALSE(no.use_cudnn) << buggy;
      EXPECT_NE(no.reason.find("9.10.0/9.10.1"), std::string::npos) << no.reason;
    }
  }
  EXPECT_TRUE(decide(even, SdpaDirection::kForward, 91002).use_cudnn);
  EXPECT_TRUE(decide(even, SdpaDirection::kBackward, 91002).use_cudnn);

  const SdpaDecision padded = decide(odd, SdpaDirection::kBackward, 91500);
  EXPECT_FALSE(padded.use_cudnn);
  EXPECT_NE(padded.reason.find("multiple of 128"), std::string::npos) << padded.reason;
  EXPECT_FALSE(decide(odd, SdpaDirection::kBackward, 90100).use_cudnn);
  EXPECT_TRUE(decide(odd, SdpaDirection::kBackward, 91501).use_cudnn);
  EXPECT_TRUE(decide(odd, SdpaDirection::kBackward, 91900).use_cudnn);
  EXPECT_TRUE(decide(odd, SdpaDirection::kForward, 91500).use_cudnn);  // the forward has no rule
  EXPECT_TRUE(decide(even, SdpaDirection::kBackward, 91500).use_cudnn);
  EXPECT_TRUE(decide(odd, SdpaDirection::kBackward, 0).use_cudnn);  // unknown: no version rule
}

TEST(CudnnAttentionMask, FillValueFollowsTheFrontend) {
  EXPECT_EQ(SdpaMaskFillValue(90900), std::numeric_limits<float>::lowest());
  EXPECT_EQ(SdpaMaskFillValue(90000), std::numeric_limits<float>::lowest());
  EXPECT_EQ(SdpaMaskFillValue(91000), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(SdpaMaskFillValue(91900), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(SdpaMaskFillValue(0), -std::numeric_limits<float>::infinity());
}

// One plan per everything a graph bakes in; not the scale (a by-value scalar), not the positions
// once they give the same mask.
TEST(CudnnAttentionKey, SeparatesWhatAGraphBakesIn) {
  AttentionDesc a = Resolved(2, 8, 2, 64, 128, 128, true, 0, 0);
  AttentionDesc same = Resolved(2, 8, 2, 64, 128, 128, true, 256, 256);
  same.scale = 0.5f;
  EXPECT_EQ(Decide(a).key, Decide(same).key);

  std::set<SdpaKey> keys;
  keys.insert(Decide(a).key);
  keys.insert(DecideSdpa(a, DType::kBF16, SdpaDirection::kBackward, true).key);
  keys.insert(Decide(a, DType::kF16).key);
  keys.insert(Decide(Resolved(2, 8, 2, 64, 128, 128, false)).key);
  keys.insert(Decide(Resolved(2, 8, 2, 64, 128, 128, true, 128, 0)).key);  // no mask either
  keys.insert(Decide(Resolved(2, 8, 4, 64, 128, 128, true)).key);
  keys.insert(Decide(Resolved(2, 8, 2, 64, 128, 128, true, 0, 0, 1024, 1024)).key);
  keys.insert(Decide(Resolved(2, 8, 2, 64, 128, 64, true)).key);
  EXPECT_EQ(keys.size(), 7u);  // the unmasked causal pair shares the non-causal plan
  EXPECT_EQ(SdpaKeyName(Decide(a).key),
            "fwd bf16 b2 hq8 hkv2 d64 sq128 skv128 qs512 kvs128 causal");
}

std::int64_t Offset(const SdpaLayout& l, std::int64_t b, std::int64_t h, std::int64_t s,
                    std::int64_t x) {
  return b * l.strides[0] + h * l.strides[1] + s * l.strides[2] + x * l.strides[3];
}

// cuDNN element (b, h, s, x) must be our element (s, b, h, x): kernels/attention.cc's Index.
TEST(CudnnAttentionLayout, MatchesTheReferenceIndexing) {
  const AttentionDesc d = Resolved(3, 6, 2, 16, 5, 7, true, 0, 0, 6 * 16 + 8, 3 * 2 * 16 + 24);
  const SdpaDecision decision = Decide(d);
  ASSERT_TRUE(decision.use_cudnn) << decision.reason;
  const SdpaKey& k = decision.key;
  const SdpaLayout q = SdpaQLayout(k), kv = SdpaKvLayout(k), o = SdpaOLayout(k);
  EXPECT_EQ(q.dims, (std::array<std::int64_t, 4>{3, 6, 5, 16}));
  EXPECT_EQ(kv.dims, (std::array<std::int64_t, 4>{3, 2, 7, 16}));
  std::int64_t q_max = 0, kv_max = 0;
  for (std::int64_t b = 0; b < d.batch; ++b) {
    for (std::int64_t x = 0; x < d.head_dim; ++x) {
      for (std::int64_t h = 0; h < d.heads_q; ++h) {
        for (std::int64_t s = 0; s < d.seq_q; ++s) {
          const std::int64_t ours = (s * d.batch + b) * d.q_stride + h * d.head_dim + x;
          ASSERT_EQ(Offset(q, b, h, s, x), ours);
          ASSERT_EQ(Offset(o, b, h, s, x), ((s * d.batch + b) * d.heads_q + h) * d.head_dim + x);
          q_max = std::max(q_max, ours);
        }
      }
      for (std::int64_t h = 0; h < d.heads_kv; ++h) {
        for (std::int64_t s = 0; s < d.seq_kv; ++s) {
          const std::int64_t ours = (s * d.batch + b) * d.kv_stride + h * d.head_dim + x;
          ASSERT_EQ(Offset(kv, b, h, s, x), ours);
          // K^T [b, h, d, s] reads the same element.
          ASSERT_EQ(Offset(SdpaTransposed(kv), b, h, x, s), ours);
          kv_max = std::max(kv_max, ours);
        }
      }
    }
  }
  EXPECT_EQ(q_max + 1, SdpaQExtent(k));
  EXPECT_EQ(kv_max + 1, SdpaKvExtent(k));
}

// The stats are [b, h_q, s_q] in cuDNN and [s_q, b, h_q] for us; the forward transposes the
// (b h_q) x s_q matrix with cublasSgeam(T, N, m = b h_q, n = s_q, A = stats, lda = s_q,
// C = lse, ldc = b h_q) and the backward the other way. Column-major semantics of that call:
// C[i + j ldc] = A[j + i lda].
TEST(CudnnAttentionLayout, StatsTransposeMatchesOurLseLayout) {
  const SdpaKey k = Decide(Resolved(2, 3, 1, 8, 5, 5, true)).key;
  const SdpaLayout stats = SdpaRowStatsLayout(k);
  EXPECT_EQ(stats.dims, (std::array<std::int64_t, 4>{2, 3, 5, 1}));
  const std::int64_t rows = k.batch * k.heads_q, cols = k.seq_q;
  std::vector<float> cudnn_stats(static_cast<std::size_t>(rows * cols));
  for (std::int64_t b = 0; b < k.batch; ++b) {
    for (std::int64_t h = 0; h < k.heads_q; ++h) {
      for (std::int64_t s = 0; s < k.seq_q; ++s) {
        cudnn_stats[static_cast<std::size_t>(Offset(stats, b, h, s, 0))] =
            static_cast<float>(100 * s + 10 * b + h);
      }
    }
  }
  // The geam call as the forward makes it: m = rows, n = cols, lda = cols, ldc = rows.
  std::vector<float> lse(cudnn_stats.size());
  for (std::int64_t j = 0; j < cols; ++j) {
    for (std::int64_t i = 0; i < rows; ++i) {
      lse[static_cast<std::size_t>(i + j * rows)] =
          cudnn_stats[static_cast<std::size_t>(j + i * cols)];
    }
  }
  for (std::int64_t s = 0; s < k.seq_q; ++s) {
    for (std::int64_t b = 0; b < k.batch; ++b) {
      for (std::int64_t h = 0; h < k.heads_q; ++h) {
        EXPECT_EQ(lse[static_cast<std::size_t>((s * k.batch + b) * k.heads_q + h)],
                  static_cast<float>(100 * s + 10 * b + h));
      }
    }
  }
}

TEST(CudnnAttentionLayout, ScoresAndAccumulatorsArePacked) {
  const SdpaKey k =
      DecideSdpa(Resolved(2, 8, 2, 64, 32, 48, true), DType::kBF16, SdpaDirection::kBackward, true)
          .key;
  EXPECT_EQ(SdpaScoreLayout(k).dims, (std::array<std::int64_t, 4>{2, 8, 32, 48}));
  EXPECT_EQ(SdpaScoreLayout(k).strides,
            (std::array<std::int64_t, 4>{std::int64_t{8} * 32 * 48, std::int64_t{32} * 48, 48, 1}));
  // P^T is the same memory read [b, h, s_kv, s_q].
  EXPECT_EQ(SdpaScoreTransposedLayout(k).dims, (std::array<std::int64_t, 4>{2, 8, 48, 32}));
  EXPECT_EQ(SdpaScoreTransposedLayout(k).strides,
            (std::array<std::int64_t, 4>{std::int64_t{8} * 32 * 48, std::int64_t{32} * 48, 1, 48}));
  EXPECT_EQ(SdpaDqAccumLayout(k).strides,
            (std::array<std::int64_t, 4>{std::int64_t{8} * 32 * 64, std::int64_t{32} * 64, 64, 1}));
  EXPECT_EQ(SdpaFullHeadKvGradLayout(k).dims, (std::array<std::int64_t, 4>{2, 8, 48, 64}));
  EXPECT_EQ(SdpaScalarLayout().dims, (std::array<std::int64_t, 4>{1, 1, 1, 1}));
}

TEST(CudnnAttentionScratch, PartsAreAlignedDisjointAndSized) {
  const AttentionDesc d =
      Resolved(2, 8, 2, 64, 100, 100, true, 0, 0, 8 * 64 + 2 * 2 * 64, 8 * 64 + 2 * 2 * 64);
  const SdpaKey fwd = Decide(d).key;
  const SdpaKey bwd = DecideSdpa(d, DType::kBF16, SdpaDirection::kBackward, true, true).key;
  const std::size_t rows_bytes = std::size_t{2} * 8 * 100 * sizeof(float);

  const SdpaScratch f = PlanSdpaScratch(fwd, 1000, false);
  EXPECT_EQ(f.workspace, 0u);
  EXPECT_EQ(f.stats, 1024u);  // 1000 rounded up to 256 bytes
  EXPECT_EQ(f.total_bytes, 1024u + (rows_bytes + 255) / 256 * 256);

  const SdpaScratch b = PlanSdpaScratch(bwd, 0, true);
  struct Part {
    std::size_t offset, bytes;
  };
  const std::size_t elem = 2;
  const std::vector<Part> parts = {
      {b.stats, rows_bytes},
      {b.softmax_sum, rows_bytes},
      {b.dq_accum, rows_bytes * 64},
      {b.dq, static_cast<std::size_t>(SdpaQExtent(bwd)) * elem},
      {b.dk, static_cast<std::size_t>(SdpaKvExtent(bwd)) * elem},
      {b.dv, static_cast<std::size_t>(SdpaKvExtent(bwd)) * elem},
  };
  for (std::size_t i = 0; i < parts.size(); ++i) {
    EXPECT_EQ(parts[i].offset % SdpaScratch::kScratchAlignment, 0u) << i;
    EXPECT_LE(parts[i].offset + parts[i].bytes, b.total_bytes) << i;
    if (i + 1 < parts.size()) {
      EXPECT_LE(parts[i].offset + parts[i].bytes, parts[i + 1].offset) << i;
    }
  }
  // Without accumulate the gradient copies take nothing.
  const SdpaScratch plain = PlanSdpaScratch(bwd, 0, false);
  EXPECT_EQ(plain.total_bytes, b.dq);
}

#if defined(AUTOPAR_HAVE_CUDNN) && AUTOPAR_HAVE_CUDNN
// A refused graph is the call's shape (kInvalid, so the device falls back), running out of memory
// is the trial's oom, and a failed execution is the GPU's.
TEST(CudnnAttentionErrors, StatusCodesMapToOutcomes) {
  EXPECT_EQ(CudnnOutcome(CUDNN_STATUS_SUCCESS), Outcome::kOk);
  EXPECT_EQ(CudnnOutcome(CUDNN_STATUS_BAD_PARAM_NULL_POINTER), Outcome::kInvalid);
  EXPECT_EQ(CudnnOutcome(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN), Outcome::kInvalid);
  EXPECT_EQ(CudnnOutcome(CUDNN_STATUS_NOT_SUPPORTED_SHAPE), Outcome::kInvalid);
  EXPECT_EQ(CudnnOutcome(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED), Outcome::kOom);
  EXPECT_EQ(CudnnOutcome(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED), Outcome::kOom);
  EXPECT_EQ(CudnnOutcome(CUDNN_STATUS_EXECUTION_FAILED_CUDART), Outcome::kDeviceError);
  EXPECT_EQ(CudnnOutcome(CUDNN_STATUS_INTERNAL_ERROR), Outcome::kDeviceError);
}
#endif

}  // namespace
}  // namespace autopar::device
