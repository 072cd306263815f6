// The CPU device's non-GEMM, non-attention ops: each against its host reference, plus the
// argument checks and the failure classes (kInvalid, kNonfinite) they report.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "autopar/device/platform.h"
#include "kernels/activations.h"
#include "kernels/adam.h"
#include "kernels/cross_entropy.h"
#include "kernels/init.h"
#include "kernels/norms.h"
#include "kernels/rope.h"
#include "tests/unit/device_test_util.h"

namespace autopar::device {
namespace {

std::vector<float> Random(std::uint64_t seed, std::int64_t n, float scale = 1.0f,
                          float shift = 0.0f) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = shift + scale * kernels::ref::HashUniform(seed, i);
  }
  return v;
}

using DeviceOps = test_util::CpuDeviceTest;

TEST_F(DeviceOps, NormsMatchReference) {
  const NormDesc d{4, 16, 1e-5f};
  const std::vector<float> x = Random(1, 64, 2.0f), gamma = Random(2, 16, 0.1f, 1.0f);
  const std::vector<float> beta = Random(3, 16), dy = Random(4, 64);
  std::vector<float> y(64), rstd(4), mean(4), dx(64), dgamma(16, 0.0f), dbeta(16, 0.0f);

  const Tensor tx = Put(x), tg = Put(gamma), tb = Put(beta), tdy = Put(dy);
  const Tensor ty = Zeros(64), tr = Zeros(4), tm = Zeros(4), tdx = Zeros(64);
  const Tensor tdg = Zeros(16), tdb = Zeros(16);
  ASSERT_TRUE(dev().RmsNormForward(d, tx, tg, ty, tr).ok());
  ASSERT_TRUE(dev().RmsNormBackward(d, tdy, tx, tg, tr, tdx, tdg).ok());
  kernels::ref::RmsNormForward(x.data(), gamma.data(), 4, 16, 1e-5f, y.data(), rstd.data());
  kernels::ref::RmsNormBackward(dy.data(), x.data(), gamma.data(), rstd.data(), 4, 16, dx.data(),
                                dgamma.data());
  EXPECT_EQ(Get(ty), y);
  EXPECT_EQ(Get(tdx), dx);
  EXPECT_EQ(Get(tdg), dgamma);

  std::fill(dgamma.begin(), dgamma.end(), 0.0f);
  ASSERT_TRUE(dev().Fill(tdg, 0.0f).ok());
  ASSERT_TRUE(dev().LayerNormForward(d, tx, tg, tb, ty, tm, tr).ok());
  ASSERT_TRUE(dev().LayerNormBackward(d, tdy, tx, tg, tm, tr, tdx, tdg, tdb).ok());
  kernels::ref::LayerNormForward(x.data(), gamma.data(), beta.data(), 4, 16, 1e-5f, y.data(),
                                 mean.data(), rstd.data());
  kernels::ref::LayerNormBackward(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), 4,
                                  16, dx.data(), dgamma.data(), dbeta.data());
  EXPECT_EQ(Get(ty), y);
  EXPECT_EQ(Get(tdx), dx);
  EXPECT_EQ(Get(tdg), dgamma);
  EXPECT_EQ(Get(tdb), dbeta);

  const Status bad = dev().RmsNormForward(NormDesc{4, 32, 1e-5f}, tx, tg, ty, tr);
  EXPECT_EQ(bad.outcome(), Outcome::kInvalid);
}

