// Status values, device memory accounting and the OOM contract.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "autopar/device/platform.h"
#include "autopar/device/status.h"

namespace autopar::device {
namespace {

Status FailsWithOom() { return Status::Error(Outcome::kOom, "no room", "src/x/y.cc", 12); }

Status PassesUp() {
  AUTOPAR_RETURN_IF_ERROR(FailsWithOom());
  return OkStatus();
}

StatusOr<int> Half(int x) {
  AUTOPAR_CHECK_ARG(x % 2 == 0, "odd " + std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  AUTOPAR_ASSIGN_OR_RETURN(const int half, Half(x));
  AUTOPAR_ASSIGN_OR_RETURN(*out, Half(half));
  return OkStatus();
}

TEST(DeviceStatus, CarriesOutcomeOriginAndFrames) {
  const Status status = PassesUp();
  EXPECT_EQ(status.outcome(), Outcome::kOom);
  EXPECT_NE(status.message().find("y.cc:12: no room"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find(HostPidTag()), std::string::npos);
  EXPECT_NE(status.message().find("<- device_memory_test.cc:"), std::string::npos);
  EXPECT_EQ(status.ToString().rfind("oom: ", 0), 0u);
  EXPECT_TRUE(OkStatus().ok());
  EXPECT_STREQ(OutcomeName(Outcome::kCommError), "comm_error");
  EXPECT_STREQ(OutcomeName(Outcome::kNonfinite), "nonfinite");
}

TEST(DeviceStatusDeathTest, ValueOfAnErrorAbortsNamingTheError) {
  const StatusOr<int> error = Status(Outcome::kOom, "no room for the activations");
  EXPECT_DEATH((void)error.value(), "StatusOr::value\\(\\) of an error: oom: no room");
  EXPECT_DEATH((void)*error, "no room for the activations");
  const StatusOr<int> fine = 7;
  EXPECT_EQ(fine.value(), 7);
}

TEST(DeviceStatusDeathTest, BrokenInvariantAbortsNamingTheCondition) {
  const int slots = 0;
  EXPECT_DEATH(AUTOPAR_INVARIANT(slots > 0), "internal invariant broken: slots > 0");
  AUTOPAR_INVARIANT(slots == 0);  // holds: nothing happens
}

TEST(DeviceStatus, AssignOrReturnPropagates) {
  int out = 0;
  EXPECT_TRUE(Quarter(12, &out).ok());
  EXPECT_EQ(out, 3);
  const Status odd = Quarter(6, &out);  // 6 / 2 = 3 is odd
  EXPECT_EQ(odd.outcome(), Outcome::kInvalid);
  EXPECT_NE(odd.message().find("odd 3"), std::string::npos);
  const StatusOr<int> wrong(OkStatus());
  EXPECT_EQ(wrong.status().outcome(), Outcome::kInvalid);
}

class CpuDeviceMemory : public ::testing::Test {
 protected:
  static constexpr std::size_t kBudget = 1 << 20;
  void SetUp() override {
    CpuPlatformOptions options;
    options.memory_budget_bytes = kBudget;
    StatusOr<std::unique_ptr<Platform>> platform = MakeCpuPlatform(options);
    ASSERT_TRUE(platform.ok()) << platform.status().ToString();
    platform_ = std::move(platform).value();
  }
  Device& device() { return platform_->device(); }

  std::unique_ptr<Platform> platform_;
};

TEST_F(CpuDeviceMemory, OverBudgetIsOomAndLeavesTheDeviceUsable) {
  Device& dev = device();
  EXPECT_EQ(dev.budget_bytes(), kBudget);
  StatusOr<Buffer> a = dev.Allocate(std::size_t{600} << 10);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(dev.bytes_in_use(), std::size_t{600} << 10);

  StatusOr<Buffer> b = dev.Allocate(std::size_t{600} << 10);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().outcome(), Outcome::kOom);
  EXPECT_NE(b.status().message().find("exceeds the budget"), std::string::npos);
  EXPECT_EQ(dev.bytes_in_use(), std::size_t{600} << 10);  // a is untouched, nothing leaked

  StatusOr<Buffer> c = dev.Allocate(std::size_t{300} << 10);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(dev.peak_bytes(), std::size_t{900} << 10);

  a->Reset();
  EXPECT_EQ(dev.bytes_in_use(), std::size_t{300} << 10);
  EXPECT_EQ(dev.peak_bytes(), std::size_t{900} << 10);
  dev.ResetPeak();
  EXPECT_EQ(dev.peak_bytes(), std::size_t{300} << 10);

  StatusOr<Buffer> d = dev.Allocate(std::size_t{700} << 10);  // fits again once a is gone
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(dev.peak_bytes(), std::size_t{1000} << 10);
}

TEST_F(CpuDeviceMemory, TypedAllocationAndBufferLifetime) {
  Device& dev = device();
  {
    StatusOr<Buffer> f = dev.Allocate(std::int64_t{1000}, DType::kF32);
    ASSERT_TRUE(f.ok());
    EXPECT_EQ(f->bytes(), 4000u);
    EXPECT_EQ(f->tensor().numel, 1000);
    EXPECT_EQ(f->tensor().dtype, DType::kF32);
    EXPECT_EQ(f->view(DType::kBF16).numel, 2000);
    Buffer moved = std::move(f).value();
    EXPECT_EQ(dev.bytes_in_use(), 4000u);
    Buffer assigned;
    assigned = std::move(moved);
    EXPECT_EQ(moved.data(), nullptr);  // NOLINT: checking the moved-from state on purpose
    EXPECT_EQ(dev.bytes_in_use(), 4000u);
  }
  EXPECT_EQ(dev.bytes_in_use(), 0u);
  StatusOr<Buffer> empty = dev.Allocate(std::int64_t{0}, DType::kF32);
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->tensor().valid());
  EXPECT_EQ(dev.Allocate(std::int64_t{-1}, DType::kF32).status().outcome(), Outcome::kInvalid);
}

TEST(DeviceMemoryUnbudgeted, AllocatorRefusalIsOomNotAnAbort) {
  StatusOr<std::unique_ptr<Platform>> platform = MakeCpuPlatform(CpuPlatformOptions{});
  ASSERT_TRUE(platform.ok());
  Device& dev = (*platform)->device();
  // 1 PiB is beyond the 47-bit user address space, so the allocator itself says no.
  StatusOr<Buffer> huge = dev.Allocate(std::size_t{1} << 50);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().outcome(), Outcome::kOom);
  EXPECT_NE(huge.status().message().find("aligned_alloc"), std::string::npos);
  EXPECT_EQ(dev.bytes_in_use(), 0u);
  EXPECT_EQ(dev.peak_bytes(), 0u);
  EXPECT_TRUE(dev.Allocate(std::size_t{4096}).ok());
}

TEST_F(CpuDeviceMemory, SliceUploadDownload) {
  Device& dev = device();
  StatusOr<Buffer> buf = dev.Allocate(std::int64_t{8}, DType::kF32);
  ASSERT_TRUE(buf.ok());
  const Tensor t = buf->tensor();
  ASSERT_TRUE(dev.Upload(t, std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}).ok());
  StatusOr<std::vector<float>> tail = dev.Download<float>(t.Slice(5, 3));
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(*tail, (std::vector<float>{5, 6, 7}));
  EXPECT_FALSE(t.Slice(6, 3).valid());
  EXPECT_EQ(dev.Fill(t.Slice(6, 3), 1.0f).outcome(), Outcome::kInvalid);
  EXPECT_EQ(dev.Upload(t, std::vector<float>{1, 2}).outcome(), Outcome::kInvalid);
  EXPECT_EQ(dev.Download<std::int32_t>(t).status().outcome(), Outcome::kInvalid);
  EXPECT_TRUE(dev.Synchronize().ok());
}

}  // namespace
}  // namespace autopar::device
