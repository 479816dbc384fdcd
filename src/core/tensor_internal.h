// Building blocks for tensors that the public API does not expose.
#pragma once

#include <string_view>

#include <strata/core/tensor.hpp>

namespace strata::detail {

/// A new contiguous tensor with uninitialised memory.
Tensor make_tensor(const Shape& shape, DType dtype, Device device, Allocator* allocator = nullptr);
/// A tensor sharing base's storage with the given layout (unchecked: callers check bounds).
Tensor make_view(const Tensor& base, Shape shape, Strides strides, int64_t offset);
/// Raises Error naming `op` unless every element of the layout lies inside `storage`.
void check_in_bounds(const Storage& storage, const Shape& shape, const Strides& strides, int64_t offset, DType dtype,
                     std::string_view op);

}  // namespace strata::detail