// Every operand of every norm op is checked before anything runs: one element short, or of
// another dtype, it is refused as kInvalid by the op's name and its own.
TEST_F(DeviceOps, NormsRefuseEachOperandByName) {
  const NormDesc d{4, 16, 1e-5f};
  using Args = std::vector<Tensor>;
  struct Op {
    const char* name;
    std::vector<const char*> operands;
    std::vector<std::int64_t> sizes;
    std::function<Status(const Args&)> call;
  };
  const std::vector<Op> ops = {
      {"RmsNormForward",
       {"x", "gamma", "y", "rstd"},
       {64, 16, 64, 4},
       [&](const Args& t) { return dev().RmsNormForward(d, t[0], t[1], t[2], t[3]); }},
      {"RmsNormBackward",
       {"dy", "x", "gamma", "rstd", "dx", "dgamma"},
       {64, 64, 16, 4, 64, 16},
       [&](const Args& t) { return dev().RmsNormBackward(d, t[0], t[1], t[2], t[3], t[4], t[5]); }},
      {"LayerNormForward",
       {"x", "gamma", "beta", "y", "mean", "rstd"},
       {64, 16, 16, 64, 4, 4},
       [&](const Args& t) {
         return dev().LayerNormForward(d, t[0], t[1], t[2], t[3], t[4], t[5]);
       }},
      {"LayerNormBackward",
       {"dy", "x", "gamma", "mean", "rstd", "dx", "dgamma", "dbeta"},
       {64, 64, 16, 4, 4, 64, 16, 16},
       [&](const Args& t) {
         return dev().LayerNormBackward(d, t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
       }},
  };
  for (const Op& op : ops) {
    Args good;
    for (std::int64_t n : op.sizes) good.push_back(Put(Random(good.size() + 1, n, 1.0f, 0.5f)));
    const Status ok = op.call(good);
    ASSERT_TRUE(ok.ok()) << op.name << ": " << ok.ToString();
    for (std::size_t i = 0; i < good.size(); ++i) {
      const std::string named = std::string(op.name) + ": `" + op.operands[i] + "` ";
      Args args = good;
      args[i] = good[i].Slice(0, op.sizes[i] - 1);
      const Status short_one = op.call(args);
      EXPECT_EQ(short_one.outcome(), Outcome::kInvalid) << named;
      EXPECT_NE(short_one.message().find(named + "has " + std::to_string(op.sizes[i] - 1)),
                std::string::npos)
          << short_one.message();
      args[i] = Put(std::vector<std::int32_t>(static_cast<std::size_t>(op.sizes[i])));
      const Status retyped = op.call(args);
      EXPECT_EQ(retyped.outcome(), Outcome::kInvalid) << named;
      EXPECT_NE(retyped.message().find(named + "is i32, expected f32"), std::string::npos)
          << retyped.message();
    }
  }
}

// qk-layernorm's layout through the Device API: 2 heads of 8 per row, x rows 20 apart, y (dy, dx)
// rows 28 apart, dx over dy; and the layout's argument checks.
TEST_F(DeviceOps, StridedNormsMatchReferenceAndCheckTheirLayout) {
  NormDesc d{5, 8, 1e-5f};
  d.vectors = 2;
  d.x_stride = 20;
  d.y_stride = 28;
  const kernels::ref::NormLayout layout{2, 20, 28};
  const std::int64_t nx = std::int64_t{5} * 20, ny = std::int64_t{5} * 28, stats = 10;
  const std::vector<float> x = Random(11, nx, 2.0f), gamma = Random(12, 8, 0.1f, 1.0f);
  const std::vector<float> beta = Random(13, 8), dy = Random(14, ny), y0 = Random(15, ny);
  const Tensor tx = Put(x), tg = Put(gamma), tb = Put(beta), ty = Put(y0), tdy = Put(dy);
  const Tensor tm = Zeros(stats), tr = Zeros(stats), tdg = Zeros(8), tdb = Zeros(8);
  std::vector<float> y = y0, dx = dy, mean(stats), rstd(stats), dgamma(8, 0.0f), dbeta(8, 0.0f);

  ASSERT_TRUE(dev().LayerNormForward(d, tx, tg, tb, ty, tm, tr).ok());
  ASSERT_TRUE(dev().LayerNormBackward(d, tdy, tx, tg, tm, tr, tdy, tdg, tdb).ok());  // in place
  kernels::ref::LayerNormForward(x.data(), gamma.data(), beta.data(), 5, 8, 1e-5f, y.data(),
                                 mean.data(), rstd.data(), layout);
  kernels::ref::LayerNormBackward(dy.data(), x.data(), gamma.data(), mean.data(), rstd.data(), 5, 8,
                                  dx.data(), dgamma.data(), dbeta.data(), layout);
  EXPECT_EQ(Get(ty), y);
  EXPECT_EQ(Get(tm), mean);
  EXPECT_EQ(Get(tr), rstd);
  EXPECT_EQ(Get(tdy), dx);
  EXPECT_EQ(Get(tdg), dgamma);
  EXPECT_EQ(Get(tdb), dbeta);
  const std::vector<float> got_y = Get(ty);
  for (std::int64_t i = 0; i < ny; ++i) {
    if (i % 28 >= 16) {
      EXPECT_EQ(got_y[i], y0[i]) << "y's padding at " << i;
    }
  }

  const Tensor tdx = Put(y0);
  std::fill(dgamma.begin(), dgamma.end(), 0.0f);
  dx = y0;
  ASSERT_TRUE(dev().Fill(tdg, 0.0f).ok());
  ASSERT_TRUE(dev().RmsNormForward(d, tx, tg, ty, tr).ok());
  ASSERT_TRUE(dev().RmsNormBackward(d, Put(dy), tx, tg, tr, tdx, tdg).ok());
  kernels::ref::RmsNormForward(x.data(), gamma.data(), 5, 8, 1e-5f, y.data(), rstd.data(), layout);
  kernels::ref::RmsNormBackward(dy.data(), x.data(), gamma.data(), rstd.data(), 5, 8, dx.data(),
                                dgamma.data(), layout);
  EXPECT_EQ(Get(ty), y);
  EXPECT_EQ(Get(tr), rstd);
  EXPECT_EQ(Get(tdx), dx);
  EXPECT_EQ(Get(tdg), dgamma);

  // Each failure is kInvalid and names the op and what is wrong.
  auto expect_invalid = [](const Status& status, const std::string& what) {
    EXPECT_EQ(status.outcome(), Outcome::kInvalid) << what;
    EXPECT_NE(status.message().find(what), std::string::npos) << status.message();
  };
  NormDesc bad = d;
  bad.vectors = 0;
  expect_invalid(dev().RmsNormForward(bad, tx, tg, ty, tr), "RmsNormForward: vectors is 0");
  bad = d;
  bad.x_stride = 15;  // < 2 heads of 8
  expect_invalid(dev().LayerNormForward(bad, tx, tg, tb, ty, tm, tr),
                 "LayerNormForward: x_stride 15 < vectors * hidden 16");
  bad = d;
  bad.y_stride = -28;
  expect_invalid(dev().RmsNormBackward(bad, tdy, tx, tg, tr, tdx, tdg),
                 "RmsNormBackward: y_stride -28");
  // The views must hold the last element reached: (rows - 1) * stride + vectors * hidden.
  expect_invalid(dev().RmsNormForward(d, tx.Slice(0, 4 * 20 + 15), tg, ty, tr),
                 "`x` has 95 elements, needs 96");
  EXPECT_TRUE(dev().RmsNormForward(d, tx.Slice(0, 4 * 20 + 16), tg, ty, tr).ok());
  expect_invalid(
      dev().LayerNormBackward(d, tdy, tx, tg, tm, tr, tdx.Slice(0, 4 * 28 + 15), tdg, tdb),
      "`dx` has 127 elements, needs 128");
  // Statistics: one per vector.
  expect_invalid(dev().LayerNormForward(d, tx, tg, tb, ty, tm.Slice(0, 5), tr),
                 "`mean` has 5 elements, needs 10");
  // Aliasing: y apart from x; dx apart from x, and dy itself or apart from it.
  const NormDesc packed{5, 8, 1e-5f};
  expect_invalid(dev().RmsNormForward(packed, tx.Slice(0, 40), tg, tx.Slice(0, 40), tr),
                 "RmsNormForward: y overlaps x");
  expect_invalid(dev().LayerNormForward(packed, tx.Slice(0, 40), tg, tb, tx.Slice(39, 40), tm, tr),
                 "LayerNormForward: y overlaps x");
  expect_invalid(dev().RmsNormBackward(packed, tdy.Slice(0, 40), tx.Slice(0, 40), tg, tr,
                                       tx.Slice(20, 40), tdg),
                 "RmsNormBackward: dx overlaps x");
  expect_invalid(dev().LayerNormBackward(d, tdy, tx, tg, tm, tr, tdy.Slice(1, 128), tdg, tdb),
                 "LayerNormBackward: dx overlaps dy without being the same view");
}

TEST_F(DeviceOps, CopyRowsCopiesABlockBetweenStridesAndLeavesTheRestAlone) {
  // A [3, 4] block from rows 6 apart into rows 5 apart, starting one element in.
  const std::vector<float> src = Random(21, 18), dst0 = Random(22, 16);
  const Tensor tsrc = Put(src), tdst = Put(dst0);
  ASSERT_TRUE(dev().CopyRows(tdst.Slice(1, 14), 5, tsrc, 6, 3, 4).ok());
  std::vector<float> want = dst0;
  for (int r = 0; r < 3; ++r) {
    for (int c = 0; c < 4; ++c) want[1 + r * 5 + c] = src[r * 6 + c];
  }
  EXPECT_EQ(Get(tdst), want);

  // Any dtype, like Copy: i32 rows packed into rows 3 apart.
  const std::vector<std::int32_t> ids = {1, 2, 3, 4, 5, 6};
  const Tensor tids = Put(ids), tout = Put(std::vector<std::int32_t>(8, -1));
  ASSERT_TRUE(dev().CopyRows(tout, 3, tids, 2, 3, 2).ok());
  StatusOr<std::vector<std::int32_t>> out = dev().Download<std::int32_t>(tout);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, (std::vector<std::int32_t>{1, 2, -1, 3, 4, -1, 5, 6}));

  // Interleaved blocks of one buffer that share no element (columns 0-1 to columns 2-3).
  ASSERT_TRUE(dev().CopyRows(tsrc.Slice(2, 16), 6, tsrc, 6, 3, 2).ok());
  const std::vector<float> moved = Get(tsrc);
  for (size_t r = 0; r < 3; ++r) {
    EXPECT_EQ(moved[r * 6 + 2], src[r * 6]);
    EXPECT_EQ(moved[r * 6 + 3], src[r * 6 + 1]);
  }
  EXPECT_TRUE(dev().CopyRows(tdst, 5, tsrc, 6, 0, 4).ok());  // nothing to copy

  auto expect_invalid = [](const Status& status, const std::string& what) {
    EXPECT_EQ(status.outcome(), Outcome::kInvalid) << what;
    EXPECT_NE(status.message().find(what), std::string::npos) << status.message();
  };
  expect_invalid(dev().CopyRows(tdst, 3, tsrc, 6, 3, 4), "CopyRows: dst_stride 3 < cols 4");
  expect_invalid(dev().CopyRows(tdst, 5, tsrc, 2, 3, 4), "CopyRows: src_stride 2 < cols 4");
  expect_invalid(dev().CopyRows(tdst, 5, tsrc, 6, -1, 4), "CopyRows: negative rows or cols");
  expect_invalid(dev().CopyRows(tdst, 5, tids, 2, 3, 2), "CopyRows: dst is f32, src i32");
  expect_invalid(dev().CopyRows(tdst.Slice(0, 13), 5, tsrc, 6, 3, 4),
                 "`dst` has 13 elements, needs 14");
  expect_invalid(dev().CopyRows(tdst, 5, tsrc.Slice(0, 15), 6, 3, 4),
                 "`src` has 15 elements, needs 16");
  // Blocks sharing elements: destination rows [2, 5) and [6, 9), source rows [1, 4) and [5, 8).
  expect_invalid(dev().CopyRows(tsrc.Slice(2, 16), 4, tsrc.Slice(1, 17), 4, 2, 3),
                 "CopyRows: source and destination blocks overlap");
}

