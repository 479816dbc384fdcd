// Whole-tensor comparisons: isclose (elementwise), allclose and equal (one bool).
#pragma once

#include <strata/core/tensor.hpp>

namespace strata {

/// Parameters of the isclose kernel.
struct IsCloseParams {
  double rtol = 1e-5;
  double atol = 1e-8;
  bool equal_nan = false;
};

/// Elementwise |a - b| <= atol + rtol * |b| (bool), broadcasting a and b, after promoting
/// both to one dtype: floating values compared in float64, integers exactly (the tolerance
/// in float64). Equal infinities are close; NaN is close to
/// NaN only when equal_nan is set.
STRATA_API Tensor isclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8,
                          bool equal_nan = false);
/// True when every element of isclose(a, b, ...) is true.
STRATA_API bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8,
                         bool equal_nan = false);
/// True when a and b have the same shape and equal values (NaN equals nothing). Values of
/// different dtypes are compared after promotion.
STRATA_API bool equal(const Tensor& a, const Tensor& b);

}  // namespace strata
