// A mixture-of-experts layer (src/trial/moe.h) on the GPU against the same layer on the CPU
// platform (fp32), one rank, both token dispatchers: the router's top-k, the experts' grouped rows
// and GEMMs, the flex dispatcher's gated activations and row sums run on the CUDA ops; the
// numerical equivalence of the distributed layouts is the CPU suites' (trial_test.cc) and, on 4
// GPUs, trial_cuda_test.cc's. The CPU half runs everywhere (it checks the two dispatchers agree);
// the GPU half skips without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "../distributed/trial_setup.h"
#include "autopar/device/platform.h"
#include "cuda_test_util.h"
#include "src/trial/moe.h"

namespace autopar::trial {
namespace {

using device::DType;
using device::cuda_test::Close;
using device::cuda_test::FromBf16Bits;
using device::cuda_test::Random;
using device::cuda_test::Stored;
using device::cuda_test::ToBf16Bits;
using device::cuda_test::ToDouble;

// 64 tokens of width 64 routed top-2 over 8 experts of width 32.
Shapes MoeShapes(bool flex) { return testing::OneRankMoe(32, 64, 8, 2, 32, flex); }

Status Put(Device& dev, Tensor t, const std::vector<float>& host) {
  if (t.dtype == DType::kF32) return dev.Upload(t, host);
  std::vector<uint16_t> bits(host.size());
  for (size_t i = 0; i < host.size(); ++i) bits[i] = ToBf16Bits(host[i]);
  return dev.CopyFromHost(t, bits.data(), bits.size() * sizeof(uint16_t));
}

std::vector<float> Get(Device& dev, Tensor t) {
  if (t.dtype == DType::kF32) return dev.Download<float>(t).value();
  std::vector<uint16_t> bits(static_cast<size_t>(t.numel));
  EXPECT_TRUE(dev.CopyToHost(bits.data(), t, bits.size() * sizeof(uint16_t)).ok());
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = FromBf16Bits(bits[i]);
  return out;
}

// What one forward and backward of the layer gives: its output, the input's gradient, every
// weight gradient (router, then each expert's fc1 and fc2), and the routing.
struct MoeResult {
  std::vector<float> out, dx, grads;
  std::vector<int32_t> choice;
};

// The layer on `dev`, with weights, input and output gradient from fixed seeds, stored as bf16
// values on every device (so both see the same numbers).
MoeResult RunLayer(Device& dev, const Shapes& s) {
  const int64_t T = s.tokens, h = s.hidden, E = s.experts, f = s.expert_ffn;
  const int64_t router = E * h, fc1 = 2 * f * h, fc2 = h * f, params = router + E * (fc1 + fc2);
  const DType compute = dev.compute_dtype();
  auto weights = dev.Allocate(params, compute);
  auto grads = dev.Allocate(params, DType::kF32);
  auto acts = dev.Allocate(4 * T * h, compute);
  EXPECT_TRUE(weights.ok() && grads.ok() && acts.ok());
  const Tensor w = weights->tensor(), dw = grads->tensor(), a = acts->tensor();
  const Tensor x = a.Slice(0, T * h), dy = a.Slice(T * h, T * h);
  const Tensor out = a.Slice(2 * T * h, T * h), dx = a.Slice(3 * T * h, T * h);
  // Router rows spread the logits far beyond bf16's rounding, so both devices route alike.
  std::vector<float> host = Random(41, params, 0.3f);
  for (int64_t i = 0; i < router; ++i) host[i] *= 4;
  EXPECT_TRUE(Put(dev, w, Stored(DType::kBF16, host)).ok());
  EXPECT_TRUE(Put(dev, x, Stored(DType::kBF16, Random(42, T * h))).ok());
  EXPECT_TRUE(Put(dev, dy, Stored(DType::kBF16, Random(43, T * h, 0.1f))).ok());
  EXPECT_TRUE(dev.Fill(dw, 0.0f).ok() && dev.Fill(out, 0.0f).ok() && dev.Fill(dx, 0.0f).ok());
  const LayerWeights lw = testing::MoeWeights(s, w, dw);
  ProcessGroups g;  // one rank: every group is unconnected
  auto layer = MoeLayer::Create(dev, s, g, /*samples_per_step=*/2.0);
  EXPECT_TRUE(layer.ok()) << layer.status().ToString();
  MoeResult r;
  if (!layer.ok()) return r;
  MoeActs saved;
  EXPECT_TRUE((*layer)->Forward(lw, saved, x, out, true).ok());
  r.choice = saved.choice;
  EXPECT_TRUE((*layer)->BackwardExperts(lw, saved, dy).ok());
  EXPECT_TRUE((*layer)->BackwardRouter(lw, saved, x, dx).ok());
  EXPECT_TRUE(dev.Synchronize().ok());
  r.out = Get(dev, out);
  r.dx = Get(dev, dx);
  r.grads = Get(dev, dw);
  return r;
}

// bf16 activations and rounded intermediate rows against fp32: a few parts in a hundred of the
// largest value.
void ExpectClose(const MoeResult& got, const MoeResult& want, double tol, const char* what) {
  ASSERT_EQ(got.choice, want.choice) << what << ": routed differently";
  EXPECT_TRUE(Close(got.out, ToDouble(want.out), tol, tol)) << what << ": output";
  EXPECT_TRUE(Close(got.dx, ToDouble(want.dx), tol, tol)) << what << ": input gradient";
  EXPECT_TRUE(Close(got.grads, ToDouble(want.grads), tol, tol)) << what << ": weight gradients";
}

TEST(CudaMoe, BothDispatchersMatchTheCpuLayer) {
  auto cpu = device::MakeCpuPlatform({});
  ASSERT_TRUE(cpu.ok()) << cpu.status().ToString();
  const MoeResult all_cpu = RunLayer((*cpu)->device(), MoeShapes(false));
  const MoeResult flex_cpu = RunLayer((*cpu)->device(), MoeShapes(true));
  ASSERT_EQ(all_cpu.choice.size(), 64u * 2);
  double largest = 0;
  for (float v : all_cpu.dx) largest = std::max(largest, double{std::abs(v)});
  ASSERT_GT(largest, 0.0) << "the layer passed no gradient back";
  // The two dispatchers are one computation: on fp32 they agree to rounding.
  ExpectClose(flex_cpu, all_cpu, 2e-5, "flex against all-to-all, CPU");
  if (device::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  device::CudaPlatformOptions options;
  options.device_index = 0;
  options.timeout_s = 60.0;
  auto gpu = device::MakeCudaPlatform(options);
  ASSERT_TRUE(gpu.ok()) << gpu.status().ToString();
  ExpectClose(RunLayer((*gpu)->device(), MoeShapes(false)), all_cpu, 3e-2, "all-to-all, GPU");
  ExpectClose(RunLayer((*gpu)->device(), MoeShapes(true)), flex_cpu, 3e-2, "flex, GPU");
}

}  // namespace
}  // namespace autopar::trial