TEST_F(DeviceOps, RopeInPlaceInsideAFusedRowAndInverse) {
  RopeDesc d;
  d.seq = 6;
  d.batch = 2;
  d.heads = 2;
  d.head_dim = 8;
  d.position_offset = 100;
  d.row_stride = 40;  // q heads (16) followed by other data in each row
  const std::vector<float> x = Random(5, std::int64_t{6} * 2 * 40);
  const Tensor t = Put(x);
  ASSERT_TRUE(dev().RopeForward(d, t, t).ok());
  std::vector<float> want = x;
  kernels::ref::RopeShape shape{6, 2, 2, 8, 8, 100, 40, 10000.0};
  kernels::ref::RopeForward(shape, x.data(), want.data());
  const std::vector<float> rotated = Get(t);
  EXPECT_EQ(rotated, want);
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (i % 40 >= 16) {
      EXPECT_EQ(rotated[i], x[i]) << "outside the heads";
    }
  }
  ASSERT_TRUE(dev().RopeBackward(d, t, t).ok());  // the inverse rotation restores x
  const std::vector<float> restored = Get(t);
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(restored[i], x[i], 1e-5);
  d.rotary_dim = 5;
  EXPECT_EQ(dev().RopeForward(d, t, t).outcome(), Outcome::kInvalid);
}

