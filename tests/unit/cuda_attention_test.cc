// The CUDA flash-style attention against the naive double reference (kernels/attention.h), in f32
// and bf16: causal masks from global positions, GQA/MQA, fully masked rows, fused-QKV strides,
// head sizes that change the tile plan, the accumulate flag, and a context-parallel ring of chunk
// calls, merges and accumulated backward passes. Skipped without a GPU.
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention.h"
#include "tests/unit/cuda_test_util.h"
#include "tests/unit/device_test_util.h"

namespace autopar::device {
namespace {

using cuda_test::Close;
using cuda_test::CudaTest;
using cuda_test::Random;
using cuda_test::Stored;
using cuda_test::ToDouble;
using test_util::Desc;
using test_util::ToShape;

struct Case {
  const char* name;
  AttentionDesc desc;
};

using Param = std::tuple<Case, DType>;

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class CudaAttention : public CudaTest, public ::testing::WithParamInterface<Param> {};

TEST_P(CudaAttention, ForwardAndBackwardMatchReference) {
  const Case& c = std::get<0>(GetParam());
  const DType dt = std::get<1>(GetParam());
  const bool bf16 = dt == DType::kBF16;
  const AttentionDesc& d = c.desc;
  const kernels::ref::AttentionShape shape = ToShape(d);
  const std::int64_t nq = d.seq_q * d.batch * shape.resolved_q_stride();
  const std::int64_t nkv = d.seq_kv * d.batch * shape.resolved_kv_stride();
  const std::int64_t no = d.seq_q * d.batch * d.heads_q * d.head_dim;
  const std::int64_t nstat = d.seq_q * d.batch * d.heads_q;
  const std::vector<float> q = Stored(dt, Random(1, nq, 2.0f)),
                           k = Stored(dt, Random(2, nkv, 2.0f));
  const std::vector<float> v = Stored(dt, Random(3, nkv)), dout = Stored(dt, Random(4, no));

  const Tensor tq = Put(dt, q), tk = Put(dt, k), tv = Put(dt, v), tdout = Put(dt, dout);
  const Tensor tout = Zeros(dt, no), tlse = Zeros(DType::kF32, nstat);
  const Status fwd = dev().AttentionForward(d, tq, tk, tv, tout, tlse);
  ASSERT_TRUE(fwd.ok()) << fwd.ToString();
  const std::vector<double> qd = ToDouble(q), kd = ToDouble(k), vd = ToDouble(v);
  std::vector<double> out(no), lse(nstat);
  kernels::ref::AttentionForward(shape, qd.data(), kd.data(), vd.data(), out.data(), lse.data());
  const double fwd_tol = bf16 ? 2e-2 : 2e-5;
  EXPECT_TRUE(Close(Get(tout), out, fwd_tol, fwd_tol)) << "out";
  EXPECT_TRUE(Close(Get(tlse), lse, 1e-4, 1e-5)) << "lse";

  // The backward's reference takes the device's own out and lse, as the op does, so only the
  // backward's arithmetic is compared.
  const std::vector<double> dev_out = ToDouble(Get(tout)), dev_lse = ToDouble(Get(tlse));
  const std::vector<double> doutd = ToDouble(dout);
  std::vector<double> dq(nq), dk(nkv), dv(nkv);
  kernels::ref::AttentionBackward(shape, qd.data(), kd.data(), vd.data(), dev_out.data(),
                                  doutd.data(), dev_lse.data(), dq.data(), dk.data(), dv.data());
  // Pre-filled gradients: the head slots are overwritten, the rest of a fused row is kept.
  const std::vector<float> old_dq = Stored(dt, Random(9, nq)), old_dk = Stored(dt, Random(10, nkv));
  const std::vector<float> old_dv = Stored(dt, Random(11, nkv));
  const Tensor tdq = Put(dt, old_dq), tdk = Put(dt, old_dk), tdv = Put(dt, old_dv);
  const Status bwd =
      dev().AttentionBackward(d, tq, tk, tv, tout, tdout, tlse, tdq, tdk, tdv, false);
  ASSERT_TRUE(bwd.ok()) << bwd.ToString();
  const std::int64_t q_used = d.heads_q * d.head_dim, kv_used = d.heads_kv * d.head_dim;
  const std::int64_t q_row = shape.resolved_q_stride(), kv_row = shape.resolved_kv_stride();
  for (std::int64_t i = 0; i < nq; ++i) {
    if (i % q_row >= q_used) dq[i] = old_dq[i];
  }
  for (std::int64_t i = 0; i < nkv; ++i) {
    if (i % kv_row >= kv_used) {
      dk[i] = old_dk[i];
      dv[i] = old_dv[i];
    }
  }
  const double bwd_tol = bf16 ? 3e-2 : 1e-4;
  EXPECT_TRUE(Close(Get(tdq), dq, bwd_tol, bwd_tol)) << "dq";
  EXPECT_TRUE(Close(Get(tdk), dk, bwd_tol, bwd_tol)) << "dk";
  EXPECT_TRUE(Close(Get(tdv), dv, bwd_tol, bwd_tol)) << "dv";

  // accumulate adds the same gradients again.
  ASSERT_TRUE(dev().AttentionBackward(d, tq, tk, tv, tout, tdout, tlse, tdq, tdk, tdv, true).ok());
  for (std::int64_t i = 0; i < nq; ++i) {
    if (i % q_row < q_used) dq[i] *= 2;
  }
  for (std::int64_t i = 0; i < nkv; ++i) {
    if (i % kv_row < kv_used) {
      dk[i] *= 2;
      dv[i] *= 2;
    }
  }
  EXPECT_TRUE(Close(Get(tdq), dq, bwd_tol, bwd_tol)) << "dq accumulated";
  EXPECT_TRUE(Close(Get(tdk), dk, bwd_tol, bwd_tol)) << "dk accumulated";
  EXPECT_TRUE(Close(Get(tdv), dv, bwd_tol, bwd_tol)) << "dv accumulated";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttention,
    ::testing::Combine(
        ::testing::Values(
            Case{"causal_mha_d64", Desc(2, 4, 4, 64, 37, 37, true)},
            Case{"causal_gqa_d128_query_chunk_after_keys", Desc(1, 8, 2, 128, 70, 45, true, 30)},
            Case{"full_mqa_d32", Desc(2, 4, 1, 32, 33, 65, false)},
            Case{"masked_rows_d80", Desc(1, 2, 2, 80, 40, 40, true, 0, 20)},
            Case{"wide_heads_d256", Desc(1, 4, 2, 256, 20, 50, true, 30)},
            Case{"fused_qkv_odd_d17", Desc(2, 4, 2, 17, 13, 13, true, 0, 0, 5)},
            Case{"fused_qkv_d48", Desc(1, 4, 2, 48, 50, 50, true, 0, 0, 3)},
            Case{"one_query_many_keys", Desc(1, 2, 1, 64, 1, 40, true, 39)},
            Case{"late_query_chunk_many_key_tiles", Desc(1, 2, 2, 64, 64, 300, true, 236)}),
        ::testing::Values(DType::kF32, DType::kBF16)),
    [](const ::testing::TestParamInfo<Param>& param_info) {
      return std::string(std::get<0>(param_info.param).name) + "_" +
             DTypeName(std::get<1>(param_info.param));
    });

// A context-parallel ring on one GPU: query chunk i attends to key chunks 0..i by global
// positions, partial results merge by lse, and the backward runs per chunk pair with the final out
// and lse, accumulating into dq, dk, dv. The result must equal attention over the whole sequence.
class CudaAttentionRing : public CudaTest, public ::testing::WithParamInterface<DType> {};

TEST_P(CudaAttentionRing, ChunksReproduceFullAttention) {
  const DType dt = GetParam();
  const double tol = dt == DType::kBF16 ? 3e-2 : 1e-4;
  const AttentionDesc full = Desc(2, 4, 2, 64, 96, 96, true);
  const kernels::ref::AttentionShape shape = ToShape(full);
  const std::int64_t chunks = 3, len = full.seq_q / chunks;
  const std::int64_t q_tok = full.batch * full.heads_q * full.head_dim;
  const std::int64_t kv_tok = full.batch * full.heads_kv * full.head_dim;
  const std::int64_t stat_tok = full.batch * full.heads_q;
  const std::int64_t nq = full.seq_q * q_tok, nkv = full.seq_kv * kv_tok;
  const std::vector<float> q = Stored(dt, Random(1, nq, 2.0f)),
                           k = Stored(dt, Random(2, nkv, 2.0f));
  const std::vector<float> v = Stored(dt, Random(3, nkv)), dout = Stored(dt, Random(4, nq));
  const Tensor tq = Put(dt, q), tk = Put(dt, k), tv = Put(dt, v), tdout = Put(dt, dout);
  const Tensor out = Zeros(dt, nq), lse = Zeros(DType::kF32, full.seq_q * stat_tok);
  const Tensor part_out = Zeros(dt, len * q_tok), part_lse = Zeros(DType::kF32, len * stat_tok);
  const Tensor dq = Zeros(dt, nq), dk = Zeros(dt, nkv), dv = Zeros(dt, nkv);
  auto pair = [&](std::int64_t i, std::int64_t j) {
    AttentionDesc d = full;
    d.seq_q = len;
    d.seq_kv = len;
    d.q_offset = i * len;
    d.kv_offset = j * len;
    return d;
  };
  auto qs = [&](Tensor t, std::int64_t i) { return t.Slice(i * len * q_tok, len * q_tok); };
  auto ks = [&](Tensor t, std::int64_t j) { return t.Slice(j * len * kv_tok, len * kv_tok); };
  auto ls = [&](Tensor t, std::int64_t i) { return t.Slice(i * len * stat_tok, len * stat_tok); };
  for (std::int64_t i = 0; i < chunks; ++i) {
    // out starts as NaN garbage: an empty (lse = -inf) side must not be read by the merge.
    ASSERT_TRUE(dev().Fill(qs(out, i), std::numeric_limits<float>::quiet_NaN()).ok());
    ASSERT_TRUE(dev().Fill(ls(lse, i), -std::numeric_limits<float>::infinity()).ok());
    for (std::int64_t j = 0; j <= i; ++j) {
      ASSERT_TRUE(
          dev()
              .AttentionForward(pair(i, j), qs(tq, i), ks(tk, j), ks(tv, j), part_out, part_lse)
              .ok());
      ASSERT_TRUE(dev()
                      .AttentionMerge(len * stat_tok, full.head_dim, qs(out, i), ls(lse, i),
                                      part_out, part_lse)
                      .ok());
    }
  }
  const std::vector<double> qd = ToDouble(q), kd = ToDouble(k), vd = ToDouble(v);
  std::vector<double> want_out(nq), want_lse(full.seq_q * stat_tok);
  kernels::ref::AttentionForward(shape, qd.data(), kd.data(), vd.data(), want_out.data(),
                                 want_lse.data());
  EXPECT_TRUE(Close(Get(out), want_out, tol, tol)) << "ring out";
  EXPECT_TRUE(Close(Get(lse), want_lse, 1e-4, 1e-5)) << "ring lse";

  for (std::int64_t i = 0; i < chunks; ++i) {
    for (std::int64_t j = 0; j <= i; ++j) {
      ASSERT_TRUE(dev()
                      .AttentionBackward(pair(i, j), qs(tq, i), ks(tk, j), ks(tv, j), qs(out, i),
                                         qs(tdout, i), ls(lse, i), qs(dq, i), ks(dk, j), ks(dv, j),
                                         /*accumulate=*/true)
                      .ok());
    }
  }
  const std::vector<double> dev_out = ToDouble(Get(out)), dev_lse = ToDouble(Get(lse));
  const std::vector<double> doutd = ToDouble(dout);
  std::vector<double> want_dq(nq), want_dk(nkv), want_dv(nkv);
  kernels::ref::AttentionBackward(shape, qd.data(), kd.data(), vd.data(), dev_out.data(),
                                  doutd.data(), dev_lse.data(), want_dq.data(), want_dk.data(),
                                  want_dv.data());
  EXPECT_TRUE(Close(Get(dq), want_dq, tol, tol)) << "ring dq";
  EXPECT_TRUE(Close(Get(dk), want_dk, tol, tol)) << "ring dk";
  EXPECT_TRUE(Close(Get(dv), want_dv, tol, tol)) << "ring dv";
}

INSTANTIATE_TEST_SUITE_P(Storage, CudaAttentionRing, ::testing::Values(DType::kF32, DType::kBF16),
                         cuda_test::DTypeParamName);

TEST_F(CudaTest, AttentionRejectsBadShapes) {
  const Tensor t = Zeros(DType::kBF16, 1 << 16), lse = Zeros(DType::kF32, 1 << 12);
  AttentionDesc d = Desc(1, 3, 2, 8, 4, 4, true);  // 3 query heads over 2 groups
  EXPECT_EQ(dev().AttentionForward(d, t, t, t, t, lse).outcome(), Outcome::kInvalid);
  d = Desc(1, 4, 2, 2048, 4, 4, true);  // no tile plan fits
  EXPECT_EQ(dev().AttentionForward(d, t, t, t, t, lse).outcome(), Outcome::kInvalid);
  d = Desc(1, 4, 2, 64, 512, 512, true);  // q needs 131072 elements
  const Status small = dev().AttentionForward(d, t, t, t, t, lse);
  EXPECT_EQ(small.outcome(), Outcome::kInvalid);
  EXPECT_NE(small.message().find("`q`"), std::string::npos) << small.message();
}

}  // namespace
}  // namespace autopar::device
