// Flash-style attention forward (Dao et al. 2022) and the log-sum-exp merge of partial results.
//
// A block owns block_q query rows of one (batch, head) and streams the visible key/value tiles
// through shared memory, keeping a running max and sum per row (online softmax, Milakov &
// Gimelshein 2018) and an fp32 output accumulator, so memory is O(tile) and never
// O(seq_q * seq_kv). Key tiles wholly past the causal diagonal of the block's last query are not
// visited. The algorithm and its special cases (fully masked rows: out = 0, lse = -inf) are those
// of the CPU device's blockwise attention; correctness over speed: scores are dot products from
// fp32 shared memory, not tensor-core MMAs.
#include "kernels/cuda_attention.cuh"

namespace AUTOPAR_CUDA_KERNELS_NS {
namespace {

template <typename T>
__global__ void __launch_bounds__(kAttentionThreads)
    AttentionForwardKernel(AttentionArgs a, AttentionTilePlan plan, const T* q, const T* k,
                           const T* v, T* out, float* lse) {
  float* smem = DynamicShared();
  const int bq = plan.block_q;
  const int bk = plan.block_kv;
  const int dim = plan.head_dim;
  const int st = plan.row_stride;
  float* q_s = smem;
  float* k_s = q_s + plan.Tile(bq);
  float* v_s = k_s + plan.Tile(bk);
  float* o_s = v_s + plan.Tile(bk);
  float* s_s = o_s + plan.Packed(bq);  // [bq, bk] scores, then probabilities
  float* m_s = s_s + bq * bk;          // running row max
  float* l_s = m_s + bq;               // running row sum
  float* alpha_s = l_s + bq;           // this tile's rescale factor of the old accumulator

  const int tid = static_cast<int>(threadIdx.x);
  const int threads = static_cast<int>(blockDim.x);
  const int lane = tid % kWarpSize;
  const int warp = tid / kWarpSize;
  const int warps = threads / kWarpSize;
  const std::int64_t b = blockIdx.x / a.heads_q;
  const std::int64_t h = blockIdx.x % a.heads_q;
  const std::int64_t g = h / (a.heads_q / a.heads_kv);
  const std::int64_t i0 = static_cast<std::int64_t>(blockIdx.y) * bq;
  const int q_rows = static_cast<int>(a.seq_q - i0 < bq ? a.seq_q - i0 : bq);

  LoadTile(q_s, st, q, a.seq_q, a.batch, b, a.q_stride, h * dim, i0, bq, dim);
  for (int e = tid; e < bq * dim; e += threads) o_s[e] = 0.0f;
  for (int r = tid; r < bq; r += threads) {
    m_s[r] = -INFINITY;
    l_s[r] = 0.0f;
  }
  __syncthreads();

  const std::int64_t kv_end = KeyEnd(a, i0 + q_rows);
  for (std::int64_t j0 = 0; j0 < kv_end; j0 += bk) {
    LoadTile(k_s, st, k, a.seq_kv, a.batch, b, a.kv_stride, g * dim, j0, bk, dim);
    LoadTile(v_s, st, v, a.seq_kv, a.batch, b, a.kv_stride, g * dim, j0, bk, dim);
    __syncthreads();

    // Scaled scores, -inf where masked. A warp takes one query row and 32 keys (bk = 32), so q
    // is a broadcast and k reads hit distinct banks (odd row stride).
    for (int e = tid; e < bq * bk; e += threads) {
      const int r = e / bk;
      const int c = e % bk;
      float s = -INFINITY;
      if (Visible(a, i0 + r, j0 + c)) {
        float dot = 0.0f;
        for (int d = 0; d < dim; ++d) dot += q_s[r * st + d] * k_s[c * st + d];
        s = dot * a.scale;
      }
      s_s[e] = s;
    }
    __syncthreads();

    // Online softmax: a warp per row, a lane per key (bk <= 32; idle lanes hold -inf).
    for (int r = warp; r < bq; r += warps) {
      const float s = lane < bk ? s_s[r * bk + lane] : -INFINITY;
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, WarpMax(s));
      float p = 0.0f;
      float alpha = 1.0f;
      if (m_new != -INFINITY) {  // otherwise nothing is visible yet: contribute nothing
        p = expf(s - m_new);     // exp(-inf) = 0 for masked keys
        alpha = expf(m_old - m_new);
      }
      const float tile_sum = WarpSum(p);
      if (lane < bk) s_s[r * bk + lane] = p;
      __syncwarp();  // every lane has read m_s[r] before lane 0 replaces it
      if (lane == 0) {
        m_s[r] = m_new;
        l_s[r] = l_s[r] * alpha + tile_sum;
        alpha_s[r] = alpha;
      }
    }
    __syncthreads();

    // O = alpha * O + P V; consecutive threads own consecutive features of a row.
    for (int e = tid; e < bq * dim; e += threads) {
      const int r = e / dim;
      const int d = e % dim;
      float acc = o_s[e] * alpha_s[r];
      for (int c = 0; c < bk; ++c) acc += s_s[r * bk + c] * v_s[c * st + d];
      o_s[e] = acc;
    }
    __syncthreads();
  }

