// The CUDA device's non-GEMM, non-attention ops against their host references, in f32 (tight:
// the index math) and bf16 (the compute dtype), plus memory, fills and failure classes. Skipped
// without a GPU.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/activations.h"
#include "kernels/adam.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/init.h"
#include "kernels/norms.h"
#include "kernels/rope.h"
#include "tests/unit/cuda_test_util.h"

namespace autopar::device {
namespace {

using cuda_test::Close;
using cuda_test::CudaTest;
using cuda_test::CudaTypedTest;
using cuda_test::Random;
using cuda_test::RoundBf16;
using cuda_test::Stored;
using cuda_test::ToDouble;
using cuda_test::TolFor;

TEST_F(CudaTest, ReportsItselfAndComputesInBf16) {
  EXPECT_EQ(platform_->name(), "cuda");
  EXPECT_EQ(dev().compute_dtype(), DType::kBF16);
  EXPECT_TRUE(dev().Synchronize().ok());
}

TEST_F(CudaTest, OverBudgetAndDriverRefusalAreOomAndTheDeviceStaysUsable) {
  StatusOr<Buffer> too_big = dev().Allocate(kBudgetBytes + 1);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().outcome(), Outcome::kOom);

  // Past any GPU's memory with no budget in the way: cudaMalloc itself refuses.
  CudaPlatformOptions options;
  options.device_index = 0;
  StatusOr<std::unique_ptr<Platform>> unbudgeted = MakeCudaPlatform(options);
  ASSERT_TRUE(unbudgeted.ok()) << unbudgeted.status().ToString();
  Device& raw = (*unbudgeted)->device();
  StatusOr<Buffer> huge = raw.Allocate(std::size_t{1} << 50);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().outcome(), Outcome::kOom) << huge.status().ToString();
  EXPECT_EQ(raw.bytes_in_use(), 0u);
  // The refused allocation left no error behind for the next op to trip over.
  StatusOr<Buffer> small = raw.Allocate(1024, DType::kF32);
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  EXPECT_TRUE(raw.Fill(small->tensor(), 1.0f).ok());
  EXPECT_TRUE(raw.Synchronize().ok());
  EXPECT_EQ(raw.peak_bytes(), 4096u);
}

TEST_P(CudaTypedTest, HashFillIsBitIdenticalToTheHost) {
  const DType dt = GetParam();
  // A [3, 5] block at (2, 4) of a [10, 20] matrix, then a plain fill of the whole view.
  const Tensor x = Zeros(dt, 15);
  HashFill fill{42, 0.5f, 3, 5, 20, 2, 4};
  ASSERT_TRUE(dev().FillHash(x, fill).ok());
  std::vector<float> want(15);
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 5; ++c) {
      want[r * 5 + c] = 0.5f * kernels::ref::HashUniform(42, (2 + r) * 20 + 4 + c);
    }
  }
  EXPECT_EQ(Get(x), Stored(dt, want));
  ASSERT_TRUE(dev().FillHash(x, HashFill{7, 2.0f}).ok());
  for (int i = 0; i < 15; ++i) want[i] = 2.0f * kernels::ref::HashUniform(7, i);
  EXPECT_EQ(Get(x), Stored(dt, want));
  ASSERT_TRUE(dev().Fill(x, -1.25f).ok());
  EXPECT_EQ(Get(x), std::vector<float>(15, -1.25f));
  ASSERT_TRUE(dev().Fill(x, 0.0f).ok());
  EXPECT_EQ(Get(x), std::vector<float>(15, 0.0f));
}

