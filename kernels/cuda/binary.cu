// CUDA binary kernels (arithmetic, comparisons, logical and/or) and where, over broadcast
// strided operands, with the functors of kernels/common/binary_math.h.
#include "../common/binary_math.h"
#include "../common/compare_math.h"
#include "adapters.cuh"
#include "elementwise.cuh"
#include "elementwise_ops.h"

namespace strata::cuda_kernels {

template <class F, class T, class Out>
cudaError_t binary(const StridedLoop<3>& loop, cudaStream_t s, Out* out, const T* a, const T* b, F f) {
  return elementwise(loop, s, out, BinaryFn<F, T, Out>{f}, a, b);
}

template <class T>
cudaError_t where(const StridedLoop<4>& loop, cudaStream_t s, T* out, const bool* cond, const T* a, const T* b) {
  return elementwise(loop, s, out, WhereFn<T>{}, cond, a, b);
}

template <class T>
cudaError_t isclose(const StridedLoop<3>& loop, cudaStream_t s, bool* out, const T* a, const T* b, double rtol,
                    double atol, bool equal_nan) {
  return elementwise(loop, s, out, IsCloseFn<T>{math::IsClose{rtol, atol, equal_nan}}, a, b);
}

// Explicit instances, one per (functor, dtype) the registry uses.
#define STRATA_BIN(F, T, O) \
  template cudaError_t binary<F, T, O>(const StridedLoop<3>&, cudaStream_t, O*, const T*, const T*, F);
#define STRATA_BIN_FLOAT(F, O) STRATA_BIN(F, Half, O) STRATA_BIN(F, BFloat16, O) STRATA_BIN(F, float, O) \
  STRATA_BIN(F, double, O)
#define STRATA_BIN_INT(F, O) STRATA_BIN(F, int64_t, O) STRATA_BIN(F, int32_t, O) STRATA_BIN(F, int8_t, O) \
  STRATA_BIN(F, uint8_t, O)
#define STRATA_BIN_NUMERIC(F)                                                                   \
  STRATA_BIN(F, Half, Half) STRATA_BIN(F, BFloat16, BFloat16) STRATA_BIN(F, float, float)        \
  STRATA_BIN(F, double, double) STRATA_BIN(F, int64_t, int64_t) STRATA_BIN(F, int32_t, int32_t)  \
  STRATA_BIN(F, int8_t, int8_t) STRATA_BIN(F, uint8_t, uint8_t)
#define STRATA_BIN_COMPARE(F) STRATA_BIN_FLOAT(F, bool) STRATA_BIN_INT(F, bool) STRATA_BIN(F, bool, bool)
STRATA_BIN_NUMERIC(math::Add)
STRATA_BIN_NUMERIC(math::Sub)
STRATA_BIN_NUMERIC(math::Mul)
STRATA_BIN_NUMERIC(math::Maximum)
STRATA_BIN_NUMERIC(math::Minimum)
STRATA_BIN_NUMERIC(math::Pow)
STRATA_BIN_NUMERIC(math::Fmod)
STRATA_BIN_NUMERIC(math::Remainder)
STRATA_BIN(math::Atan2, Half, Half)
STRATA_BIN(math::Atan2, BFloat16, BFloat16)
STRATA_BIN(math::Atan2, float, float)
STRATA_BIN(math::Atan2, double, double)
STRATA_BIN(math::Div, Half, Half)
STRATA_BIN(math::Div, BFloat16, BFloat16)
STRATA_BIN(math::Div, float, float)
STRATA_BIN(math::Div, double, double)
STRATA_BIN_COMPARE(math::Eq)
STRATA_BIN_COMPARE(math::Ne)
STRATA_BIN_COMPARE(math::Lt)
STRATA_BIN_COMPARE(math::Le)
STRATA_BIN_COMPARE(math::Gt)
STRATA_BIN_COMPARE(math::Ge)
STRATA_BIN(math::LogicalAnd, bool, bool)
STRATA_BIN(math::LogicalOr, bool, bool)
#undef STRATA_BIN_COMPARE
#undef STRATA_BIN_NUMERIC
#undef STRATA_BIN_INT
#undef STRATA_BIN_FLOAT
#undef STRATA_BIN

template cudaError_t where<Half>(const StridedLoop<4>&, cudaStream_t, Half*, const bool*, const Half*, const Half*);
template cudaError_t where<BFloat16>(const StridedLoop<4>&, cudaStream_t, BFloat16*, const bool*, const BFloat16*,
                                     const BFloat16*);
template cudaError_t where<float>(const StridedLoop<4>&, cudaStream_t, float*, const bool*, const float*, const float*);
template cudaError_t where<double>(const StridedLoop<4>&, cudaStream_t, double*, const bool*, const double*,
                                   const double*);
template cudaError_t where<int64_t>(const StridedLoop<4>&, cudaStream_t, int64_t*, const bool*, const int64_t*,
                                    const int64_t*);
template cudaError_t where<int32_t>(const StridedLoop<4>&, cudaStream_t, int32_t*, const bool*, const int32_t*,
                                    const int32_t*);
template cudaError_t where<int8_t>(const StridedLoop<4>&, cudaStream_t, int8_t*, const bool*, const int8_t*,
                                   const int8_t*);
template cudaError_t where<uint8_t>(const StridedLoop<4>&, cudaStream_t, uint8_t*, const bool*, const uint8_t*,
                                    const uint8_t*);
template cudaError_t where<bool>(const StridedLoop<4>&, cudaStream_t, bool*, const bool*, const bool*, const bool*);

template cudaError_t isclose<Half>(const StridedLoop<3>&, cudaStream_t, bool*, const Half*, const Half*, double, double, bool);
template cudaError_t isclose<BFloat16>(const StridedLoop<3>&, cudaStream_t, bool*, const BFloat16*, const BFloat16*, double, double, bool);
template cudaError_t isclose<float>(const StridedLoop<3>&, cudaStream_t, bool*, const float*, const float*, double, double, bool);
template cudaError_t isclose<double>(const StridedLoop<3>&, cudaStream_t, bool*, const double*, const double*, double, double, bool);
template cudaError_t isclose<int64_t>(const StridedLoop<3>&, cudaStream_t, bool*, const int64_t*, const int64_t*, double, double, bool);
template cudaError_t isclose<int32_t>(const StridedLoop<3>&, cudaStream_t, bool*, const int32_t*, const int32_t*, double, double, bool);
template cudaError_t isclose<int8_t>(const StridedLoop<3>&, cudaStream_t, bool*, const int8_t*, const int8_t*, double, double, bool);
template cudaError_t isclose<uint8_t>(const StridedLoop<3>&, cudaStream_t, bool*, const uint8_t*, const uint8_t*, double, double, bool);
template cudaError_t isclose<bool>(const StridedLoop<3>&, cudaStream_t, bool*, const bool*, const bool*, double, double, bool);

}  // namespace strata::cuda_kernels
