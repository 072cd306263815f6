// CPU device: blockwise causal attention with grouped-query heads.
//
// The FlashAttention algorithm (Dao et al. 2022; backward as in FlashAttention-2, Dao 2023) on the
// host: scores are formed one [block_q, block_kv] tile at a time with OpenBLAS, the forward keeps a
// running max and sum per query row (online softmax, Milakov & Gimelshein 2018) and saves the
// log-sum-exp, and the backward recomputes each tile's probabilities from that log-sum-exp. Extra
// memory is O(block_q * block_kv + block * head_dim) per call plus one float per query row, never
// O(seq_q * seq_kv). Tiles wholly above the causal diagonal are skipped.
//
// For a fixed (batch b, head h), row s of q sits at s * batch * q_stride + b * q_stride + h * dim:
// a matrix with leading dimension batch * q_stride, which BLAS takes directly (no copies).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "src/device/cpu/cpu_device.h"
#include "src/device/validate.h"

namespace autopar::device {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Number of keys [j0, j0 + nk) visible to query i (the visible ones are a prefix).
std::int64_t VisibleKeys(const AttentionDesc& d, std::int64_t i, std::int64_t j0, std::int64_t nk) {
  if (!d.causal) return nk;
  const std::int64_t last = d.q_offset + i - d.kv_offset - j0;  // last visible
  return std::clamp<std::int64_t>(last + 1, 0, nk);
}

// Keys [0, end) can be visible to queries [0, i_end); later keys are masked for all of them.
std::int64_t KeyEnd(const AttentionDesc& d, std::int64_t i_end) {
  if (!d.causal) return d.seq_kv;
  const std::int64_t last = d.q_offset + i_end - 1 - d.kv_offset;
  return std::clamp<std::int64_t>(last + 1, 0, d.seq_kv);
}

// Queries [start, seq_q) can see some key at or after j0; earlier ones see none of them.
std::int64_t QueryStart(const AttentionDesc& d, std::int64_t j0) {
  if (!d.causal) return 0;
  return std::clamp<std::int64_t>(d.kv_offset + j0 - d.q_offset, 0, d.seq_q);
}

// S = scale * Q_tile K_tile^T, [nq, nk] packed.
void ScoreTile(const float* q, std::int64_t ldq, const float* k, std::int64_t ldk, std::int64_t nq,
               std::int64_t nk, std::int64_t dim, float scale, float* s) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(nq), static_cast<int>(nk),
              static_cast<int>(dim), scale, q, static_cast<int>(ldq), k, static_cast<int>(ldk),
              0.0f, s, static_cast<int>(nk));
}

