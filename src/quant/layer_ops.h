// What the quantized forms need to know of the layers they serve (nn::Linear, nn::Conv2d), as
// overloads, so one template form serves both: the float forward with a given input and weight,
// the number of output channels (the weight's dim 0) and the layer's name.
#pragma once

#include <strata/nn/batchnorm.hpp>
#include <strata/nn/conv.hpp>
#include <strata/nn/functional.hpp>
#include <strata/nn/linear.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/unary.hpp>

namespace strata::quant::detail {

inline nn::functional::Conv2dArgs conv_args(const nn::Conv2d& c) {
  return {c.options.stride, c.options.padding, c.options.dilation, c.options.groups};
}

/// The layer's forward with weight w (and bias b: the layer's unless given).
inline Tensor float_forward(const nn::Linear& l, const Tensor& x, const Tensor& w) {
  return nn::functional::linear(x, w, l.bias);
}
inline Tensor float_forward(const nn::Linear&, const Tensor& x, const Tensor& w, const Tensor& b) {
  return nn::functional::linear(x, w, b);
}
/// Zero padding only: quantize refuses other padding modes.
inline Tensor float_forward(const nn::Conv2d& c, const Tensor& x, const Tensor& w) {
  return nn::functional::conv2d(x, w, c.bias, conv_args(c));
}
inline Tensor float_forward(const nn::Conv2d& c, const Tensor& x, const Tensor& w, const Tensor& b) {
  return nn::functional::conv2d(x, w, b, conv_args(c));
}
/// The dim of an output of `dims` dims that holds the channels: a Linear's last, a Conv2d's 1.
inline int64_t output_channel_dim(const nn::Linear&, int64_t dims) { return dims - 1; }
inline int64_t output_channel_dim(const nn::Conv2d&, int64_t dims) { return dims == 3 ? 0 : 1; }
/// A shape of `dims` ones but `channels` at `dim`, to broadcast a per-channel vector.
inline Shape per_channel_shape(int64_t dims, int64_t dim, int64_t channels) {
  Shape s(static_cast<size_t>(dims), 1);
  s[static_cast<size_t>(dim)] = channels;
  return s;
}
/// gamma / sqrt(running_var + eps) of a batch norm (gamma 1 without affine), in w's dtype; the
/// gradient reaches gamma.
inline Tensor bn_scale(const nn::BatchNormBase& bn, const Tensor& w) {
  const Tensor inv_std = rsqrt(bn.running_var.detach().to(w.device(), w.dtype()) + bn.options.eps);
  return bn.weight.defined() ? bn.weight.to(w.dtype()) * inv_std : inv_std;
}

inline int64_t out_channels(const nn::Linear& l) { return l.out_features; }
inline int64_t out_channels(const nn::Conv2d& c) { return c.out_channels; }
inline const char* layer_name(const nn::Linear*) { return "Linear"; }
inline const char* layer_name(const nn::Conv2d*) { return "Conv2d"; }

}  // namespace strata::quant::detail
