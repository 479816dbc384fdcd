// Elementwise ops of two tensors (or a tensor and a scalar) with NumPy broadcasting and
// PyTorch type promotion, and `where`.
#pragma once

#include <strata/core/tensor.hpp>

namespace strata {

/// The dtype PyTorch gives `a op b`: tensors promote by category and width; a scalar only
/// lifts the category (an int tensor times 2.5 is float32, a float16 tensor times 2.5 stays
/// float16).
STRATA_API DType result_type(const Tensor& a, const Tensor& b);
STRATA_API DType result_type(const Tensor& a, Scalar b);

STRATA_API Tensor add(const Tensor& a, const Tensor& b, Scalar alpha = 1);
STRATA_API Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha = 1);
STRATA_API Tensor mul(const Tensor& a, const Tensor& b);
/// True division: integer inputs give float32.
STRATA_API Tensor div(const Tensor& a, const Tensor& b);
STRATA_API Tensor maximum(const Tensor& a, const Tensor& b);
STRATA_API Tensor minimum(const Tensor& a, const Tensor& b);
STRATA_API Tensor pow(const Tensor& a, const Tensor& b);
STRATA_API Tensor eq(const Tensor& a, const Tensor& b);
STRATA_API Tensor ne(const Tensor& a, const Tensor& b);
STRATA_API Tensor lt(const Tensor& a, const Tensor& b);
STRATA_API Tensor le(const Tensor& a, const Tensor& b);
STRATA_API Tensor gt(const Tensor& a, const Tensor& b);
STRATA_API Tensor ge(const Tensor& a, const Tensor& b);
STRATA_API Tensor logical_and(const Tensor& a, const Tensor& b);
STRATA_API Tensor logical_or(const Tensor& a, const Tensor& b);
/// Elementwise cond ? a : b, broadcasting all three.
/// The remainder of a / b: remainder's with the floored quotient (b's sign, Python's %, and
/// operator%), fmod's with the truncated one (a's sign, C's fmod), as torch.remainder and
/// torch.fmod. Integer operands raise on a zero divisor.
STRATA_API Tensor remainder(const Tensor& a, const Tensor& b);
STRATA_API Tensor fmod(const Tensor& a, const Tensor& b);
/// The angle of the point (b, a), in (-pi, pi]; integer operands give float32.
STRATA_API Tensor atan2(const Tensor& a, const Tensor& b);
STRATA_API Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
STRATA_API Tensor where(const Tensor& cond, const Tensor& a, Scalar b);
STRATA_API Tensor where(const Tensor& cond, Scalar a, const Tensor& b);

/// The scalar forms make a 0-d tensor of the promoted dtype and broadcast it, except that
/// float16/bfloat16 arithmetic with a scalar the 16-bit type cannot hold runs in float32 and
/// rounds once.
STRATA_API Tensor add(const Tensor& a, Scalar b);
STRATA_API Tensor sub(const Tensor& a, Scalar b);
STRATA_API Tensor mul(const Tensor& a, Scalar b);
STRATA_API Tensor div(const Tensor& a, Scalar b);
STRATA_API Tensor maximum(const Tensor& a, Scalar b);
STRATA_API Tensor minimum(const Tensor& a, Scalar b);
STRATA_API Tensor remainder(const Tensor& a, Scalar b);
STRATA_API Tensor fmod(const Tensor& a, Scalar b);
STRATA_API Tensor eq(const Tensor& a, Scalar b);
STRATA_API Tensor ne(const Tensor& a, Scalar b);
STRATA_API Tensor lt(const Tensor& a, Scalar b);
STRATA_API Tensor le(const Tensor& a, Scalar b);
STRATA_API Tensor gt(const Tensor& a, Scalar b);
STRATA_API Tensor ge(const Tensor& a, Scalar b);

/// Fills the elements where mask is true (mask broadcasts to x).
STRATA_API Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value);

STRATA_API Tensor operator+(const Tensor& a, const Tensor& b);
STRATA_API Tensor operator-(const Tensor& a, const Tensor& b);
STRATA_API Tensor operator*(const Tensor& a, const Tensor& b);
STRATA_API Tensor operator/(const Tensor& a, const Tensor& b);
STRATA_API Tensor operator+(const Tensor& a, Scalar b);
STRATA_API Tensor operator-(const Tensor& a, Scalar b);
STRATA_API Tensor operator*(const Tensor& a, Scalar b);
STRATA_API Tensor operator/(const Tensor& a, Scalar b);
STRATA_API Tensor operator+(Scalar a, const Tensor& b);
STRATA_API Tensor operator-(Scalar a, const Tensor& b);
STRATA_API Tensor operator*(Scalar a, const Tensor& b);
STRATA_API Tensor operator/(Scalar a, const Tensor& b);
STRATA_API Tensor operator%(const Tensor& a, const Tensor& b);
STRATA_API Tensor operator%(const Tensor& a, Scalar b);
STRATA_API Tensor operator==(const Tensor& a, const Tensor& b);
STRATA_API Tensor operator!=(const Tensor& a, const Tensor& b);
STRATA_API Tensor operator<(const Tensor& a, const Tensor& b);
STRATA_API Tensor operator<=(const Tensor& a, const Tensor& b);
STRATA_API Tensor operator>(const Tensor& a, const Tensor& b);
STRATA_API Tensor operator>=(const Tensor& a, const Tensor& b);
STRATA_API Tensor operator==(const Tensor& a, Scalar b);
STRATA_API Tensor operator!=(const Tensor& a, Scalar b);
STRATA_API Tensor operator<(const Tensor& a, Scalar b);
STRATA_API Tensor operator<=(const Tensor& a, Scalar b);
STRATA_API Tensor operator>(const Tensor& a, Scalar b);
STRATA_API Tensor operator>=(const Tensor& a, Scalar b);
/// On bool tensors (masks): logical and, or, exclusive or. strata has no bitwise integer ops,
/// so other dtypes raise Error.
STRATA_API Tensor operator&(const Tensor& a, const Tensor& b);
STRATA_API Tensor operator|(const Tensor& a, const Tensor& b);
STRATA_API Tensor operator^(const Tensor& a, const Tensor& b);

/// start + weight * (end - start), in PyTorch's two forms (exact at weight 0 and 1).
STRATA_API Tensor lerp(const Tensor& start, const Tensor& end, Scalar weight);
STRATA_API Tensor lerp(const Tensor& start, const Tensor& end, const Tensor& weight);
/// x + value * t1 * t2, and x + value * t1 / t2.
STRATA_API Tensor addcmul(const Tensor& x, const Tensor& t1, const Tensor& t2, Scalar value = 1);
STRATA_API Tensor addcdiv(const Tensor& x, const Tensor& t1, const Tensor& t2, Scalar value = 1);
/// cond ? a : b with two scalars: float32 when either is floating, else int64 (bool for two bools).
STRATA_API Tensor where(const Tensor& cond, Scalar a, Scalar b);
/// masked_fill with a 0-d tensor as the value, differentiable with respect to it.
STRATA_API Tensor masked_fill(const Tensor& x, const Tensor& mask, const Tensor& value);

}  // namespace strata