  for (int e = tid; e < q_rows * dim; e += threads) {
    const int r = e / dim;
    const int d = e % dim;
    const float l = l_s[r];
    const std::int64_t row = ((i0 + r) * a.batch + b) * a.heads_q + h;
    out[row * dim + d] = FromFloat<T>(l > 0.0f ? o_s[e] / l : 0.0f);
  }
  for (int r = tid; r < q_rows; r += threads) {
    const float l = l_s[r];
    lse[((i0 + r) * a.batch + b) * a.heads_q + h] = l > 0.0f ? m_s[r] + logf(l) : -INFINITY;
  }
}

// A warp per row: out = (w_a out + w_b part) / (w_a + w_b) with w = exp(lse - max).
template <typename T>
__global__ void AttentionMergeKernel(std::int64_t rows, std::int64_t head_dim, T* out, float* lse,
                                     const T* part_out, const float* part_lse) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const std::int64_t warps = GridThreads() / kWarpSize;
  for (std::int64_t r = GlobalThread() / kWarpSize; r < rows; r += warps) {
    const float lse_a = lse[r];
    const float lse_b = part_lse[r];
    // Every lane has read lse[r] before lane 0 overwrites it below.
    __syncwarp();
    const float m = fmaxf(lse_a, lse_b);
    if (m == -INFINITY) continue;  // both parts empty
    const float wa = expf(lse_a - m);
    const float wb = expf(lse_b - m);
    const float total = wa + wb;
    for (std::int64_t d = lane; d < head_dim; d += kWarpSize) {
      const std::int64_t idx = r * head_dim + d;
      // An empty side (weight 0) is not read: a ring may start from an unwritten out buffer,
      // whose garbage could be NaN, and 0 * NaN would poison the row.
      const float a = wa > 0.0f ? wa * ToFloat(out[idx]) : 0.0f;
      const float b = wb > 0.0f ? wb * ToFloat(part_out[idx]) : 0.0f;
      out[idx] = FromFloat<T>((a + b) / total);
    }
    if (lane == 0) lse[r] = m + logf(total);
  }
}

}  // namespace

cudaError_t AttentionForward(cudaStream_t stream, Storage t, const AttentionArgs& args,
                             const void* q, const void* k, const void* v, void* out, float* lse,
                             int max_smem_bytes) {
  const AttentionTilePlan plan = PlanAttentionTiles(args.head_dim);
  const std::int64_t q_tiles = (args.seq_q + plan.block_q - 1) / plan.block_q;
  const std::int64_t heads = args.batch * args.heads_q;
  if (q_tiles <= 0 || heads <= 0) return cudaSuccess;
  if (q_tiles > 65535 || heads > 0x7fffffff) return cudaErrorInvalidConfiguration;
  const std::size_t bytes = plan.ForwardFloats() * sizeof(float);
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    const cudaError_t rc = PrepareSharedMemory(AttentionForwardKernel<T>, bytes, max_smem_bytes);
    if (rc != cudaSuccess) return rc;
    const dim3 grid(static_cast<unsigned>(heads), static_cast<unsigned>(q_tiles));
    return Launch(AttentionForwardKernel<T>, grid, plan.threads, bytes, stream, args, plan,
                  static_cast<const T*>(q), static_cast<const T*>(k), static_cast<const T*>(v),
                  static_cast<T*>(out), lse);
  });
}

cudaError_t AttentionMerge(cudaStream_t stream, Storage t, std::int64_t rows, std::int64_t head_dim,
                           void* out, float* lse, const void* part_out, const float* part_lse) {
  if (rows <= 0 || head_dim <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(AttentionMergeKernel<T>, GridFor(rows * kWarpSize), kThreads, 0, stream, rows,
                  head_dim, static_cast<T*>(out), lse, static_cast<const T*>(part_out), part_lse);
  });
}

}  // namespace AUTOPAR_CUDA_KERNELS_NS
