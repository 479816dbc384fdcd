// The activations composed of elementwise ops (so both devices run them and autograd derives
// them), with torch.nn.functional's values and its gradients at the kinks: a kink's side is
// chosen by the `where` that picks the branch, and each branch reads its input clamped to its
// own side, so an unused branch cannot overflow and turn a zero gradient into 0 * inf = NaN.
// float16 and bfloat16 inputs compute in float32 and round once, as torch's kernels do (e^x of
// a 16-bit value overflows at 11.1 in float16). Also PReLU's layer.
#include <cmath>

#include <strata/amp/autocast.hpp>
#include <strata/nn/activation.hpp>
#include <strata/nn/functional.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/unary.hpp>

#include "nn/stable_math.h"

namespace strata::nn::functional {

namespace {

void check_floating(const char* op, const Tensor& x) {
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op);
  STRATA_CHECK(is_floating(x.dtype()), "[{}] takes floating tensors, got {}", op, dtype_name(x.dtype()));
}

// f(x) computed in float32 for a 16-bit x, the result rounded back to x's dtype.
template <class F>
Tensor in_float(const Tensor& x, F f) {
  if (x.dtype() != kFloat16 && x.dtype() != kBFloat16) return f(x);
  return f(x.to(kFloat32)).to(x.dtype());
}

Tensor below_zero(const Tensor& x) { return clamp(x, std::nullopt, 0); }

using detail::log1p_exp;

}  // namespace

Tensor elu(const Tensor& x, double alpha) {
  check_floating("elu", x);
  return in_float(x, [alpha](const Tensor& v) { return where(v > 0, v, alpha * expm1(below_zero(v))); });
}

Tensor selu(const Tensor& x) {
  check_floating("selu", x);
  // the constants of Klambauer et al., "Self-Normalizing Neural Networks" (2017), as torch's
  constexpr double kAlpha = 1.6732632423543772848170429916717, kScale = 1.0507009873554804934193349852946;
  return in_float(x, [](const Tensor& v) { return kScale * where(v > 0, v, kAlpha * expm1(below_zero(v))); });
}

Tensor celu(const Tensor& x, double alpha) {
  check_floating("celu", x);
  STRATA_CHECK(alpha != 0, "[celu] alpha must be nonzero");
  return in_float(x, [alpha](const Tensor& v) { return where(v > 0, v, alpha * expm1(below_zero(v) / alpha)); });
}

Tensor softplus(const Tensor& x, double beta, double threshold) {
  amp::detail::AutocastScope amp_scope("softplus", x);
  if (amp_scope.cast()) return softplus(amp_scope[0], beta, threshold);
  check_floating("softplus", x);
  STRATA_CHECK(beta != 0 && std::isfinite(beta), "[softplus] beta must be finite and nonzero, got {}", beta);
  return in_float(x, [beta, threshold](const Tensor& v) {
    const Tensor scaled = v * beta;
    // past the threshold the result is the input itself, as torch's (its gradient 1)
    return where(scaled > threshold, v, log1p(exp(clamp(scaled, std::nullopt, threshold))) / beta);
  });
}

Tensor mish(const Tensor& x) {
  check_floating("mish", x);
  return in_float(x, [](const Tensor& v) { return v * strata::tanh(log1p_exp(v)); });
}

Tensor logsigmoid(const Tensor& x) {
  check_floating("logsigmoid", x);
  return in_float(x, [](const Tensor& v) { return -log1p_exp(-v); });
}

Tensor hardtanh(const Tensor& x, double min_val, double max_val) {
  check_floating("hardtanh", x);
  STRATA_CHECK(min_val <= max_val, "[hardtanh] min_val ({}) must not exceed max_val ({})", min_val, max_val);
  return where(x <= min_val, min_val, where(x >= max_val, max_val, x));
}

Tensor relu6(const Tensor& x) {
  check_floating("relu6", x);
  return hardtanh(x, 0, 6);
}

Tensor hardsigmoid(const Tensor& x) {
  check_floating("hardsigmoid", x);
  return in_float(x, [](const Tensor& v) { return where(v <= -3, 0, where(v >= 3, 1, v / 6 + 0.5)); });
}

Tensor hardswish(const Tensor& x) {
  check_floating("hardswish", x);
  // torch's gradient is (2x + 3) / 6 on [-3, 3], both ends included
  return in_float(x, [](const Tensor& v) { return where(v < -3, 0, where(v <= 3, v * (v + 3) / 6, v)); });
}

Tensor softsign(const Tensor& x) {
  check_floating("softsign", x);
  return in_float(x, [](const Tensor& v) { return v / (abs(v) + 1); });
}

Tensor glu(const Tensor& x, int64_t dim) {
  check_floating("glu", x);
  STRATA_CHECK(x.dim() > 0, "[glu] needs at least one dim");
  const int64_t d = dim < 0 ? dim + x.dim() : dim;
  STRATA_CHECK(d >= 0 && d < x.dim(), "[glu] dim {} is out of range for an input of shape {}", dim, x.shape());
  STRATA_CHECK(x.size(d) % 2 == 0, "[glu] halves dim {}, whose size {} is odd (input of shape {})", dim, x.size(d),
               x.shape());
  return in_float(x, [d](const Tensor& v) {
    const std::vector<Tensor> halves = chunk(v, 2, d);
    return halves[0] * strata::sigmoid(halves[1]);
  });
}

Tensor prelu(const Tensor& x, const Tensor& weight) {
  check_floating("prelu", x);
  STRATA_CHECK(weight.defined(), "[prelu] weight is undefined");
  const int64_t n = weight.numel(), channels = x.dim() >= 2 ? x.size(1) : 1;
  STRATA_CHECK(n == 1 || n == channels,
               "[prelu] weight has {} elements; it needs 1 or one per channel (dim 1 of the input of shape {}: {})", n,
               x.shape(), channels);
  Tensor w = weight.reshape({n});
  if (n > 1) {  // one slope per channel: (C, 1, ..., 1) against x's dims after the batch
    Shape s(static_cast<size_t>(x.dim() - 1), 1);
    s[0] = n;
    w = w.view(s);
  } else {
    w = w.reshape({});
  }
  return where(x > 0, x, w * x);
}

}  // namespace strata::nn::functional

namespace strata::nn {

PReLU::PReLU(int64_t num_parameters, double init) : num_parameters(num_parameters) {
  STRATA_CHECK(num_parameters > 0, "[PReLU] num_parameters must be positive, got {}", num_parameters);
  weight = register_parameter("weight", full({num_parameters}, init));
}

Tensor PReLU::forward(const Tensor& input) { return functional::prelu(input, weight); }

}  // namespace strata::nn