TEST_F(DeviceOps, ActivationsMatchReference) {
  const std::vector<float> x = Random(6, std::int64_t{3} * 10, 3.0f),
                           dy = Random(7, std::int64_t{3} * 5);
  std::vector<float> y(15), dx(30);
  kernels::ref::SwiGluForward(x.data(), 3, 5, y.data());
  kernels::ref::SwiGluBackward(dy.data(), x.data(), 3, 5, dx.data());
  const Tensor tx = Put(x), tdy = Put(dy), ty = Zeros(15), tdx = Zeros(30);
  ASSERT_TRUE(dev().SwiGluForward(3, 5, tx, ty).ok());
  ASSERT_TRUE(dev().SwiGluBackward(3, 5, tdy, tx, tdx).ok());
  EXPECT_EQ(Get(ty), y);
  EXPECT_EQ(Get(tdx), dx);
  EXPECT_EQ(dev().SwiGluBackward(3, 5, tdy, tx, tx).outcome(), Outcome::kInvalid);

  std::vector<float> gy(30), gdx(30);
  const std::vector<float> gdy = Random(8, 30);
  kernels::ref::GeluForward(x.data(), 30, gy.data());
  kernels::ref::GeluBackward(gdy.data(), x.data(), 30, gdx.data());
  const Tensor tgdy = Put(gdy), tgy = Zeros(30);
  ASSERT_TRUE(dev().GeluForward(tx, tgy).ok());
  ASSERT_TRUE(dev().GeluBackward(tgdy, tx, tgdy).ok());  // in place on dy
  EXPECT_EQ(Get(tgy), gy);
  EXPECT_EQ(Get(tgdy), gdx);
}

