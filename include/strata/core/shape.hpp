// Shapes and strides (in elements), with the checked arithmetic every op uses on them.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <strata/core/export.hpp>

namespace strata {

using Shape = std::vector<int64_t>;
using Strides = std::vector<int64_t>;

/// Product of the sizes; raises Error naming `op` on a negative size or int64 overflow.
STRATA_API int64_t checked_numel(const Shape& shape, std::string_view op = "shape");
/// Row-major (C order) strides of a shape.
STRATA_API Strides contiguous_strides(const Shape& shape);
/// Maps a possibly negative dim into [0, ndim); raises Error naming `op` when out of range.
STRATA_API int64_t normalize_dim(int64_t dim, int64_t ndim, std::string_view op);
/// NumPy broadcasting of two shapes; raises Error naming `op` when they do not broadcast.
STRATA_API Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op);

}  // namespace strata
