// Flash-style attention backward (FlashAttention-2, Dao 2023) from the FINAL out and lse.
//
// Two kernels, so that no gradient needs atomics or an fp32 workspace:
//  * the key kernel owns one key/value tile of one (batch, kv head) and visits every query tile
//    of every query head of its group, accumulating dK and dV in shared memory;
//  * the query kernel owns one query tile of one (batch, head) and visits every visible key tile,
//    accumulating dQ.
// Each recomputes the probabilities P = exp(scale q.k - lse) and dS = P * (dout.v - delta) * scale
// for its tiles, with delta_i = dout_i . out_i (the softmax backward's row term, recomputed per
// tile from out rather than stored). The price is computing P and dP twice; the gain is plain
// overwrite-or-add stores of dq, dk, dv in their storage type, touching only their head slots,
// which is what `accumulate` (a context-parallel ring's chunk pairs) and fused QKV buffers need.
#include "kernels/cuda_attention.cuh"

namespace AUTOPAR_CUDA_KERNELS_NS {
namespace {

// lse and delta of the query rows [i0, i0 + bq) of head h: a warp per row. dout rows are in
// do_s already; out is read from global memory once.
template <typename T>
__device__ void LoadRowStats(const AttentionArgs& a, const AttentionTilePlan& plan, const T* out,
                             const float* lse, const float* do_s, std::int64_t b, std::int64_t h,
                             std::int64_t i0, float* lse_s, float* delta_s) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int warps = static_cast<int>(blockDim.x) / kWarpSize;
  for (int r = warp; r < plan.block_q; r += warps) {
    const std::int64_t i = i0 + r;
    const std::int64_t row = (i * a.batch + b) * a.heads_q + h;
    float dot = 0.0f;
    if (i < a.seq_q) {
      for (int d = lane; d < plan.head_dim; d += kWarpSize) {
        dot += do_s[r * plan.row_stride + d] * ToFloat(out[row * plan.head_dim + d]);
      }
    }
    dot = WarpSum(dot);
    if (lane == 0) {
      delta_s[r] = dot;
      lse_s[r] = i < a.seq_q ? lse[row] : -INFINITY;
    }
  }
}

// P (optional) and dS of the tile pair, [bq, bk] row-major. Rows that saw no key in the forward
// (lse = -inf) and masked pairs get zeros, so no gradient flows through them.
__device__ __forceinline__ void ProbabilityGrads(const AttentionArgs& a,
                                                 const AttentionTilePlan& plan, std::int64_t i0,
                                                 std::int64_t j0, const float* q_s,
                                                 const float* do_s, const float* k_s,
                                                 const float* v_s, const float* lse_s,
                                                 const float* delta_s, float* p_s, float* ds_s) {
  const int bq = plan.block_q;
  const int bk = plan.block_kv;
  const int st = plan.row_stride;
  for (int e = static_cast<int>(threadIdx.x); e < bq * bk; e += static_cast<int>(blockDim.x)) {
    const int r = e / bk;
    const int c = e % bk;
    const float row_lse = lse_s[r];
    float p = 0.0f;
    float ds = 0.0f;
    if (row_lse != -INFINITY && Visible(a, i0 + r, j0 + c)) {
      float dot = 0.0f;
      float dp = 0.0f;
      for (int d = 0; d < plan.head_dim; ++d) {
        dot += q_s[r * st + d] * k_s[c * st + d];
        dp += do_s[r * st + d] * v_s[c * st + d];
      }
      p = expf(dot * a.scale - row_lse);
      ds = p * (dp - delta_s[r]) * a.scale;
    }
    if (p_s != nullptr) p_s[e] = p;
    ds_s[e] = ds;
  }
}

template <typename T>
__device__ __forceinline__ void StoreGrad(T* dst, float value, bool accumulate) {
  *dst = FromFloat<T>(accumulate ? ToFloat(*dst) + value : value);
}

template <typename T>
__global__ void __launch_bounds__(kAttentionThreads)
    AttentionBackwardKvKernel(AttentionArgs a, AttentionTilePlan plan, const T* q, const T* k,
                              const T* v, const T* out, const T* dout, const float* lse, T* dk,
                              T* dv, bool accumulate) {
  float* smem = DynamicShared();
  const int bq = plan.block_q;
  const int bk = plan.block_kv;
  const int dim = plan.head_dim;
  const int st = plan.row_stride;
  float* k_s = smem;
  float* v_s = k_s + plan.Tile(bk);
  float* q_s = v_s + plan.Tile(bk);
  float* do_s = q_s + plan.Tile(bq);
  float* dk_s = do_s + plan.Tile(bq);
  float* dv_s = dk_s + plan.Packed(bk);
  float* p_s = dv_s + plan.Packed(bk);
  float* ds_s = p_s + bq * bk;
  float* lse_s = ds_s + bq * bk;
  float* delta_s = lse_s + bq;

  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const std::int64_t b = blockIdx.x / a.heads_kv;
  const std::int64_t g = blockIdx.x % a.heads_kv;
  const std::int64_t group = a.heads_q / a.heads_kv;
  const std::int64_t j0 = static_cast<std::int64_t>(blockIdx.y) * bk;
  const int kv_rows = static_cast<int>(a.seq_kv - j0 < bk ? a.seq_kv - j0 : bk);
  const std::int64_t o_stride = a.heads_q * dim;

  LoadTile(k_s, st, k, a.seq_kv, a.batch, b, a.kv_stride, g * dim, j0, bk, dim);
  LoadTile(v_s, st, v, a.seq_kv, a.batch, b, a.kv_stride, g * dim, j0, bk, dim);
  for (int e = tid; e < bk * dim; e += threads) {
    dk_s[e] = 0.0f;
    dv_s[e] = 0.0f;
  }
  __syncthreads();

  // Blocks whose keys no query sees still run to the end: they write the zeros an overwrite
  // (accumulate = false) owes.
  for (std::int64_t h = g * group; h < (g + 1) * group; ++h) {
    for (std::int64_t i0 = QueryStart(a, j0); i0 < a.seq_q; i0 += bq) {
      LoadTile(q_s, st, q, a.seq_q, a.batch, b, a.q_stride, h * dim, i0, bq, dim);
      LoadTile(do_s, st, dout, a.seq_q, a.batch, b, o_stride, h * dim, i0, bq, dim);
      __syncthreads();  // LoadRowStats reads do_s
      LoadRowStats(a, plan, out, lse, do_s, b, h, i0, lse_s, delta_s);
      __syncthreads();
      ProbabilityGrads(a, plan, i0, j0, q_s, do_s, k_s, v_s, lse_s, delta_s, p_s, ds_s);
      __syncthreads();
      // dV += P^T dO and dK += dS^T Q; a thread owns fixed (key, feature) slots.
      for (int e = tid; e < bk * dim; e += threads) {
        const int c = e / dim;
        const int d = e % dim;
        float acc_v = dv_s[e];
        float acc_k = dk_s[e];
        for (int r = 0; r < bq; ++r) {
          acc_v += p_s[r * bk + c] * do_s[r * st + d];
          acc_k += ds_s[r * bk + c] * q_s[r * st + d];
        }
        dv_s[e] = acc_v;
        dk_s[e] = acc_k;
      }
      __syncthreads();  // before the next query tile overwrites q_s, do_s, p_s, ds_s
    }
  }

  for (int e = tid; e < kv_rows * dim; e += threads) {
    const int c = e / dim;
    const int d = e % dim;
    const std::int64_t idx = ((j0 + c) * a.batch + b) * a.kv_stride + g * dim + d;
    StoreGrad(dk + idx, dk_s[e], accumulate);
    StoreGrad(dv + idx, dv_s[e], accumulate);
  }
}

template <typename T>
__global__ void __launch_bounds__(kAttentionThreads)
    AttentionBackwardQKernel(AttentionArgs a, AttentionTilePlan plan, const T* q, const T* k,
                             const T* v, const T* out, const T* dout, const float* lse, T* dq,
                             bool accumulate) {
  float* smem = DynamicShared();
  const int bq = plan.block_q;
  const int bk = plan.block_kv;
  const int dim = plan.head_dim;
  const int st = plan.row_stride;
  float* q_s = smem;
  float* do_s = q_s + plan.Tile(bq);
  float* k_s = do_s + plan.Tile(bq);
  float* v_s = k_s + plan.Tile(bk);
  float* dq_s = v_s + plan.Tile(bk);
  float* ds_s = dq_s + plan.Packed(bq);
  float* lse_s = ds_s + bq * bk;
  float* delta_s = lse_s + bq;

  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const std::int64_t b = blockIdx.x / a.heads_q;
  const std::int64_t h = blockIdx.x % a.heads_q;
  const std::int64_t g = h / (a.heads_q / a.heads_kv);
  const std::int64_t i0 = static_cast<std::int64_t>(blockIdx.y) * bq;
  const int q_rows = static_cast<int>(a.seq_q - i0 < bq ? a.seq_q - i0 : bq);

  LoadTile(q_s, st, q, a.seq_q, a.batch, b, a.q_stride, h * dim, i0, bq, dim);
  LoadTile(do_s, st, dout, a.seq_q, a.batch, b, a.heads_q * dim, h * dim, i0, bq, dim);
  for (int e = tid; e < bq * dim; e += threads) dq_s[e] = 0.0f;
  __syncthreads();
  LoadRowStats(a, plan, out, lse, do_s, b, h, i0, lse_s, delta_s);
  __syncthreads();

  const std::int64_t kv_end = KeyEnd(a, i0 + q_rows);
  for (std::int64_t j0 = 0; j0 < kv_end; j0 += bk) {
    LoadTile(k_s, st, k, a.seq_kv, a.batch, b, a.kv_stride, g * dim, j0, bk, dim);
    LoadTile(v_s, st, v, a.seq_kv, a.batch, b, a.kv_stride, g * dim, j0, bk, dim);
    __syncthreads();
    ProbabilityGrads(a, plan, i0, j0, q_s, do_s, k_s, v_s, lse_s, delta_s, nullptr, ds_s);
    __syncthreads();
    // dQ += dS K.
    for (int e = tid; e < bq * dim; e += threads) {
      const int r = e / dim;
      const int d = e % dim;
      float acc = dq_s[e];
      for (int c = 0; c < bk; ++c) acc += ds_s[r * bk + c] * k_s[c * st + d];
      dq_s[e] = acc;
    }
    __syncthreads();  // before the next key tile overwrites k_s, ds_s
  }

  for (int e = tid; e < q_rows * dim; e += threads) {
    const int r = e / dim;
    const int d = e % dim;
    const std::int64_t idx = ((i0 + r) * a.batch + b) * a.q_stride + h * dim + d;
    StoreGrad(dq + idx, dq_s[e], accumulate);
  }
}

}  // namespace

