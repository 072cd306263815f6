// The CUDA kernels and launchers of kernels/*.cu, built by the host compiler and run on the host
// through tests/unit/cuda_emulation.h (one thread per CUDA thread, real barriers), against the
// host references. Runs everywhere, GPU or not: it checks index math, masks, tiling, barriers and
// warp reductions of the very code the GPU runs; the GPU tests (cuda_*_test.cc) check the rest.
#include "tests/unit/cuda_emulation.h"  // first: it defines the device built-ins
// clang-format off
#include "kernels/activations.cu"
#include "kernels/adam.cu"
#include "kernels/attention_backward.cu"
#include "kernels/attention_forward.cu"
#include "kernels/cross_entropy.cu"
#include "kernels/elementwise.cu"
#include "kernels/embedding.cu"
#include "kernels/fp8.cu"
#include "kernels/norms.cu"
#include "kernels/rope.cu"
// clang-format on

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/activations.h"
#include "kernels/adam.h"
#include "kernels/attention.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/fp8_scale.h"
#include "kernels/norms.h"
#include "kernels/rope.h"
#include "tests/unit/cuda_test_util.h"

namespace autopar::kernels::cuda {
inline void PrintTo(Storage storage, std::ostream* os) {
  *os << (storage == Storage::kBF16 ? "bf16" : "f32");
}
}  // namespace autopar::kernels::cuda

