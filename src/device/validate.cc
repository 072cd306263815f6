#include "src/device/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace autopar::device {

Status CheckArgs(const char* op, std::initializer_list<ArgSpec> args) {
  for (const ArgSpec& arg : args) {
    const std::string where = std::string(op) + ": `" + arg.name + "` ";
    AUTOPAR_CHECK_ARG(arg.tensor.valid(), where + "is an invalid view (out-of-range slice?)");
    AUTOPAR_CHECK_ARG(arg.tensor.dtype == arg.dtype, where + "is " + DTypeName(arg.tensor.dtype) +
                                                         ", expected " + DTypeName(arg.dtype));
    AUTOPAR_CHECK_ARG(arg.tensor.numel >= arg.min_numel,
                      where + "has " + std::to_string(arg.tensor.numel) + " elements, needs " +
                          std::to_string(arg.min_numel));
  }
  return OkStatus();
}

Status CheckDropout(const char* op, const DropoutDesc& d) {
  AUTOPAR_CHECK_ARG(d.p >= 0.0f && d.p < 1.0f, std::string(op) + ": dropout probability " +
                                                   std::to_string(d.p) + " is outside [0, 1)");
  return OkStatus();
}

Status CheckPositive(const char* op, std::initializer_list<std::int64_t> dims) {
  int position = 0;
  for (std::int64_t dim : dims) {
    AUTOPAR_CHECK_ARG(dim > 0, std::string(op) + ": dimension #" + std::to_string(position) +
                                   " is " + std::to_string(dim));
    ++position;
  }
  return OkStatus();
}

std::int64_t MatrixExtent(std::int64_t rows, std::int64_t cols, std::int64_t ld) {
  return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols;
}

StatusOr<GemmDesc> ResolveGemm(const GemmDesc& desc, const Tensor& a, const Tensor& b,
                               const Tensor& c, DType ab_dtype) {
  GemmDesc d = desc;
  AUTOPAR_CHECK_ARG(d.m >= 0 && d.n >= 0 && d.k >= 0 && d.batch >= 1, "Gemm: bad m, n, k or batch");
  // Stored shapes: A [a_rows, a_cols], B [b_rows, b_cols], C [m, n].
  const std::int64_t a_rows = d.trans_a ? d.k : d.m;
  const std::int64_t a_cols = d.trans_a ? d.m : d.k;
  const std::int64_t b_rows = d.trans_b ? d.n : d.k;
  const std::int64_t b_cols = d.trans_b ? d.k : d.n;
  // BLAS wants ld >= max(1, cols) even for empty matrices.
  if (d.lda == 0) d.lda = a_cols > 0 ? a_cols : 1;
  if (d.ldb == 0) d.ldb = b_cols > 0 ? b_cols : 1;
  if (d.ldc == 0) d.ldc = d.n > 0 ? d.n : 1;
  AUTOPAR_CHECK_ARG(d.lda >= a_cols && d.ldb >= b_cols && d.ldc >= d.n,
                    "Gemm: a leading dimension is smaller than its row");
  if (d.stride_a == 0) d.stride_a = a_rows * d.lda;
  if (d.stride_b == 0) d.stride_b = b_rows * d.ldb;
  if (d.stride_c == 0) d.stride_c = d.m * d.ldc;
  AUTOPAR_CHECK_ARG(d.stride_a > 0 && d.stride_b > 0 && d.stride_c > 0,
                    "Gemm: batch strides must be positive");
  const std::int64_t last = d.batch - 1;
  const std::int64_t need_a = MatrixExtent(a_rows, a_cols, d.lda) + last * d.stride_a;
  const std::int64_t need_b = MatrixExtent(b_rows, b_cols, d.ldb) + last * d.stride_b;
  const std::int64_t need_c = MatrixExtent(d.m, d.n, d.ldc) + last * d.stride_c;
  const bool c_f32 = c.dtype == DType::kF32;
  AUTOPAR_RETURN_IF_ERROR(CheckArgs("Gemm", {{"a", a, ab_dtype, need_a},
                                             {"b", b, ab_dtype, need_b},
                                             {"c", c, c_f32 ? DType::kF32 : ab_dtype, need_c}}));
  return d;
}

