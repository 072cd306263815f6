// Host reference AdamW step (Loshchilov & Hutter 2019) on fp32 master weights, in the order of
// operations of torch.optim.AdamW (single-tensor path), so results match it to rounding:
//   p *= 1 - lr * wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps),   with g = grad * grad_scale.
#pragma once

#include <cstdint>

namespace autopar::kernels::ref {

struct AdamHyper {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double grad_scale = 1.0;
  std::int64_t step = 1;  // 1-based
};

template <typename T>
void AdamStep(const AdamHyper& hyper, std::int64_t n, T* param, const T* grad, T* exp_avg,
              T* exp_avg_sq);

}  // namespace autopar::kernels::ref