// C[m, n] (+)= alpha op(A) op(B) on packed or strided tiles; a thin wrapper to keep call sites
// readable.
void Tile(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a,
              static_cast<int>(lda), b, static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

Status CheckBlasRange(const AttentionDesc& d) {
  constexpr std::int64_t kMax = std::numeric_limits<int>::max();
  AUTOPAR_CHECK_ARG(d.batch * d.q_stride <= kMax && d.batch * d.kv_stride <= kMax &&
                        d.batch * d.heads_q * d.head_dim <= kMax,
                    "Attention: row strides exceed the 32-bit BLAS interface");
  return OkStatus();
}

// Zeroes only the head slots of dq, dk and dv: a fused QKV buffer's other parts stay intact.
void ZeroHeadSlots(const AttentionDesc& d, Tensor dq, Tensor dk, Tensor dv) {
  const std::int64_t dim = d.head_dim;
  for (std::int64_t t = 0; t < d.seq_q * d.batch; ++t) {
    std::fill_n(dq.as<float>() + t * d.q_stride, d.heads_q * dim, 0.0f);
  }
  for (std::int64_t t = 0; t < d.seq_kv * d.batch; ++t) {
    std::fill_n(dk.as<float>() + t * d.kv_stride, d.heads_kv * dim, 0.0f);
    std::fill_n(dv.as<float>() + t * d.kv_stride, d.heads_kv * dim, 0.0f);
  }
}

// delta_i = dout_i . out_i = sum_j P_ij dP_ij, the row term of the softmax backward, for each of
// `rows` query rows of `dim` values.
std::vector<float> SoftmaxRowTerms(std::int64_t rows, std::int64_t dim, const float* dout,
                                   const float* out) {
  std::vector<float> delta(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    double dot = 0.0;
    for (std::int64_t x = 0; x < dim; ++x) {
      dot += double{dout[r * dim + x]} * double{out[r * dim + x]};
    }
    delta[r] = static_cast<float>(dot);
  }
  return delta;
}

// The backward pass of one call, one key block at a time: the tensors, their leading dimensions
// and the scratch of one tile pair.
class BackwardPass {
 public:
  BackwardPass(const AttentionDesc& d, std::int64_t block_q, std::int64_t block_kv, Tensor q,
               Tensor k, Tensor v, Tensor dout, Tensor lse, Tensor dq, Tensor dk, Tensor dv,
               std::vector<float> delta)
      : d_(d),
        dim_(d.head_dim),
        group_(d.heads_q / d.heads_kv),
        ldq_(d.batch * d.q_stride),
        ldkv_(d.batch * d.kv_stride),
        ldo_(d.batch * d.heads_q * dim_),
        ld_lse_(d.batch * d.heads_q),
        bq_(std::max<std::int64_t>(1, block_q)),
        bk_(std::max<std::int64_t>(1, block_kv)),
        q_(q.as<float>()),
        k_(k.as<float>()),
        v_(v.as<float>()),
        dout_(dout.as<float>()),
        lse_(lse.as<float>()),
        dq_(dq.as<float>()),
        dk_(dk.as<float>()),
        dv_(dv.as<float>()),
        delta_(std::move(delta)),
        probs_(static_cast<std::size_t>(bq_ * bk_)),
        dprobs_(probs_.size()),
        dk_acc_(static_cast<std::size_t>(bk_ * dim_)),
        dv_acc_(dk_acc_.size()) {}

  // Every key block of every (batch, kv head).
  void Run() {
    for (std::int64_t b = 0; b < d_.batch; ++b) {
      for (std::int64_t g = 0; g < d_.heads_kv; ++g) {
        for (std::int64_t j0 = 0; j0 < d_.seq_kv; j0 += bk_) KeyBlock(b, g, j0);
      }
    }
  }

 private:
  // dK and dV of keys [j0, j0 + bk) of kv head g in batch b, summed over the query heads that
  // read them, and those heads' dQ terms from these keys.
  void KeyBlock(std::int64_t b, std::int64_t g, std::int64_t j0) {
    const std::int64_t nk = std::min(bk_, d_.seq_kv - j0);
    std::fill_n(dk_acc_.begin(), nk * dim_, 0.0f);
    std::fill_n(dv_acc_.begin(), nk * dim_, 0.0f);
    for (std::int64_t h = g * group_; h < (g + 1) * group_; ++h) QueryTiles(b, h, g, j0, nk);
    float* dkbg = dk_ + b * d_.kv_stride + g * dim_;
    float* dvbg = dv_ + b * d_.kv_stride + g * dim_;
    for (std::int64_t c = 0; c < nk; ++c) {
      for (std::int64_t x = 0; x < dim_; ++x) {
        dkbg[(j0 + c) * ldkv_ + x] += dk_acc_[c * dim_ + x];
        dvbg[(j0 + c) * ldkv_ + x] += dv_acc_[c * dim_ + x];
      }
    }
  }

  // Query head h's tiles that can see keys [j0, j0 + nk) of its kv head g: P from the saved
  // log-sum-exp, then their terms of dV, dQ and dK.
  void QueryTiles(std::int64_t b, std::int64_t h, std::int64_t g, std::int64_t j0,
                  std::int64_t nk) {
    const float* kbg = k_ + b * d_.kv_stride + g * dim_;
    const float* vbg = v_ + b * d_.kv_stride + g * dim_;
    const float* qbh = q_ + b * d_.q_stride + h * dim_;
    float* dqbh = dq_ + b * d_.q_stride + h * dim_;
    const float* dobh = dout_ + (b * d_.heads_q + h) * dim_;
    const std::int64_t stat0 = b * d_.heads_q + h;
    for (std::int64_t i0 = QueryStart(d_, j0); i0 < d_.seq_q; i0 += bq_) {
      const std::int64_t nq = std::min(bq_, d_.seq_q - i0);
      ScoreTile(qbh + i0 * ldq_, ldq_, kbg + j0 * ldkv_, ldkv_, nq, nk, dim_, d_.scale,
                probs_.data());
      for (std::int64_t r = 0; r < nq; ++r) {
        float* p = probs_.data() + r * nk;
        const float row_lse = lse_[(i0 + r) * ld_lse_ + stat0];
        const std::int64_t visible = row_lse == kNegInf ? 0 : VisibleKeys(d_, i0 + r, j0, nk);
        for (std::int64_t c = 0; c < visible; ++c) p[c] = std::exp(p[c] - row_lse);
        std::fill(p + visible, p + nk, 0.0f);
      }
      // dV_j += P^T dO_i;  dP = dO_i V_j^T.
      Tile(true, false, nk, dim_, nq, probs_.data(), nk, dobh + i0 * ldo_, ldo_, 1.0f,
           dv_acc_.data(), dim_);
      Tile(false, true, nq, nk, dim_, dobh + i0 * ldo_, ldo_, vbg + j0 * ldkv_, ldkv_, 0.0f,
           dprobs_.data(), nk);
      // dS = P * (dP - delta) * scale, in place of dP.
      for (std::int64_t r = 0; r < nq; ++r) {
        const float row_delta = delta_[(i0 + r) * ld_lse_ + stat0];
        for (std::int64_t c = 0; c < nk; ++c) {
          dprobs_[r * nk + c] = probs_[r * nk + c] * (dprobs_[r * nk + c] - row_delta) * d_.scale;
        }
      }
      // dQ_i += dS K_j (straight into the strided dq);  dK_j += dS^T Q_i.
      Tile(false, false, nq, dim_, nk, dprobs_.data(), nk, kbg + j0 * ldkv_, ldkv_, 1.0f,
           dqbh + i0 * ldq_, ldq_);
      Tile(true, false, nk, dim_, nq, dprobs_.data(), nk, qbh + i0 * ldq_, ldq_, 1.0f,
           dk_acc_.data(), dim_);
    }
  }

  const AttentionDesc d_;
  const std::int64_t dim_, group_, ldq_, ldkv_, ldo_, ld_lse_, bq_, bk_;
  const float *q_, *k_, *v_, *dout_, *lse_;
  float *dq_, *dk_, *dv_;
  const std::vector<float> delta_;
  std::vector<float> probs_, dprobs_, dk_acc_, dv_acc_;
};

}  // namespace

