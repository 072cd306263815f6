// CUDA device: lifetime, memory, waiting, data movement, elementwise ops and GEMM.
#include "src/device/cuda/cuda_device.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "kernels/fp8_scale.h"
#include "kernels/init.h"
#include "src/device/cuda/gemm_mapping.h"
#include "src/device/device_memory.h"
#include "src/device/validate.h"

namespace autopar::device {
namespace kc = kernels::cuda;

namespace {

// Scratch layout: SumSquares partials, then CheckFinite's index.
constexpr std::size_t kPartialsBytes = kc::kSumSquaresPartials * sizeof(double);
constexpr std::size_t kFirstBadOffset = kPartialsBytes;
constexpr std::size_t kScratchBytes = kPartialsBytes + 64;
constexpr std::size_t kPinnedBytes = 16;

// After this long a wait stops spinning and naps between polls, to leave the core to others.
constexpr double kSpinSeconds = 1e-2;

bool FitsInt(std::int64_t v) { return v >= 0 && v <= INT_MAX; }

// Destructors cannot return a status: report on stderr and carry on releasing.
void Report(cudaError_t rc, const char* call) {
  if (rc != cudaSuccess) {
    std::fprintf(stderr, "%s\n", CudaError(rc, call, __FILE__, __LINE__).ToString().c_str());
  }
}

}  // namespace

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double ToSteadySeconds(std::chrono::steady_clock::time_point t) {
  if (t == std::chrono::steady_clock::time_point::max()) {
    return std::numeric_limits<double>::infinity();
  }
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

StatusOr<kc::Storage> ComputeStorage(const char* op, const char* arg, const Tensor& t) {
  if (t.dtype == DType::kBF16) return kc::Storage::kBF16;
  if (t.dtype == DType::kF32) return kc::Storage::kF32;
  return Status::Error(
      Outcome::kInvalid,
      std::string(op) + ": `" + arg + "` is " + DTypeName(t.dtype) + ", expected bf16 or f32",
      __FILE__, __LINE__);
}

// ---- cuBLAS handle ----

void CublasHandle::Reset() {
  if (handle_ != nullptr) {
    const cublasStatus_t rc = cublasDestroy(handle_);
    handle_ = nullptr;
    if (rc != CUBLAS_STATUS_SUCCESS) {
      std::fprintf(stderr, "%s\n",
                   CublasError(rc, "cublasDestroy", __FILE__, __LINE__).ToString().c_str());
    }
  }
  if (workspace_ != nullptr) {
    Report(cudaFree(workspace_), "cudaFree(cuBLAS workspace)");
    workspace_ = nullptr;
  }
}

StatusOr<cublasHandle_t> CublasHandle::Get(cudaStream_t stream) {
  if (handle_ != nullptr) return handle_;
  cublasHandle_t handle = nullptr;
  AUTOPAR_CHECK_CUBLAS(cublasCreate(&handle));
  handle_ = handle;  // Reset releases it (and the workspace) on a failure below
  cublasStatus_t rc = cublasSetStream(handle, stream);
  if (rc != CUBLAS_STATUS_SUCCESS) {
    Reset();
    return CublasError(rc, "cublasSetStream", __FILE__, __LINE__);
  }
  if (workspace_bytes_ > 0) {
    const cudaError_t alloc = cudaMalloc(&workspace_, workspace_bytes_);
    if (alloc != cudaSuccess) {
      workspace_ = nullptr;
      Reset();
      return CudaError(alloc, "cudaMalloc(cuBLAS workspace)", __FILE__, __LINE__);
    }
    // After cublasSetStream, which resets the handle to the default workspace pool.
    rc = cublasSetWorkspace(handle, workspace_, workspace_bytes_);
    if (rc != CUBLAS_STATUS_SUCCESS) {
      Reset();
      return CublasError(rc, "cublasSetWorkspace", __FILE__, __LINE__);
    }
  }
  return handle_;
}

// ---- lifetime ----

static_assert(CudaPlatformOptions{}.memory_reserve_bytes == kDefaultMemoryReserveBytes,
              "cuda_platform.h states the default of device_memory.h");

CudaDevice::CudaDevice(const CudaPlatformOptions& options, int index, std::size_t budget_bytes)
    : Device(budget_bytes),
      index_(index),
      name_("cuda:" + std::to_string(index)),
      timeout_s_(options.timeout_s),
      reserve_bytes_(options.memory_reserve_bytes) {}

StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(const CudaPlatformOptions& options) {
  AUTOPAR_CHECK_ARG(options.timeout_s > 0.0, "CUDA backend: timeout_s must be positive");
  AUTOPAR_CHECK_CUDA(cudaSetDevice(options.device_index));
  // cudaFree(nullptr) makes the primary context (the runtime creates it lazily), so the reading
  // below is the earliest the runtime can give: the context and other processes' use, before any
  // stream, handle, workspace or communicator of ours.
  AUTOPAR_CHECK_CUDA(cudaFree(nullptr));
  std::size_t free_bytes = 0, total_bytes = 0;
  AUTOPAR_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  const std::size_t budget =
      DeviceBudgetBytes(total_bytes, options.memory_reserve_bytes, options.memory_budget_bytes);
  // The destructor releases whatever was made before a failure below.
  std::unique_ptr<CudaDevice> device(new CudaDevice(options, options.device_index, budget));
  AUTOPAR_RETURN_IF_ERROR(device->Activate());
  AUTOPAR_CHECK_CUDA(cudaDeviceGetAttribute(
      &device->max_smem_optin_, cudaDevAttrMaxSharedMemoryPerBlockOptin, device->index_));
  cudaDeviceProp prop{};
  AUTOPAR_CHECK_CUDA(cudaGetDeviceProperties(&prop, device->index_));
  device->name_ += std::string(" (") + prop.name + ")";
  device->has_fp8_ = kernels::DeviceHasFp8(prop.major, prop.minor);
  device->cublas_.set_workspace_bytes(CublasWorkspaceBytes(prop.major));
  // Non-blocking: the legacy default stream, which other libraries may use, must not serialise
  // with ours.
  AUTOPAR_CHECK_CUDA(cudaStreamCreateWithFlags(&device->stream_, cudaStreamNonBlocking));
  AUTOPAR_RETURN_IF_ERROR(device->CreatePool());
  AUTOPAR_CHECK_CUDA(cudaMalloc(&device->scratch_, kScratchBytes));
  AUTOPAR_CHECK_CUDA(cudaMallocHost(&device->pinned_, kPinnedBytes));
  return device;
}

CudaDevice::~CudaDevice() {
  if (cudaSetDevice(index_) != cudaSuccess) {
    (void)cudaGetLastError();
    return;  // no usable context: nothing of ours can be released either
  }
  if (stream_ != nullptr) {
    const Status status = Synchronize();
    if (!status.ok()) std::fprintf(stderr, "~CudaDevice: %s\n", status.ToString().c_str());
  }
  cudnn_attention_.reset();  // uses the cuBLAS handle and the stream, and frees into the budget
  cublas_.Reset();  // the handle is bound to the stream: it goes first
  fp8_.Reset();
  if (pinned_ != nullptr) Report(cudaFreeHost(pinned_), "cudaFreeHost");
  if (scratch_ != nullptr) Report(cudaFree(scratch_), "cudaFree(scratch)");
  if (stream_ != nullptr) Report(cudaStreamDestroy(stream_), "cudaStreamDestroy");
  // Frees still queued on the stream complete first: the pool is released once they have.
  if (pool_ != nullptr) Report(cudaMemPoolDestroy(pool_), "cudaMemPoolDestroy");
}

Status CudaDevice::CreatePool() {
  int supported = 0;
  AUTOPAR_CHECK_CUDA(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, index_));
  if (supported == 0) return OkStatus();  // cudaMalloc / cudaFree then (AllocateRaw, FreeRaw)
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = index_;
  AUTOPAR_CHECK_CUDA(cudaMemPoolCreate(&pool_, &props));
  // Keep what a step frees for the next step, as a training job's caching allocator does: the
  // default threshold (0) would hand it back to the driver at synchronize calls, and the driver
  // calls that map it again would land inside timed steps. ReleaseCachedMemory trims between
  // trials instead.
  std::uint64_t keep_all = UINT64_MAX;  // cuuint64_t
  AUTOPAR_CHECK_CUDA(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep_all));
  return OkStatus();
}