TEST_P(CudaTypedTest, CopiesConvertAndElementwiseOpsMatch) {
  const DType dt = GetParam();
  const std::int64_t n = 1000;
  const std::vector<float> a = Stored(dt, Random(1, n, 3.0f)), b = Stored(dt, Random(2, n));
  const Tensor ta = Put(dt, a), tb = Put(dt, b), out = Zeros(dt, n);

  ASSERT_TRUE(dev().Copy(out, ta).ok());
  EXPECT_EQ(Get(out), a);
  // f32 <-> bf16 conversion rounds to nearest even.
  const Tensor f32 = Zeros(DType::kF32, n), bf16 = Zeros(DType::kBF16, n);
  ASSERT_TRUE(dev().Copy(f32, ta).ok());
  ASSERT_TRUE(dev().Copy(bf16, f32).ok());
  EXPECT_EQ(Get(bf16), Stored(DType::kBF16, a));
  EXPECT_EQ(dev().Copy(out, ta.Slice(0, n - 1)).outcome(), Outcome::kInvalid);

  std::vector<float> sum(n), axpy(n), scaled(n);
  for (std::int64_t i = 0; i < n; ++i) {
    sum[i] = a[i] + b[i];
    axpy[i] = b[i] + 0.25f * a[i];
    scaled[i] = a[i] * -3.0f;
  }
  ASSERT_TRUE(dev().Add(ta, tb, out).ok());
  EXPECT_EQ(Get(out), Stored(dt, sum));
  ASSERT_TRUE(dev().Axpy(0.25f, ta, tb).ok());
  EXPECT_EQ(Get(tb), Stored(dt, axpy));
  ASSERT_TRUE(dev().Scale(ta, -3.0f).ok());
  EXPECT_EQ(Get(ta), Stored(dt, scaled));

  // SumSquares accumulates (+=) into an f32 scalar; large counts use many blocks.
  const std::int64_t big = 3'000'001;
  const std::vector<float> x = Stored(dt, Random(3, big));
  double want = 7.0;
  for (float v : x) want += double{v} * double{v};
  const Tensor tx = Put(dt, x), acc = Put(DType::kF32, {7.0f});
  ASSERT_TRUE(dev().SumSquares(tx, acc).ok());
  EXPECT_NEAR(Get(acc)[0], want, want * 1e-6);

  ASSERT_TRUE(dev().CheckFinite(tx).ok());
  std::vector<float> bad = x;
  bad[123457] = std::numeric_limits<float>::infinity();
  bad[2'000'000] = std::numeric_limits<float>::quiet_NaN();
  const Status nonfinite = dev().CheckFinite(Put(dt, bad));
  EXPECT_EQ(nonfinite.outcome(), Outcome::kNonfinite);
  EXPECT_NE(nonfinite.message().find("element 123457"), std::string::npos) << nonfinite.message();
  // Mixed storage within one op is the caller's bug.
  const DType other = dt == DType::kF32 ? DType::kBF16 : DType::kF32;
  EXPECT_EQ(dev().Add(ta, Put(other, b), out).outcome(), Outcome::kInvalid);
}

// Hidden dropout: the kernel draws kernels::ref::DropoutKeeps' mask (the CPU device's) and
// computes residual + mask·x/(1 − p) and mask·dy/(1 − p) as the host does, rounded once into the
// storage; over many blocks (the grid-stride loop's index is the mask's counter).
TEST_P(CudaTypedTest, DropoutMatchesTheHostMask) {
  const DType dt = GetParam();
  const std::int64_t n = 300'001;
  const std::vector<float> x = Stored(dt, Random(4, n)), residual = Stored(dt, Random(5, n)),
                           dy = Stored(dt, Random(6, n));
  StatusOr<Buffer> mask = dev().Allocate(n, DType::kU8);
  ASSERT_TRUE(mask.ok()) << mask.status().ToString();
  const Tensor out = Zeros(dt, n), dx = Zeros(dt, n);
  const DropoutDesc d{0.1f, 2024};
  ASSERT_TRUE(dev().DropoutAdd(d, Put(dt, x), Put(dt, residual), out, mask->tensor()).ok());
  ASSERT_TRUE(dev().DropoutBackward(d, Put(dt, dy), mask->tensor(), dx).ok());
  StatusOr<std::vector<std::uint8_t>> kept = dev().Download<std::uint8_t>(mask->tensor());
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  const std::uint32_t threshold = kernels::ref::DropoutThreshold(0.1f);
  const float scale = 1.0f / (1.0f - 0.1f);
  std::vector<float> want_out(n), want_dx(n);
  std::vector<std::uint8_t> want_mask(n);
  for (std::int64_t i = 0; i < n; ++i) {
    const bool keep = kernels::ref::DropoutKeeps(2024, static_cast<std::uint64_t>(i), threshold);
    want_mask[i] = keep ? 1 : 0;
    want_out[i] = residual[i] + (keep ? x[i] * scale : 0.0f);
    want_dx[i] = keep ? dy[i] * scale : 0.0f;
  }
  EXPECT_EQ(*kept, want_mask);
  EXPECT_EQ(Get(out), Stored(dt, want_out));
  EXPECT_EQ(Get(dx), Stored(dt, want_dx));
  EXPECT_EQ(
      dev().DropoutAdd({1.5f, 1}, Put(dt, x), Put(dt, residual), out, mask->tensor()).outcome(),
      Outcome::kInvalid);
}

