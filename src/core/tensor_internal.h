// Building blocks for tensors that the public API does not expose.
#pragma once

#include <string_view>
#include <utility>

#include <strata/core/tensor.hpp>

namespace strata::detail {

/// The dtype float kernels compute in and keep statistics in (mean, 1/std, logsumexp) for a
/// floating dtype: float64 for float64, float32 for the rest (compute_t's dtype).
inline DType compute_dtype(DType t) { return t == kFloat64 ? kFloat64 : kFloat32; }

/// A new contiguous tensor with uninitialised memory.
Tensor make_tensor(const Shape& shape, DType dtype, Device device, Allocator* allocator = nullptr);
/// The layout a copy of t keeps, as PyTorch's preserve_format for the two layouts strata has:
/// channels-last for a 4-d tensor laid out so (and not also contiguous), or, not dense, whose
/// channel stride is the smallest (a slice of one); else contiguous. The image ops give their
/// results this layout too (Note [Channels-last results] in src/nn/memory_format.h).
MemoryFormat suggested_format(const Tensor& t);
/// make_tensor laid out in `format` (channels-last: NHWC storage viewed as NCHW).
Tensor make_tensor_as(const Shape& shape, DType dtype, Device device, MemoryFormat format);
/// A tensor sharing base's storage with the given layout (unchecked: callers check bounds).
Tensor make_view(const Tensor& base, Shape shape, Strides strides, int64_t offset);
/// Raises Error naming `op` unless every element of the layout lies inside `storage`.
void check_in_bounds(const Storage& storage, const Shape& shape, const Strides& strides, int64_t offset, DType dtype,
                     std::string_view op);

/// Raises Error naming `op` when two elements of `self`, a tensor about to be written, share
/// one address (a stride of 0 over more than one element: an expanded view).
void check_writable(const Tensor& self, std::string_view op);
/// True when t's elements fill their span of memory exactly once, in any dim order (contiguous,
/// channels-last, transposed), so writing into it in place touches each element alone.
bool is_dense(const Tensor& t);
/// Whether some elements of t share memory (a stride 0 over a dim of 2 or more: an expanded view).
bool elements_share_memory(const Tensor& t);

/// True when a and b are the very same view: one storage, dtype, offset, shape and strides.
bool same_view(const Tensor& a, const Tensor& b);

/// `src`, or a copy of it when it shares memory with `dst` (a tensor about to be written)
/// without being the very same view: an elementwise write could otherwise overwrite values
/// of `src` before they are read (a.add_(a.t()), a.copy_(a.t()), a row divided by its column).
Tensor unaliased(const Tensor& src, const Tensor& dst);

/// Clears p's gradient, as zero_grad does for Module and Optimizer: drops it (set_to_none), or
/// zeroes it in place, detached first (a gradient built with create_graph would otherwise keep
/// its graph alive and the next backward would add to a tensor with history).
void clear_grad(const Tensor& p, bool set_to_none);

/// The values an integer dtype holds, [lo, hi] (bool: [0, 1]); floating dtypes: the int64 range.
std::pair<int64_t, int64_t> integer_range(DType t);

/// Raises Error naming `op` unless `value` fits a tensor of dtype `t`: integer dtypes take
/// finite values whose integer part is in their range (floats and bool take any value).
void check_scalar_fits(Scalar value, DType t, std::string_view op);

/// check_scalar_fits, and for a value stored as it is (fill_, full, masked_fill) a finite
/// value past a floating dtype's largest finite one raises too, as in PyTorch: 7e4 does not
/// silently become inf in float16 (inf and NaN themselves are stored).
void check_fill_value(Scalar value, DType t, std::string_view op);

/// A 0-d tensor holding `value` as an operand of arithmetic: unlike full(), a floating value
/// past the dtype's range rounds to inf as the arithmetic would (x + 1e300 is inf in float32).
/// Integer range checks are the caller's (scalar_like in src/ops/binary.cpp).
Tensor scalar_operand(Scalar value, DType t, Device device);

}  // namespace strata::detail
