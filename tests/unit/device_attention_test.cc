// The CPU platform's blockwise attention against the naive reference (kernels/attention.h), and the
// context-parallel ring pattern built from chunk calls, merges and accumulated backward passes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "autopar/device/platform.h"
#include "kernels/attention.h"
#include "kernels/init.h"
#include "tests/unit/device_test_util.h"

namespace autopar::device {
namespace {

using test_util::Desc;
using test_util::ToShape;

std::vector<float> Random(std::uint64_t seed, std::int64_t n, float scale = 1.0f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = scale * kernels::ref::HashUniform(seed, i);
  return v;
}

// Host data of one attention problem and its double-precision reference answers.
struct Problem {
  explicit Problem(const AttentionDesc& desc) : d(desc), shape(ToShape(desc)) {
    nq = d.seq_q * d.batch * shape.resolved_q_stride();
    nkv = d.seq_kv * d.batch * shape.resolved_kv_stride();
    no = d.seq_q * d.batch * d.heads_q * d.head_dim;
    nstat = d.seq_q * d.batch * d.heads_q;
    q = Random(1, nq, 2.0f);
    k = Random(2, nkv, 2.0f);
    v = Random(3, nkv);
    dout = Random(4, no);
    const std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()),
        vd(v.begin(), v.end()), dod(dout.begin(), dout.end());
    out.assign(no, 0.0);
    lse.assign(nstat, 0.0);
    dq.assign(nq, 0.0);
    dk.assign(nkv, 0.0);
    dv.assign(nkv, 0.0);
    kernels::ref::AttentionForward(shape, qd.data(), kd.data(), vd.data(), out.data(), lse.data());
    kernels::ref::AttentionBackward(shape, qd.data(), kd.data(), vd.data(), out.data(), dod.data(),
                                    lse.data(), dq.data(), dk.data(), dv.data());
  }

  AttentionDesc d;
  kernels::ref::AttentionShape shape;
  std::int64_t nq, nkv, no, nstat;
  std::vector<float> q, k, v, dout;
  std::vector<double> out, lse, dq, dk, dv;
};

class DeviceAttention : public test_util::CpuDeviceTest {
 protected:
  // A platform whose blockwise attention takes tiles of block_q queries by block_kv keys.
  void MakePlatform(std::int64_t block_q, std::int64_t block_kv) {
    CpuPlatformOptions options;
    options.attention_block_q = block_q;
    options.attention_block_kv = block_kv;
    UsePlatform(options);
  }
};

void ExpectClose(const std::vector<float>& actual, const std::vector<double>& expected, double tol,
                 const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (std::isinf(expected[i])) {
      ASSERT_EQ(double{actual[i]}, expected[i]) << what << "[" << i << "]";
    } else {
      ASSERT_NEAR(actual[i], expected[i], tol * (1.0 + std::abs(expected[i])))
          << what << "[" << i << "]";
    }
  }
}

struct Case {
  const char* name;
  AttentionDesc desc;
  std::int64_t block_q;
  std::int64_t block_kv;
};

// Names the case in failure messages instead of dumping its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class DeviceAttentionVsReference : public DeviceAttention,
                                   public ::testing::WithParamInterface<Case> {};

