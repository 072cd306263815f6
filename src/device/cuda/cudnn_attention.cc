// cuDNN fused attention: the handle, the plan cache, the scratch arena, and running the plans that
// cudnn_sdpa_graph.cc builds.
#include "src/device/cuda/cudnn_attention.h"

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda_kernels.cuh"
#include "src/device/cuda/cuda_check.h"
#include "src/device/cuda/cudnn_sdpa_graph.h"

namespace autopar::device {

#if defined(AUTOPAR_HAVE_CUDNN) && AUTOPAR_HAVE_CUDNN

namespace {

using sdpa::Descriptor;
using sdpa::MakeDescriptor;
using sdpa::Plan;

// The stats transposes, in f32: dst [cols, rows] = src [rows, cols]^T, both row-major. A row-major
// [r, c] matrix is the column-major [c, r] one, so in cuBLAS's terms C = dst as column-major
// [rows, cols] (ldc = rows) is op(A) = A^T for A = src as column-major [cols, rows] (lda = cols).
// beta = 0 with B = C (in place is allowed for transb N and ldb = ldc); dst is zeroed first so
// that no stale NaN can meet the 0.
Status Transpose(cudaStream_t stream, cublasHandle_t cublas, const float* src, float* dst,
                 std::int64_t rows, std::int64_t cols) {
  AUTOPAR_CHECK_CUDA(
      cudaMemsetAsync(dst, 0, static_cast<std::size_t>(rows * cols) * sizeof(float), stream));
  const float one = 1.0f, zero = 0.0f;
  const int r = static_cast<int>(rows), c = static_cast<int>(cols);
  AUTOPAR_CHECK_CUBLAS(
      cublasSgeam(cublas, CUBLAS_OP_T, CUBLAS_OP_N, r, c, &one, src, c, &zero, dst, r, dst, r));
  return OkStatus();
}

}  // namespace

struct CudnnAttention::Impl {
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cudnnHandle_t handle = nullptr;
  Allocator allocate;
  Waiter wait;
  Buffer arena;
  std::map<SdpaKey, std::unique_ptr<Plan>> plans;

  ~Impl() {
    plans.clear();  // descriptors before the handle they were built with
    arena.Reset();
    if (handle != nullptr) {
      const cudnnStatus_t rc = cudnnDestroy(handle);
      if (rc != CUDNN_STATUS_SUCCESS) {
        std::fprintf(stderr, "%s\n",
                     CudnnError(rc, "cudnnDestroy", __FILE__, __LINE__).ToString().c_str());
      }
    }
  }

  // The cached plan of `key`, built on first use; a declined one has `declined` set.
  StatusOr<Plan*> GetPlan(const SdpaKey& key) {
    auto it = plans.find(key);
    if (it != plans.end()) return it->second.get();
    auto plan = std::make_unique<Plan>();
    const Status built = sdpa::BuildPlan(handle, key, plan.get());
    if (!built.ok()) {
      // Out of host or device memory while building is a real failure of the call, not a
      // property of the shape: do not remember it.
      if (built.outcome() == Outcome::kOom) return built;
      plan->declined = SdpaKeyName(key) + ": " + built.message();
    }
    Plan* result = plan.get();
    plans.emplace(key, std::move(plan));
    return result;
  }

  // Runs `plan`. cuDNN refusing a finalized plan at execution (a bad parameter or an unsupported
  // case, kInvalid) has enqueued none of the graph's work and left the outputs to the caller's
  // fallback, which rewrites them all (or, accumulating, adds into the real ones, which the arena
  // copies have not touched yet): the plan is declined from then on. Anything else is an error.
  StatusOr<CudnnAttention::Attempt> Run(const SdpaKey& key, Plan* plan,
                                        const std::vector<std::int64_t>& uids,
                                        const std::vector<void*>& pointers, void* workspace) {
    Status ran = Execute(*plan, uids, pointers, workspace);
    if (ran.ok()) return CudnnAttention::Attempt{true, ""};
    if (ran.outcome() != Outcome::kInvalid) return ran;
    plan->declined = SdpaKeyName(key) + ": " + ran.message();
    return CudnnAttention::Attempt{false, plan->declined};
  }

  // The arena, grown to at least `bytes`. Queued work may still use the old arena, so the stream
  // drains before it is freed.
  StatusOr<char*> Arena(std::size_t bytes) {
    if (arena.bytes() < bytes) {
      if (arena.bytes() > 0) AUTOPAR_RETURN_IF_ERROR(wait());
      arena.Reset();
      AUTOPAR_ASSIGN_OR_RETURN(arena, allocate(bytes));
    }
    return static_cast<char*>(arena.data());
  }

