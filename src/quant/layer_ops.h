// What the quantized forms need to know of the layers they serve (nn::Linear, nn::Conv2d), as
// overloads, so one template form serves both: the float forward with a given input and weight,
// the number of output channels (the weight's dim 0) and the layer's name.
#pragma once

#include <strata/nn/conv.hpp>
#include <strata/nn/functional.hpp>
#include <strata/nn/linear.hpp>

namespace strata::quant::detail {

inline nn::functional::Conv2dArgs conv_args(const nn::Conv2d& c) {
  return {c.options.stride, c.options.padding, c.options.dilation, c.options.groups};
}

inline Tensor float_forward(const nn::Linear& l, const Tensor& x, const Tensor& w) {
  return nn::functional::linear(x, w, l.bias);
}
/// Zero padding only: quantize refuses other padding modes.
inline Tensor float_forward(const nn::Conv2d& c, const Tensor& x, const Tensor& w) {
  return nn::functional::conv2d(x, w, c.bias, conv_args(c));
}

inline int64_t out_channels(const nn::Linear& l) { return l.out_features; }
inline int64_t out_channels(const nn::Conv2d& c) { return c.out_channels; }
inline const char* layer_name(const nn::Linear*) { return "Linear"; }
inline const char* layer_name(const nn::Conv2d*) { return "Conv2d"; }

}  // namespace strata::quant::detail