TEST_P(DeviceAttentionVsReference, ForwardAndBackwardMatch) {
  const Case& c = GetParam();
  MakePlatform(c.block_q, c.block_kv);
  const Problem p(c.desc);
  const Tensor q = Put(p.q), k = Put(p.k), v = Put(p.v), dout = Put(p.dout);
  const Tensor out = Zeros(p.no), lse = Zeros(p.nstat);
  ASSERT_TRUE(dev().AttentionForward(c.desc, q, k, v, out, lse).ok());
  ExpectClose(Get(out), p.out, 2e-5, "out");
  ExpectClose(Get(lse), p.lse, 2e-5, "lse");

  // Pre-filled gradients: overwritten without accumulate (outside the head slots too: kept).
  const Tensor dq = Put(Random(9, p.nq)), dk = Put(Random(10, p.nkv)), dv = Put(Random(11, p.nkv));
  ASSERT_TRUE(dev().AttentionBackward(c.desc, q, k, v, out, dout, lse, dq, dk, dv, false).ok());
  std::vector<double> want_dq = p.dq, want_dk = p.dk, want_dv = p.dv;
  const std::int64_t q_used = c.desc.heads_q * c.desc.head_dim;
  const std::int64_t kv_used = c.desc.heads_kv * c.desc.head_dim;
  const std::int64_t q_row = p.shape.resolved_q_stride(), kv_row = p.shape.resolved_kv_stride();
  const std::vector<float> old_dq = Random(9, p.nq), old_dk = Random(10, p.nkv);
  const std::vector<float> old_dv = Random(11, p.nkv);
  for (std::int64_t i = 0; i < p.nq; ++i) {
    if (i % q_row >= q_used) want_dq[i] = old_dq[i];
  }
  for (std::int64_t i = 0; i < p.nkv; ++i) {
    if (i % kv_row >= kv_used) {
      want_dk[i] = old_dk[i];
      want_dv[i] = old_dv[i];
    }
  }
  ExpectClose(Get(dq), want_dq, 5e-5, "dq");
  ExpectClose(Get(dk), want_dk, 5e-5, "dk");
  ExpectClose(Get(dv), want_dv, 5e-5, "dv");

  // A second pass with accumulate adds the same gradients again.
  ASSERT_TRUE(dev().AttentionBackward(c.desc, q, k, v, out, dout, lse, dq, dk, dv, true).ok());
  for (std::int64_t i = 0; i < p.nq; ++i) {
    if (i % q_row < q_used) want_dq[i] *= 2;
  }
  for (std::int64_t i = 0; i < p.nkv; ++i) {
    if (i % kv_row < kv_used) {
      want_dk[i] *= 2;
      want_dv[i] *= 2;
    }
  }
  ExpectClose(Get(dq), want_dq, 5e-5, "dq accumulated");
  ExpectClose(Get(dk), want_dk, 5e-5, "dk accumulated");
  ExpectClose(Get(dv), want_dv, 5e-5, "dv accumulated");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DeviceAttentionVsReference,
    ::testing::Values(Case{"causal_gqa_small_tiles", Desc(2, 4, 2, 8, 37, 37, true), 8, 4},
                      Case{"causal_mha_odd_tiles", Desc(1, 3, 3, 16, 29, 29, true), 5, 7},
                      Case{"full_mqa", Desc(2, 4, 1, 8, 19, 23, false), 8, 8},
                      Case{"tiles_larger_than_seq", Desc(1, 2, 1, 4, 9, 9, true), 64, 64},
                      Case{"query_chunk_after_keys", Desc(2, 4, 2, 8, 16, 16, true, 16, 0), 4, 4},
                      Case{"diagonal_chunk_with_offsets", Desc(1, 2, 2, 8, 12, 12, true, 24, 24), 5,
                           3},
                      Case{"masked_rows", Desc(1, 2, 1, 8, 10, 10, true, 0, 4), 4, 4},
                      Case{"fused_qkv_strides", Desc(2, 4, 2, 8, 13, 13, true, 0, 0, 5), 4, 8}),
    [](const ::testing::TestParamInfo<Case>& param_info) { return param_info.param.name; });

