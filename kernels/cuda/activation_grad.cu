// CUDA kernels of the activation gradients (relu_backward, ..., gelu_tanh_backward) with the
// functors of kernels/common/activation_grad_math.h, through the elementwise launcher.
#include "../common/activation_grad_math.h"
#include "adapters.cuh"
#include "elementwise.cuh"
#include "elementwise_ops.h"

namespace strata::cuda_kernels {

template <class F, class T>
cudaError_t activation_grad(const StridedLoop<3>& loop, cudaStream_t s, T* out, const T* g, const T* saved, F f) {
  return elementwise(loop, s, out, BinaryFn<F, T, T>{f}, g, saved);
}

#define STRATA_ACT_GRAD(F, T) \
  template cudaError_t activation_grad<F, T>(const StridedLoop<3>&, cudaStream_t, T*, const T*, const T*, F);
#define STRATA_ACT_GRAD_FLOAT(F) \
  STRATA_ACT_GRAD(F, Half) STRATA_ACT_GRAD(F, BFloat16) STRATA_ACT_GRAD(F, float) STRATA_ACT_GRAD(F, double)
STRATA_ACT_GRAD_FLOAT(math::ReluBackward)
STRATA_ACT_GRAD_FLOAT(math::TanhBackward)
STRATA_ACT_GRAD_FLOAT(math::SigmoidBackward)
STRATA_ACT_GRAD_FLOAT(math::SiluBackward)
STRATA_ACT_GRAD_FLOAT(math::GeluBackward)
STRATA_ACT_GRAD_FLOAT(math::GeluTanhBackward)
#undef STRATA_ACT_GRAD_FLOAT
#undef STRATA_ACT_GRAD

}  // namespace strata::cuda_kernels
