// Fused AdamW step on fp32 master weights (ref: kernels/adam.h), optionally writing the updated
// weights converted into the model copy in the same pass.
//
// Every multiply, add, divide and square root is an explicitly rounded IEEE operation (no fused
// multiply-add), in the host reference's order with the host's per-step scalars, so the fp32
// state matches the CPU device bit for bit.
#include "kernels/cuda_common.cuh"

namespace AUTOPAR_CUDA_KERNELS_NS {
namespace {

template <typename M>
__global__ void AdamKernel(AdamScalars s, std::int64_t n, float* master, const float* grad,
                           float* exp_avg, float* exp_avg_sq, M* model) {
  for (std::int64_t i = GlobalThread(); i < n; i += GridThreads()) {
    const float g = __fmul_rn(grad[i], s.grad_scale);
    float p = __fmul_rn(master[i], s.decay);
    const float m = __fadd_rn(__fmul_rn(s.beta1, exp_avg[i]), __fmul_rn(s.one_minus_beta1, g));
    const float v =
        __fadd_rn(__fmul_rn(s.beta2, exp_avg_sq[i]), __fmul_rn(__fmul_rn(s.one_minus_beta2, g), g));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.sqrt_bias_correction2), s.eps);
    p = __fsub_rn(p, __fdiv_rn(__fmul_rn(s.step_size, m), denom));
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    master[i] = p;
    if (model != nullptr) model[i] = FromFloat<M>(p);
  }
}

}  // namespace

cudaError_t AdamStep(cudaStream_t stream, const AdamScalars& s, std::int64_t n, float* master,
                     const float* grad, float* exp_avg, float* exp_avg_sq, Storage model_t,
                     void* model) {
  if (n <= 0) return cudaSuccess;
  return Dispatch(model_t, [&](auto tag) {
    using M = decltype(tag);
    return Launch(AdamKernel<M>, GridFor(n), kThreads, 0, stream, s, n, master, grad, exp_avg,
                  exp_avg_sq, static_cast<M*>(model));
  });
}

}  // namespace AUTOPAR_CUDA_KERNELS_NS
