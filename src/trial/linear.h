// GEMM descriptors of linear layers with PyTorch's [out, in] weight layout, row-major activations.
#pragma once

#include <cstdint>

#include "autopar/backend/ops.h"

namespace autopar::trial {

// y[m, n] (+)= x[m, k] · W[n, k]ᵀ.
inline backend::GemmDesc Linear(int64_t m, int64_t n, int64_t k, float beta = 0) {
  backend::GemmDesc d;
  d.trans_b = true;
  d.m = m;
  d.n = n;
  d.k = k;
  d.beta = beta;
  return d;
}
// dx[m, k] (+)= dy[m, n] · W[n, k].
inline backend::GemmDesc LinearInputGrad(int64_t m, int64_t n, int64_t k, float beta = 0) {
  backend::GemmDesc d;
  d.m = m;
  d.n = k;
  d.k = n;
  d.beta = beta;
  return d;
}
// dW[n, k] += dy[m, n]ᵀ · x[m, k].
inline backend::GemmDesc LinearWeightGrad(int64_t m, int64_t n, int64_t k) {
  backend::GemmDesc d;
  d.trans_a = true;
  d.m = n;
  d.n = k;
  d.k = m;
  d.beta = 1;
  return d;
}
// `batch` row-vector products, item i: C_i[m, n] (+)= A_i[m, k] · op(B_i), all packed.
inline backend::GemmDesc Batched(int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_b,
                                 float beta = 0) {
  backend::GemmDesc d;
  d.batch = batch;
  d.trans_b = trans_b;
  d.m = m;
  d.n = n;
  d.k = k;
  d.beta = beta;
  return d;
}

}  // namespace autopar::trial