TEST_P(CudaTypedTest, NormsMatchReference) {
  const DType dt = GetParam();
  const auto tol = TolFor(dt, 2e-5, 2e-2);
  const NormDesc d{67, 300, 1e-5f};
  const std::int64_t n = d.rows * d.hidden;
  const std::vector<float> x = Stored(dt, Random(1, n, 2.0f, 0.3f));
  const std::vector<float> gamma = Stored(dt, Random(2, d.hidden, 0.1f, 1.0f));
  const std::vector<float> beta = Stored(dt, Random(3, d.hidden));
  const std::vector<float> dy = Stored(dt, Random(4, n));
  const std::vector<float> dgamma0 = Random(5, d.hidden), dbeta0 = Random(6, d.hidden);
  const Tensor tx = Put(dt, x), tg = Put(dt, gamma), tb = Put(dt, beta), tdy = Put(dt, dy);
  const Tensor ty = Zeros(dt, n), tdx = Zeros(dt, n), tr = Zeros(DType::kF32, d.rows);
  const Tensor tm = Zeros(DType::kF32, d.rows);
  const Tensor tdg = Put(DType::kF32, dgamma0), tdb = Put(DType::kF32, dbeta0);

  std::vector<double> y(n), rstd(d.rows), mean(d.rows), dx(n);
  std::vector<double> dgamma = ToDouble(dgamma0), dbeta = ToDouble(dbeta0);
  const std::vector<double> xd = ToDouble(x), gd = ToDouble(gamma), bd = ToDouble(beta),
                            dyd = ToDouble(dy);
  ASSERT_TRUE(dev().RmsNormForward(d, tx, tg, ty, tr).ok());
  kernels::ref::RmsNormForward(xd.data(), gd.data(), d.rows, d.hidden, double{d.eps}, y.data(),
                               rstd.data());
  EXPECT_TRUE(Close(Get(ty), y, tol.rtol, tol.atol));
  EXPECT_TRUE(Close(Get(tr), rstd, 1e-5, 1e-5));
  ASSERT_TRUE(dev().RmsNormBackward(d, tdy, tx, tg, tr, tdx, tdg).ok());
  kernels::ref::RmsNormBackward(dyd.data(), xd.data(), gd.data(), rstd.data(), d.rows, d.hidden,
                                dx.data(), dgamma.data());
  EXPECT_TRUE(Close(Get(tdx), dx, tol.rtol, tol.atol));
  EXPECT_TRUE(Close(Get(tdg), dgamma, 1e-5, 1e-5));  // f32 accumulation whatever the storage

  ASSERT_TRUE(dev().Upload(tdg, dgamma0).ok());
  dgamma = ToDouble(dgamma0);
  ASSERT_TRUE(dev().LayerNormForward(d, tx, tg, tb, ty, tm, tr).ok());
  kernels::ref::LayerNormForward(xd.data(), gd.data(), bd.data(), d.rows, d.hidden, double{d.eps},
                                 y.data(), mean.data(), rstd.data());
  EXPECT_TRUE(Close(Get(ty), y, tol.rtol, tol.atol));
  EXPECT_TRUE(Close(Get(tm), mean, 1e-5, 1e-5));
  EXPECT_TRUE(Close(Get(tr), rstd, 1e-5, 1e-5));
  ASSERT_TRUE(dev().LayerNormBackward(d, tdy, tx, tg, tm, tr, tdx, tdg, tdb).ok());
  kernels::ref::LayerNormBackward(dyd.data(), xd.data(), gd.data(), mean.data(), rstd.data(),
                                  d.rows, d.hidden, dx.data(), dgamma.data(), dbeta.data());
  EXPECT_TRUE(Close(Get(tdx), dx, tol.rtol, tol.atol));
  EXPECT_TRUE(Close(Get(tdg), dgamma, 1e-5, 1e-5));
  EXPECT_TRUE(Close(Get(tdb), dbeta, 1e-5, 1e-5));

  // Wrong dtypes are the caller's bug.
  const Tensor int_gamma = PutI32(std::vector<std::int32_t>(d.hidden, 1));
  EXPECT_EQ(dev().RmsNormForward(d, tx, int_gamma, ty, tr).outcome(), Outcome::kInvalid);
}