Status CpuDevice::AttentionForward(const AttentionDesc& desc, Tensor q, Tensor k, Tensor v,
                                   Tensor out, Tensor lse) {
  AUTOPAR_ASSIGN_OR_RETURN(const AttentionDesc d, ResolveAttention(desc));
  AUTOPAR_RETURN_IF_ERROR(CheckBlasRange(d));
  const std::int64_t rows = d.seq_q * d.batch * d.heads_q;
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("AttentionForward", {{"q", q, DType::kF32, AttentionQExtent(d)},
                                     {"k", k, DType::kF32, AttentionKvExtent(d)},
                                     {"v", v, DType::kF32, AttentionKvExtent(d)},
                                     {"out", out, DType::kF32, rows * d.head_dim},
                                     {"lse", lse, DType::kF32, rows}}));
  const std::int64_t dim = d.head_dim;
  const std::int64_t group = d.heads_q / d.heads_kv;
  const std::int64_t ldq = d.batch * d.q_stride;
  const std::int64_t ldkv = d.batch * d.kv_stride;
  const std::int64_t ldo = d.batch * d.heads_q * dim;
  const std::int64_t ld_lse = d.batch * d.heads_q;
  const std::int64_t bq = std::max<std::int64_t>(1, block_q_);
  const std::int64_t bk = std::max<std::int64_t>(1, block_kv_);

  std::vector<float> scores(static_cast<std::size_t>(bq * bk));
  std::vector<float> acc(static_cast<std::size_t>(bq * dim));
  std::vector<float> row_max(static_cast<std::size_t>(bq));
  std::vector<float> row_sum(static_cast<std::size_t>(bq));

  for (std::int64_t b = 0; b < d.batch; ++b) {
    for (std::int64_t h = 0; h < d.heads_q; ++h) {
      const std::int64_t g = h / group;
      const float* qbh = q.as<float>() + b * d.q_stride + h * dim;
      const float* kbg = k.as<float>() + b * d.kv_stride + g * dim;
      const float* vbg = v.as<float>() + b * d.kv_stride + g * dim;
      float* obh = out.as<float>() + (b * d.heads_q + h) * dim;
      float* lbh = lse.as<float>() + b * d.heads_q + h;

      for (std::int64_t i0 = 0; i0 < d.seq_q; i0 += bq) {
        const std::int64_t nq = std::min(bq, d.seq_q - i0);
        std::fill_n(row_max.begin(), nq, kNegInf);
        std::fill_n(row_sum.begin(), nq, 0.0f);
        std::fill_n(acc.begin(), nq * dim, 0.0f);
        const std::int64_t kv_end = KeyEnd(d, i0 + nq);
        for (std::int64_t j0 = 0; j0 < kv_end; j0 += bk) {
          const std::int64_t nk = std::min(bk, kv_end - j0);
          ScoreTile(qbh + i0 * ldq, ldq, kbg + j0 * ldkv, ldkv, nq, nk, dim, d.scale,
                    scores.data());
          for (std::int64_t r = 0; r < nq; ++r) {
            float* s = scores.data() + r * nk;
            const std::int64_t visible = VisibleKeys(d, i0 + r, j0, nk);
            float tile_max = kNegInf;
            for (std::int64_t c = 0; c < visible; ++c) tile_max = std::max(tile_max, s[c]);
            const float new_max = std::max(row_max[r], tile_max);
            if (new_max == kNegInf) {  // nothing visible yet: contribute nothing
              std::fill_n(s, nk, 0.0f);
              continue;
            }
            // Rescale what was accumulated under the old max (exp(-inf) = 0 the first time).
            const float correction = std::exp(row_max[r] - new_max);
            float tile_sum = 0.0f;
            for (std::int64_t c = 0; c < visible; ++c) {
              s[c] = std::exp(s[c] - new_max);
              tile_sum += s[c];
            }
            std::fill(s + visible, s + nk, 0.0f);
            row_sum[r] = row_sum[r] * correction + tile_sum;
            row_max[r] = new_max;
            if (correction != 1.0f) {
              for (std::int64_t x = 0; x < dim; ++x) acc[r * dim + x] *= correction;
            }
          }
          Tile(false, false, nq, dim, nk, scores.data(), nk, vbg + j0 * ldkv, ldkv, 1.0f,
               acc.data(), dim);
        }
        for (std::int64_t r = 0; r < nq; ++r) {
          float* o = obh + (i0 + r) * ldo;
          if (row_sum[r] == 0.0f) {
            std::fill_n(o, dim, 0.0f);
            lbh[(i0 + r) * ld_lse] = kNegInf;
            continue;
          }
          const float inv = 1.0f / row_sum[r];
          for (std::int64_t x = 0; x < dim; ++x) o[x] = acc[r * dim + x] * inv;
          lbh[(i0 + r) * ld_lse] = row_max[r] + std::log(row_sum[r]);
        }
      }
    }
  }
  return OkStatus();
}

