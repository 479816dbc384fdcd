// Memory-format policy of the image ops (convolution, pooling, batch norm): which layout a
// result takes, and how inputs are brought to a dense layout that the kernels read in place.
//
// Note [Channels-last results]
// An op's result takes its input's memory format, as in PyTorch: channels-last when the
// input is channels-last (and not also plain contiguous, as a tensor with C == 1 or
// H == W == 1 can be both), or, for a non-dense input, when its channel stride is the
// smallest. Inputs that are not dense in that format are copied into it once; dense ones
// are passed to the kernels as they are.
#pragma once

#include <strata/autograd/grad_mode.hpp>
#include <strata/core/tensor.hpp>

#include "core/tensor_internal.h"

namespace strata::nn::detail {

using strata::detail::suggested_format;  // the rule copies follow too

/// t itself when dense in `format`, else a copy that is (not recorded by autograd).
inline Tensor dense_in(const Tensor& t, MemoryFormat format) {
  if (t.is_contiguous(format)) return t;
  NoGradGuard no_grad;
  return t.to(format);
}

/// A new uninitialised 4-d tensor of `shape` (N, C, H, W) laid out in `format`.
inline Tensor empty_in(const Shape& shape, DType dtype, Device device, MemoryFormat format) {
  return strata::detail::make_tensor_as(shape, dtype, device, shape.size() == 4 ? format : MemoryFormat::Contiguous);
}

/// The strides of a dense 4-d tensor in `format`, with the canonical value also for size-1
/// dims (whose stride any value may hold), so kernels see one description per layout.
inline Strides canonical_strides(const Shape& s, MemoryFormat format) {
  if (format == MemoryFormat::Contiguous) return contiguous_strides(s);
  return {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]};
}

}  // namespace strata::nn::detail
