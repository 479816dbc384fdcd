// The depth-wise steps that put the composed 3-d convolutions together from the 2-d ones
// (Note [3-d over 2-d] in nn/conv3d.cpp, which defines tap_depths and gather_depths).
#pragma once

#include <cstdint>
#include <vector>

#include <strata/core/tensor.hpp>
#include <strata/nn/functional_conv3d.hpp>

namespace strata::nn::detail {

/// Whether every component of s lies in [lo, 2^31), which keeps every size product inside int64.
inline bool in_arg_range(Size3 s, int64_t lo) {
  constexpr int64_t kMaxArg = int64_t(1) << 31;
  return s.d >= lo && s.h >= lo && s.w >= lo && s.d < kMaxArg && s.h < kMaxArg && s.w < kMaxArg;
}

/// The depth slice that tap t of output o reads, o * stride - pad + t * dil, at [o * k + t]; -1
/// where that lies outside [0, depth) (the padding).
std::vector<int64_t> tap_depths(int64_t depth, int64_t out, int64_t k, int64_t stride, int64_t pad, int64_t dil);

/// x (N, C, D, *) -> (N, C, rows.size(), *): the depth slices `rows`, a slice of `fill` for -1.
Tensor gather_depths(const Tensor& x, std::vector<int64_t> rows, double fill);

/// Whether conv3d and conv_transpose3d of x run the native 3-d ops (nn/conv3d_native.cpp): on for
/// x's device (functional::set_native_conv3d) and a kernel for its dtype (or float32's, for the
/// half types on the CPU).
bool native_conv3d_applies(const Tensor& x);

/// conv3d of a checked 5-d input through the native ops, its output of shape `out`; differentiable.
Tensor native_conv3d(const Tensor& input, const Tensor& weight, const Tensor& bias, const functional::Conv3dArgs& args,
                     const Shape& out);

/// conv_transpose3d of a checked 5-d input through the native ops, its output of shape `out`.
Tensor native_conv_transpose3d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                               const functional::ConvTranspose3dArgs& args, const Shape& out);

}  // namespace strata::nn::detail
