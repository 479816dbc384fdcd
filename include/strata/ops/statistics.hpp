// Order statistics and distinct values: median, nanmedian, quantile, nanquantile, unique and
// unique_consecutive, with PyTorch's semantics. All are composed of sort, gather, cumsum and
// comparisons, so they run on every device; median and quantile are differentiable through
// the elements they select (and quantile through its interpolation), unique is not.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include <strata/core/tensor.hpp>

namespace strata {

/// Values and int64 indices of median / nanmedian along a dim, like torch.median(x, dim).
struct MedianResult {
  Tensor values;
  Tensor indices;
};

/// What unique returns: the distinct values (or slices along `dim`); with return_inverse, the
/// int64 position in `values` of every element (x's shape without dim, x.size(dim) with it);
/// with return_counts, how often each value occurs. Fields not asked for are undefined.
struct UniqueResult {
  Tensor values;
  Tensor inverse;
  Tensor counts;
};

/// The lower of the two middle values of all elements (0-d), NaN when there is a NaN; an
/// empty floating input gives NaN. The gradient is shared evenly among the elements equal to
/// the result, as PyTorch's.
STRATA_API Tensor median(const Tensor& x);
/// Median along `dim` and its index: with ties, the middle one in (value, position) order;
/// for a row holding NaN, NaN and the index of its first NaN. The gradient flows to the
/// element at the index.
STRATA_API MedianResult median(const Tensor& x, int64_t dim, bool keepdim = false);
/// As median, ignoring NaNs; a row of NaNs only gives NaN (index 0 along a dim).
STRATA_API Tensor nanmedian(const Tensor& x);
STRATA_API MedianResult nanmedian(const Tensor& x, int64_t dim, bool keepdim = false);

/// The q-th quantiles of x (float32 or float64) over all elements or along `dim`; q in [0, 1],
/// a double or a 0-d / 1-d tensor of x's dtype and device. The result holds q's dims first,
/// then x's dims without `dim` (kept as 1 with keepdim; all of them without `dim`). The
/// position q * (n - 1) between two sorted values is resolved by `interpolation`: "linear",
/// "lower", "higher", "midpoint" or "nearest" (halves to even). quantile gives NaN for a row
/// holding NaN; nanquantile ignores NaNs (NaN for a row of NaNs only). Differentiable through
/// the selected values and the interpolation.
STRATA_API Tensor quantile(const Tensor& x, double q, std::optional<int64_t> dim = std::nullopt, bool keepdim = false,
                           std::string_view interpolation = "linear");
STRATA_API Tensor quantile(const Tensor& x, const Tensor& q, std::optional<int64_t> dim = std::nullopt,
                           bool keepdim = false, std::string_view interpolation = "linear");
STRATA_API Tensor nanquantile(const Tensor& x, double q, std::optional<int64_t> dim = std::nullopt,
                              bool keepdim = false, std::string_view interpolation = "linear");
STRATA_API Tensor nanquantile(const Tensor& x, const Tensor& q, std::optional<int64_t> dim = std::nullopt,
                              bool keepdim = false, std::string_view interpolation = "linear");

/// The distinct elements of x in ascending order (NaNs each distinct, last), or with `dim` the
/// distinct slices along dim in lexicographic order. Always sorted, as PyTorch on the CPU:
/// `sorted` is accepted for compatibility. Waits for the count (a device-to-host copy).
STRATA_API UniqueResult unique(const Tensor& x, bool sorted = true, bool return_inverse = false,
                               bool return_counts = false, std::optional<int64_t> dim = std::nullopt);
/// As unique, merging only runs of equal neighbours, in their order.
STRATA_API UniqueResult unique_consecutive(const Tensor& x, bool return_inverse = false, bool return_counts = false,
                                           std::optional<int64_t> dim = std::nullopt);

}  // namespace strata
