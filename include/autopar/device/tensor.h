// Device memory: owning buffers and the typed views that ops take.
//
// Ops take `Tensor` views (pointer, element count, dtype) and their shapes as separate arguments,
// the way cuBLAS and cuDNN do, so one interface serves fp32 on the CPU and bf16 on a GPU: a device
// checks the dtypes it supports and the element counts an op will touch, and answers kInvalid
// rather than reading out of bounds.
#pragma once

#include <cstddef>
#include <cstdint>

namespace autopar::device {

enum class DType : std::uint8_t { kF32, kBF16, kF16, kI32, kU8 };

std::size_t DTypeSize(DType dtype);
const char* DTypeName(DType dtype);  // "f32", "bf16", ...

template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType DTypeOf<std::int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType DTypeOf<std::uint8_t>() {
  return DType::kU8;
}

// A non-owning view of `numel` elements of `dtype` in device memory. A view with numel < 0 is
// the result of an out-of-range Slice; every op rejects it.
struct Tensor {
  void* data = nullptr;
  std::int64_t numel = 0;
  DType dtype = DType::kF32;

  std::size_t bytes() const {
    return numel > 0 ? static_cast<std::size_t>(numel) * DTypeSize(dtype) : 0;
  }
  bool valid() const { return numel >= 0 && (numel == 0 || data != nullptr); }

  // Elements [offset, offset + count); an invalid view when that is out of range.
  Tensor Slice(std::int64_t offset, std::int64_t count) const;

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

class Device;

// Owns one allocation from a Device and returns it (and its bytes to the budget) on destruction.
// Move-only. The Device must outlive its buffers.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

  // The view given at allocation (u8 bytes for Allocate(bytes)).
  Tensor tensor() const { return Tensor{data_, numel_, dtype_}; }
  // The whole buffer as `dtype`: bytes() / DTypeSize(dtype) elements.
  Tensor view(DType dtype) const;

  // Gives the memory back now.
  void Reset();

 private:
  friend class Device;
  Buffer(Device* owner, void* data, std::size_t bytes, std::int64_t numel, DType dtype)
      : owner_(owner), data_(data), bytes_(bytes), numel_(numel), dtype_(dtype) {}

  Device* owner_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  std::int64_t numel_ = 0;
  DType dtype_ = DType::kU8;
};

}  // namespace autopar::device
