// Shapes and parameters of the device ops, one descriptor per op family.
//
// Layout conventions shared by all ops (Megatron-core's):
//  * Activations are row-major [tokens, features]; a token row is (s, b) with s slowest, i.e.
//    sequence tensors are [seq, batch, ...] ("sbhd"), so that sequence-parallel and context-
//    parallel shards are contiguous slices along the leading dimension.
//  * Attention inputs are [seq, batch, heads, head_dim]; head h of the queries reads key/value head
//    h / (heads_q / heads_kv) (grouped-query attention with contiguous groups).
//  * Parameter gradients (dgamma, dbeta, embedding table) are ACCUMULATED (+=) so micro-batches sum
//    without extra adds, as into Megatron's main_grad; activation gradients are overwritten.
//  * Statistics saved for backward (rstd, mean, lse, cross-entropy pieces) are always fp32.
#pragma once

#include <cstdint>

namespace autopar::device {

// Row-major C = alpha * op(A) * op(B) + beta * C, with op(A) [m, k], op(B) [k, n], C [m, n].
// A is stored [m, k] (or [k, m] when trans_a), B [k, n] (or [n, k] when trans_b). Leading
// dimensions are row strides in elements; 0 means packed. With batch > 1 the matrices of item i
// start at i * stride_*; a stride of 0 means packed (rows * ld). When beta == 0, C is not read, so
// it may hold garbage (even NaN).
//
// fp8_a / fp8_b ask for an FP8 GEMM, on devices whose SupportsFp8() is true (the CUDA device
// answers kInvalid without fp8 tensor cores; callers check SupportsFp8 first): both operands are
// quantized to their format with a per-tensor scale from their own amax (current scaling, see
// kernels/fp8_scale.h), multiplied with fp32 accumulation and written to C in its dtype. Both must
// be set, not both kE5M2 (no e5m2 x e5m2 kernel exists), with batch 1 and m, n, k multiples of 16.
enum class Fp8Operand : std::uint8_t { kNone, kE4M3, kE5M2 };
struct GemmDesc {
  bool trans_a = false;
  bool trans_b = false;
  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  std::int64_t lda = 0;
  std::int64_t ldb = 0;
  std::int64_t ldc = 0;
  std::int64_t batch = 1;
  std::int64_t stride_a = 0;
  std::int64_t stride_b = 0;
  std::int64_t stride_c = 0;
  Fp8Operand fp8_a = Fp8Operand::kNone;
  Fp8Operand fp8_b = Fp8Operand::kNone;
  // FP8 only: accumulate in cuBLASLt's fast mode (CUBLASLT_MATMUL_DESC_FAST_ACCUM = 1, no periodic
  // promotion to fp32), as TransformerEngine runs a linear layer's forward GEMM
  // (_2X_ACC_FPROP = False); its gradient GEMMs keep split accumulation (_2X_ACC_DGRAD/WGRAD).
  bool fp8_fast_accumulate = false;
  // FP8 only: b is a weight, unchanged until Device::WeightsChanged, so the device may quantize
  // it once and reuse the copy (and its scale) for every GEMM of the step that reads it the same
  // way, as Transformer Engine does across the micro-batches of a step (Megatron-core passes
  // is_first_microbatch to its linear layers: the weight's FP8 copy and, on Hopper, its
  // transposed copy are made by the first micro-batch and cached).
  bool fp8_b_is_weight = false;
};

// RMSNorm and LayerNorm over vectors of `hidden` elements: rows × vectors of them, the statistics
// (mean, rstd) of vector v of row r at index r * vectors + v, gamma and beta [hidden] shared by
// all. Element i of that vector lies at r * stride + v * hidden + i, with x_stride for x and
// y_stride for y, dy and dx (0: packed, vectors * hidden). The defaults are the plain norm of
// x [rows, hidden]. Megatron's qk-layernorm is vectors = heads, hidden = head_dim: the output, its
// gradient and the input's gradient live in the fused QKV buffer (y_stride its row), while x is a
// saved copy of the pre-norm values. dx may be dy itself (in place, the same view); y may share
// no element with x, nor dx with x (the devices refuse them).
struct NormDesc {
  std::int64_t rows = 0;
  std::int64_t hidden = 0;
  float eps = 1e-5f;
  std::int64_t vectors = 1;
  std::int64_t x_stride = 0;
  std::int64_t y_stride = 0;
};

// Rotary position embedding (rotate-half form, as Megatron's default) on x [seq, batch, heads,
// head_dim]. The first rotary_dim features of a head rotate as pairs (i, i + rotary_dim / 2) by
// angle position * base^(-2i / rotary_dim); the rest pass through. Token (s, b) has position
// position_offset + s, so a context-parallel chunk passes its global start. row_stride is the
// distance in elements between consecutive (s, b) rows (0: heads * head_dim), so q and k can be
// rotated in place inside a fused QKV buffer.
struct RopeDesc {
  std::int64_t seq = 0;
  std::int64_t batch = 0;
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t rotary_dim = 0;  // 0: head_dim; must be even
  std::int64_t position_offset = 0;
  std::int64_t row_stride = 0;
  float base = 10000.0f;
};

// Scaled-dot-product attention of a query chunk against a key/value chunk.
//   q, dq [seq_q, batch, heads_q, head_dim] with row stride q_stride (0: heads_q * head_dim);
//   k, v, dk, dv [seq_kv, batch, heads_kv, head_dim] with row stride kv_stride (0: packed);
//   out, dout [seq_q, batch, heads_q, head_dim] packed; lse [seq_q, batch, heads_q] fp32.
// With `causal`, key j is visible to query i iff kv_offset + j <= q_offset + i,
// so a context-parallel ring computes any chunk pair from global positions. A query that sees no
// key gets out = 0 and lse = -inf, which AttentionMerge treats as an empty part.
struct AttentionDesc {
  std::int64_t batch = 0;
  std::int64_t heads_q = 0;
  std::int64_t heads_kv = 0;
  std::int64_t head_dim = 0;
  std::int64_t seq_q = 0;
  std::int64_t seq_kv = 0;
  bool causal = true;
  std::int64_t q_offset = 0;
  std::int64_t kv_offset = 0;
  float scale = 0.0f;  // 0: 1 / sqrt(head_dim)
  std::int64_t q_stride = 0;
  std::int64_t kv_stride = 0;
};

// Softmax cross-entropy of logits [rows, vocab_shard] whose columns are the global vocabulary
// entries [vocab_start, vocab_start + vocab_shard). Targets are global ids (i32, >= 0). The loss is
// computed from per-row pieces that combine across vocabulary shards (Megatron's vocab-parallel
// cross-entropy):
//   1. CrossEntropyMax -> row_max[rows];            all-reduce MAX over the shards;
//   2. CrossEntropyPartials -> partials[2 * rows]:  [0, rows) sum_j exp(logit_j - row_max),
//      [rows, 2 rows) the target's logit (0 on shards without it); all-reduce SUM;
//   3. CrossEntropyLoss -> loss[rows] = row_max + log(sum_exp) - target_logit;
//   4. CrossEntropyBackward -> dlogits = dloss * (softmax - onehot), may overwrite logits.
struct CrossEntropyDesc {
  std::int64_t rows = 0;
  std::int64_t vocab_shard = 0;
  std::int64_t vocab_start = 0;
};

// Vocabulary-parallel embedding: table [vocab_shard, hidden] holds global ids [vocab_start,
// vocab_start + vocab_shard); ids (i32) outside the shard produce zero rows, so an all-reduce over
// the shards gives the full lookup.
struct EmbeddingDesc {
  std::int64_t tokens = 0;
  std::int64_t hidden = 0;
  std::int64_t vocab_shard = 0;
  std::int64_t vocab_start = 0;
};

// AdamW (Loshchilov & Hutter 2019, decoupled weight decay, torch.optim.AdamW semantics) on fp32
// master weights: g = grad * grad_scale; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr * (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps) + weight_decay * p).
struct AdamParams {
  float lr = 1e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;
  std::int64_t step = 1;  // 1-based, for bias correction
};

// Deterministic fill: element (r, c) of a [rows, cols] view gets
//   scale * HashUniform(seed, (row_offset + r) * global_cols + col_offset + c)
// with HashUniform in [-1, 1) (kernels/init.h). A shard of a weight filled with its offsets equals
// the same slice of the unsharded weight, bit for bit, on every device. rows = 0 means one row of
// numel columns with global_cols = numel.
struct HashFill {
  std::uint64_t seed = 0;
  float scale = 1.0f;
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t global_cols = 0;
  std::int64_t row_offset = 0;
  std::int64_t col_offset = 0;
};

// Hidden dropout (Megatron's bias-dropout-add, no bias): element i is kept with probability 1 − p,
// drawn by kernels::ref::DropoutKeeps(seed, i, DropoutThreshold(p)), and scaled by 1/(1 − p).
struct DropoutDesc {
  float p = 0;
  std::uint64_t seed = 0;
};

}  // namespace autopar::device