Status CudaDevice::Activate() const {
  AUTOPAR_CHECK_CUDA(cudaSetDevice(index_));
  return OkStatus();
}

// ---- waiting ----

void CudaDevice::Watch(CommWatch* comm) {
  std::lock_guard<std::mutex> lock(watched_mu_);
  watched_.push_back(comm);
}

void CudaDevice::Unwatch(CommWatch* comm) {
  std::lock_guard<std::mutex> lock(watched_mu_);
  std::erase(watched_, comm);
}

Status CudaDevice::CheckWatched(const char* what, double started_s) {
  std::vector<CommWatch*> comms;
  {
    std::lock_guard<std::mutex> lock(watched_mu_);
    comms = watched_;
  }
  for (CommWatch* comm : comms) {
    Status status = comm->AsyncError();
    if (!status.ok()) {
      // A failed communicator's kernels may never finish; aborting it lets the stream drain.
      comm->Abort();
      return std::move(status).WithFrame(__FILE__, __LINE__);
    }
  }
  const double now_s = SteadySeconds();
  const double waited_s = now_s - started_s;
  const bool past_ordered = now_s > ordered_deadline_s_;
  if (past_ordered || now_s > wait_end_s(started_s)) {
    for (CommWatch* comm : comms) comm->Abort();
    // Spent either way: the aborts end that work, and a later wait must not inherit the old
    // deadline.
    ordered_deadline_s_ = std::numeric_limits<double>::infinity();
    const std::string why =
        past_ordered ? ": stream-ordered collectives not done by their deadline"
        : now_s > deadline_s_
            ? " not done by the trial's deadline (waited " + std::to_string(waited_s) + " s)"
            : " not done after " + std::to_string(waited_s) + " s";
    return Status::Error(Outcome::kTimeout,
                         std::string(what) + why + "; aborted " + std::to_string(comms.size()) +
                             " NCCL communicator(s)",
                         __FILE__, __LINE__);
  }
  if (waited_s > kSpinSeconds) {
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  } else {
    std::this_thread::yield();
  }
  return OkStatus();
}