// Vocab-parallel cross-entropy on one device, two shards, with the reductions done by hand where
// the trial runner would all-reduce.
TEST_F(DeviceOps, VocabShardedCrossEntropyEqualsUnsharded) {
  const std::int64_t rows = 5, vocab = 12, half = 6;
  const std::vector<float> logits = Random(9, rows * vocab, 5.0f);
  const std::vector<std::int32_t> targets = {0, 5, 6, 11, 3};
  const std::vector<float> dloss(rows, 0.2f);
  const Tensor tl = Put(logits), tt = Put(targets), tdl = Put(dloss);
  const Tensor max_full = Zeros(rows), part_full = Zeros(2 * rows), loss_full = Zeros(rows);
  const CrossEntropyDesc full{rows, vocab, 0};
  ASSERT_TRUE(dev().CrossEntropyMax(full, tl, max_full).ok());
  ASSERT_TRUE(dev().CrossEntropyPartials(full, tl, tt, max_full, part_full).ok());
  ASSERT_TRUE(dev().CrossEntropyLoss(full, max_full, part_full, loss_full).ok());
  const Tensor dfull = Zeros(rows * vocab);
  ASSERT_TRUE(dev().CrossEntropyBackward(full, tl, tt, max_full, part_full, tdl, dfull).ok());

  std::vector<float> shard[2];
  for (int s = 0; s < 2; ++s) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < half; ++j) shard[s].push_back(logits[r * vocab + s * half + j]);
    }
  }
  const Tensor ts[2] = {Put(shard[0]), Put(shard[1])};
  const Tensor maxes[2] = {Zeros(rows), Zeros(rows)};
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(dev().CrossEntropyMax({rows, half, s * half}, ts[s], maxes[s]).ok());
  }
  const std::vector<float> m0 = Get(maxes[0]), m1 = Get(maxes[1]);
  std::vector<float> m(rows);
  for (std::int64_t r = 0; r < rows; ++r) m[r] = std::max(m0[r], m1[r]);
  const Tensor tmax = Put(m), sum = Zeros(2 * rows), part = Zeros(2 * rows);
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(dev().CrossEntropyPartials({rows, half, s * half}, ts[s], tt, tmax, part).ok());
    ASSERT_TRUE(dev().Axpy(1.0f, part, sum).ok());
  }
  const Tensor loss = Zeros(rows);
  ASSERT_TRUE(dev().CrossEntropyLoss({rows, half, 0}, tmax, sum, loss).ok());
  const std::vector<float> want = Get(loss_full), got = Get(loss);
  for (std::int64_t r = 0; r < rows; ++r) EXPECT_NEAR(got[r], want[r], 1e-5);

  const std::vector<float> dwant = Get(dfull);
  for (int s = 0; s < 2; ++s) {  // backward in place over the shard's logits
    ASSERT_TRUE(
        dev().CrossEntropyBackward({rows, half, s * half}, ts[s], tt, tmax, sum, tdl, ts[s]).ok());
    const std::vector<float> dshard = Get(ts[s]);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t j = 0; j < half; ++j) {
        EXPECT_NEAR(dshard[r * half + j], dwant[r * vocab + s * half + j], 1e-6);
      }
    }
  }
  const Tensor bad_targets = Put(std::vector<std::int32_t>{0, -1, 2, 3, 4});
  EXPECT_EQ(dev().CrossEntropyPartials(full, tl, bad_targets, max_full, part_full).outcome(),
            Outcome::kInvalid);
}

