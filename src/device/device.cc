#include "autopar/device/device.h"

#include <limits>
#include <string>

namespace autopar::device {
namespace {

std::string Mib(std::size_t bytes) {
  return std::to_string(bytes) + " B (" + std::to_string(bytes >> 20) + " MiB)";
}

}  // namespace

StatusOr<Buffer> Device::Allocate(std::size_t bytes) {
  return Allocate(static_cast<std::int64_t>(bytes), DType::kU8);
}

StatusOr<Buffer> Device::Allocate(std::int64_t numel, DType dtype) {
  AUTOPAR_CHECK_ARG(numel >= 0, "Allocate: negative element count " + std::to_string(numel));
  const std::size_t elem = DTypeSize(dtype);
  AUTOPAR_CHECK_ARG(
      static_cast<std::size_t>(numel) <= std::numeric_limits<std::size_t>::max() / elem,
      "Allocate: byte count overflows");
  const std::size_t bytes = static_cast<std::size_t>(numel) * elem;
  if (bytes == 0) return Buffer(this, nullptr, 0, 0, dtype);

  // Reserve against the budget first, so concurrent allocations cannot both squeeze in.
  std::size_t in_use = in_use_.load();
  do {
    if (bytes > budget_bytes_ || in_use > budget_bytes_ - bytes) {
      return Status::Error(Outcome::kOom,
                           std::string(name()) + ": allocating " + Mib(bytes) + " with " +
                               Mib(in_use) + " in use exceeds the budget of " + Mib(budget_bytes_),
                           __FILE__, __LINE__);
    }
  } while (!in_use_.compare_exchange_weak(in_use, in_use + bytes));

  StatusOr<void*> raw = AllocateRaw(bytes);
  if (!raw.ok() || *raw == nullptr) {
    in_use_.fetch_sub(bytes);
    std::string why = raw.ok() ? "the allocator returned no memory" : raw.status().message();
    return Status::Error(Outcome::kOom,
                         std::string(name()) + ": allocating " + Mib(bytes) + " failed: " + why,
                         __FILE__, __LINE__);
  }
  std::size_t peak = peak_.load();
  const std::size_t now = in_use + bytes;
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  return Buffer(this, *raw, bytes, numel, dtype);
}

void Device::Release(void* data, std::size_t bytes) {
  if (bytes == 0) return;
  FreeRaw(data, bytes);
  in_use_.fetch_sub(bytes);
}

}  // namespace autopar::device
