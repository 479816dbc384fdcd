// The depth-wise steps that put the 3-d convolutions and pooling ops together from the 2-d ones
// (Note [3-d over 2-d] in nn/conv3d.cpp, which defines depth_taps; nn/pooling3d.cpp defines
// depth_weighted).
#pragma once

#include <cstdint>
#include <vector>

#include <strata/core/tensor.hpp>

namespace strata::nn::detail {

/// x (N, C, D, *) -> (N, C, out * k, *), ordered (output, tap): tap t of output o is the depth
/// slice o * stride - pad + t * dil, or a slice of `fill` where that lies outside [0, D).
Tensor depth_taps(const Tensor& x, int64_t out, int64_t k, int64_t stride, int64_t pad, int64_t dil, double fill);

/// x (N, C, D, H, W) -> (N, C, out, H, W): output depth o is sum_d weights[o * D + d] * x[:, :, d].
Tensor depth_weighted(const Tensor& x, const std::vector<double>& weights, int64_t out);

}  // namespace strata::nn::detail
