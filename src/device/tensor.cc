#include "autopar/device/tensor.h"

#include <utility>

#include "autopar/device/device.h"

namespace autopar::device {

std::size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kU8:
      return 1;
  }
  return 1;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kU8:
      return "u8";
  }
  return "unknown";
}

Tensor Tensor::Slice(std::int64_t offset, std::int64_t count) const {
  if (!valid() || offset < 0 || count < 0 || offset > numel || count > numel - offset) {
    return Tensor{nullptr, -1, dtype};
  }
  if (count == 0) return Tensor{nullptr, 0, dtype};
  return Tensor{static_cast<char*>(data) + offset * static_cast<std::int64_t>(DTypeSize(dtype)),
                count, dtype};
}

Buffer::Buffer(Buffer&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      numel_(std::exchange(other.numel_, 0)),
      dtype_(other.dtype_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    owner_ = std::exchange(other.owner_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    numel_ = std::exchange(other.numel_, 0);
    dtype_ = other.dtype_;
  }
  return *this;
}

Tensor Buffer::view(DType dtype) const {
  return Tensor{data_, static_cast<std::int64_t>(bytes_ / DTypeSize(dtype)), dtype};
}

void Buffer::Reset() {
  if (owner_ != nullptr) owner_->Release(data_, bytes_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
  numel_ = 0;
}

}  // namespace autopar::device