  Status Execute(const Plan& plan, const std::vector<std::int64_t>& uids,
                 const std::vector<void*>& pointers, void* workspace) {
    AUTOPAR_ASSIGN_OR_RETURN(Descriptor pack,
                             MakeDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR));
    AUTOPAR_CUDNN_SET(pack.get(), CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64,
                      static_cast<std::int64_t>(uids.size()), uids.data());
    AUTOPAR_CUDNN_SET(pack.get(), CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
                      static_cast<std::int64_t>(pointers.size()), pointers.data());
    AUTOPAR_CUDNN_SET(pack.get(), CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                      &workspace);
    AUTOPAR_CHECK_CUDNN(cudnnBackendFinalize(pack.get()));
    AUTOPAR_CHECK_CUDNN(cudnnBackendExecute(handle, plan.plan, pack.get()));
    return OkStatus();
  }
};

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnAttention::~CudnnAttention() = default;

StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::Create(cudaStream_t stream,
                                                                 cublasHandle_t cublas,
                                                                 Allocator allocate, Waiter wait) {
  AUTOPAR_CHECK_ARG(cublas != nullptr && allocate && wait,
                    "CudnnAttention: missing cuBLAS, allocator or waiter");
  auto impl = std::make_unique<Impl>();
  impl->stream = stream;
  impl->cublas = cublas;
  impl->allocate = std::move(allocate);
  impl->wait = std::move(wait);
  AUTOPAR_CHECK_CUDNN(cudnnCreate(&impl->handle));  // Impl's destructor releases it on failure
  AUTOPAR_CHECK_CUDNN(cudnnSetStream(impl->handle, stream));
  return std::unique_ptr<CudnnAttention>(new CudnnAttention(std::move(impl)));
}

std::size_t CudnnAttention::cached_plans() const { return impl_->plans.size(); }

void CudnnAttention::ReleaseArena() { impl_->arena.Reset(); }

std::size_t CudnnAttention::arena_bytes() const { return impl_->arena.bytes(); }

std::int64_t CudnnAttention::LibraryVersion() {
  return static_cast<std::int64_t>(cudnnGetVersion());
}

StatusOr<CudnnAttention::Attempt> CudnnAttention::Forward(const SdpaKey& key, float scale,
                                                          const void* q, const void* k,
                                                          const void* v, void* out, float* lse) {
  AUTOPAR_CHECK_ARG(key.direction == SdpaDirection::kForward, "CudnnAttention: not a forward key");
  AUTOPAR_ASSIGN_OR_RETURN(Plan* const plan, impl_->GetPlan(key));
  if (!plan->declined.empty()) return Attempt{false, plan->declined};
  const SdpaScratch layout =
      PlanSdpaScratch(key, static_cast<std::size_t>(plan->workspace_bytes), false);
  AUTOPAR_ASSIGN_OR_RETURN(char* arena, impl_->Arena(layout.total_bytes));
  auto* stats = reinterpret_cast<float*>(arena + layout.stats);
  // Host scalars read at execution (by-value tensors).
  float scale_value = scale;
  float neg_inf = SdpaMaskFillValue(LibraryVersion());
  std::vector<std::int64_t> uids = {sdpa::kUidQ, sdpa::kUidK,     sdpa::kUidV,
                                    sdpa::kUidO, sdpa::kUidStats, sdpa::kUidScale};
  std::vector<void*> pointers = {
      const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), out, stats, &scale_value};
  if (key.mask == SdpaMask::kCausalTopLeft) {
    uids.push_back(sdpa::kUidNegInf);
    pointers.push_back(&neg_inf);
  }
  AUTOPAR_ASSIGN_OR_RETURN(const Attempt attempt,
                           impl_->Run(key, plan, uids, pointers, arena + layout.workspace));
  if (!attempt.ran) return attempt;
  // stats [b h_q, s_q] -> lse [s_q, b h_q].
  AUTOPAR_RETURN_IF_ERROR(
      Transpose(impl_->stream, impl_->cublas, stats, lse, key.batch * key.heads_q, key.seq_q));
  return Attempt{true, ""};
}