// Megatron's qk-layernorm: a norm over each of 6 heads of 128 inside rows of a fused QKV buffer
// (y, dy, dx rows 1027 apart) from a saved copy of the pre-norm values (x rows 773 apart); the
// backward in place over the buffer's gradient. 402 vectors: several parameter-gradient slices.
TEST_P(CudaTypedTest, StridedNormsOverHeadsMatchReferenceAndKeepThePadding) {
  const DType dt = GetParam();
  const auto tol = TolFor(dt, 2e-5, 2e-2);
  NormDesc d{67, 128, 1e-5f};
  d.vectors = 6;
  d.x_stride = 6 * 128 + 5;
  d.y_stride = 8 * 128 + 3;
  const kernels::ref::NormLayout layout{d.vectors, d.x_stride, d.y_stride};
  const std::int64_t nx = d.rows * d.x_stride, ny = d.rows * d.y_stride;
  const std::int64_t width = d.vectors * d.hidden, stats = d.rows * d.vectors;
  const std::vector<float> x = Stored(dt, Random(1, nx, 2.0f, 0.3f));
  const std::vector<float> gamma = Stored(dt, Random(2, d.hidden, 0.1f, 1.0f));
  const std::vector<float> beta = Stored(dt, Random(3, d.hidden));
  const std::vector<float> dy = Stored(dt, Random(4, ny)), y0 = Stored(dt, Random(5, ny));
  const std::vector<float> acc = Random(6, d.hidden);
  const std::vector<double> xd = ToDouble(x), gd = ToDouble(gamma), bd = ToDouble(beta);
  const Tensor tx = Put(dt, x), tg = Put(dt, gamma), tb = Put(dt, beta);
  for (bool layernorm : {false, true}) {
    SCOPED_TRACE(layernorm ? "LayerNorm" : "RMSNorm");
    const Tensor ty = Put(dt, y0), tdx = Put(dt, dy), tm = Zeros(DType::kF32, stats);
    const Tensor tr = Zeros(DType::kF32, stats);
    const Tensor tdg = Put(DType::kF32, acc), tdb = Put(DType::kF32, acc);
    std::vector<double> y = ToDouble(y0), dx = ToDouble(dy), mean(stats), rstd(stats);
    std::vector<double> dgamma = ToDouble(acc), dbeta = dgamma;
    if (layernorm) {
      ASSERT_TRUE(dev().LayerNormForward(d, tx, tg, tb, ty, tm, tr).ok());
      ASSERT_TRUE(dev().LayerNormBackward(d, tdx, tx, tg, tm, tr, tdx, tdg, tdb).ok());
      kernels::ref::LayerNormForward(xd.data(), gd.data(), bd.data(), d.rows, d.hidden,
                                     double{d.eps}, y.data(), mean.data(), rstd.data(), layout);
      kernels::ref::LayerNormBackward(dx.data(), xd.data(), gd.data(), mean.data(), rstd.data(),
                                      d.rows, d.hidden, dx.data(), dgamma.data(), dbeta.data(),
                                      layout);
      EXPECT_TRUE(Close(Get(tm), mean, 1e-5, 1e-5));
      EXPECT_TRUE(Close(Get(tdb), dbeta, 1e-5, 1e-5));
    } else {
      ASSERT_TRUE(dev().RmsNormForward(d, tx, tg, ty, tr).ok());
      ASSERT_TRUE(dev().RmsNormBackward(d, tdx, tx, tg, tr, tdx, tdg).ok());
      kernels::ref::RmsNormForward(xd.data(), gd.data(), d.rows, d.hidden, double{d.eps}, y.data(),
                                   rstd.data(), layout);
      kernels::ref::RmsNormBackward(dx.data(), xd.data(), gd.data(), rstd.data(), d.rows, d.hidden,
                                    dx.data(), dgamma.data(), layout);
    }
    const std::vector<float> got_y = Get(ty), got_dx = Get(tdx);
    EXPECT_TRUE(Close(got_y, y, tol.rtol, tol.atol));
    EXPECT_TRUE(Close(Get(tr), rstd, 1e-5, 1e-5));
    EXPECT_TRUE(Close(got_dx, dx, tol.rtol, tol.atol));
    EXPECT_TRUE(Close(Get(tdg), dgamma, 1e-5, 1e-5));
    for (std::int64_t i = 0; i < ny; ++i) {
      if (i % d.y_stride < width) continue;
      ASSERT_EQ(got_y[i], y0[i]) << "y's padding at " << i;
      ASSERT_EQ(got_dx[i], dy[i]) << "dx's padding at " << i;
    }
  }
  // The views must reach the last vector's end; stats are one per vector.
  EXPECT_EQ(dev()
                .RmsNormForward(d, tx.Slice(0, nx - d.x_stride + width - 1), tg, Zeros(dt, ny),
                                Zeros(DType::kF32, stats))
                .outcome(),
            Outcome::kInvalid);
  EXPECT_EQ(dev().RmsNormForward(d, tx, tg, Zeros(dt, ny), Zeros(DType::kF32, d.rows)).outcome(),
            Outcome::kInvalid);
  NormDesc narrow = d;
  narrow.y_stride = width - 1;
  EXPECT_EQ(
      dev().RmsNormForward(narrow, tx, tg, Zeros(dt, ny), Zeros(DType::kF32, stats)).outcome(),
      Outcome::kInvalid);
}

