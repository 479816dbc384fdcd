// Shape checks shared by the view ops and the ops that reshape distributed tensors.
#pragma once

#include <string_view>

#include <strata/core/shape.hpp>

namespace strata {

/// `shape` with its one -1 entry inferred from `numel`; raises (naming `op`) where the count differs.
Shape infer_shape(const Shape& shape, int64_t numel, std::string_view op);

}  // namespace strata