StatusOr<CudnnAttention::Attempt> CudnnAttention::Backward(
    const SdpaKey& key, float scale, const void* q, const void* k, const void* v, const void* out,
    const void* dout, const float* lse, void* dq, void* dk, void* dv, bool accumulate) {
  AUTOPAR_CHECK_ARG(key.direction == SdpaDirection::kBackward,
                    "CudnnAttention: not a backward key");
  AUTOPAR_CHECK_ARG(!accumulate || key.dtype == DType::kBF16,
                    "CudnnAttention: accumulate is bf16 only");
  AUTOPAR_ASSIGN_OR_RETURN(Plan* const plan, impl_->GetPlan(key));
  if (!plan->declined.empty()) return Attempt{false, plan->declined};
  const SdpaScratch layout =
      PlanSdpaScratch(key, static_cast<std::size_t>(plan->workspace_bytes), accumulate);
  AUTOPAR_ASSIGN_OR_RETURN(char* arena, impl_->Arena(layout.total_bytes));
  const cudaStream_t stream = impl_->stream;
  auto* stats = reinterpret_cast<float*>(arena + layout.stats);
  auto* dq_accum = reinterpret_cast<float*>(arena + layout.dq_accum);
  // lse [s_q, b h_q] -> stats [b h_q, s_q].
  AUTOPAR_RETURN_IF_ERROR(
      Transpose(stream, impl_->cublas, lse, stats, key.seq_q, key.batch * key.heads_q));
  // cuDNN before 9.6 needed the dQ accumulator zeroed by the caller (cudnn-frontend still does
  // it for those); cheap, so done always.
  AUTOPAR_CHECK_CUDA(cudaMemsetAsync(
      dq_accum, 0,
      static_cast<std::size_t>(key.batch * key.heads_q * key.seq_q * key.head_dim) * sizeof(float),
      stream));
  const std::size_t elem = DTypeSize(key.dtype);
  const std::int64_t q_extent = SdpaQExtent(key), kv_extent = SdpaKvExtent(key);
  void* dq_target = dq;
  void* dk_target = dk;
  void* dv_target = dv;
  if (accumulate) {
    dq_target = arena + layout.dq;
    dk_target = arena + layout.dk;
    dv_target = arena + layout.dv;
    // Zeroed, so the Axpy below adds +0 outside the head slots cuDNN writes.
    AUTOPAR_CHECK_CUDA(
        cudaMemsetAsync(dq_target, 0, static_cast<std::size_t>(q_extent) * elem, stream));
    AUTOPAR_CHECK_CUDA(
        cudaMemsetAsync(dk_target, 0, static_cast<std::size_t>(kv_extent) * elem, stream));
    AUTOPAR_CHECK_CUDA(
        cudaMemsetAsync(dv_target, 0, static_cast<std::size_t>(kv_extent) * elem, stream));
  }
  float scale_value = scale;
  float neg_inf = SdpaMaskFillValue(LibraryVersion());
  float one = 1.0f;
  std::vector<std::int64_t> uids = {
      sdpa::kUidQ,       sdpa::kUidK,     sdpa::kUidV,  sdpa::kUidO,  sdpa::kUidDo,
      sdpa::kUidStats,   sdpa::kUidDq,    sdpa::kUidDk, sdpa::kUidDv, sdpa::kUidSoftmaxSum,
      sdpa::kUidDqAccum, sdpa::kUidScale, sdpa::kUidOne};
  std::vector<void*> pointers = {const_cast<void*>(q),
                                 const_cast<void*>(k),
                                 const_cast<void*>(v),
                                 const_cast<void*>(out),
                                 const_cast<void*>(dout),
                                 stats,
                                 dq_target,
                                 dk_target,
                                 dv_target,
                                 arena + layout.softmax_sum,
                                 dq_accum,
                                 &scale_value,
                                 &one};
  if (key.mask == SdpaMask::kCausalTopLeft) {
    uids.push_back(sdpa::kUidNegInf);
    pointers.push_back(&neg_inf);
  }
  AUTOPAR_ASSIGN_OR_RETURN(const Attempt attempt,
                           impl_->Run(key, plan, uids, pointers, arena + layout.workspace));
  if (!attempt.ran) return attempt;
  if (accumulate) {
    namespace kc = kernels::cuda;
    AUTOPAR_CHECK_CUDA(kc::Axpy(stream, kc::Storage::kBF16, 1.0f, dq_target, dq, q_extent));
    AUTOPAR_CHECK_CUDA(kc::Axpy(stream, kc::Storage::kBF16, 1.0f, dk_target, dk, kv_extent));
    AUTOPAR_CHECK_CUDA(kc::Axpy(stream, kc::Storage::kBF16, 1.0f, dv_target, dv, kv_extent));
  }
  return Attempt{true, ""};
}

#else  // !AUTOPAR_HAVE_CUDNN

struct CudnnAttention::Impl {};

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnAttention::~CudnnAttention() = default;

StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::Create(cudaStream_t, cublasHandle_t,
                                                                 Allocator, Waiter) {
  return Status::Error(Outcome::kInvalid, "this build has no cuDNN (AUTOPAR_HAVE_CUDNN unset)",
                       __FILE__, __LINE__);
}

std::size_t CudnnAttention::cached_plans() const { return 0; }

void CudnnAttention::ReleaseArena() {}

std::size_t CudnnAttention::arena_bytes() const { return 0; }

std::int64_t CudnnAttention::LibraryVersion() { return 0; }

StatusOr<CudnnAttention::Attempt> CudnnAttention::Forward(const SdpaKey&, float, const void*,
                                                          const void*, const void*, void*, float*) {
  return Attempt{false, "this build has no cuDNN"};
}

StatusOr<CudnnAttention::Attempt> CudnnAttention::Backward(const SdpaKey&, float, const void*,
                                                           const void*, const void*, const void*,
                                                           const void*, const float*, void*, void*,
                                                           void*, bool) {
  return Attempt{false, "this build has no cuDNN"};
}

#endif  // AUTOPAR_HAVE_CUDNN

}  // namespace autopar::device
