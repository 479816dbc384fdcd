// The operand checks shared by the 2-d convolutions (nn/conv.cpp, which defines them) and the
// 3-d ones (nn/conv3d.cpp).
#pragma once

#include <strata/core/tensor.hpp>

namespace strata::nn::detail {

/// Raises Error naming `op` unless x is a batched or unbatched input with `spatial` (2 or 3)
/// spatial dims, w a weight of spatial + 2 dims with a non-empty kernel, and x, w and b (when
/// defined) share a floating dtype and a device.
void check_conv_operands(const char* op, const Tensor& x, const Tensor& w, const Tensor& b, int spatial);

}  // namespace strata::nn::detail