namespace autopar::kernels::cuda::emulated {
namespace {

// Launchers are called qualified: their Storage and AttentionArgs arguments would otherwise bring
// the real (GPU) launchers of the enclosing namespace into overload resolution.
using device::cuda_test::Close;
using device::cuda_test::FromBf16Bits;
using device::cuda_test::Random;
using device::cuda_test::RoundBf16;
using device::cuda_test::ToBf16Bits;
using device::cuda_test::ToDouble;

constexpr int kSharedMemory = 227 * 1024;  // an H100's opt-in limit

// Host memory standing in for a device tensor of either storage.
struct Buf {
  Buf(Storage s, const std::vector<float>& values) : storage(s), f32(values) {
    if (s == Storage::kBF16) {
      for (float v : values) bf16.push_back(ToBf16Bits(v));
    }
  }
  void* data() { return storage == Storage::kBF16 ? static_cast<void*>(bf16.data()) : f32.data(); }
  std::vector<float> Get() const {
    if (storage == Storage::kF32) return f32;
    std::vector<float> out;
    for (std::uint16_t b : bf16) out.push_back(FromBf16Bits(b));
    return out;
  }
  Storage storage;
  std::vector<float> f32;
  std::vector<std::uint16_t> bf16;
};

std::vector<float> Stored(Storage s, std::vector<float> v) {
  if (s == Storage::kBF16) {
    for (float& x : v) x = RoundBf16(x);
  }
  return v;
}

struct AttentionCase {
  const char* name;
  ref::AttentionShape shape;
};

// Test names and failure messages show the case's name, not its bytes.
void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }

ref::AttentionShape Shape(std::int64_t batch, std::int64_t hq, std::int64_t hkv, std::int64_t dim,
                          std::int64_t sq, std::int64_t skv, bool causal, std::int64_t q_off = 0,
                          std::int64_t kv_off = 0, std::int64_t pad = 0) {
  ref::AttentionShape s;
  s.batch = batch;
  s.heads_q = hq;
  s.heads_kv = hkv;
  s.head_dim = dim;
  s.seq_q = sq;
  s.seq_kv = skv;
  s.causal = causal;
  s.q_offset = q_off;
  s.kv_offset = kv_off;
  if (pad) s.q_stride = s.kv_stride = (hq + 2 * hkv) * dim + pad;
  return s;
}

AttentionArgs ToArgs(const ref::AttentionShape& s) {
  return AttentionArgs{s.batch,
                       s.heads_q,
                       s.heads_kv,
                       s.head_dim,
                       s.seq_q,
                       s.seq_kv,
                       s.causal,
                       s.q_offset,
                       s.kv_offset,
                       static_cast<float>(s.resolved_scale()),
                       s.resolved_q_stride(),
                       s.resolved_kv_stride()};
}

class EmulatedAttention : public ::testing::TestWithParam<std::tuple<AttentionCase, Storage>> {};

TEST_P(EmulatedAttention, ForwardAndBackwardMatchReference) {
  const ref::AttentionShape& shape = std::get<0>(GetParam()).shape;
  const Storage st = std::get<1>(GetParam());
  const bool bf16 = st == Storage::kBF16;
  const std::int64_t nq = shape.seq_q * shape.batch * shape.resolved_q_stride();
  const std::int64_t nkv = shape.seq_kv * shape.batch * shape.resolved_kv_stride();
  const std::int64_t no = shape.seq_q * shape.batch * shape.heads_q * shape.head_dim;
  const std::int64_t nstat = shape.seq_q * shape.batch * shape.heads_q;
  const std::vector<float> q = Stored(st, Random(1, nq, 2.0f)),
                           k = Stored(st, Random(2, nkv, 2.0f));
  const std::vector<float> v = Stored(st, Random(3, nkv)), dout = Stored(st, Random(4, no));
  Buf bq(st, q), bk(st, k), bv(st, v), bdout(st, dout), bout(st, std::vector<float>(no, 7.0f));
  std::vector<float> lse(nstat, 7.0f);
  const AttentionArgs args = ToArgs(shape);
  ASSERT_EQ(emulated::AttentionForward(nullptr, st, args, bq.data(), bk.data(), bv.data(),
                                       bout.data(), lse.data(), kSharedMemory),
            cudaSuccess);
  const std::vector<double> qd = ToDouble(q), kd = ToDouble(k), vd = ToDouble(v);
  std::vector<double> want_out(no), want_lse(nstat);
  ref::AttentionForward(shape, qd.data(), kd.data(), vd.data(), want_out.data(), want_lse.data());
  const double tol = bf16 ? 2e-2 : 2e-5;
  EXPECT_TRUE(Close(bout.Get(), want_out, tol, tol)) << "out";
  EXPECT_TRUE(Close(lse, want_lse, 1e-5, 1e-5)) << "lse";

  // Backward from the kernel's own out and lse; gradients pre-filled to check overwrite, then
  // accumulate.
  const std::vector<double> dev_out = ToDouble(bout.Get()), dev_lse = ToDouble(lse);
  const std::vector<double> doutd = ToDouble(dout);
  std::vector<double> dq(nq), dk(nkv), dv(nkv);
  ref::AttentionBackward(shape, qd.data(), kd.data(), vd.data(), dev_out.data(), doutd.data(),
                         dev_lse.data(), dq.data(), dk.data(), dv.data());
  const std::vector<float> old_dq = Stored(st, Random(9, nq)), old_dk = Stored(st, Random(10, nkv));
  const std::vector<float> old_dv = Stored(st, Random(11, nkv));
  Buf bdq(st, old_dq), bdk(st, old_dk), bdv(st, old_dv);
  for (const bool accumulate : {false, true}) {
    ASSERT_EQ(emulated::AttentionBackward(nullptr, st, args, bq.data(), bk.data(), bv.data(),
                                          bout.data(), bdout.data(), lse.data(), bdq.data(),
                                          bdk.data(), bdv.data(), accumulate, kSharedMemory),
              cudaSuccess);
    std::vector<double> want_dq = dq, want_dk = dk, want_dv = dv;
    const double times = accumulate ? 2.0 : 1.0;
    const std::int64_t q_used = shape.heads_q * shape.head_dim;
    const std::int64_t kv_used = shape.heads_kv * shape.head_dim;
    for (std::int64_t i = 0; i < nq; ++i) {
      want_dq[i] = i % shape.resolved_q_stride() < q_used ? times * dq[i] : old_dq[i];
    }
    for (std::int64_t i = 0; i < nkv; ++i) {
      const bool used = i % shape.resolved_kv_stride() < kv_used;
      want_dk[i] = used ? times * dk[i] : old_dk[i];
      want_dv[i] = used ? times * dv[i] : old_dv[i];
    }
    const double btol = bf16 ? 3e-2 : 1e-4;
    const std::string when = accumulate ? " accumulated" : "";
    EXPECT_TRUE(Close(bdq.Get(), want_dq, btol, btol)) << "dq" << when;
    EXPECT_TRUE(Close(bdk.Get(), want_dk, btol, btol)) << "dk" << when;
    EXPECT_TRUE(Close(bdv.Get(), want_dv, btol, btol)) << "dv" << when;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, EmulatedAttention,
    ::testing::Combine(
        ::testing::Values(
            AttentionCase{"causal_gqa", Shape(1, 4, 2, 16, 37, 37, true)},
            AttentionCase{"query_chunk_after_keys", Shape(1, 2, 1, 8, 20, 12, true, 12, 0)},
            AttentionCase{"masked_rows", Shape(1, 2, 2, 8, 40, 40, true, 0, 20)},
            AttentionCase{"fused_qkv_odd_dim", Shape(2, 2, 1, 5, 13, 13, true, 0, 0, 3)},
            AttentionCase{"full_mqa", Shape(1, 3, 1, 8, 9, 45, false)},
            AttentionCase{"wide_heads_tile16", Shape(1, 2, 1, 160, 20, 36, true, 16, 0)},
            AttentionCase{"late_queries_many_key_tiles", Shape(1, 2, 1, 8, 8, 70, true, 62)}),
        ::testing::Values(Storage::kF32, Storage::kBF16)),
    [](const ::testing::TestParamInfo<std::tuple<AttentionCase, Storage>>& param_info) {
      return std::string(std::get<0>(param_info.param).name) +
             (std::get<1>(param_info.param) == Storage::kBF16 ? "_bf16" : "_f32");
    });

TEST(EmulatedKernels, MergeOfChunksEqualsFullAttention) {
  const ref::AttentionShape full = Shape(1, 2, 1, 8, 24, 24, true);
  const std::int64_t chunks = 3, len = 8, q_tok = std::int64_t{2} * 8, kv_tok = 8, stat_tok = 2;
  const std::vector<float> q = Random(1, 24 * q_tok), k = Random(2, 24 * kv_tok);
  const std::vector<float> v = Random(3, 24 * kv_tok);
  std::vector<float> out(24 * q_tok, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> lse(24 * stat_tok, -std::numeric_limits<float>::infinity());
  std::vector<float> part(len * q_tok), part_lse(len * stat_tok);
  for (std::int64_t i = 0; i < chunks; ++i) {
    for (std::int64_t j = 0; j <= i; ++j) {
      ref::AttentionShape pair = full;
      pair.seq_q = pair.seq_kv = len;
      pair.q_offset = i * len;
      pair.kv_offset = j * len;
      ASSERT_EQ(emulated::AttentionForward(nullptr, Storage::kF32, ToArgs(pair),
                                           q.data() + i * len * q_tok, k.data() + j * len * kv_tok,
                                           v.data() + j * len * kv_tok, part.data(),
                                           part_lse.data(), kSharedMemory),
                cudaSuccess);
      ASSERT_EQ(emulated::AttentionMerge(
                    nullptr, Storage::kF32, len * stat_tok, 8, out.data() + i * len * q_tok,
                    lse.data() + i * len * stat_tok, part.data(), part_lse.data()),
                cudaSuccess);
    }
  }
  const std::vector<double> qd = ToDouble(q), kd = ToDouble(k), vd = ToDouble(v);
  std::vector<double> want(out.size()), want_lse(lse.size());
  ref::AttentionForward(full, qd.data(), kd.data(), vd.data(), want.data(), want_lse.data());
  EXPECT_TRUE(Close(out, want, 2e-5, 2e-5));
  EXPECT_TRUE(Close(lse, want_lse, 1e-5, 1e-5));
}

TEST(EmulatedKernels, NormsMatchReference) {
  const std::int64_t rows = 5, hidden = 70;
  const std::vector<float> x = Random(1, rows * hidden, 2.0f, 0.3f);
  const std::vector<float> gamma = Random(2, hidden, 0.1f, 1.0f), beta = Random(3, hidden);
  const std::vector<float> dy = Random(4, rows * hidden);
  std::vector<float> y(rows * hidden), dx(rows * hidden), rstd(rows), mean(rows);
  std::vector<float> dgamma = Random(5, hidden), dbeta = Random(6, hidden);
  std::vector<float> want_y = y, want_dx = dx, want_rstd = rstd, want_mean = mean;
  std::vector<float> want_dgamma = dgamma, want_dbeta = dbeta;
  const NormArgs args{rows, hidden, 1, hidden, hidden};
  ASSERT_EQ(emulated::RmsNormForward(nullptr, Storage::kF32, args, x.data(), gamma.data(), 1e-5f,
                                     y.data(), rstd.data()),
            cudaSuccess);
  ASSERT_EQ(emulated::RmsNormBackward(nullptr, Storage::kF32, args, dy.data(), x.data(),
                                      gamma.data(), rstd.data(), dx.data(), dgamma.data()),
            cudaSuccess);
  ref::RmsNormForward(x.data(), gamma.data(), rows, hidden, 1e-5f, want_y.data(), want_rstd.data());
  ref::RmsNormBackward(dy.data(), x.data(), gamma.data(), want_rstd.data(), rows, hidden,
                       want_dx.data(), want_dgamma.data());
  EXPECT_TRUE(Close(y, ToDouble(want_y), 1e-5, 1e-6));
  EXPECT_TRUE(Close(dx, ToDouble(want_dx), 1e-5, 1e-5));
  EXPECT_TRUE(Close(dgamma, ToDouble(want_dgamma), 1e-5, 1e-6));

  ASSERT_EQ(emulated::LayerNormForward(nullptr, Storage::kF32, args, x.data(), gamma.data(),
                                       beta.data(), 1e-5f, y.data(), mean.data(), rstd.data()),
            cudaSuccess);
  ASSERT_EQ(
      emulated::LayerNormBackward(nullptr, Storage::kF32, args, dy.data(), x.data(), gamma.data(),
                                  mean.data(), rstd.data(), dx.data(), dgamma.data(), dbeta.data()),
      cudaSuccess);
  ref::LayerNormForward(x.data(), gamma.data(), beta.data(), rows, hidden, 1e-5f, want_y.data(),
                        want_mean.data(), want_rstd.data());
  ref::LayerNormBackward(dy.data(), x.data(), gamma.data(), want_mean.data(), want_rstd.data(),
                         rows, hidden, want_dx.data(), want_dgamma.data(), want_dbeta.data());
  EXPECT_TRUE(Close(y, ToDouble(want_y), 1e-5, 1e-6));
  EXPECT_TRUE(Close(mean, ToDouble(want_mean), 1e-5, 1e-6));
  EXPECT_TRUE(Close(dx, ToDouble(want_dx), 1e-5, 1e-5));
  EXPECT_TRUE(Close(dgamma, ToDouble(want_dgamma), 1e-5, 1e-6));
  EXPECT_TRUE(Close(dbeta, ToDouble(want_dbeta), 1e-5, 1e-6));
}

// qk-layernorm's layout: 22 rows of 3 heads of 40 (not a multiple of a warp), x rows 130 apart and
// y (dy, dx) rows 150 apart; 66 vectors, so the parameter-gradient kernel runs two slices. The
// backward runs in place, dx over dy, as on the fused QKV buffer's gradient.
class EmulatedNorms : public ::testing::TestWithParam<Storage> {};

TEST_P(EmulatedNorms, StridedHeadsMatchReferenceAndKeepThePadding) {
  const Storage st = GetParam();
  const double tol = st == Storage::kF32 ? 1e-5 : 2e-2;
  const std::int64_t rows = 22, vectors = 3, hidden = 40, x_stride = 130, y_stride = 150;
  const std::int64_t width = vectors * hidden, count = rows * vectors;
  const ref::NormLayout layout{vectors, x_stride, y_stride};
  const NormArgs args{rows, hidden, vectors, x_stride, y_stride};
  const std::vector<float> x = Stored(st, Random(1, rows * x_stride, 2.0f, 0.3f));
  const std::vector<float> gamma = Stored(st, Random(2, hidden, 0.1f, 1.0f));
  const std::vector<float> beta = Stored(st, Random(3, hidden));
  const std::vector<float> dy = Stored(st, Random(4, rows * y_stride));
  const std::vector<float> y0 = Stored(st, Random(5, rows * y_stride));
  const std::vector<float> acc = Random(6, hidden);
  const std::vector<double> xd = ToDouble(x), gd = ToDouble(gamma), bd = ToDouble(beta);
  for (bool layernorm : {false, true}) {
    SCOPED_TRACE(layernorm ? "LayerNorm" : "RMSNorm");
    Buf bx(st, x), bg(st, gamma), bb(st, beta), by(st, y0), bdx(st, dy);
    std::vector<float> mean(count), rstd(count), dgamma = acc, dbeta = acc;
    std::vector<double> want_y = ToDouble(y0), want_dx = ToDouble(dy), want_mean(count),
                        want_rstd(count), want_dgamma = ToDouble(acc), want_dbeta = want_dgamma;
    if (layernorm) {
      ASSERT_EQ(emulated::LayerNormForward(nullptr, st, args, bx.data(), bg.data(), bb.data(),
                                           1e-5f, by.data(), mean.data(), rstd.data()),
                cudaSuccess);
      ASSERT_EQ(emulated::LayerNormBackward(nullptr, st, args, bdx.data(), bx.data(), bg.data(),
                                            mean.data(), rstd.data(), bdx.data(), dgamma.data(),
                                            dbeta.data()),
                cudaSuccess);
      ref::LayerNormForward(xd.data(), gd.data(), bd.data(), rows, hidden, 1e-5, want_y.data(),
                            want_mean.data(), want_rstd.data(), layout);
      ref::LayerNormBackward(want_dx.data(), xd.data(), gd.data(), want_mean.data(),
                             want_rstd.data(), rows, hidden, want_dx.data(), want_dgamma.data(),
                             want_dbeta.data(), layout);
      EXPECT_TRUE(Close(mean, want_mean, 1e-5, 1e-6));
      EXPECT_TRUE(Close(dbeta, want_dbeta, 1e-5, 1e-5));
    } else {
      ASSERT_EQ(emulated::RmsNormForward(nullptr, st, args, bx.data(), bg.data(), 1e-5f, by.data(),
                                         rstd.data()),
                cudaSuccess);
      ASSERT_EQ(emulated::RmsNormBackward(nullptr, st, args, bdx.data(), bx.data(), bg.data(),
                                          rstd.data(), bdx.data(), dgamma.data()),
                cudaSuccess);
      ref::RmsNormForward(xd.data(), gd.data(), rows, hidden, 1e-5, want_y.data(), want_rstd.data(),
                          layout);
      ref::RmsNormBackward(want_dx.data(), xd.data(), gd.data(), want_rstd.data(), rows, hidden,
                           want_dx.data(), want_dgamma.data(), layout);
    }
    const std::vector<float> y = by.Get(), dx = bdx.Get();
    EXPECT_TRUE(Close(y, want_y, tol, tol * 1e-1));
    EXPECT_TRUE(Close(rstd, want_rstd, 1e-5, 1e-6));
    EXPECT_TRUE(Close(dx, want_dx, tol, tol));
    EXPECT_TRUE(Close(dgamma, want_dgamma, 1e-5, 1e-5));
    for (std::int64_t i = 0; i < rows * y_stride; ++i) {
      if (i % y_stride < width) continue;
      ASSERT_EQ(y[i], y0[i]) << "y's padding at " << i;
      ASSERT_EQ(dx[i], dy[i]) << "dx's padding at " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Storages, EmulatedNorms, ::testing::Values(Storage::kF32, Storage::kBF16),
                         [](const ::testing::TestParamInfo<Storage>& param_info) {
                           return param_info.param == Storage::kBF16 ? "bf16" : "f32";
                         });

TEST(EmulatedKernels, CrossEntropyPiecesMatchReference) {
  const std::int64_t rows = 3, vocab = 300, start = 300;
  std::vector<float> logits = Random(1, rows * vocab, 8.0f);
  const std::vector<std::int32_t> targets = {310, 5, 599};
  const std::vector<float> dloss = {1.0f, 0.5f, 2.0f};
  std::vector<float> row_max(rows), partials(2 * rows), loss(rows), dlogits(rows * vocab);
  std::vector<float> want_max = row_max, want_partials = partials, want_loss = loss;
  std::vector<float> want_dlogits = dlogits;
  ASSERT_EQ(
      emulated::CrossEntropyMax(nullptr, Storage::kF32, logits.data(), rows, vocab, row_max.data()),
      cudaSuccess);
  ASSERT_EQ(emulated::CrossEntropyPartials(nullptr, Storage::kF32, logits.data(), targets.data(),
                                           rows, vocab, start, row_max.data(), partials.data()),
            cudaSuccess);
  ASSERT_EQ(emulated::CrossEntropyLoss(nullptr, row_max.data(), partials.data(), rows, loss.data()),
            cudaSuccess);
  ref::CrossEntropyMax(logits.data(), rows, vocab, want_max.data());
  ref::CrossEntropyPartials(logits.data(), targets.data(), rows, vocab, start, want_max.data(),
                            want_partials.data());
  ref::CrossEntropyLoss(want_max.data(), want_partials.data(), rows, want_loss.data());
  ref::CrossEntropyBackward(logits.data(), targets.data(), want_max.data(), want_partials.data(),
                            dloss.data(), rows, vocab, start, want_dlogits.data());
  EXPECT_EQ(row_max, want_max);
  EXPECT_TRUE(Close(partials, ToDouble(want_partials), 1e-6, 0));
  EXPECT_TRUE(Close(loss, ToDouble(want_loss), 1e-6, 0));
  ASSERT_EQ(emulated::CrossEntropyBackward(nullptr, Storage::kF32, logits.data(), targets.data(),
                                           row_max.data(), partials.data(), dloss.data(), rows,
                                           vocab, start,
                                           logits.data()),  // in place
            cudaSuccess);
  EXPECT_TRUE(Close(logits, ToDouble(want_dlogits), 1e-5, 1e-7));
}

TEST(EmulatedKernels, ElementwiseFillsAndReductions) {
  const std::int64_t n = 5000;
  std::vector<float> x(n);
  ASSERT_EQ(emulated::FillHash(nullptr, Storage::kF32, x.data(), 9, 0.5f, 10, 500, 800, 3, 100),
            cudaSuccess);
  for (std::int64_t r = 0; r < 10; ++r) {
    for (std::int64_t c = 0; c < 500; ++c) {
      ASSERT_EQ(x[r * 500 + c], 0.5f * ref::HashUniform(9, (3 + r) * 800 + 100 + c));
    }
  }
  Buf half(Storage::kBF16, std::vector<float>(n));
  ASSERT_EQ(emulated::Convert(nullptr, Storage::kBF16, half.data(), Storage::kF32, x.data(), n),
            cudaSuccess);
  for (std::int64_t i = 0; i < n; ++i) ASSERT_EQ(half.Get()[i], RoundBf16(x[i]));

  std::vector<double> partials(kSumSquaresPartials);
  float sum = 1.0f;
  ASSERT_EQ(emulated::SumSquares(nullptr, Storage::kF32, x.data(), n, &sum, partials.data()),
            cudaSuccess);
  double want = 1.0;
  for (float v : x) want += double{v} * double{v};
  EXPECT_NEAR(sum, want, want * 1e-6);

  unsigned long long first_bad = 0;
  ASSERT_EQ(emulated::FindNonfinite(nullptr, Storage::kF32, x.data(), n, &first_bad), cudaSuccess);
  EXPECT_EQ(first_bad, ~0ull);
  x[4321] = std::numeric_limits<float>::infinity();
  x[777] = std::numeric_limits<float>::quiet_NaN();
  ASSERT_EQ(emulated::FindNonfinite(nullptr, Storage::kF32, x.data(), n, &first_bad), cudaSuccess);
  EXPECT_EQ(first_bad, 777u);

  // A k = 0 GEMM: C = beta C over a strided batch, garbage not propagated when beta = 0.
  std::vector<float> c(std::size_t{2} * 13, std::numeric_limits<float>::quiet_NaN());
  ASSERT_EQ(emulated::ScaleMatrix(nullptr, Storage::kF32, c.data(), 2, 3, 4, 4, 13, 0.0f),
            cudaSuccess);
  for (int i = 0; i < 26; ++i) EXPECT_EQ(std::isnan(c[i]), i % 13 >= 12) << i;
}

// The hidden dropout kernels draw kernels::ref::DropoutKeeps' mask and compute what the CPU
// device does, bit for bit in f32 (no fused multiply-add); bf16 storage rounds the f32 result.
TEST(EmulatedKernels, DropoutMatchesTheHostMask) {
  const std::int64_t n = 3000;
  std::vector<float> x(n), residual(n), dy(n);
  for (std::int64_t i = 0; i < n; ++i) {
    x[i] = ref::HashUniform(1, i);
    residual[i] = ref::HashUniform(2, i);
    dy[i] = ref::HashUniform(3, i);
  }
  const std::uint32_t threshold = ref::DropoutThreshold(0.1f);
  const float scale = 1.0f / (1.0f - 0.1f);
  std::vector<float> out(n), dx(n);
  std::vector<std::uint8_t> mask(n, 7);
  ASSERT_EQ(emulated::DropoutAdd(nullptr, Storage::kF32, x.data(), residual.data(), out.data(),
                                 mask.data(), n, 42, threshold, scale),
            cudaSuccess);
  ASSERT_EQ(emulated::DropoutBackward(nullptr, Storage::kF32, dy.data(), mask.data(), dx.data(), n,
                                      scale),
            cudaSuccess);
  for (std::int64_t i = 0; i < n; ++i) {
    const bool keep = ref::DropoutKeeps(42, static_cast<std::uint64_t>(i), threshold);
    ASSERT_EQ(mask[i], keep ? 1 : 0) << i;
    ASSERT_EQ(out[i], residual[i] + (keep ? x[i] * scale : 0.0f)) << i;
    ASSERT_EQ(dx[i], keep ? dy[i] * scale : 0.0f) << i;
  }
  Buf hx(Storage::kBF16, x), hr(Storage::kBF16, residual),
      hout(Storage::kBF16, std::vector<float>(n));
  ASSERT_EQ(emulated::DropoutAdd(nullptr, Storage::kBF16, hx.data(), hr.data(), hout.data(),
                                 mask.data(), n, 42, threshold, scale),
            cudaSuccess);
  const std::vector<float> half = hout.Get();
  for (std::int64_t i = 0; i < n; ++i) {
    const float rx = RoundBf16(x[i]), rr = RoundBf16(residual[i]);
    ASSERT_EQ(half[i], RoundBf16(rr + (mask[i] != 0 ? rx * scale : 0.0f))) << i;
  }
}

TEST(EmulatedKernels, RopeActivationsEmbeddingAndAdamMatchReference) {
  RopeArgs rope{5, 2, 3, 12, 8, 1000, 3 * 12 + 2, 10000.0};
  const std::int64_t n = std::int64_t{5} * 2 * rope.row_stride;
  std::vector<float> x = Random(1, n);
  std::vector<float> want = x;
  ASSERT_EQ(emulated::Rope(nullptr, Storage::kF32, rope, x.data(), x.data(), 1.0), cudaSuccess);
  ref::RopeShape shape{5, 2, 3, 12, 8, 1000, 3 * 12 + 2, 10000.0};
  ref::RopeForward(shape, want.data(), want.data());
  EXPECT_TRUE(Close(x, ToDouble(want), 1e-6, 1e-7));

  const std::int64_t rows = 4, ffn = 33;
  const std::vector<float> gu = Random(2, rows * 2 * ffn, 4.0f), dy = Random(3, rows * ffn);
  std::vector<float> y(rows * ffn), dgu(rows * 2 * ffn), want_y = y, want_dgu = dgu;
  ASSERT_EQ(emulated::SwiGluForward(nullptr, Storage::kF32, gu.data(), rows, ffn, y.data()),
            cudaSuccess);
  ASSERT_EQ(
      emulated::SwiGluBackward(nullptr, Storage::kF32, dy.data(), gu.data(), rows, ffn, dgu.data()),
      cudaSuccess);
  ref::SwiGluForward(gu.data(), rows, ffn, want_y.data());
  ref::SwiGluBackward(dy.data(), gu.data(), rows, ffn, want_dgu.data());
  EXPECT_TRUE(Close(y, ToDouble(want_y), 1e-5, 1e-6));
  EXPECT_TRUE(Close(dgu, ToDouble(want_dgu), 1e-5, 1e-6));
  ASSERT_EQ(emulated::GeluForward(nullptr, Storage::kF32, gu.data(), rows * ffn, y.data()),
            cudaSuccess);
  ref::GeluForward(gu.data(), rows * ffn, want_y.data());
  EXPECT_TRUE(Close(y, ToDouble(want_y), 1e-5, 1e-6));

  const std::int64_t tokens = 20, hidden = 6, vocab = 10;
  const std::vector<float> table = Random(4, vocab * hidden), dout = Random(5, tokens * hidden);
  std::vector<std::int32_t> ids;
  ids.reserve(static_cast<std::size_t>(tokens));
  for (int t = 0; t < tokens; ++t) ids.push_back((t * 7) % 30);
  std::vector<float> out(tokens * hidden, 9.0f), want_out = out;
  std::vector<float> dtable = Random(6, vocab * hidden), want_dtable = dtable;
  ASSERT_EQ(emulated::EmbeddingForward(nullptr, Storage::kF32, table.data(), ids.data(), tokens,
                                       hidden, vocab, 10, out.data()),
            cudaSuccess);
  ASSERT_EQ(emulated::EmbeddingBackward(nullptr, Storage::kF32, dout.data(), ids.data(), tokens,
                                        hidden, vocab, 10, dtable.data()),
            cudaSuccess);
  ref::EmbeddingForward(table.data(), ids.data(), tokens, hidden, vocab, 10, want_out.data());
  ref::EmbeddingBackward(dout.data(), ids.data(), tokens, hidden, vocab, 10, want_dtable.data());
  EXPECT_EQ(out, want_out);
  EXPECT_TRUE(Close(dtable, ToDouble(want_dtable), 1e-6, 1e-7));

  // Adam: the scalars as CudaDevice::AdamStep forms them; the state must match bit for bit.
  const std::int64_t m = 700;
  std::vector<float> master = Random(7, m), grad = Random(8, m, 0.01f);
  std::vector<float> ea = Random(9, m, 0.001f), eas = Random(10, m, 1e-6f, 2e-6f);
  std::vector<float> w_master = master, w_ea = ea, w_eas = eas;
  std::vector<std::uint16_t> model(m);
  ref::AdamHyper hyper;
  hyper.lr = 3e-4f;
  hyper.weight_decay = 0.1f;
  hyper.step = 2;
  const double t = 2.0;
  AdamScalars s{};
  s.decay = static_cast<float>(1.0 - hyper.lr * hyper.weight_decay);
  s.beta1 = static_cast<float>(hyper.beta1);
  s.beta2 = static_cast<float>(hyper.beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - hyper.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - hyper.beta2);
  s.step_size = static_cast<float>(hyper.lr / (1.0 - std::pow(hyper.beta1, t)));
  s.sqrt_bias_correction2 = static_cast<float>(std::sqrt(1.0 - std::pow(hyper.beta2, t)));
  s.eps = static_cast<float>(hyper.eps);
  s.grad_scale = 1.0f;
  ASSERT_EQ(emulated::AdamStep(nullptr, s, m, master.data(), grad.data(), ea.data(), eas.data(),
                               Storage::kBF16, model.data()),
            cudaSuccess);
  ref::AdamStep(hyper, m, w_master.data(), grad.data(), w_ea.data(), w_eas.data());
  EXPECT_EQ(master, w_master);
  EXPECT_EQ(ea, w_ea);
  EXPECT_EQ(eas, w_eas);
  for (std::int64_t i = 0; i < m; ++i) ASSERT_EQ(model[i], ToBf16Bits(w_master[i])) << i;
}

// The FP8 quantizer of the cuBLASLt GEMM against the host: amax over a strided view (NaN
// ignored), scale = Fp8ScaleFromAmax, every element scaled and cast with saturation, written
// as is (by words of 4, or by bytes where a row is not whole words) or transposed: odd sizes, a
// row stride past the columns. Then the amax kernel alone on a
// grid of fewer blocks than rows, as a large view runs it: its four-row loop and its tail.
TEST(EmulatedKernels, Fp8QuantizeMatchesHostAmaxScaleAndCast) {
  struct View {
    std::int64_t rows, cols, ld;
    bool transpose;
  };
  for (const Storage storage : {Storage::kBF16, Storage::kF32}) {
    for (const View v : {View{70, 300, 310, false}, View{9, 30, 31, false}, View{37, 40, 40, true},
                         View{5, 33, 48, true}}) {
      for (const Fp8Format format : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
        std::vector<float> x = Stored(storage, Random(31, v.rows * v.ld, 6.0f, -3.0f));
        x[static_cast<std::size_t>((v.rows / 2) * v.ld + v.cols / 3)] = -17.5f;  // the amax
        x[static_cast<std::size_t>(v.cols - 1)] = std::numeric_limits<float>::quiet_NaN();
        if (v.ld > v.cols) x[static_cast<std::size_t>(v.cols)] = 1000.0f;  // outside the view
        Buf in(storage, x);
        Fp8Scales scales{};
        std::vector<__nv_fp8_storage_t> out(static_cast<std::size_t>(v.rows * v.cols));
        ASSERT_EQ(emulated::QuantizeFp8(nullptr, storage, in.data(), v.rows, v.cols, v.ld,
                                        v.transpose, format, &scales, out.data()),
                  cudaSuccess);
        const bool e4m3 = format == Fp8Format::kE4M3;
        const float scale = Fp8ScaleFromAmax(17.5f, e4m3 ? kFp8E4M3Max : kFp8E5M2Max);
        ASSERT_EQ(scales.scale, scale);
        ASSERT_EQ(scales.scale_inv, 1.0f / scale);
        for (std::int64_t r = 0; r < v.rows; ++r) {
          for (std::int64_t c = 0; c < v.cols; ++c) {
            const __nv_fp8_storage_t want =
                __nv_cvt_float_to_fp8(x[static_cast<std::size_t>(r * v.ld + c)] * scale,
                                      __NV_SATFINITE, e4m3 ? __NV_E4M3 : __NV_E5M2);
            const std::int64_t at = v.transpose ? c * v.rows + r : r * v.cols + c;
            ASSERT_EQ(out[static_cast<std::size_t>(at)], want)
                << "(" << r << ", " << c << ") of " << v.rows << "x" << v.cols;
          }
        }
      }
    }
  }
  for (const std::int64_t amax_row : {0, 29, 36}) {  // in the four-row loop, and in the tail
    const std::int64_t rows = 37, cols = 300, ld = 301;
    std::vector<float> x = Random(32, rows * ld, 2.0f, -1.0f);
    x[static_cast<std::size_t>(amax_row * ld + 299)] = 9.0f;
    x[static_cast<std::size_t>(5 * ld + 300)] = 50.0f;  // outside the view
    unsigned amax_bits = 0;
    ASSERT_EQ(Launch(AmaxKernel<float>, dim3(3, 2), kThreads, 0, nullptr, x.data(), rows, cols, ld,
                     &amax_bits),
              cudaSuccess);
    EXPECT_EQ(__uint_as_float(amax_bits), 9.0f) << "row " << amax_row;
  }
}

}  // namespace
}  // namespace autopar::kernels::cuda::emulated
