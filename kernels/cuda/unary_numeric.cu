// CUDA unary kernels of the ops defined on every numeric dtype (neg, abs, sign, relu, square,
// pow with a scalar exponent, clamp), and logical_not on every dtype.
#include "../common/unary_math.h"
#include "adapters.cuh"
#include "elementwise.cuh"
#include "elementwise_ops.h"

namespace strata::cuda_kernels {

template <class F, class T>
cudaError_t unary(const StridedLoop<2>& loop, cudaStream_t s, T* out, const T* in, F f) {
  return elementwise(loop, s, out, UnaryFn<F, T>{f}, in);
}

template <class T>
cudaError_t logical_not(const StridedLoop<2>& loop, cudaStream_t s, bool* out, const T* in) {
  return elementwise(loop, s, out, LogicalNotFn<T>{}, in);
}

// Explicit instances, one per (functor, dtype) the registry uses.
#define STRATA_UNARY(F, T) template cudaError_t unary<F, T>(const StridedLoop<2>&, cudaStream_t, T*, const T*, F);
#define STRATA_UNARY_NUMERIC(F)                                                                  \
  STRATA_UNARY(F, Half) STRATA_UNARY(F, BFloat16) STRATA_UNARY(F, float) STRATA_UNARY(F, double) \
  STRATA_UNARY(F, int64_t) STRATA_UNARY(F, int32_t) STRATA_UNARY(F, int8_t) STRATA_UNARY(F, uint8_t)
STRATA_UNARY_NUMERIC(math::Neg)
STRATA_UNARY_NUMERIC(math::Abs)
STRATA_UNARY_NUMERIC(math::Sign)
STRATA_UNARY_NUMERIC(math::Relu)
STRATA_UNARY_NUMERIC(math::Square)
STRATA_UNARY_NUMERIC(math::PowScalar)
STRATA_UNARY_NUMERIC(math::Clamp)
#undef STRATA_UNARY_NUMERIC
#undef STRATA_UNARY

template cudaError_t logical_not<Half>(const StridedLoop<2>&, cudaStream_t, bool*, const Half*);
template cudaError_t logical_not<BFloat16>(const StridedLoop<2>&, cudaStream_t, bool*, const BFloat16*);
template cudaError_t logical_not<float>(const StridedLoop<2>&, cudaStream_t, bool*, const float*);
template cudaError_t logical_not<double>(const StridedLoop<2>&, cudaStream_t, bool*, const double*);
template cudaError_t logical_not<int64_t>(const StridedLoop<2>&, cudaStream_t, bool*, const int64_t*);
template cudaError_t logical_not<int32_t>(const StridedLoop<2>&, cudaStream_t, bool*, const int32_t*);
template cudaError_t logical_not<int8_t>(const StridedLoop<2>&, cudaStream_t, bool*, const int8_t*);
template cudaError_t logical_not<uint8_t>(const StridedLoop<2>&, cudaStream_t, bool*, const uint8_t*);
template cudaError_t logical_not<bool>(const StridedLoop<2>&, cudaStream_t, bool*, const bool*);

}  // namespace strata::cuda_kernels
