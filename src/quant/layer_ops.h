// What the quantized forms need to know of the layers they serve (nn::Linear, nn::Conv2d, nn::Conv1d,
// nn::ConvTranspose2d), as overloads, so one template form serves them all: the float forward with a
// given input and weight, the number of output channels, the weight with them on dim 0 and the name.
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

inline nn::functional::Conv1dArgs conv_args(const nn::Conv1d& c) {
  return {c.options.stride, c.options.padding, c.options.dilation, c.options.groups};
}
inline nn::functional::ConvTranspose2dArgs conv_args(const nn::ConvTranspose2d& c) {
  const auto& o = c.options;
  return {o.stride, o.padding, o.output_padding, o.groups, o.dilation};
}

/// A convolution as a 2-d one (Conv1d: height 1, the input gets a height dim of 1).
struct Conv2dGeometry {
  nn::Size2 kernel;
  nn::functional::Conv2dArgs args;
  bool one_d = false;
};
inline Conv2dGeometry as_conv2d(const nn::Conv2d& c) { return {c.kernel_size, conv_args(c)}; }
inline Conv2dGeometry as_conv2d(const nn::Conv1d& c) {
  const auto& o = c.options;
  return {{1, c.kernel_size}, {{1, o.stride}, {0, o.padding}, {1, o.dilation}, o.groups}, true};
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
inline Tensor float_forward(const nn::Conv1d& c, const Tensor& x, const Tensor& w) {
  return nn::functional::conv1d(x, w, c.bias, conv_args(c));
}
inline Tensor float_forward(const nn::Conv1d& c, const Tensor& x, const Tensor& w, const Tensor& b) {
  return nn::functional::conv1d(x, w, b, conv_args(c));
}
inline Tensor float_forward(const nn::ConvTranspose2d& c, const Tensor& x, const Tensor& w) {
  return nn::functional::conv_transpose2d(x, w, c.bias, conv_args(c));
}
inline Tensor float_forward(const nn::ConvTranspose2d& c, const Tensor& x, const Tensor& w, const Tensor& b) {
  return nn::functional::conv_transpose2d(x, w, b, conv_args(c));
}
/// The dim of an output of `dims` dims that holds the channels: a Linear's last, a Conv2d's 1.
inline int64_t output_channel_dim(const nn::Linear&, int64_t dims) { return dims - 1; }
inline int64_t output_channel_dim(const nn::Conv2d&, int64_t dims) { return dims == 3 ? 0 : 1; }
inline int64_t output_channel_dim(const nn::Conv1d&, int64_t dims) { return dims == 2 ? 0 : 1; }
inline int64_t output_channel_dim(const nn::ConvTranspose2d&, int64_t dims) { return dims == 3 ? 0 : 1; }

/// The weight with the output channels on dim 0, which per-channel weight quantization reads: the
/// layer's own, but a transposed convolution's (in, out / groups, kH, kW) as (out, in / groups, kH, kW),
/// the weight of the convolution it is the transpose of (differentiable; from_out_major undoes it).
template <class Layer>
Tensor out_major(const Layer&, const Tensor& w) {
  return w;
}
template <class Layer>
Tensor from_out_major(const Layer&, const Tensor& w) {
  return w;
}
inline Tensor out_major(const nn::ConvTranspose2d& c, const Tensor& w) {
  const int64_t G = c.options.groups, in_g = c.in_channels / G, out_g = c.out_channels / G;
  const int64_t kh = c.kernel_size.h, kw = c.kernel_size.w;
  return w.reshape({G, in_g, out_g, kh, kw}).permute({0, 2, 1, 3, 4}).reshape({c.out_channels, in_g, kh, kw});
}
inline Tensor from_out_major(const nn::ConvTranspose2d& c, const Tensor& w) {
  const int64_t G = c.options.groups, in_g = c.in_channels / G, out_g = c.out_channels / G;
  const int64_t kh = c.kernel_size.h, kw = c.kernel_size.w;
  return w.reshape({G, out_g, in_g, kh, kw}).permute({0, 2, 1, 3, 4}).reshape({c.in_channels, out_g, kh, kw});
}
/// Whether the layer pads with zeros (quantization supports no other padding mode).
inline bool zero_padded(const nn::Linear&) { return true; }
template <class Conv>
bool zero_padded(const Conv& c) {
  return c.options.padding_mode == nn::PaddingMode::Zeros;
}
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
template <class Conv>
int64_t out_channels(const Conv& c) {
  return c.out_channels;
}
inline const char* layer_name(const nn::Linear*) { return "Linear"; }
inline const char* layer_name(const nn::Conv2d*) { return "Conv2d"; }
inline const char* layer_name(const nn::Conv1d*) { return "Conv1d"; }
inline const char* layer_name(const nn::ConvTranspose2d*) { return "ConvTranspose2d"; }

}  // namespace strata::quant::detail