Status CudaDevice::Synchronize() {
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_RETURN_IF_ERROR(
      Poll("cudaStreamQuery(compute stream)", [this] { return cudaStreamQuery(stream_); }));
  // Everything ordered with OrderAfter was before this point of the stream: done.
  ordered_deadline_s_ = std::numeric_limits<double>::infinity();
  return OkStatus();
}

Status CudaDevice::ReleaseCachedMemory() {
  // FreeRaw is stream-ordered (cudaFreeAsync; without a pool, cudaFree waits for the device), so
  // the work queued on these buffers needs no wait before they go.
  if (cudnn_attention_ != nullptr) cudnn_attention_->ReleaseArena();
  fp8_.ReleaseWorkspace();
  // Once the stream has run the work and these frees, all the pool holds unused can go back.
  AUTOPAR_RETURN_IF_ERROR(Synchronize());
  if (pool_ != nullptr) AUTOPAR_CHECK_CUDA(cudaMemPoolTrimTo(pool_, 0));
  return OkStatus();
}

void CudaDevice::SetDeadline(std::chrono::steady_clock::time_point deadline) {
  deadline_s_ = ToSteadySeconds(deadline);
}

Status CudaDevice::OrderAfter(cudaEvent_t event, std::chrono::steady_clock::time_point deadline) {
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(cudaStreamWaitEvent(stream_, event, 0));
  ordered_deadline_s_ = std::min(ordered_deadline_s_, ToSteadySeconds(deadline));
  return OkStatus();
}

