// Argument checks shared by every device's ops (internal to src/device).
//
// Ops take raw views and separate shapes, so each op states which views it reads or writes, in
// which dtype, and how many elements it touches; a device calls these before launching anything,
// and a mismatch comes back as kInvalid naming the op and the argument.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>

#include "autopar/device/collectives.h"
#include "autopar/device/ops.h"
#include "autopar/device/status.h"
#include "autopar/device/tensor.h"

namespace autopar::device {

struct ArgSpec {
  const char* name;
  const Tensor& tensor;
  DType dtype;
  std::int64_t min_numel;  // elements the op touches
};

// kInvalid unless every view is valid, of its dtype, and holds at least min_numel elements.
Status CheckArgs(const char* op, std::initializer_list<ArgSpec> args);

// True when two non-empty views share a byte.
bool Overlaps(const Tensor& a, const Tensor& b);

// Collectives: kInvalid unless the view is valid and holds at most `max_count` elements (the
// largest count the library's calls take).
Status CheckView(const char* op, const Tensor& t, std::int64_t max_count);
// ... both views pass CheckView, share a dtype, and recv holds num/den times send's elements.
Status CheckPair(const char* op, const Tensor& send, const Tensor& recv, std::int64_t num,
                 std::int64_t den, std::int64_t max_count);

// kInvalid unless `peer` is a rank of a group of `group_size`; the message names `op`.
Status CheckPeer(const char* op, int peer, int group_size);

// A batch of sends and receives (IBatchSendRecv): every view passes CheckView, every peer is in
// [0, group_size), and no received view overlaps another view of the batch.
Status CheckBatch(std::span<const P2POp> ops, int group_size, std::int64_t max_count);

// A HashFill with the block resolved against a view of `numel` elements (rows = 0: the whole view
// as one row) and checked to lie inside both the view and the global matrix.
StatusOr<HashFill> ResolveHashFill(const HashFill& fill, std::int64_t numel);

// kInvalid unless the dropout probability is in [0, 1).
Status CheckDropout(const char* op, const DropoutDesc& d);

// kInvalid unless all dimensions are positive.
Status CheckPositive(const char* op, std::initializer_list<std::int64_t> dims);

// Elements a row-major [rows, cols] matrix with row stride ld touches.
std::int64_t MatrixExtent(std::int64_t rows, std::int64_t cols, std::int64_t ld);

// A GemmDesc with leading dimensions and batch strides resolved, checked against the views.
StatusOr<GemmDesc> ResolveGemm(const GemmDesc& desc, const Tensor& a, const Tensor& b,
                               const Tensor& c, DType ab_dtype);

// An AttentionDesc with scale and strides resolved and the shape checked (GQA divisibility).
StatusOr<AttentionDesc> ResolveAttention(const AttentionDesc& desc);

// Elements of q (or k/v) an attention call touches with the resolved strides.
std::int64_t AttentionQExtent(const AttentionDesc& d);
std::int64_t AttentionKvExtent(const AttentionDesc& d);

// A RopeDesc with rotary_dim and row_stride resolved and checked.
StatusOr<RopeDesc> ResolveRope(const RopeDesc& desc);

// The checks of the four norm ops, one contract for every device: the NormDesc resolved (x_stride
// and y_stride: 0 means packed, vectors * hidden; rows, hidden and vectors positive, each stride at
// least vectors * hidden); every view valid, of its dtype (`data` for x, y, dy, dx, gamma and beta;
// f32 for the statistics mean and rstd and for dgamma and dbeta) and holding what the op touches
// (x and y with their strides, dy and dx with y's); and the aliasing the ops allow: in forward y
// shares no element with x, in backward dx shares none with x and is either dy itself (the same
// view, in place) or apart from it. Messages name the op and the argument. Returns the resolved
// desc.
StatusOr<NormDesc> CheckRmsNormForward(const NormDesc& desc, DType data, const Tensor& x,
                                       const Tensor& gamma, const Tensor& y, const Tensor& rstd);
StatusOr<NormDesc> CheckRmsNormBackward(const NormDesc& desc, DType data, const Tensor& dy,
                                        const Tensor& x, const Tensor& gamma, const Tensor& rstd,
                                        const Tensor& dx, const Tensor& dgamma);
StatusOr<NormDesc> CheckLayerNormForward(const NormDesc& desc, DType data, const Tensor& x,
                                         const Tensor& gamma, const Tensor& beta, const Tensor& y,
                                         const Tensor& mean, const Tensor& rstd);
StatusOr<NormDesc> CheckLayerNormBackward(const NormDesc& desc, DType data, const Tensor& dy,
                                          const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                          const Tensor& rstd, const Tensor& dx,
                                          const Tensor& dgamma, const Tensor& dbeta);

// Device::CopyRows's arguments: valid views of one dtype, rows and cols not negative, strides at
// least cols, both blocks inside their views and sharing no byte.
Status CheckCopyRows(const Tensor& dst, std::int64_t dst_stride, const Tensor& src,
                     std::int64_t src_stride, std::int64_t rows, std::int64_t cols);

}  // namespace autopar::device