StatusOr<AttentionDesc> ResolveAttention(const AttentionDesc& desc) {
  AttentionDesc d = desc;
  AUTOPAR_RETURN_IF_ERROR(
      CheckPositive("Attention", {d.batch, d.heads_q, d.heads_kv, d.head_dim, d.seq_q, d.seq_kv}));
  AUTOPAR_CHECK_ARG(d.heads_q % d.heads_kv == 0, "Attention: heads_q " + std::to_string(d.heads_q) +
                                                     " is not a multiple of heads_kv " +
                                                     std::to_string(d.heads_kv));
  if (d.scale == 0.0f)
    d.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d.head_dim)));
  if (d.q_stride == 0) d.q_stride = d.heads_q * d.head_dim;
  if (d.kv_stride == 0) d.kv_stride = d.heads_kv * d.head_dim;
  AUTOPAR_CHECK_ARG(d.q_stride >= d.heads_q * d.head_dim,
                    "Attention: q_stride < heads_q * head_dim");
  AUTOPAR_CHECK_ARG(d.kv_stride >= d.heads_kv * d.head_dim,
                    "Attention: kv_stride < heads_kv * head_dim");
  return d;
}

std::int64_t AttentionQExtent(const AttentionDesc& d) {
  return MatrixExtent(d.seq_q * d.batch, d.heads_q * d.head_dim, d.q_stride);
}

std::int64_t AttentionKvExtent(const AttentionDesc& d) {
  return MatrixExtent(d.seq_kv * d.batch, d.heads_kv * d.head_dim, d.kv_stride);
}

StatusOr<RopeDesc> ResolveRope(const RopeDesc& desc) {
  RopeDesc d = desc;
  AUTOPAR_RETURN_IF_ERROR(CheckPositive("Rope", {d.seq, d.batch, d.heads, d.head_dim}));
  if (d.rotary_dim == 0) d.rotary_dim = d.head_dim;
  if (d.row_stride == 0) d.row_stride = d.heads * d.head_dim;
  AUTOPAR_CHECK_ARG(d.rotary_dim > 0 && d.rotary_dim % 2 == 0 && d.rotary_dim <= d.head_dim,
                    "Rope: rotary_dim must be even and within head_dim");
  AUTOPAR_CHECK_ARG(d.row_stride >= d.heads * d.head_dim, "Rope: row_stride < heads * head_dim");
  AUTOPAR_CHECK_ARG(d.base > 0.0f, "Rope: base must be positive");
  return d;
}

namespace {

StatusOr<NormDesc> ResolveNorm(const char* op, const NormDesc& desc) {
  NormDesc d = desc;
  AUTOPAR_RETURN_IF_ERROR(CheckPositive(op, {d.rows, d.hidden}));
  AUTOPAR_CHECK_ARG(d.vectors >= 1, std::string(op) + ": vectors is " + std::to_string(d.vectors) +
                                        ", must be at least 1");
  const std::int64_t width = d.vectors * d.hidden;
  auto narrow = [&](const char* name, std::int64_t stride) {
    return std::string(op) + ": " + name + " " + std::to_string(stride) + " < vectors * hidden " +
           std::to_string(width);
  };
  if (d.x_stride == 0) d.x_stride = width;
  if (d.y_stride == 0) d.y_stride = width;
  AUTOPAR_CHECK_ARG(d.x_stride >= width, narrow("x_stride", d.x_stride));
  AUTOPAR_CHECK_ARG(d.y_stride >= width, narrow("y_stride", d.y_stride));
  return d;
}

// What a norm (resolved desc) touches of an operand whose rows are `stride` apart, and of its
// per-vector statistics.
std::int64_t NormExtent(const NormDesc& d, std::int64_t stride) {
  return MatrixExtent(d.rows, d.vectors * d.hidden, stride);
}
std::int64_t NormStats(const NormDesc& d) { return d.rows * d.vectors; }

Status CheckNormForwardViews(const char* op, const Tensor& x, const Tensor& y) {
  AUTOPAR_CHECK_ARG(!Overlaps(x, y), std::string(op) + ": y overlaps x (y may not alias x)");
  return OkStatus();
}

Status CheckNormBackwardViews(const char* op, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  AUTOPAR_CHECK_ARG(!Overlaps(dx, x), std::string(op) + ": dx overlaps x (x is read throughout)");
  AUTOPAR_CHECK_ARG(
      !Overlaps(dx, dy) || (dx.data == dy.data && dx.numel == dy.numel),
      std::string(op) + ": dx overlaps dy without being the same view (in place means dx = dy)");
  return OkStatus();
}

}  // namespace

StatusOr<NormDesc> CheckRmsNormForward(const NormDesc& desc, DType data, const Tensor& x,
                                       const Tensor& gamma, const Tensor& y, const Tensor& rstd) {
  const char* op = "RmsNormForward";
  AUTOPAR_ASSIGN_OR_RETURN(const NormDesc d, ResolveNorm(op, desc));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs(op, {{"x", x, data, NormExtent(d, d.x_stride)},
                                         {"gamma", gamma, data, d.hidden},
                                         {"y", y, data, NormExtent(d, d.y_stride)},
                                         {"rstd", rstd, DType::kF32, NormStats(d)}}));
  AUTOPAR_RETURN_IF_ERROR(CheckNormForwardViews(op, x, y));
  return d;
}