Status CudaDevice::ReadFreeBytes(std::size_t* free_bytes, std::size_t* total_bytes) const {
  AUTOPAR_CHECK_CUDA(cudaMemGetInfo(free_bytes, total_bytes));
  if (pool_ == nullptr) return OkStatus();
  std::uint64_t reserved = 0, used = 0;  // the attributes are cuuint64_t
  AUTOPAR_CHECK_CUDA(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved));
  AUTOPAR_CHECK_CUDA(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &used));
  *free_bytes = PoolAdjustedFreeBytes(*free_bytes, static_cast<std::size_t>(reserved),
                                      static_cast<std::size_t>(used));
  return OkStatus();
}

StatusOr<std::size_t> CudaDevice::NonTensorBytes() {
  AUTOPAR_RETURN_IF_ERROR(Activate());
  std::size_t free_bytes = 0, total_bytes = 0;
  AUTOPAR_RETURN_IF_ERROR(ReadFreeBytes(&free_bytes, &total_bytes));
  // The runtime cannot read device memory before it has made the context, so what was in use
  // before our context is unknowable (NVML's per-process figure would be needed). Nothing is
  // subtracted: everything on the device beyond the tensors counts, the context included. On a
  // training node (one rank per GPU) that is the context, workspaces and NCCL buffers; anything
  // a foreign process holds would shrink the real job's memory just the same.
  return autopar::device::NonTensorBytes(total_bytes, free_bytes, /*used_at_start_bytes=*/0,
                                         bytes_in_use());
}

Status CudaDevice::ReadScalar(const void* device_src, std::size_t bytes, void* host_dst) {
  AUTOPAR_CHECK_ARG(bytes <= kPinnedBytes, "ReadScalar: too many bytes");
  AUTOPAR_CHECK_CUDA(cudaMemcpyAsync(pinned_, device_src, bytes, cudaMemcpyDeviceToHost, stream_));
  AUTOPAR_RETURN_IF_ERROR(Synchronize());
  std::memcpy(host_dst, pinned_, bytes);
  return OkStatus();
}

// ---- memory ----

StatusOr<void*> CudaDevice::AllocateRaw(std::size_t bytes) {
  AUTOPAR_RETURN_IF_ERROR(Activate());
  // The budget counts tensors; the device also holds the context, library workspaces and NCCL
  // buffers, so the reserve is checked against what is really free.
  std::size_t free_bytes = 0, total_bytes = 0;
  AUTOPAR_RETURN_IF_ERROR(ReadFreeBytes(&free_bytes, &total_bytes));
  if (!LeavesReserve(free_bytes, bytes, reserve_bytes_)) {
    return Status::Error(
        Outcome::kOom,
        "cudaMalloc of " + std::to_string(bytes) + " bytes would leave less than the reserve of " +
            std::to_string(reserve_bytes_) + " bytes free (" + std::to_string(free_bytes) +
            " free of " + std::to_string(total_bytes) + ")",
        __FILE__, __LINE__);
  }
  void* data = nullptr;
  // CudaError clears the runtime's last error, so a refused allocation leaves nothing behind for
  // the next launch check to trip over (cudaErrorMemoryAllocation is not sticky).
  if (pool_ == nullptr) {
    AUTOPAR_CHECK_CUDA(cudaMalloc(&data, bytes));
  } else {
    // Usable at once by the compute stream's later work, and by another stream's work ordered
    // after it (cuda_device.h).
    AUTOPAR_CHECK_CUDA(cudaMallocFromPoolAsync(&data, bytes, pool_, stream_));
  }
  return data;
}

void CudaDevice::FreeRaw(void* data, std::size_t /*bytes*/) {
  if (cudaSetDevice(index_) != cudaSuccess) (void)cudaGetLastError();
  if (pool_ == nullptr) {
    Report(cudaFree(data), "cudaFree");
    return;
  }
  // Stream-ordered: the block is reused only by work after this point of the compute stream, and
  // the host does not wait for the device.
  Report(cudaFreeAsync(data, stream_), "cudaFreeAsync");
}

// ---- data movement ----
// The host copies first wait for the stream by polling: a pageable cudaMemcpyAsync would otherwise
// wait for it inside the driver, where no deadline applies.

