// GEMM descriptors of linear layers with PyTorch's [out, in] weight layout, row-major activations.
#pragma once

#include <cstdint>

#include "autopar/device/ops.h"

namespace autopar::trial {

// The fp8 formats of a linear layer's GEMMs, as TransformerEngine runs them under --fp8-format:
// activations and weights in `fwd` (e4m3), gradients in `grad` (e5m2 with hybrid, e4m3 with
// e4m3). kNone: the compute dtype.
struct Fp8Formats {
  device::Fp8Operand fwd = device::Fp8Operand::kNone;
  device::Fp8Operand grad = device::Fp8Operand::kNone;
  bool on() const { return fwd != device::Fp8Operand::kNone; }
};

// y[m, n] (+)= x[m, k] · W[n, k]ᵀ. In fp8 with fast accumulation, as TransformerEngine's forward
// (its gradient GEMMs below use split accumulation).
inline device::GemmDesc Linear(int64_t m, int64_t n, int64_t k, float beta = 0,
                               Fp8Formats fp8 = {}) {
  device::GemmDesc d;
  d.fp8_a = fp8.fwd;  // x
  d.fp8_b = fp8.fwd;  // W
  d.fp8_fast_accumulate = fp8.on();
  d.fp8_b_is_weight = fp8.on();
  d.trans_b = true;
  d.m = m;
  d.n = n;
  d.k = k;
  d.beta = beta;
  return d;
}
// dx[m, k] (+)= dy[m, n] · W[n, k].
inline device::GemmDesc LinearInputGrad(int64_t m, int64_t n, int64_t k, float beta = 0,
                                        Fp8Formats fp8 = {}) {
  device::GemmDesc d;
  d.fp8_a = fp8.grad;  // dy
  d.fp8_b = fp8.fwd;   // W
  d.fp8_b_is_weight = fp8.on();
  d.m = m;
  d.n = k;
  d.k = n;
  d.beta = beta;
  return d;
}
// dW[n, k] += dy[m, n]ᵀ · x[m, k].
inline device::GemmDesc LinearWeightGrad(int64_t m, int64_t n, int64_t k, Fp8Formats fp8 = {}) {
  device::GemmDesc d;
  d.fp8_a = fp8.grad;  // dy
  d.fp8_b = fp8.fwd;   // x
  d.trans_a = true;
  d.m = n;
  d.n = k;
  d.k = m;
  d.beta = 1;
  return d;
}
// `batch` row-vector products, item i: C_i[m, n] (+)= A_i[m, k] · op(B_i), all packed.
inline device::GemmDesc Batched(int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_b,
                                float beta = 0) {
  device::GemmDesc d;
  d.batch = batch;
  d.trans_b = trans_b;
  d.m = m;
  d.n = n;
  d.k = k;
  d.beta = beta;
  return d;
}

}  // namespace autopar::trial