cudaError_t AttentionBackward(cudaStream_t stream, Storage t, const AttentionArgs& args,
                              const void* q, const void* k, const void* v, const void* out,
                              const void* dout, const float* lse, void* dq, void* dk, void* dv,
                              bool accumulate, int max_smem_bytes) {
  const AttentionTilePlan plan = PlanAttentionTiles(args.head_dim);
  const std::int64_t q_tiles = (args.seq_q + plan.block_q - 1) / plan.block_q;
  const std::int64_t kv_tiles = (args.seq_kv + plan.block_kv - 1) / plan.block_kv;
  const std::int64_t q_heads = args.batch * args.heads_q;
  const std::int64_t kv_heads = args.batch * args.heads_kv;
  if (q_tiles <= 0 || kv_tiles <= 0 || q_heads <= 0 || kv_heads <= 0) return cudaSuccess;
  if (q_tiles > 65535 || kv_tiles > 65535 || q_heads > 0x7fffffff) {
    return cudaErrorInvalidConfiguration;
  }
  const std::size_t kv_bytes = plan.BackwardKvFloats() * sizeof(float);
  const std::size_t q_bytes = plan.BackwardQFloats() * sizeof(float);
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    const T* pq = static_cast<const T*>(q);
    const T* pk = static_cast<const T*>(k);
    const T* pv = static_cast<const T*>(v);
    const T* pout = static_cast<const T*>(out);
    const T* pdout = static_cast<const T*>(dout);
    cudaError_t rc = PrepareSharedMemory(AttentionBackwardKvKernel<T>, kv_bytes, max_smem_bytes);
    if (rc != cudaSuccess) return rc;
    rc = PrepareSharedMemory(AttentionBackwardQKernel<T>, q_bytes, max_smem_bytes);
    if (rc != cudaSuccess) return rc;
    const dim3 kv_grid(static_cast<unsigned>(kv_heads), static_cast<unsigned>(kv_tiles));
    rc = Launch(AttentionBackwardKvKernel<T>, kv_grid, plan.threads, kv_bytes, stream, args, plan,
                pq, pk, pv, pout, pdout, lse, static_cast<T*>(dk), static_cast<T*>(dv), accumulate);
    if (rc != cudaSuccess) return rc;
    const dim3 q_grid(static_cast<unsigned>(q_heads), static_cast<unsigned>(q_tiles));
    return Launch(AttentionBackwardQKernel<T>, q_grid, plan.threads, q_bytes, stream, args, plan,
                  pq, pk, pv, pout, pdout, lse, static_cast<T*>(dq), accumulate);
  });
}

}  // namespace AUTOPAR_CUDA_KERNELS_NS