// A context-parallel ring on one process: the sequence is cut into chunks, query chunk i attends
// to key chunks 0..i by global positions, partial results merge by lse, and the backward runs per
// chunk pair with the final out and lse, accumulating into dq, dk, dv. The result must equal
// attention over the whole sequence.
TEST_F(DeviceAttention, ContextParallelChunksReproduceFullAttention) {
  MakePlatform(4, 4);
  const AttentionDesc full = Desc(2, 4, 2, 8, 24, 24, true);
  const Problem p(full);
  const std::int64_t chunks = 3, len = full.seq_q / chunks;
  const std::int64_t q_tok = full.batch * full.heads_q * full.head_dim;  // per sequence position
  const std::int64_t kv_tok = full.batch * full.heads_kv * full.head_dim;
  const std::int64_t stat_tok = full.batch * full.heads_q;
  const Tensor q = Put(p.q), k = Put(p.k), v = Put(p.v), dout = Put(p.dout);
  const Tensor out = Zeros(p.no), lse = Zeros(p.nstat);
  const Tensor part_out = Zeros(len * q_tok), part_lse = Zeros(len * stat_tok);
  const Tensor dq = Zeros(p.nq), dk = Zeros(p.nkv), dv = Zeros(p.nkv);

  auto pair = [&](std::int64_t i, std::int64_t j) {
    AttentionDesc d = full;
    d.seq_q = len;
    d.seq_kv = len;
    d.q_offset = i * len;
    d.kv_offset = j * len;
    return d;
  };
  for (std::int64_t i = 0; i < chunks; ++i) {
    const Tensor out_i = out.Slice(i * len * q_tok, len * q_tok);
    const Tensor lse_i = lse.Slice(i * len * stat_tok, len * stat_tok);
    ASSERT_TRUE(dev().Fill(lse_i, -std::numeric_limits<float>::infinity()).ok());
    for (std::int64_t j = 0; j <= i; ++j) {
      ASSERT_TRUE(dev()
                      .AttentionForward(pair(i, j), q.Slice(i * len * q_tok, len * q_tok),
                                        k.Slice(j * len * kv_tok, len * kv_tok),
                                        v.Slice(j * len * kv_tok, len * kv_tok), part_out, part_lse)
                      .ok());
      ASSERT_TRUE(
          dev()
              .AttentionMerge(len * stat_tok, full.head_dim, out_i, lse_i, part_out, part_lse)
              .ok());
    }
  }
  ExpectClose(Get(out), p.out, 2e-5, "ring out");
  ExpectClose(Get(lse), p.lse, 2e-5, "ring lse");

  for (std::int64_t i = 0; i < chunks; ++i) {
    for (std::int64_t j = 0; j <= i; ++j) {
      ASSERT_TRUE(
          dev()
              .AttentionBackward(
                  pair(i, j), q.Slice(i * len * q_tok, len * q_tok),
                  k.Slice(j * len * kv_tok, len * kv_tok), v.Slice(j * len * kv_tok, len * kv_tok),
                  out.Slice(i * len * q_tok, len * q_tok), dout.Slice(i * len * q_tok, len * q_tok),
                  lse.Slice(i * len * stat_tok, len * stat_tok),
                  dq.Slice(i * len * q_tok, len * q_tok), dk.Slice(j * len * kv_tok, len * kv_tok),
                  dv.Slice(j * len * kv_tok, len * kv_tok), /*accumulate=*/true)
              .ok());
    }
  }
  ExpectClose(Get(dq), p.dq, 5e-5, "ring dq");
  ExpectClose(Get(dk), p.dk, 5e-5, "ring dk");
  ExpectClose(Get(dv), p.dv, 5e-5, "ring dv");
}

TEST_F(DeviceAttention, RejectsBadShapes) {
  MakePlatform(8, 8);
  const Tensor t = Zeros(1024);
  AttentionDesc d = Desc(1, 3, 2, 8, 4, 4, true);  // 3 query heads over 2 groups
  EXPECT_EQ(dev().AttentionForward(d, t, t, t, t, t).outcome(), Outcome::kInvalid);
  d = Desc(1, 4, 2, 8, 64, 64, true);  // q needs 2048 elements
  const Status small = dev().AttentionForward(d, t, t, t, t, t);
  EXPECT_EQ(small.outcome(), Outcome::kInvalid);
  EXPECT_NE(small.message().find("`q`"), std::string::npos) << small.message();
}

}  // namespace
}  // namespace autopar::device
