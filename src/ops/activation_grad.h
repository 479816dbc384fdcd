// The fused activation gradients (src/ops/activation_grad.cpp), internal to the library: the
// activations' backward in src/ops/unary.cpp calls them. g is the gradient of the
// activation's output; y its output, x its input.
#pragma once

#include <strata/core/tensor.hpp>

namespace strata {

Tensor relu_backward(const Tensor& g, const Tensor& y);
Tensor tanh_backward(const Tensor& g, const Tensor& y);
Tensor sigmoid_backward(const Tensor& g, const Tensor& y);
Tensor silu_backward(const Tensor& g, const Tensor& x);
Tensor gelu_backward(const Tensor& g, const Tensor& x);
Tensor gelu_tanh_backward(const Tensor& g, const Tensor& x);

}  // namespace strata
