// CUDA unary kernels of the floating-point ops (exp, log, ..., erf, the roundings, the
// circular and hyperbolic functions) for f16, bf16, f32, f64.
#include "../common/unary_math.h"
#include "adapters.cuh"
#include "elementwise.cuh"
#include "elementwise_ops.h"

namespace strata::cuda_kernels {

template <class F, class T>
cudaError_t unary(const StridedLoop<2>& loop, cudaStream_t s, T* out, const T* in, F f) {
  return elementwise(loop, s, out, UnaryFn<F, T>{f}, in);
}

// Explicit instances, one per (functor, dtype) the registry uses.
#define STRATA_UNARY(F, T) template cudaError_t unary<F, T>(const StridedLoop<2>&, cudaStream_t, T*, const T*, F);
#define STRATA_UNARY_FLOAT(F) STRATA_UNARY(F, Half) STRATA_UNARY(F, BFloat16) STRATA_UNARY(F, float) STRATA_UNARY(F, double)
STRATA_UNARY_FLOAT(math::Exp)
STRATA_UNARY_FLOAT(math::Log)
STRATA_UNARY_FLOAT(math::Sqrt)
STRATA_UNARY_FLOAT(math::Rsqrt)
STRATA_UNARY_FLOAT(math::Sin)
STRATA_UNARY_FLOAT(math::Cos)
STRATA_UNARY_FLOAT(math::Tanh)
STRATA_UNARY_FLOAT(math::Sigmoid)
STRATA_UNARY_FLOAT(math::GeluErf)
STRATA_UNARY_FLOAT(math::GeluTanh)
STRATA_UNARY_FLOAT(math::Silu)
STRATA_UNARY_FLOAT(math::Reciprocal)
STRATA_UNARY_FLOAT(math::LeakyRelu)
STRATA_UNARY_FLOAT(math::Erf)
STRATA_UNARY_FLOAT(math::Log1p)
STRATA_UNARY_FLOAT(math::Expm1)
STRATA_UNARY_FLOAT(math::Floor)
STRATA_UNARY_FLOAT(math::Ceil)
STRATA_UNARY_FLOAT(math::Round)
STRATA_UNARY_FLOAT(math::Trunc)
STRATA_UNARY_FLOAT(math::Tan)
STRATA_UNARY_FLOAT(math::Asin)
STRATA_UNARY_FLOAT(math::Acos)
STRATA_UNARY_FLOAT(math::Atan)
STRATA_UNARY_FLOAT(math::Sinh)
STRATA_UNARY_FLOAT(math::Cosh)
STRATA_UNARY_FLOAT(math::Asinh)
STRATA_UNARY_FLOAT(math::Acosh)
STRATA_UNARY_FLOAT(math::Atanh)
STRATA_UNARY_FLOAT(math::Log2)
STRATA_UNARY_FLOAT(math::Log10)
STRATA_UNARY_FLOAT(math::Exp2)
#undef STRATA_UNARY_FLOAT
#undef STRATA_UNARY

}  // namespace strata::cuda_kernels