// CopyRows: a [300, 100] block from rows 130 apart into rows 117 apart, 7 elements in; the rest of
// the destination is left alone. Then i32 (any dtype) and the argument checks.
TEST_P(CudaTypedTest, CopyRowsMovesABlockBetweenStrides) {
  const DType dt = GetParam();
  const std::int64_t rows = 300, cols = 100, src_stride = 130, dst_stride = 117;
  const std::vector<float> src = Stored(dt, Random(1, rows * src_stride));
  const std::vector<float> dst0 = Stored(dt, Random(2, 7 + rows * dst_stride));
  const Tensor tsrc = Put(dt, src), tdst = Put(dt, dst0);
  ASSERT_TRUE(
      dev()
          .CopyRows(tdst.Slice(7, rows * dst_stride), dst_stride, tsrc, src_stride, rows, cols)
          .ok());
  std::vector<float> want = dst0;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t c = 0; c < cols; ++c) want[7 + r * dst_stride + c] = src[r * src_stride + c];
  }
  EXPECT_EQ(Get(tdst), want);

  const Tensor ids = PutI32({1, 2, 3, 4, 5, 6}), out = PutI32(std::vector<std::int32_t>(8, -1));
  ASSERT_TRUE(dev().CopyRows(out, 3, ids, 2, 3, 2).ok());
  StatusOr<std::vector<std::int32_t>> got = dev().Download<std::int32_t>(out);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, (std::vector<std::int32_t>{1, 2, -1, 3, 4, -1, 5, 6}));

  EXPECT_TRUE(dev().CopyRows(tdst, dst_stride, tsrc, src_stride, 0, cols).ok());
  EXPECT_EQ(dev().CopyRows(tdst, cols - 1, tsrc, src_stride, rows, cols).outcome(),
            Outcome::kInvalid);
  EXPECT_EQ(dev().CopyRows(tdst, dst_stride, tsrc.Slice(0, 1000), src_stride, rows, cols).outcome(),
            Outcome::kInvalid);
  EXPECT_EQ(dev().CopyRows(out, 3, tsrc, src_stride, 2, 2).outcome(), Outcome::kInvalid);
  EXPECT_EQ(dev().CopyRows(tsrc.Slice(1, 1000), 130, tsrc, 130, 5, 100).outcome(),
            Outcome::kInvalid);  // the blocks overlap
  EXPECT_TRUE(dev().Synchronize().ok());
}

