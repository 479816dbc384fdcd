// Elementwise ops of one tensor. Float ops on integer or bool tensors compute in float32,
// as PyTorch does.
#pragma once

#include <optional>

#include <strata/core/tensor.hpp>

namespace strata {

/// Parameters of pow_scalar (a = exponent), clamp (a = min, b = max) and leaky_relu (a).
struct UnaryScalarParams {
  double a = 0;
  double b = 0;
  /// clamp's bounds as integers (absent: the int64 limits), exact past 2^53, which integer
  /// tensors compare against when `integral` says both bounds are integers; pow's exponent of
  /// integer tensors in `ia`.
  int64_t ia = 0, ib = 0;
  bool integral = false;
};

STRATA_API Tensor neg(const Tensor& x);
STRATA_API Tensor abs(const Tensor& x);
STRATA_API Tensor sign(const Tensor& x);
STRATA_API Tensor exp(const Tensor& x);
STRATA_API Tensor log(const Tensor& x);
STRATA_API Tensor sqrt(const Tensor& x);
STRATA_API Tensor rsqrt(const Tensor& x);
STRATA_API Tensor sin(const Tensor& x);
STRATA_API Tensor cos(const Tensor& x);
STRATA_API Tensor tanh(const Tensor& x);
STRATA_API Tensor sigmoid(const Tensor& x);
STRATA_API Tensor relu(const Tensor& x);
/// GELU; approximate = "none" (erf, exact) or "tanh".
STRATA_API Tensor gelu(const Tensor& x, std::string_view approximate = "none");
STRATA_API Tensor silu(const Tensor& x);
STRATA_API Tensor erf(const Tensor& x);
/// log(1 + x) and exp(x) - 1, accurate near 0.
STRATA_API Tensor log1p(const Tensor& x);
STRATA_API Tensor expm1(const Tensor& x);
/// Rounding of floating values (round: halves to even, as PyTorch); an integer tensor gives
/// a copy. The gradient is 0.
STRATA_API Tensor floor(const Tensor& x);
STRATA_API Tensor ceil(const Tensor& x);
STRATA_API Tensor round(const Tensor& x);
STRATA_API Tensor trunc(const Tensor& x);
/// The circular and hyperbolic functions and their inverses, and the base-2 and base-10
/// logarithm and exponential; integer inputs give float32. Outside a function's domain the
/// result is NaN (asin(2), log2(-1)), as in PyTorch.
STRATA_API Tensor tan(const Tensor& x);
STRATA_API Tensor asin(const Tensor& x);
STRATA_API Tensor acos(const Tensor& x);
STRATA_API Tensor atan(const Tensor& x);
STRATA_API Tensor sinh(const Tensor& x);
STRATA_API Tensor cosh(const Tensor& x);
STRATA_API Tensor asinh(const Tensor& x);
STRATA_API Tensor acosh(const Tensor& x);
STRATA_API Tensor atanh(const Tensor& x);
STRATA_API Tensor log2(const Tensor& x);
STRATA_API Tensor log10(const Tensor& x);
STRATA_API Tensor exp2(const Tensor& x);
STRATA_API Tensor square(const Tensor& x);
STRATA_API Tensor reciprocal(const Tensor& x);
STRATA_API Tensor logical_not(const Tensor& x);
STRATA_API Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
STRATA_API Tensor pow(const Tensor& x, Scalar exponent);
/// Clamps to [min, max]; either bound may be absent.
STRATA_API Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max);
/// A copy converted to `dtype` (the same tensor when it already has it).
STRATA_API Tensor cast(const Tensor& x, DType dtype);

STRATA_API Tensor operator-(const Tensor& x);
/// Logical not of a bool tensor (a mask); other dtypes raise Error.
STRATA_API Tensor operator~(const Tensor& x);

/// Elementwise tests of floating values, as bool tensors (integers are always finite).
STRATA_API Tensor isnan(const Tensor& x);
STRATA_API Tensor isinf(const Tensor& x);
STRATA_API Tensor isfinite(const Tensor& x);
/// NaN, +inf and -inf replaced by `nan`, `posinf` and `neginf`; the infinities default to the
/// dtype's largest finite values, as in PyTorch. Differentiable (the replaced elements get 0).
STRATA_API Tensor nan_to_num(const Tensor& x, double nan = 0, std::optional<double> posinf = std::nullopt,
                             std::optional<double> neginf = std::nullopt);

}  // namespace strata
