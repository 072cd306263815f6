// The operation graphs of cuDNN's fused attention and their execution plans (the internals of
// cudnn_attention.cc; only with AUTOPAR_HAVE_CUDNN).
//
// The graphs are cudnn-frontend's composite SDPA lowering for cuDNN backends before 9.21
// (include/cudnn_frontend/node/scaled_dot_product_flash_attention.h, CompositeSDPANode and
// CompositeSDPABackwardNode, with softmax.h's CompositeSoftmaxNode and diagonal_band_mask.h's
// CompositeDiagonalBandMaskNode), written out against the backend C API. cuDNN recognises this
// pattern and runs it as one fused flash-attention kernel; the data types of the intermediate
// tensors (f32 scores, bf16/f16 P and dS feeding the second products, int32 indices, boolean
// mask) are part of the pattern and follow the frontend's.
#pragma once

#if defined(AUTOPAR_HAVE_CUDNN) && AUTOPAR_HAVE_CUDNN

#include <cudnn_graph.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "autopar/device/status.h"
#include "src/device/cuda/cuda_check.h"
#include "src/device/cuda/cudnn_attention_plan.h"

// The call's source text names the attribute in a failure message.
#define AUTOPAR_CUDNN_SET(desc, name, type, count, value) \
  AUTOPAR_CHECK_CUDNN(cudnnBackendSetAttribute(desc, name, type, count, value))

namespace autopar::device::sdpa {

using Raw = cudnnBackendDescriptor_t;

// Ids the variant pack names; virtual tensors are numbered from kFirstVirtual.
enum Uid : std::int64_t {
  kUidQ = 1,
  kUidK,
  kUidV,
  kUidO,
  kUidStats,
  kUidScale,
  kUidNegInf,
  kUidDo,
  kUidDq,
  kUidDk,
  kUidDv,
  kUidSoftmaxSum,
  kUidDqAccum,
  kUidOne,
  kFirstVirtual = 100,
};

// One backend descriptor, destroyed with its owner.
class Descriptor {
 public:
  Descriptor() = default;
  explicit Descriptor(Raw raw) : raw_(raw) {}
  Descriptor(Descriptor&& other) noexcept : raw_(std::exchange(other.raw_, nullptr)) {}
  Descriptor& operator=(Descriptor&& other) noexcept {
    if (this != &other) {
      Reset();
      raw_ = std::exchange(other.raw_, nullptr);
    }
    return *this;
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() { Reset(); }
  Raw get() const { return raw_; }

 private:
  void Reset() {
    if (raw_ == nullptr) return;
    const cudnnStatus_t rc = cudnnBackendDestroyDescriptor(raw_);
    raw_ = nullptr;
    // A destructor cannot return a status: report and carry on.
    if (rc != CUDNN_STATUS_SUCCESS) {
      std::fprintf(
          stderr, "%s\n",
          CudnnError(rc, "cudnnBackendDestroyDescriptor", __FILE__, __LINE__).ToString().c_str());
    }
  }
  Raw raw_ = nullptr;
};

StatusOr<Descriptor> MakeDescriptor(cudnnBackendDescriptorType_t type);

// A built graph and what its plan refers to: cuDNN's descriptors reference each other, so all of
// them live as long as the plan.
struct Plan {
  std::vector<Descriptor> parts;
  Raw plan = nullptr;  // one of parts
  std::int64_t workspace_bytes = 0;
  std::string declined;  // non-empty: cuDNN refused the graph, the caller runs the kernel
};

// Builds the graph of `key` (forward or backward by key.direction) and finalizes its plan into
// `plan`. Any refusal by cuDNN is returned as its error (kInvalid for an unsupported graph, kOom
// when memory ran out); the caller decides what a refusal means.
Status BuildPlan(cudnnHandle_t handle, const SdpaKey& key, Plan* plan);

}  // namespace autopar::device::sdpa

#endif  // AUTOPAR_HAVE_CUDNN