TEST_F(DeviceOps, EmbeddingShardAndBackward) {
  const std::vector<float> table =
      Random(10, std::int64_t{4} * 3);  // ids [4, 8) of a larger vocabulary
  const std::vector<std::int32_t> ids = {4, 9, 7, 4};
  const Tensor tt = Put(table), ti = Put(ids), out = Zeros(12), dtable = Zeros(12);
  const EmbeddingDesc d{4, 3, 4, 4};
  ASSERT_TRUE(dev().EmbeddingForward(d, tt, ti, out).ok());
  const std::vector<float> got = Get(out);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(got[0 * 3 + i], table[0 * 3 + i]);
    EXPECT_EQ(got[1 * 3 + i], 0.0f);  // id 9 is on another shard
    EXPECT_EQ(got[2 * 3 + i], table[3 * 3 + i]);
  }
  ASSERT_TRUE(dev().Fill(out, 1.0f).ok());
  ASSERT_TRUE(dev().EmbeddingBackward(d, out, ti, dtable).ok());
  const std::vector<float> grad = Get(dtable);
  EXPECT_EQ(grad[0], 2.0f);  // id 4 twice
  EXPECT_EQ(grad[std::size_t{3} * 3], 1.0f);
  EXPECT_EQ(grad[std::size_t{1} * 3], 0.0f);
}