TEST_P(CudaTypedTest, RopeWithOffsetPartialRotationAndFusedRowsMatchesReference) {
  const DType dt = GetParam();
  const auto tol = TolFor(dt, 1e-5, 1e-2);
  // q of 4 heads inside a fused [tokens, 4 + 2 + 2 heads + 3 pad] row, rotated in place.
  RopeDesc d;
  d.seq = 9;
  d.batch = 2;
  d.heads = 4;
  d.head_dim = 16;
  d.rotary_dim = 12;
  d.position_offset = 100000;  // large positions: angles must not lose precision
  d.row_stride = 8 * 16 + 3;
  const std::int64_t n = d.seq * d.batch * d.row_stride;
  const std::vector<float> x = Stored(dt, Random(1, n));
  const Tensor t = Put(dt, x);
  ASSERT_TRUE(dev().RopeForward(d, t, t).ok());
  kernels::ref::RopeShape shape{d.seq,        d.batch,           d.heads,      d.head_dim,
                                d.rotary_dim, d.position_offset, d.row_stride, double{d.base}};
  std::vector<double> want = ToDouble(x);
  kernels::ref::RopeForward(shape, want.data(), want.data());
  EXPECT_TRUE(Close(Get(t), want, tol.rtol, tol.atol));
  // Backward is the inverse rotation: back to x (up to rounding).
  ASSERT_TRUE(dev().RopeBackward(d, t, t).ok());
  EXPECT_TRUE(Close(Get(t), ToDouble(x), tol.rtol, 2 * tol.atol));
  // Out of place: the pass-through features and the rest of the row.
  const Tensor y = Put(dt, std::vector<float>(static_cast<std::size_t>(n), 0.0f));
  const Tensor tx = Put(dt, x);
  ASSERT_TRUE(dev().RopeBackward(d, tx, y).ok());
  std::vector<double> back = ToDouble(x);
  kernels::ref::RopeBackward(shape, back.data(), back.data());
  std::vector<float> got = Get(y);
  for (std::int64_t i = 0; i < n; ++i) {
    if (i % d.row_stride >= d.heads * d.head_dim) back[i] = 0.0;  // untouched by the op
  }
  EXPECT_TRUE(Close(got, back, tol.rtol, tol.atol));
}

