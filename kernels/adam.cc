#include "kernels/adam.h"

#include <cmath>

namespace autopar::kernels::ref {

template <typename T>
void AdamStep(const AdamHyper& hyper, std::int64_t n, T* param, const T* grad, T* exp_avg,
              T* exp_avg_sq) {
  const double t = static_cast<double>(hyper.step);
  // Per-step scalars in double, per-element arithmetic in T, as a fused GPU kernel does.
  const T decay = static_cast<T>(1.0 - hyper.lr * hyper.weight_decay);
  const T b1 = static_cast<T>(hyper.beta1);
  const T b2 = static_cast<T>(hyper.beta2);
  const T one_minus_b1 = static_cast<T>(1.0 - hyper.beta1);
  const T one_minus_b2 = static_cast<T>(1.0 - hyper.beta2);
  const T step_size = static_cast<T>(hyper.lr / (1.0 - std::pow(hyper.beta1, t)));
  const T sqrt_bc2 = static_cast<T>(std::sqrt(1.0 - std::pow(hyper.beta2, t)));
  const T eps = static_cast<T>(hyper.eps);
  const T scale = static_cast<T>(hyper.grad_scale);
  for (std::int64_t i = 0; i < n; ++i) {
    const T g = grad[i] * scale;
    param[i] *= decay;
    exp_avg[i] = b1 * exp_avg[i] + one_minus_b1 * g;
    exp_avg_sq[i] = b2 * exp_avg_sq[i] + one_minus_b2 * g * g;
    const T denom = std::sqrt(exp_avg_sq[i]) / sqrt_bc2 + eps;
    param[i] -= step_size * exp_avg[i] / denom;
  }
}

template void AdamStep<float>(const AdamHyper&, std::int64_t, float*, const float*, float*, float*);
template void AdamStep<double>(const AdamHyper&, std::int64_t, double*, const double*, double*,
                               double*);

}  // namespace autopar::kernels::ref