Status CudaDevice::CopyFromHost(Tensor dst, const void* src, std::size_t bytes) {
  AUTOPAR_CHECK_ARG(dst.valid() && bytes <= dst.bytes(), "CopyFromHost: destination too small");
  AUTOPAR_CHECK_ARG(bytes == 0 || src != nullptr, "CopyFromHost: null source");
  if (bytes == 0) return OkStatus();
  AUTOPAR_RETURN_IF_ERROR(Synchronize());
  AUTOPAR_CHECK_CUDA(cudaMemcpyAsync(dst.data, src, bytes, cudaMemcpyHostToDevice, stream_));
  // Done before returning: the caller may free or reuse `src` at once.
  return Synchronize();
}

Status CudaDevice::CopyToHost(void* dst, Tensor src, std::size_t bytes) {
  AUTOPAR_CHECK_ARG(src.valid() && bytes <= src.bytes(), "CopyToHost: source too small");
  AUTOPAR_CHECK_ARG(bytes == 0 || dst != nullptr, "CopyToHost: null destination");
  if (bytes == 0) return OkStatus();
  AUTOPAR_RETURN_IF_ERROR(Synchronize());
  AUTOPAR_CHECK_CUDA(cudaMemcpyAsync(dst, src.data, bytes, cudaMemcpyDeviceToHost, stream_));
  return Synchronize();
}

Status CudaDevice::Copy(Tensor dst, Tensor src) {
  AUTOPAR_CHECK_ARG(dst.valid() && src.valid(), "Copy: invalid view");
  AUTOPAR_CHECK_ARG(src.numel == dst.numel, "Copy: element counts differ (" +
                                                std::to_string(src.numel) + " vs " +
                                                std::to_string(dst.numel) + ")");
  if (dst.numel == 0 || (dst.data == src.data && dst.dtype == src.dtype)) return OkStatus();
  AUTOPAR_CHECK_ARG(!Overlaps(dst, src), "Copy: source and destination overlap");
  AUTOPAR_RETURN_IF_ERROR(Activate());
  if (dst.dtype == src.dtype) {
    AUTOPAR_CHECK_CUDA(
        cudaMemcpyAsync(dst.data, src.data, dst.bytes(), cudaMemcpyDeviceToDevice, stream_));
    return OkStatus();
  }
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage dst_t, ComputeStorage("Copy", "dst", dst));
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage src_t, ComputeStorage("Copy", "src", src));
  AUTOPAR_CHECK_CUDA(kc::Convert(stream_, dst_t, dst.data, src_t, src.data, dst.numel));
  return OkStatus();
}

Status CudaDevice::CopyRows(Tensor dst, std::int64_t dst_stride, Tensor src,
                            std::int64_t src_stride, std::int64_t rows, std::int64_t cols) {
  AUTOPAR_RETURN_IF_ERROR(CheckCopyRows(dst, dst_stride, src, src_stride, rows, cols));
  if (rows == 0 || cols == 0) return OkStatus();
  const std::size_t size = DTypeSize(src.dtype);
  AUTOPAR_RETURN_IF_ERROR(Activate());
  // Pitches and width in bytes, height in rows.
  AUTOPAR_CHECK_CUDA(cudaMemcpy2DAsync(
      dst.data, static_cast<std::size_t>(dst_stride) * size, src.data,
      static_cast<std::size_t>(src_stride) * size, static_cast<std::size_t>(cols) * size,
      static_cast<std::size_t>(rows), cudaMemcpyDeviceToDevice, stream_));
  return OkStatus();
}

Status CudaDevice::Fill(Tensor x, float value) {
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("Fill", "x", x));
  AUTOPAR_CHECK_ARG(x.valid(), "Fill: invalid view");
  if (x.numel == 0) return OkStatus();
  AUTOPAR_RETURN_IF_ERROR(Activate());
  if (value == 0.0f && !std::signbit(value)) {  // +0 is all-zero bits in f32 and bf16
    AUTOPAR_CHECK_CUDA(cudaMemsetAsync(x.data, 0, x.bytes(), stream_));
    return OkStatus();
  }
  AUTOPAR_CHECK_CUDA(kc::Fill(stream_, t, x.data, x.numel, value));
  return OkStatus();
}