StatusOr<NormDesc> CheckRmsNormBackward(const NormDesc& desc, DType data, const Tensor& dy,
                                        const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                                        const Tensor& dx, const Tensor& dgamma) {
  const char* op = "RmsNormBackward";
  AUTOPAR_ASSIGN_OR_RETURN(const NormDesc d, ResolveNorm(op, desc));
  const std::int64_t ny = NormExtent(d, d.y_stride);
  AUTOPAR_RETURN_IF_ERROR(CheckArgs(op, {{"dy", dy, data, ny},
                                         {"x", x, data, NormExtent(d, d.x_stride)},
                                         {"gamma", gamma, data, d.hidden},
                                         {"rstd", rstd, DType::kF32, NormStats(d)},
                                         {"dx", dx, data, ny},
                                         {"dgamma", dgamma, DType::kF32, d.hidden}}));
  AUTOPAR_RETURN_IF_ERROR(CheckNormBackwardViews(op, x, dy, dx));
  return d;
}

StatusOr<NormDesc> CheckLayerNormForward(const NormDesc& desc, DType data, const Tensor& x,
                                         const Tensor& gamma, const Tensor& beta, const Tensor& y,
                                         const Tensor& mean, const Tensor& rstd) {
  const char* op = "LayerNormForward";
  AUTOPAR_ASSIGN_OR_RETURN(const NormDesc d, ResolveNorm(op, desc));
  AUTOPAR_RETURN_IF_ERROR(CheckArgs(op, {{"x", x, data, NormExtent(d, d.x_stride)},
                                         {"gamma", gamma, data, d.hidden},
                                         {"beta", beta, data, d.hidden},
                                         {"y", y, data, NormExtent(d, d.y_stride)},
                                         {"mean", mean, DType::kF32, NormStats(d)},
                                         {"rstd", rstd, DType::kF32, NormStats(d)}}));
  AUTOPAR_RETURN_IF_ERROR(CheckNormForwardViews(op, x, y));
  return d;
}

StatusOr<NormDesc> CheckLayerNormBackward(const NormDesc& desc, DType data, const Tensor& dy,
                                          const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                          const Tensor& rstd, const Tensor& dx,
                                          const Tensor& dgamma, const Tensor& dbeta) {
  const char* op = "LayerNormBackward";
  AUTOPAR_ASSIGN_OR_RETURN(const NormDesc d, ResolveNorm(op, desc));
  const std::int64_t ny = NormExtent(d, d.y_stride);
  AUTOPAR_RETURN_IF_ERROR(CheckArgs(op, {{"dy", dy, data, ny},
                                         {"x", x, data, NormExtent(d, d.x_stride)},
                                         {"gamma", gamma, data, d.hidden},
                                         {"mean", mean, DType::kF32, NormStats(d)},
                                         {"rstd", rstd, DType::kF32, NormStats(d)},
                                         {"dx", dx, data, ny},
                                         {"dgamma", dgamma, DType::kF32, d.hidden},
                                         {"dbeta", dbeta, DType::kF32, d.hidden}}));
  AUTOPAR_RETURN_IF_ERROR(CheckNormBackwardViews(op, x, dy, dx));
  return d;
}

namespace {

// Floor and ceiling of n / d for d > 0.
std::int64_t FloorDiv(std::int64_t n, std::int64_t d) {
  return n >= 0 ? n / d : -((-n + d - 1) / d);
}
std::int64_t CeilDiv(std::int64_t n, std::int64_t d) { return -FloorDiv(-n, d); }

// True when a row of one block of `rows` rows of `width` bytes, `a_pitch` bytes apart from a,
// shares a byte with a row of the other (`b_pitch` apart from b). Both pitches are at least width.
// O(rows): the caller first rules out the usual case, views that do not overlap at all.
bool RowBlocksOverlap(const void* a, std::int64_t a_pitch, const void* b, std::int64_t b_pitch,
                      std::int64_t rows, std::int64_t width) {
  if (width == 0) return false;
  const auto a0 = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(a));
  const auto b0 = static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(b));
  // Row i of a, [off, off + width) from b, meets row j of b when off - width < j * b_pitch <
  // off + width.
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t off = a0 + i * a_pitch - b0;
    const std::int64_t first = std::max<std::int64_t>(FloorDiv(off - width, b_pitch) + 1, 0);
    const std::int64_t last = std::min<std::int64_t>(CeilDiv(off + width, b_pitch) - 1, rows - 1);
    if (first <= last) return true;
  }
  return false;
}

}  // namespace

