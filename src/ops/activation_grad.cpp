// The activation gradients: relu_backward(g, y), tanh_backward(g, y), sigmoid_backward(g, y),
// silu_backward(g, x), gelu_backward(g, x) and gelu_tanh_backward(g, x), each one fused pass
// (math in kernels/common/activation_grad_math.h) that the activations' backward calls in
// place of its composed form. Each is differentiable in turn, with its own backward written
// with strata ops, so double backward through the activations still works.
#include "ops/activation_grad.h"

#include <strata/autograd/graph.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/unary.hpp>

#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/common/activation_grad_math.h"
#include "kernels/common/convert.h"
#include "kernels/cpu/elementwise.h"
#include "ops/dispatch.h"
#include "ops/loop.h"

namespace strata {

namespace {

template <class F>
void cpu_activation_grad(const KernelCall& call) {
  const Tensor& g = call.inputs[0];
  const Tensor& saved = call.inputs[1];
  Tensor& out = call.outputs[0];
  auto loop = make_loop<3>(out, {&g, &saved}, "activation_grad");
  dispatch<DTypeSet::Floating>(g.dtype(), "activation_grad", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    cpu::elementwise(loop, static_cast<T*>(out.data()),
                     [](T a, T b) { return static_cast<T>(F{}(static_cast<C>(a), static_cast<C>(b))); },
                     static_cast<const T*>(g.data()), static_cast<const T*>(saved.data()));
  });
}

// g and the saved tensor broadcast together and share a floating dtype.
Tensor activation_grad(OpId op, const Tensor& g, const Tensor& saved) {
  std::string_view name = op_name(op);
  STRATA_CHECK(g.defined() && saved.defined(), "[{}] input tensor is undefined", name);
  STRATA_CHECK(g.device() == saved.device(), "[{}] inputs are on different devices: {} and {}", name, g.device(),
               saved.device());
  DType t = promote_types(g.dtype(), saved.dtype());
  STRATA_CHECK(is_floating(t), "[{}] needs floating-point tensors, got {} and {}", name, g.dtype(), saved.dtype());
  Shape shape = broadcast_shapes(g.shape(), saved.shape(), name);
  const Tensor ins[2] = {g.to(t), saved.to(t)};
  Tensor out = detail::make_tensor(shape, t, g.device());
  run_kernel(op, t, KernelCall{ins, {&out, 1}});
  return out;
}

using autograd::Grads;
using autograd::Saved;

// Runs op(g, saved) and records its backward: every one of these is linear in g, so the
// gradient with respect to g is op(gg, saved); with respect to the saved tensor it is
// gg * g * d2(saved), d2 being the activation's second derivative written with strata ops
// (nullptr: the saved tensor gets none).
template <class D2>
Tensor fused(const char* name, OpId op, const Tensor& g, const Tensor& saved, D2 d2) {
  Tensor out = activation_grad(op, g, saved);
  autograd::record(name, {g, saved}, {out}, {g, saved}, [op, d2](const Grads& gg, const Saved& s) {
    Tensor d_saved;
    if constexpr (!std::is_same_v<D2, std::nullptr_t>) d_saved = gg[0] * s[0] * d2(s[1]);
    return Grads{activation_grad(op, gg[0], s[1]), d_saved};
  });
  return out;
}

constexpr double kInvSqrt2Pi = math::kGeluInvSqrt2Pi, kK = math::kGeluTanhK, kC = math::kGeluTanhC;

}  // namespace

namespace detail {
void register_activation_grad_kernels(KernelTable& table) {
  constexpr auto CPU = DeviceType::CPU;
  table.set(OpId::relu_backward, CPU, kFloatDTypes, cpu_activation_grad<math::ReluBackward>);
  table.set(OpId::tanh_backward, CPU, kFloatDTypes, cpu_activation_grad<math::TanhBackward>);
  table.set(OpId::sigmoid_backward, CPU, kFloatDTypes, cpu_activation_grad<math::SigmoidBackward>);
  table.set(OpId::silu_backward, CPU, kFloatDTypes, cpu_activation_grad<math::SiluBackward>);
  table.set(OpId::gelu_backward, CPU, kFloatDTypes, cpu_activation_grad<math::GeluBackward>);
  table.set(OpId::gelu_tanh_backward, CPU, kFloatDTypes, cpu_activation_grad<math::GeluTanhBackward>);
}
}  // namespace detail

Tensor relu_backward(const Tensor& g, const Tensor& y) {
  return fused("relu_backward", OpId::relu_backward, g, y, nullptr);
}
Tensor tanh_backward(const Tensor& g, const Tensor& y) {
  return fused("tanh_backward", OpId::tanh_backward, g, y, [](const Tensor& y) { return y * -2; });
}
Tensor sigmoid_backward(const Tensor& g, const Tensor& y) {
  return fused("sigmoid_backward", OpId::sigmoid_backward, g, y, [](const Tensor& y) { return 1 - y * 2; });
}
// silu'' = s (1 - s) (2 + x (1 - 2 s)) with s = sigmoid(x)
Tensor silu_backward(const Tensor& g, const Tensor& x) {
  return fused("silu_backward", OpId::silu_backward, g, x, [](const Tensor& x) {
    Tensor s = sigmoid(x);
    return s * (1 - s) * (2 + x * (1 - s * 2));
  });
}
// gelu'' = phi(x) (2 - x^2)
Tensor gelu_backward(const Tensor& g, const Tensor& x) {
  return fused("gelu_backward", OpId::gelu_backward, g, x, [](const Tensor& x) {
    Tensor x2 = x * x;
    return exp(x2 * -0.5) * kInvSqrt2Pi * (2 - x2);
  });
}
// With u = k (x + c x^3), t = tanh(u): gelu_tanh'' = (1 - t^2) (u' - x t u'^2 + 0.5 x u''),
// u' = k (1 + 3 c x^2), u'' = 6 k c x.
Tensor gelu_tanh_backward(const Tensor& g, const Tensor& x) {
  return fused("gelu_tanh_backward", OpId::gelu_tanh_backward, g, x, [](const Tensor& x) {
    Tensor x2 = x * x;
    Tensor t = tanh((x + x2 * x * kC) * kK);
    Tensor du = (1 + x2 * (3 * kC)) * kK;
    return (1 - t * t) * (du - x * t * du * du + x2 * (3 * kK * kC));
  });
}

}  // namespace strata
