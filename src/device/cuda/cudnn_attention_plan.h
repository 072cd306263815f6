// The host-side decisions of the cuDNN fused-attention path (src/device/cuda/cudnn_attention.h):
// which AttentionDesc calls it takes, the key of a cached execution plan, the [b, h, s, d] dims and
// strides cuDNN is given for our [s, b, h, d] tensors, and where the scratch of one call lies.
// Pure (no cuDNN or CUDA headers), so the host tests check all of it without a GPU.
//
// The cuDNN graph follows cudnn-frontend's composite SDPA lowering for backends before 9.21
// (matmul -> scale -> [causal mask] -> softmax with stats -> matmul, and the matching backward).
// Its masks are top-left aligned: query row i sees key column j iff j <= i. Our AttentionDesc
// masks by global positions (kv_offset + j <= q_offset + i), which is that mask
// exactly when the offsets are equal, and no mask at all when the whole key block lies at or before
// the first query. Partial overlaps would need a shifted diagonal and rows that see no key (lse =
// -inf), which the fused kernels do not promise to handle; those calls stay on the CUDA-core
// kernel.
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "autopar/device/ops.h"
#include "autopar/device/status.h"
#include "autopar/device/tensor.h"

namespace autopar::device {

// Which engine runs attention on the CUDA device. AUTOPAR_ATTENTION picks it per process:
// "auto" (or unset): cuDNN when it supports the call, else the CUDA-core kernel, noted;
// "kernel": always the CUDA-core kernel (the reference; gpu_check compares against it);
// "cudnn": cuDNN or kInvalid, to prove a shape runs on the fast path.
enum class AttentionEngine : std::uint8_t { kAuto, kKernel, kCudnn };

// kInvalid for any other spelling.
StatusOr<AttentionEngine> ParseAttentionEngine(std::string_view text);

enum class SdpaDirection : std::uint8_t { kForward, kBackward };
enum class SdpaMask : std::uint8_t { kNone, kCausalTopLeft };

// Everything a finalized cuDNN graph bakes in, so one execution plan serves every call with an
// equal key. The softmax scale is not part of it: the graph takes it as a by-value scalar at each
// execution. Pointers are not part of it either (the variant pack carries them).
struct SdpaKey {
  SdpaDirection direction = SdpaDirection::kForward;
  DType dtype = DType::kBF16;  // q, k, v, out, dout, dq, dk, dv; stats are f32
  std::int64_t batch = 0;
  std::int64_t heads_q = 0;
  std::int64_t heads_kv = 0;
  std::int64_t head_dim = 0;
  std::int64_t seq_q = 0;
  std::int64_t seq_kv = 0;
  std::int64_t q_stride = 0;   // resolved: elements between (s, b) rows of q and dq
  std::int64_t kv_stride = 0;  // resolved: of k, v, dk, dv
  SdpaMask mask = SdpaMask::kNone;