Status CheckCopyRows(const Tensor& dst, std::int64_t dst_stride, const Tensor& src,
                     std::int64_t src_stride, std::int64_t rows, std::int64_t cols) {
  AUTOPAR_CHECK_ARG(rows >= 0 && cols >= 0, "CopyRows: negative rows or cols (" +
                                                std::to_string(rows) + ", " + std::to_string(cols) +
                                                ")");
  AUTOPAR_CHECK_ARG(dst_stride >= cols, "CopyRows: dst_stride " + std::to_string(dst_stride) +
                                            " < cols " + std::to_string(cols));
  AUTOPAR_CHECK_ARG(src_stride >= cols, "CopyRows: src_stride " + std::to_string(src_stride) +
                                            " < cols " + std::to_string(cols));
  AUTOPAR_CHECK_ARG(
      dst.dtype == src.dtype,
      std::string("CopyRows: dst is ") + DTypeName(dst.dtype) + ", src " + DTypeName(src.dtype));
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("CopyRows", {{"dst", dst, src.dtype, MatrixExtent(rows, cols, dst_stride)},
                             {"src", src, src.dtype, MatrixExtent(rows, cols, src_stride)}}));
  const auto size = static_cast<std::int64_t>(DTypeSize(src.dtype));
  AUTOPAR_CHECK_ARG(!Overlaps(dst, src) || !RowBlocksOverlap(dst.data, dst_stride * size, src.data,
                                                             src_stride * size, rows, cols * size),
                    "CopyRows: source and destination blocks overlap");
  return OkStatus();
}

bool Overlaps(const Tensor& a, const Tensor& b) {
  const char* pa = static_cast<const char*>(a.data);
  const char* pb = static_cast<const char*>(b.data);
  return a.numel > 0 && b.numel > 0 && pa < pb + b.bytes() && pb < pa + a.bytes();
}

Status CheckView(const char* op, const Tensor& t, std::int64_t max_count) {
  AUTOPAR_CHECK_ARG(t.valid(), std::string(op) + ": invalid view");
  AUTOPAR_CHECK_ARG(t.numel <= max_count,
                    std::string(op) + ": more than " + std::to_string(max_count) + " elements");
  return OkStatus();
}

Status CheckPair(const char* op, const Tensor& send, const Tensor& recv, std::int64_t num,
                 std::int64_t den, std::int64_t max_count) {
  AUTOPAR_RETURN_IF_ERROR(CheckView(op, send, max_count));
  AUTOPAR_RETURN_IF_ERROR(CheckView(op, recv, max_count));
  AUTOPAR_CHECK_ARG(send.dtype == recv.dtype, std::string(op) + ": send and recv dtypes differ");
  AUTOPAR_CHECK_ARG(send.numel * num == recv.numel * den,
                    std::string(op) + ": send has " + std::to_string(send.numel) +
                        " elements, recv " + std::to_string(recv.numel));
  return OkStatus();
}

StatusOr<HashFill> ResolveHashFill(const HashFill& fill, std::int64_t numel) {
  HashFill f = fill;
  if (fill.rows == 0) {
    f.rows = 1;
    f.cols = f.global_cols = numel;
  }
  AUTOPAR_CHECK_ARG(f.rows > 0 && f.cols >= 0 && f.rows * f.cols <= numel,
                    "FillHash: rows * cols exceeds the view");
  AUTOPAR_CHECK_ARG(
      f.row_offset >= 0 && f.col_offset >= 0 && f.col_offset + f.cols <= f.global_cols,
      "FillHash: the block lies outside the global matrix");
  return f;
}

Status CheckPeer(const char* op, int peer, int group_size) {
  AUTOPAR_CHECK_ARG(peer >= 0 && peer < group_size, std::string(op) + ": peer " +
                                                        std::to_string(peer) + " not in group of " +
                                                        std::to_string(group_size));
  return OkStatus();
}

Status CheckBatch(std::span<const P2POp> ops, int group_size, std::int64_t max_count) {
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const P2POp& op = ops[i];
    const char* name = op.kind == P2POp::kSend ? "IBatchSendRecv send" : "IBatchSendRecv recv";
    AUTOPAR_RETURN_IF_ERROR(CheckView(name, op.buf, max_count));
    AUTOPAR_RETURN_IF_ERROR(CheckPeer(name, op.peer, group_size));
    for (std::size_t j = 0; j < i; ++j) {
      const bool writes = op.kind == P2POp::kRecv || ops[j].kind == P2POp::kRecv;
      AUTOPAR_CHECK_ARG(!writes || !Overlaps(op.buf, ops[j].buf),
                        "IBatchSendRecv: a received view overlaps another view of the batch");
    }
  }
  return OkStatus();
}

}  // namespace autopar::device
