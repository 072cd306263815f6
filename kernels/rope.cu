// Rotary position embedding, rotate-half form (ref: kernels/rope.h).
//
// One thread per rotated pair (i, i + rotary_dim / 2) or per pass-through feature of a head, so a
// thread reads both members of its pair before writing them and y may alias x. Angles are
// computed in double as on the host: at position 10^5 a float angle would already be off by
// ~10^-2 rad, more than bf16 resolves.
#include "kernels/cuda_common.cuh"

namespace AUTOPAR_CUDA_KERNELS_NS {
namespace {

template <typename T>
__global__ void RopeKernel(RopeArgs a, const T* x, T* y, double sign) {
  const std::int64_t half = a.rotary_dim / 2;
  const std::int64_t per_head = half + (a.head_dim - a.rotary_dim);
  const std::int64_t n = a.seq * a.batch * a.heads * per_head;
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const std::int64_t j = i % per_head;
    const std::int64_t rest = i / per_head;
    const std::int64_t h = rest % a.heads;
    const std::int64_t row = rest / a.heads;  // (s, b) with s slowest
    const std::int64_t s = row / a.batch;
    const std::int64_t head = row * a.row_stride + h * a.head_dim;
    if (j < half) {
      const double inv_freq =
          pow(a.base, -2.0 * static_cast<double>(j) / static_cast<double>(a.rotary_dim));
      const double angle = static_cast<double>(a.position_offset + s) * inv_freq;
      double sn = 0.0;
      double c = 0.0;
      sincos(angle, &sn, &c);
      sn *= sign;
      const double x1 = ToFloat(x[head + j]);
      const double x2 = ToFloat(x[head + j + half]);
      y[head + j] = FromFloat<T>(static_cast<float>(x1 * c - x2 * sn));
      y[head + j + half] = FromFloat<T>(static_cast<float>(x2 * c + x1 * sn));
    } else if (x != y) {
      const std::int64_t d = a.rotary_dim + (j - half);
      y[head + d] = x[head + d];
    }
  }
}

}  // namespace

cudaError_t Rope(cudaStream_t stream, Storage t, const RopeArgs& args, const void* x, void* y,
                 double sign) {
  const std::int64_t per_head = args.rotary_dim / 2 + (args.head_dim - args.rotary_dim);
  const std::int64_t n = args.seq * args.batch * args.heads * per_head;
  if (n <= 0) return cudaSuccess;
  return Dispatch(t, [&](auto tag) {
    using T = decltype(tag);
    return Launch(RopeKernel<T>, GridFor(n), kThreads, 0, stream, args, static_cast<const T*>(x),
                  static_cast<T*>(y), sign);
  });
}

}  // namespace AUTOPAR_CUDA_KERNELS_NS