TEST_P(CudaTypedTest, ActivationsMatchReference) {
  const DType dt = GetParam();
  const auto tol = TolFor(dt, 1e-5, 1e-2);
  const std::int64_t rows = 33, ffn = 70;
  const std::vector<float> x = Stored(dt, Random(1, rows * 2 * ffn, 4.0f));
  const std::vector<float> dy = Stored(dt, Random(2, rows * ffn));
  const Tensor tx = Put(dt, x), tdy = Put(dt, dy);
  const Tensor ty = Zeros(dt, rows * ffn), tdx = Zeros(dt, rows * 2 * ffn);
  const std::vector<double> xd = ToDouble(x), dyd = ToDouble(dy);
  std::vector<double> y(rows * ffn), dx(rows * 2 * ffn);
  ASSERT_TRUE(dev().SwiGluForward(rows, ffn, tx, ty).ok());
  kernels::ref::SwiGluForward(xd.data(), rows, ffn, y.data());
  EXPECT_TRUE(Close(Get(ty), y, tol.rtol, tol.atol));
  ASSERT_TRUE(dev().SwiGluBackward(rows, ffn, tdy, tx, tdx).ok());
  kernels::ref::SwiGluBackward(dyd.data(), xd.data(), rows, ffn, dx.data());
  EXPECT_TRUE(Close(Get(tdx), dx, tol.rtol, tol.atol));
  EXPECT_EQ(dev().SwiGluBackward(rows, ffn, tdy, tx, tx).outcome(), Outcome::kInvalid);

  const std::int64_t n = rows * ffn;
  const Tensor gx = tx.Slice(0, n), gy = Zeros(dt, n);
  ASSERT_TRUE(dev().GeluForward(gx, gy).ok());
  kernels::ref::GeluForward(xd.data(), n, y.data());
  EXPECT_TRUE(Close(Get(gy), y, tol.rtol, tol.atol));
  ASSERT_TRUE(dev().GeluBackward(tdy, gx, tdy).ok());  // dx aliases dy
  std::vector<double> gdx(n);
  kernels::ref::GeluBackward(dyd.data(), xd.data(), n, gdx.data());
  EXPECT_TRUE(Close(Get(tdy), gdx, tol.rtol, tol.atol));
}

TEST_P(CudaTypedTest, VocabShardedCrossEntropyMatchesReference) {
  const DType dt = GetParam();
  const auto tol = TolFor(dt, 1e-5, 1e-2);
  const std::int64_t rows = 13, vocab = 1000, start = 3000;
  const std::vector<float> logits = Stored(dt, Random(1, rows * vocab, 8.0f));
  std::vector<std::int32_t> targets(rows);
  for (std::int64_t r = 0; r < rows; ++r) {
    // Some targets in the shard, some on other shards.
    targets[r] = static_cast<std::int32_t>(r % 3 == 0 ? 17 : start + (r * 97) % vocab);
  }
  const CrossEntropyDesc d{rows, vocab, start};
  const Tensor tl = Put(dt, logits), tt = PutI32(targets);
  const Tensor tmax = Zeros(DType::kF32, rows), tpart = Zeros(DType::kF32, 2 * rows);
  const Tensor tloss = Zeros(DType::kF32, rows);
  const std::vector<float> dloss = Random(2, rows, 1.0f, 1.5f);
  const Tensor tdloss = Put(DType::kF32, dloss);
  const std::vector<double> ld = ToDouble(logits);
  std::vector<double> row_max(rows), partials(2 * rows), loss(rows), dlogits(rows * vocab);
  ASSERT_TRUE(dev().CrossEntropyMax(d, tl, tmax).ok());
  kernels::ref::CrossEntropyMax(ld.data(), rows, vocab, row_max.data());
  EXPECT_TRUE(Close(Get(tmax), row_max, 0, 0));  // a max is exact
  ASSERT_TRUE(dev().CrossEntropyPartials(d, tl, tt, tmax, tpart).ok());
  kernels::ref::CrossEntropyPartials(ld.data(), targets.data(), rows, vocab, start, row_max.data(),
                                     partials.data());
  EXPECT_TRUE(Close(Get(tpart), partials, 1e-5, 0));
  ASSERT_TRUE(dev().CrossEntropyLoss(d, tmax, tpart, tloss).ok());
  kernels::ref::CrossEntropyLoss(row_max.data(), partials.data(), rows, loss.data());
  EXPECT_TRUE(Close(Get(tloss), loss, 1e-5, 1e-6));
  const std::vector<double> dld = ToDouble(dloss);
  ASSERT_TRUE(dev().CrossEntropyBackward(d, tl, tt, tmax, tpart, tdloss, tl).ok());  // in place
  kernels::ref::CrossEntropyBackward(ld.data(), targets.data(), row_max.data(), partials.data(),
                                     dld.data(), rows, vocab, start, dlogits.data());
  EXPECT_TRUE(Close(Get(tl), dlogits, tol.rtol, tol.atol));
}