TEST_F(DeviceOps, AdamUpdatesMasterAndModelCopy) {
  const std::vector<float> p = Random(11, 10), g = Random(12, 10);
  const Tensor master = Put(p), grad = Put(g), m = Zeros(10), v = Zeros(10), model = Zeros(10);
  AdamParams params;
  params.lr = 1e-2f;
  params.weight_decay = 0.1f;
  params.step = 1;
  ASSERT_TRUE(dev().AdamStep(params, master, grad, m, v, model).ok());
  std::vector<float> want = p, wm(10, 0.0f), wv(10, 0.0f);
  kernels::ref::AdamHyper hyper;  // from the same float parameters the device receives
  hyper.lr = params.lr;
  hyper.beta1 = params.beta1;
  hyper.beta2 = params.beta2;
  hyper.eps = params.eps;
  hyper.weight_decay = params.weight_decay;
  kernels::ref::AdamStep(hyper, 10, want.data(), g.data(), wm.data(), wv.data());
  EXPECT_EQ(Get(master), want);
  EXPECT_EQ(Get(model), want);
  EXPECT_EQ(Get(m), wm);
  ASSERT_TRUE(dev().AdamStep(params, master, grad, m, v, Tensor{}).ok());  // no model copy
  params.step = 0;
  EXPECT_EQ(dev().AdamStep(params, master, grad, m, v, model).outcome(), Outcome::kInvalid);
}