Status CudaDevice::FillHash(Tensor x, const HashFill& fill) {
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("FillHash", "x", x));
  AUTOPAR_CHECK_ARG(x.valid(), "FillHash: invalid view");
  AUTOPAR_ASSIGN_OR_RETURN(const HashFill f, ResolveHashFill(fill, x.numel));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::FillHash(stream_, t, x.data, f.seed, f.scale, f.rows, f.cols,
                                  f.global_cols, f.row_offset, f.col_offset));
  return OkStatus();
}

Status CudaDevice::Add(Tensor a, Tensor b, Tensor out) {
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("Add", "out", out));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("Add", {{"a", a, out.dtype, out.numel},
                                            {"b", b, out.dtype, out.numel},
                                            {"out", out, out.dtype, 0}}));
  AUTOPAR_CHECK_ARG(a.numel == out.numel && b.numel == out.numel, "Add: element counts differ");
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::Add(stream_, t, a.data, b.data, out.data, out.numel));
  return OkStatus();
}

Status CudaDevice::Axpy(float alpha, Tensor x, Tensor y) {
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("Axpy", "y", y));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("Axpy", {{"x", x, y.dtype, y.numel}, {"y", y, y.dtype, 0}}));
  AUTOPAR_CHECK_ARG(x.numel == y.numel, "Axpy: element counts differ");
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::Axpy(stream_, t, alpha, x.data, y.data, y.numel));
  return OkStatus();
}

Status CudaDevice::Scale(Tensor x, float alpha) {
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("Scale", "x", x));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("Scale", {{"x", x, x.dtype, 0}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::Scale(stream_, t, x.data, x.numel, alpha));
  return OkStatus();
}

Status CudaDevice::SumSquares(Tensor x, Tensor sum) {
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("SumSquares", "x", x));
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("SumSquares", {{"x", x, x.dtype, 0}, {"sum", sum, DType::kF32, 1}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(
      kc::SumSquares(stream_, t, x.data, x.numel, sum.as<float>(), static_cast<double*>(scratch_)));
  return OkStatus();
}

Status CudaDevice::DropoutAdd(const DropoutDesc& d, Tensor x, Tensor residual, Tensor out,
                              Tensor mask) {
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("DropoutAdd", "out", out));
  AUTOPAR_RETURN_IF_ERROR(CheckDropout("DropoutAdd", d));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("DropoutAdd", {{"x", x, out.dtype, out.numel},
                                                   {"residual", residual, out.dtype, out.numel},
                                                   {"out", out, out.dtype, 0},
                                                   {"mask", mask, DType::kU8, out.numel}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::DropoutAdd(
      stream_, t, x.data, residual.data, out.data, static_cast<std::uint8_t*>(mask.data), out.numel,
      d.seed, kernels::ref::DropoutThreshold(d.p), kernels::ref::DropoutScale(d.p)));
  return OkStatus();
}

Status CudaDevice::DropoutBackward(const DropoutDesc& d, Tensor dy, Tensor mask, Tensor dx) {
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("DropoutBackward", "dx", dx));
  AUTOPAR_RETURN_IF_ERROR(CheckDropout("DropoutBackward", d));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("DropoutBackward", {{"dy", dy, dx.dtype, dx.numel},
                                                        {"mask", mask, DType::kU8, dx.numel},
                                                        {"dx", dx, dx.dtype, 0}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  AUTOPAR_CHECK_CUDA(kc::DropoutBackward(stream_, t, dy.data,
                                         static_cast<const std::uint8_t*>(mask.data), dx.data,
                                         dx.numel, kernels::ref::DropoutScale(d.p)));
  return OkStatus();
}

Status CudaDevice::CheckFinite(Tensor x) {
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage t, ComputeStorage("CheckFinite", "x", x));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("CheckFinite", {{"x", x, x.dtype, 0}}));
  AUTOPAR_RETURN_IF_ERROR(Activate());
  auto* first_bad =
      reinterpret_cast<unsigned long long*>(static_cast<char*>(scratch_) + kFirstBadOffset);
  AUTOPAR_CHECK_CUDA(kc::FindNonfinite(stream_, t, x.data, x.numel, first_bad));
  unsigned long long index = 0;
  AUTOPAR_RETURN_IF_ERROR(ReadScalar(first_bad, sizeof(index), &index));
  if (index == ~0ull) return OkStatus();
  // Name the culprit as the CPU device does: its index and value.
  float value = 0.0f;
  const Tensor element = x.Slice(static_cast<std::int64_t>(index), 1);
  if (x.dtype == DType::kF32) {
    AUTOPAR_RETURN_IF_ERROR(ReadScalar(element.data, sizeof(float), &value));
  } else {
    std::uint16_t bits = 0;
    AUTOPAR_RETURN_IF_ERROR(ReadScalar(element.data, sizeof(bits), &bits));
    const std::uint32_t widened = std::uint32_t{bits} << 16;  // bf16 is the top half of an f32
    std::memcpy(&value, &widened, sizeof(value));
  }
  return Status::Error(Outcome::kNonfinite,
                       "element " + std::to_string(index) + " of " + std::to_string(x.numel) +
                           " is " + std::to_string(value),
                       __FILE__, __LINE__);
}