TEST_P(CudaTypedTest, EmbeddingShardAndBackward) {
  const DType dt = GetParam();
  const std::int64_t tokens = 50, hidden = 24, vocab = 40, start = 40;
  const std::vector<float> table = Stored(dt, Random(1, vocab * hidden));
  std::vector<std::int32_t> ids(tokens);
  for (std::int64_t t = 0; t < tokens; ++t) ids[t] = static_cast<std::int32_t>((t * 7) % 120);
  const EmbeddingDesc d{tokens, hidden, vocab, start};
  const Tensor ttable = Put(dt, table), tids = PutI32(ids), tout = Zeros(dt, tokens * hidden);
  ASSERT_TRUE(dev().EmbeddingForward(d, ttable, tids, tout).ok());
  std::vector<float> want(tokens * hidden);
  kernels::ref::EmbeddingForward(table.data(), ids.data(), tokens, hidden, vocab, start,
                                 want.data());
  EXPECT_EQ(Get(tout), want);  // a gather is exact

  const std::vector<float> dout = Stored(dt, Random(2, tokens * hidden));
  const std::vector<float> dtable0 = Random(3, vocab * hidden);
  const Tensor tdout = Put(dt, dout), tdtable = Put(DType::kF32, dtable0);
  ASSERT_TRUE(dev().EmbeddingBackward(d, tdout, tids, tdtable).ok());
  std::vector<double> dtable = ToDouble(dtable0);
  const std::vector<double> doutd = ToDouble(dout);
  kernels::ref::EmbeddingBackward(doutd.data(), ids.data(), tokens, hidden, vocab, start,
                                  dtable.data());
  EXPECT_TRUE(Close(Get(tdtable), dtable, 1e-6, 1e-6));
}

TEST_P(CudaTypedTest, AdamIsBitIdenticalToTheHostAndWritesTheModelCopy) {
  const DType dt = GetParam();
  const std::int64_t n = 4097;
  std::vector<float> master = Random(1, n), grad = Random(2, n, 0.01f);
  std::vector<float> m = Random(3, n, 0.001f), v = Random(4, n, 1e-6f, 2e-6f);
  const Tensor tm = Put(DType::kF32, master), tg = Put(DType::kF32, grad);
  const Tensor tea = Put(DType::kF32, m), tes = Put(DType::kF32, v), model = Zeros(dt, n);
  AdamParams p;
  p.lr = 3e-4f;
  p.weight_decay = 0.1f;
  p.grad_scale = 0.5f;
  kernels::ref::AdamHyper hyper;
  hyper.lr = p.lr;
  hyper.beta1 = p.beta1;
  hyper.beta2 = p.beta2;
  hyper.eps = p.eps;
  hyper.weight_decay = p.weight_decay;
  hyper.grad_scale = p.grad_scale;
  for (std::int64_t step = 1; step <= 3; ++step) {
    p.step = step;
    hyper.step = step;
    ASSERT_TRUE(dev().AdamStep(p, tm, tg, tea, tes, model).ok());
    kernels::ref::AdamStep(hyper, n, master.data(), grad.data(), m.data(), v.data());
  }
  EXPECT_EQ(Get(tm), master);
  EXPECT_EQ(Get(tea), m);
  EXPECT_EQ(Get(tes), v);
  EXPECT_EQ(Get(model), Stored(dt, master));
  EXPECT_TRUE(dev().AdamStep(p, tm, tg, tea, tes, Tensor{}).ok());  // no model copy
}

INSTANTIATE_TEST_SUITE_P(Storage, CudaTypedTest, ::testing::Values(DType::kF32, DType::kBF16),
                         cuda_test::DTypeParamName);

}  // namespace
}  // namespace autopar::device
