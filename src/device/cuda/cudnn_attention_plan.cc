#include "src/device/cuda/cudnn_attention_plan.h"

#include <climits>
#include <limits>
#include <string>

#include "src/device/validate.h"

namespace autopar::device {
namespace {

std::size_t AlignUp(std::size_t bytes) {
  constexpr std::size_t a = SdpaScratch::kScratchAlignment;
  return (bytes + a - 1) / a * a;
}

}  // namespace

StatusOr<AttentionEngine> ParseAttentionEngine(std::string_view text) {
  if (text.empty() || text == "auto") return AttentionEngine::kAuto;
  if (text == "kernel") return AttentionEngine::kKernel;
  if (text == "cudnn") return AttentionEngine::kCudnn;
  return Status::Error(
      Outcome::kInvalid,
      "AUTOPAR_ATTENTION is \"" + std::string(text) + "\"; expected auto, kernel or cudnn",
      __FILE__, __LINE__);
}

SdpaDecision DecideSdpa(const AttentionDesc& d, DType dtype, SdpaDirection direction,
                        bool pointers_aligned, bool accumulate, std::int64_t cudnn_version) {
  SdpaDecision out;
  auto no = [&out](std::string why) {
    out.reason = std::move(why);
    return out;
  };
  if (dtype != DType::kBF16 && dtype != DType::kF16) {
    return no(std::string("dtype ") + DTypeName(dtype) + " (cuDNN attention takes bf16 or f16)");
  }
  if (d.head_dim % kSdpaHeadDimMultiple != 0 || d.head_dim > kSdpaMaxHeadDim) {
    return no("head_dim " + std::to_string(d.head_dim) + " (cuDNN needs a multiple of " +
              std::to_string(kSdpaHeadDimMultiple) + " up to " + std::to_string(kSdpaMaxHeadDim) +
              ")");
  }
  if (d.seq_q == 1 && d.seq_kv == 1) return no("seq_q = seq_kv = 1 (refused by cuDNN's backward)");
  // 16-byte rows: a row stride in elements of a 2-byte type must keep every row aligned.
  const std::int64_t per_16_bytes =
      static_cast<std::int64_t>(kSdpaAlignmentBytes / DTypeSize(dtype));
  if (d.q_stride % per_16_bytes != 0 || d.kv_stride % per_16_bytes != 0) {
    return no("row strides " + std::to_string(d.q_stride) + "/" + std::to_string(d.kv_stride) +
              " break 16-byte alignment");
  }
  if (!pointers_aligned) return no("a tensor is not 16-byte aligned");
  // The stats transposes (cublasSgeam) take int dimensions.
  if (d.batch * d.heads_q > INT_MAX || d.seq_q > INT_MAX) {
    return no("batch * heads_q or seq_q beyond 32 bits");
  }
  if (accumulate && dtype != DType::kBF16) return no("accumulate is added in bf16 only");
  if (cudnn_version == 91000 || cudnn_version == 91001) {
    return no("cuDNN " + std::to_string(cudnn_version) +
              " (9.10.0/9.10.1: fused attention has known bugs; cudnn-frontend refuses them)");
  }
  if (direction == SdpaDirection::kBackward && cudnn_version != 0 && cudnn_version <= 91500 &&
      d.seq_kv % 128 != 0) {
    return no("backward with seq_kv " + std::to_string(d.seq_kv) +
              " not a multiple of 128 on cuDNN " + std::to_string(cudnn_version) +
              " (up to 9.15.0 cudnn-frontend adds a padding-mask workaround there)");
  }

  SdpaMask mask = SdpaMask::kNone;
  if (d.causal) {
    if (d.kv_offset == d.q_offset) {
      mask = SdpaMask::kCausalTopLeft;
    } else if (d.kv_offset + d.seq_kv - 1 <= d.q_offset) {
      mask = SdpaMask::kNone;  // every key precedes every query: all visible
    } else {
      return no("causal with partly overlapping positions (q at " + std::to_string(d.q_offset) +
                ", kv at " + std::to_string(d.kv_offset) + ")");
    }
  }
  out.use_cudnn = true;
  out.key = SdpaKey{direction, dtype,    d.batch,    d.heads_q,   d.heads_kv, d.head_dim,
                    d.seq_q,   d.seq_kv, d.q_stride, d.kv_stride, mask};
  return out;
}

float SdpaMaskFillValue(std::int64_t cudnn_version) {
  if (cudnn_version != 0 && cudnn_version < 91000) return std::numeric_limits<float>::lowest();
  return -std::numeric_limits<float>::infinity();
}

// Element (s, b, h, x) of an [s, b, h, d] tensor with row stride R sits at (s b_total + b) R +
// h d + x, so in [b, h, s, d] order the strides are {R, d, b_total R, 1}.
SdpaLayout SdpaQLayout(const SdpaKey& k) {
  return {{k.batch, k.heads_q, k.seq_q, k.head_dim},
          {k.q_stride, k.head_dim, k.batch * k.q_stride, 1}};
}

SdpaLayout SdpaKvLayout(const SdpaKey& k) {
  return {{k.batch, k.heads_kv, k.seq_kv, k.head_dim},
          {k.kv_stride, k.head_dim, k.batch * k.kv_stride, 1}};
}

SdpaLayout SdpaOLayout(const SdpaKey& k) {
  const std::int64_t row = k.heads_q * k.head_dim;
  return {{k.batch, k.heads_q, k.seq_q, k.head_dim}, {row, k.head_dim, k.batch * row, 1}};
}

SdpaLayout SdpaTransposed(const SdpaLayout& l) {
  return {{l.dims[0], l.dims[1], l.dims[3], l.dims[2]},
          {l.strides[0], l.strides[1], l.strides[3], l.strides[2]}};
}

SdpaLayout SdpaRowStatsLayout(const SdpaKey& k) {
  return {{k.batch, k.heads_q, k.seq_q, 1}, {k.heads_q * k.seq_q, k.seq_q, 1, 1}};
}

SdpaLayout SdpaScoreLayout(const SdpaKey& k) {
  return {{k.batch, k.heads_q, k.seq_q, k.seq_kv},
          {k.heads_q * k.seq_q * k.seq_kv, k.seq_q * k.seq_kv, k.seq_kv, 1}};
}

SdpaLayout SdpaScoreTransposedLayout(const SdpaKey& k) {
  return SdpaTransposed(SdpaScoreLayout(k));
}

SdpaLayout SdpaDqAccumLayout(const SdpaKey& k) {
  return {{k.batch, k.heads_q, k.seq_q, k.head_dim},
          {k.heads_q * k.seq_q * k.head_dim, k.seq_q * k.head_dim, k.head_dim, 1}};
}

SdpaLayout SdpaFullHeadKvGradLayout(const SdpaKey& k) {
  return {{k.batch, k.heads_q, k.seq_kv, k.head_dim},
          {k.heads_q * k.seq_kv * k.head_dim, k.seq_kv * k.head_dim, k.head_dim, 1}};
}

SdpaLayout SdpaScalarLayout() { return {{1, 1, 1, 1}, {1, 1, 1, 1}}; }

std::int64_t SdpaQExtent(const SdpaKey& k) {
  return MatrixExtent(k.seq_q * k.batch, k.heads_q * k.head_dim, k.q_stride);
}

std::int64_t SdpaKvExtent(const SdpaKey& k) {
  return MatrixExtent(k.seq_kv * k.batch, k.heads_kv * k.head_dim, k.kv_stride);
}

SdpaScratch PlanSdpaScratch(const SdpaKey& k, std::size_t workspace_bytes, bool accumulate) {
  SdpaScratch s;
  std::size_t at = 0;
  auto take = [&at](std::size_t bytes) {
    const std::size_t offset = at;
    at += AlignUp(bytes);
    return offset;
  };
  const auto rows = static_cast<std::size_t>(k.batch * k.heads_q * k.seq_q);
  s.workspace = take(workspace_bytes);
  s.stats = take(rows * sizeof(float));
  if (k.direction == SdpaDirection::kBackward) {
    s.softmax_sum = take(rows * sizeof(float));
    s.dq_accum = take(rows * static_cast<std::size_t>(k.head_dim) * sizeof(float));
    if (accumulate) {
      const std::size_t elem = DTypeSize(k.dtype);
      s.dq = take(static_cast<std::size_t>(SdpaQExtent(k)) * elem);
      s.dk = take(static_cast<std::size_t>(SdpaKvExtent(k)) * elem);
      s.dv = take(static_cast<std::size_t>(SdpaKvExtent(k)) * elem);
    }
  }
  s.total_bytes = at;
  return s;
}

std::string SdpaKeyName(const SdpaKey& k) {
  std::string name = k.direction == SdpaDirection::kForward ? "fwd " : "bwd ";
  name += DTypeName(k.dtype);
  name += " b" + std::to_string(k.batch) + " hq" + std::to_string(k.heads_q) + " hkv" +
          std::to_string(k.heads_kv) + " d" + std::to_string(k.head_dim) + " sq" +
          std::to_string(k.seq_q) + " skv" + std::to_string(k.seq_kv) + " qs" +
          std::to_string(k.q_stride) + " kvs" + std::to_string(k.kv_stride);
  name += k.mask == SdpaMask::kCausalTopLeft ? " causal" : " full";
  return name;
}

}  // namespace autopar::device