  auto operator<=>(const SdpaKey&) const = default;
};

// Limits of the fused kernels on SM80/SM90 as cudnn-frontend checks them for cuDNN 9.x (the
// backward is the tighter: head_dim a multiple of 8 and at most 128 off Hopper; s_q = s_kv = 1
// refused), and the 16-byte alignment its tensors declare by default.
inline constexpr std::int64_t kSdpaMaxHeadDim = 128;
inline constexpr std::int64_t kSdpaHeadDimMultiple = 8;
inline constexpr std::size_t kSdpaAlignmentBytes = 16;

struct SdpaDecision {
  bool use_cudnn = false;
  SdpaKey key;         // valid when use_cudnn
  std::string reason;  // why not, when !use_cudnn
};

// Whether the call `d` (resolved by ResolveAttention) on tensors of `dtype` can run on cuDNN.
// `pointers_aligned`: every data pointer of the call is kSdpaAlignmentBytes-aligned.
// `accumulate` (backward): the gradients are added through a bf16 Axpy, so it needs bf16.
// `cudnn_version`: the loaded library's cudnnGetVersion() (major * 10000 + minor * 100 + patch);
// versions where cudnn-frontend refuses or works around our graph are declined (0: unknown, no
// version rule applies; the device always passes the real one):
//  * 9.10.0 and 9.10.1, forward and backward ("not supported ... due to known bugs",
//    sdpa_support_surface.h and CompositeSDPABackwardNode);
//  * the backward up to 9.15.0 with seq_kv not a multiple of 128, where the frontend adds a
//    padding mask over the full lengths as a workaround ("Workaround padding mask", s_kv % 128)
//    that this graph does not have.
SdpaDecision DecideSdpa(const AttentionDesc& d, DType dtype, SdpaDirection direction,
                        bool pointers_aligned, bool accumulate = false,
                        std::int64_t cudnn_version = 0);

// The value the causal mask puts in place of a hidden score: -inf, or the lowest finite float
// before cuDNN 9.10, as cudnn-frontend does (attn_score_modifiers.h, get_negative_inf_value:
// "older cuDNN version prefers lowest for softmax mask"). exp() of either minus a row's finite
// maximum is 0, so the results are the same. 0 (unknown) gives -inf.
float SdpaMaskFillValue(std::int64_t cudnn_version);

// A cuDNN tensor: dims and strides in elements, in cuDNN's [b, h, s, d] order.
struct SdpaLayout {
  std::array<std::int64_t, 4> dims{};
  std::array<std::int64_t, 4> strides{};
  bool operator==(const SdpaLayout&) const = default;
};

// q and dq: [s, b, h, d] rows of q_stride, as [b, h_q, s_q, d].
SdpaLayout SdpaQLayout(const SdpaKey& key);
// k, v, dk, dv: [s, b, h, d] rows of kv_stride, as [b, h_kv, s_kv, d].
SdpaLayout SdpaKvLayout(const SdpaKey& key);
// out and dout: packed [s, b, h_q, d], as [b, h_q, s_q, d].
SdpaLayout SdpaOLayout(const SdpaKey& key);
// The last two dims swapped (K^T for Q K^T, V^T for dO V^T).
SdpaLayout SdpaTransposed(const SdpaLayout& layout);
// Per-row statistics in cuDNN's layout, [b, h_q, s_q, 1] packed: the forward's stats (log-sum-exp
// of the scaled scores, natural log), the backward's stats input and its softmax_sum (dO . O).
// Ours are [s_q, b, h_q]: a transpose of this (b h_q) x s_q matrix.
SdpaLayout SdpaRowStatsLayout(const SdpaKey& key);
// Scores and probabilities, [b, h_q, s_q, s_kv] packed (virtual: never in memory).
SdpaLayout SdpaScoreLayout(const SdpaKey& key);
// Their [b, h_q, s_kv, s_q] view (P^T, dS^T) for the dV and dK products.
SdpaLayout SdpaScoreTransposedLayout(const SdpaKey& key);
// The backward's f32 dQ accumulator, [b, h_q, s_q, d] packed.
SdpaLayout SdpaDqAccumLayout(const SdpaKey& key);
// dK and dV per query head before GQA's reduction over the group, [b, h_q, s_kv, d] packed.
SdpaLayout SdpaFullHeadKvGradLayout(const SdpaKey& key);
// A by-value scalar (the scale, -inf, 1).
SdpaLayout SdpaScalarLayout();

// Elements an [s, b] x (h d) operand spans with its row stride (as validate.h's extents).
std::int64_t SdpaQExtent(const SdpaKey& key);
std::int64_t SdpaKvExtent(const SdpaKey& key);

// Byte offsets of one call's scratch in a single device arena, each kScratchAlignment-aligned:
// cuDNN's workspace; the stats in cuDNN's layout (f32, both directions); the backward's
// softmax_sum and dQ accumulator (f32); with `accumulate`, dq, dk, dv (key.dtype, the extents of
// the real ones) that cuDNN writes before they are added in. Absent parts have size 0.
struct SdpaScratch {
  static constexpr std::size_t kScratchAlignment = 256;
  std::size_t workspace = 0;
  std::size_t stats = 0;
  std::size_t softmax_sum = 0;
  std::size_t dq_accum = 0;
  std::size_t dq = 0;
  std::size_t dk = 0;
  std::size_t dv = 0;
  std::size_t total_bytes = 0;
};
SdpaScratch PlanSdpaScratch(const SdpaKey& key, std::size_t workspace_bytes, bool accumulate);

// "fwd bf16 b2 hq8 hkv2 d64 sq128 skv128 qs1536 kvs256 causal": for notes and messages.
std::string SdpaKeyName(const SdpaKey& key);

}  // namespace autopar::device
