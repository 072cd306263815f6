// Shared pieces of the device tests on any platform (the CPU device, the collectives over MPI or
// NCCL): a fixture base that moves host vectors into device buffers and back, and the attention
// problems' descriptions in the device's form and the host reference's.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "autopar/device/device.h"
#include "autopar/device/ops.h"
#include "autopar/device/platform.h"
#include "kernels/attention.h"

namespace autopar::device::test_util {

// A fixture whose tests put host vectors on dev(), the device the fixture gives, and read them
// back. Every Put allocates a buffer the fixture keeps until TearDown, which runs before the
// fixture's own members (its platform) are destroyed; a fixture that overrides TearDown calls this
// one first.
class DeviceDataTest : public ::testing::Test {
 protected:
  virtual Device& dev() = 0;

  void TearDown() override { buffers_.clear(); }

  // A device tensor of T's dtype holding `host`.
  template <typename T>
  Tensor Put(const std::vector<T>& host) {
    StatusOr<Buffer> buf = dev().Allocate(static_cast<std::int64_t>(host.size()), DTypeOf<T>());
    EXPECT_TRUE(buf.ok()) << buf.status().ToString();
    if (!buf.ok()) return Tensor{};
    buffers_.push_back(std::move(buf).value());
    const Status uploaded = dev().Upload(buffers_.back().tensor(), host);
    EXPECT_TRUE(uploaded.ok()) << uploaded.ToString();
    return buffers_.back().tensor();
  }
  Tensor Put(std::initializer_list<float> host) { return Put(std::vector<float>(host)); }
  // An f32 tensor of n zeros.
  Tensor Zeros(std::int64_t n) { return Put(std::vector<float>(static_cast<std::size_t>(n))); }
  // An f32 tensor's contents (empty when the download fails, which fails the test).
  std::vector<float> Get(Tensor t) {
    StatusOr<std::vector<float>> host = dev().Download<float>(t);
    EXPECT_TRUE(host.ok()) << host.status().ToString();
    return host.ok() ? *host : std::vector<float>{};
  }

  std::vector<Buffer> buffers_;
};

// A DeviceDataTest on a CPU platform of its own. SetUp builds it with the default options; a test
// that needs others calls UsePlatform before its first Put.
class CpuDeviceTest : public DeviceDataTest {
 protected:
  void SetUp() override { UsePlatform(CpuPlatformOptions{}); }
  void UsePlatform(const CpuPlatformOptions& options) {
    ASSERT_TRUE(buffers_.empty()) << "the buffers would outlive the platform they came from";
    StatusOr<std::unique_ptr<Platform>> platform = MakeCpuPlatform(options);
    ASSERT_TRUE(platform.ok()) << platform.status().ToString();
    platform_ = std::move(platform).value();
  }
  Device& dev() override { return platform_->device(); }

  std::unique_ptr<Platform> platform_;
};

// The host reference's description of the same attention problem.
inline kernels::ref::AttentionShape ToShape(const AttentionDesc& d) {
  kernels::ref::AttentionShape s;
  s.batch = d.batch;
  s.heads_q = d.heads_q;
  s.heads_kv = d.heads_kv;
  s.head_dim = d.head_dim;
  s.seq_q = d.seq_q;
  s.seq_kv = d.seq_kv;
  s.causal = d.causal;
  s.q_offset = d.q_offset;
  s.kv_offset = d.kv_offset;
  s.scale = d.scale;
  s.q_stride = d.q_stride;
  s.kv_stride = d.kv_stride;
  return s;
}

// An attention problem by its dimensions; scale and strides left to resolve (0). pad > 0: q, k
// and v are views into one fused [tokens, (hq + 2 hkv) * dim + pad] buffer.
inline AttentionDesc Desc(std::int64_t batch, std::int64_t hq, std::int64_t hkv, std::int64_t dim,
                          std::int64_t sq, std::int64_t skv, bool causal, std::int64_t q_off = 0,
                          std::int64_t kv_off = 0, std::int64_t pad = 0) {
  AttentionDesc d;
  d.batch = batch;
  d.heads_q = hq;
  d.heads_kv = hkv;
  d.head_dim = dim;
  d.seq_q = sq;
  d.seq_kv = skv;
  d.causal = causal;
  d.q_offset = q_off;
  d.kv_offset = kv_off;
  if (pad) {
    d.q_stride = (hq + 2 * hkv) * dim + pad;
    d.kv_stride = d.q_stride;
  }
  return d;
}

}  // namespace autopar::device::test_util