// ---- GEMM ----

Status CudaDevice::Gemm(const GemmDesc& desc, Tensor a, Tensor b, Tensor c) {
  AUTOPAR_ASSIGN_OR_RETURN(const kc::Storage ab_t, ComputeStorage("Gemm", "a", a));
  AUTOPAR_ASSIGN_OR_RETURN(const GemmDesc d, ResolveGemm(desc, a, b, c, a.dtype));
  AUTOPAR_CHECK_ARG(FitsInt(d.m) && FitsInt(d.n) && FitsInt(d.k) && FitsInt(d.lda) &&
                        FitsInt(d.ldb) && FitsInt(d.ldc) && FitsInt(d.batch),
                    "Gemm: a dimension exceeds cuBLAS's 32-bit interface");
  if (d.m == 0 || d.n == 0) return OkStatus();
  AUTOPAR_RETURN_IF_ERROR(Activate());
  if (d.k > 0 && (d.fp8_a != Fp8Operand::kNone || d.fp8_b != Fp8Operand::kNone)) {
    if (!has_fp8_) {
      return Status::Error(Outcome::kInvalid,
                           "--fp8-format: " + name_ +
                               " has no fp8 tensor cores (compute capability 8.9 or newer needed)",
                           __FILE__, __LINE__);
    }
    return fp8_.Run(*this, stream_, d, ab_t, a, b, c);
  }
  const kc::Storage c_t = c.dtype == DType::kF32 ? kc::Storage::kF32 : kc::Storage::kBF16;
  if (d.k == 0) {  // alpha * (empty sum) + beta * C; cuBLAS is not asked to handle k = 0
    AUTOPAR_CHECK_CUDA(
        kc::ScaleMatrix(stream_, c_t, c.data, d.batch, d.m, d.n, d.ldc, d.stride_c, d.beta));
    return OkStatus();
  }
  AUTOPAR_ASSIGN_OR_RETURN(cublasHandle_t handle, cublas_.Get(stream_));
  const ColumnMajorGemm g = ToColumnMajor(d);
  const cudaDataType ab_type = ab_t == kc::Storage::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  const cudaDataType c_type = c_t == kc::Storage::kBF16 ? CUDA_R_16BF : CUDA_R_32F;
  const float alpha = d.alpha;
  const float beta = d.beta;  // 0: cuBLAS does not read C, so garbage (NaN) there is harmless
  // fp32 accumulation (CUBLAS_COMPUTE_32F) for bf16 inputs, Megatron's default; for f32 inputs it
  // is true fp32 (no TF32 unless NVIDIA_TF32_OVERRIDE says so).
  AUTOPAR_CHECK_CUBLAS(cublasGemmStridedBatchedEx(
      handle, g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), &alpha, b.data, ab_type,
      static_cast<int>(g.ld_first), g.stride_first, a.data, ab_type, static_cast<int>(g.ld_second),
      g.stride_second, &beta, c.data, c_type, static_cast<int>(g.ld_c), g.stride_c,
      static_cast<int>(g.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return OkStatus();
}

}  // namespace autopar::device