TEST_F(DeviceOps, ElementwiseReductionsAndFiniteness) {
  const Tensor a = Put(std::vector<float>{1, 2, 3}), b = Put(std::vector<float>{10, 20, 30});
  const Tensor out = Zeros(3), sum = Zeros(1);
  ASSERT_TRUE(dev().Add(a, b, out).ok());
  EXPECT_EQ(Get(out), (std::vector<float>{11, 22, 33}));
  ASSERT_TRUE(dev().Axpy(-2.0f, a, out).ok());
  EXPECT_EQ(Get(out), (std::vector<float>{9, 18, 27}));
  ASSERT_TRUE(dev().Scale(out, 0.5f).ok());
  EXPECT_EQ(Get(out), (std::vector<float>{4.5f, 9, 13.5f}));
  ASSERT_TRUE(dev().SumSquares(a, sum).ok());
  ASSERT_TRUE(dev().SumSquares(a, sum).ok());  // accumulates
  EXPECT_EQ(Get(sum)[0], 28.0f);
  ASSERT_TRUE(dev().Copy(out, a).ok());
  EXPECT_EQ(Get(out), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(dev().Add(a, Zeros(2), out).outcome(), Outcome::kInvalid);

  EXPECT_TRUE(dev().CheckFinite(out).ok());
  const Tensor bad = Put(std::vector<float>{0, std::numeric_limits<float>::quiet_NaN()});
  const Status nan = dev().CheckFinite(bad);
  EXPECT_EQ(nan.outcome(), Outcome::kNonfinite);
  EXPECT_NE(nan.message().find("element 1 of 2"), std::string::npos) << nan.message();
  const Tensor inf = Put(std::vector<float>{std::numeric_limits<float>::infinity()});
  EXPECT_EQ(dev().CheckFinite(inf).outcome(), Outcome::kNonfinite);
}

// A column shard of a weight, filled with its offsets, is the same slice of the full weight.
// Hidden dropout: the mask is kernels::ref::DropoutKeeps' (the CUDA kernel draws the same), a
// quarter dropped at p = 0.25, the kept elements scaled by 4/3 onto the residual; the backward
// sends the gradient through the same mask. A bad probability or mask is refused by name.
TEST_F(DeviceOps, DropoutAddAndItsBackward) {
  const std::int64_t n = 40000;
  const std::vector<float> x = Random(1, n), residual = Random(2, n);
  const Tensor out = Zeros(n), dx = Zeros(n);
  const Tensor mask = Put(std::vector<std::uint8_t>(n, 7));
  const DropoutDesc d{0.25f, 99};
  ASSERT_TRUE(dev().DropoutAdd(d, Put(x), Put(residual), out, mask).ok());
  const std::vector<float> got = Get(out);
  StatusOr<std::vector<std::uint8_t>> kept = dev().Download<std::uint8_t>(mask);
  ASSERT_TRUE(kept.ok());
  const std::uint32_t threshold = kernels::ref::DropoutThreshold(0.25f);
  const float scale = 1.0f / 0.75f;
  std::int64_t dropped = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const bool keep = kernels::ref::DropoutKeeps(99, static_cast<std::uint64_t>(i), threshold);
    ASSERT_EQ((*kept)[i], keep ? 1 : 0) << i;
    ASSERT_EQ(got[i], residual[i] + (keep ? x[i] * scale : 0.0f)) << i;
    dropped += keep ? 0 : 1;
  }
  // Binomial(40000, 0.25): sd 87.
  EXPECT_NEAR(static_cast<double>(dropped), 0.25 * n, 4 * 87.0);
  const std::vector<float> dy = Random(3, n);
  ASSERT_TRUE(dev().DropoutBackward(d, Put(dy), mask, dx).ok());
  const std::vector<float> grad = Get(dx);
  for (std::int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(grad[i], (*kept)[i] != 0 ? dy[i] * scale : 0.0f) << i;
  }
  // Another seed, another mask.
  ASSERT_TRUE(dev().DropoutAdd({0.25f, 100}, Put(x), Put(residual), out, mask).ok());
  StatusOr<std::vector<std::uint8_t>> other = dev().Download<std::uint8_t>(mask);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(*other, *kept);

  const Status bad_p = dev().DropoutAdd({1.0f, 1}, Put(x), Put(residual), out, mask);
  EXPECT_EQ(bad_p.outcome(), Outcome::kInvalid);
  EXPECT_NE(bad_p.ToString().find("DropoutAdd: dropout probability"), std::string::npos)
      << bad_p.ToString();
  const Status bad_mask = dev().DropoutBackward(d, Put(dy), Zeros(n), dx);
  EXPECT_EQ(bad_mask.outcome(), Outcome::kInvalid);
  EXPECT_NE(bad_mask.ToString().find("mask"), std::string::npos) << bad_mask.ToString();
}

TEST_F(DeviceOps, HashFillShardsAreSlicesOfTheFullTensor) {
  const std::int64_t rows = 6, cols = 8;
  const Tensor full = Zeros(rows * cols), shard = Zeros(rows / 2 * cols / 2);
  HashFill fill;
  fill.seed = 42;
  fill.scale = 0.02f;
  fill.rows = rows;
  fill.cols = cols;
  fill.global_cols = cols;
  ASSERT_TRUE(dev().FillHash(full, fill).ok());
  fill.rows = rows / 2;
  fill.cols = cols / 2;
  fill.row_offset = rows / 2;
  fill.col_offset = cols / 2;
  ASSERT_TRUE(dev().FillHash(shard, fill).ok());
  const std::vector<float> f = Get(full), s = Get(shard);
  for (std::int64_t r = 0; r < rows / 2; ++r) {
    for (std::int64_t c = 0; c < cols / 2; ++c) {
      EXPECT_EQ(s[r * cols / 2 + c], f[(r + rows / 2) * cols + c + cols / 2]);
    }
  }
  EXPECT_EQ(f[0], 0.02f * kernels::ref::HashUniform(42, 0));
  fill.col_offset = cols;  // past the global width
  EXPECT_EQ(dev().FillHash(shard, fill).outcome(), Outcome::kInvalid);
}

}  // namespace
}  // namespace autopar::device