Status CpuDevice::AttentionBackward(const AttentionDesc& desc, Tensor q, Tensor k, Tensor v,
                                    Tensor out, Tensor dout, Tensor lse, Tensor dq, Tensor dk,
                                    Tensor dv, bool accumulate) {
  AUTOPAR_ASSIGN_OR_RETURN(const AttentionDesc d, ResolveAttention(desc));
  AUTOPAR_RETURN_IF_ERROR(CheckBlasRange(d));
  const std::int64_t rows = d.seq_q * d.batch * d.heads_q;
  const std::int64_t q_need = AttentionQExtent(d);
  const std::int64_t kv_need = AttentionKvExtent(d);
  AUTOPAR_RETURN_IF_ERROR(
      CheckArgs("AttentionBackward", {{"q", q, DType::kF32, q_need},
                                      {"k", k, DType::kF32, kv_need},
                                      {"v", v, DType::kF32, kv_need},
                                      {"out", out, DType::kF32, rows * d.head_dim},
                                      {"dout", dout, DType::kF32, rows * d.head_dim},
                                      {"lse", lse, DType::kF32, rows},
                                      {"dq", dq, DType::kF32, q_need},
                                      {"dk", dk, DType::kF32, kv_need},
                                      {"dv", dv, DType::kF32, kv_need}}));
  if (!accumulate) ZeroHeadSlots(d, dq, dk, dv);
  BackwardPass(d, block_q_, block_kv_, q, k, v, dout, lse, dq, dk, dv,
               SoftmaxRowTerms(rows, d.head_dim, dout.as<float>(), out.as<float>()))
      .Run();
  return OkStatus();
}

}  // namespace autopar::device
