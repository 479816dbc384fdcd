// Unary elementwise ops and their backward. Float ops (exp, log, ...) on integer or bool
// inputs compute in float32; the rest keep the input dtype. The per-element math is in
// kernels/common/unary_math.h; each backward is written with strata ops (so it runs on
// every device and can itself be differentiated), the activations' through the fused,
// differentiable gradient ops of activation_grad.cpp.
#include <limits>
#include <type_traits>

#include <strata/amp/autocast.hpp>
#include <strata/autograd/graph.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/unary.hpp>

#include <strata/ops/creation.hpp>

#include "autograd/views.h"
#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/common/convert.h"
#include "kernels/common/unary_math.h"
#include "kernels/common/vec_trig.h"
#include "kernels/cpu/elementwise.h"
#include "ops/activation_grad.h"
#include "ops/dispatch.h"
#include "ops/loop.h"
#include "ops/unary_functor.h"

namespace strata {

namespace {

// out = f(x) with out and x of the same dtype.
template <class F, DTypeSet Set>
void cpu_unary(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& out = call.outputs[0];
  const F f = unary_functor::make<F>(call);
  auto loop = make_loop<2>(out, {&x}, "unary");
  dispatch<Set>(x.dtype(), "unary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    cpu::elementwise(loop, static_cast<T*>(out.data()), [f](T v) { return static_cast<T>(f(static_cast<C>(v))); },
                     static_cast<const T*>(x.data()));
  });
}

// sin and cos: float math (float32, float16, bfloat16) takes the vectorized form of
// kernels/common/vec_trig.h on every block whose values are all below kVecTrigLimit in
// magnitude, and the library function, whose argument reduction is exact for any float, on
// the rest (and on NaN).
template <class F>
void cpu_sin_or_cos(const KernelCall& call) {
  static constexpr bool kSine = std::is_same_v<F, math::Sin>;
  const Tensor& x = call.inputs[0];
  Tensor& out = call.outputs[0];
  auto loop = make_loop<2>(out, {&x}, "unary");
  dispatch<DTypeSet::Floating>(x.dtype(), "unary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    auto slow = [](T v) { return static_cast<T>(F{}(static_cast<C>(v))); };
    if constexpr (std::is_same_v<C, float>) {
      auto fast = [](T v) { return static_cast<T>(kSine ? math::vec_sin(float(v)) : math::vec_cos(float(v))); };
      auto fast_ok = [](T v) { return std::fabs(float(v)) < math::kVecTrigLimit; };
      cpu::elementwise_guarded(loop, static_cast<T*>(out.data()), fast, slow, fast_ok, static_cast<const T*>(x.data()));
    } else {
      cpu::elementwise(loop, static_cast<T*>(out.data()), slow, static_cast<const T*>(x.data()));
    }
  });
}

void cpu_logical_not(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& out = call.outputs[0];
  auto loop = make_loop<2>(out, {&x}, "logical_not");
  dispatch(x.dtype(), "logical_not", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::elementwise(loop, static_cast<bool*>(out.data()), [](T v) { return !convert<bool>(v); },
                     static_cast<const T*>(x.data()));
  });
}

enum class Kind { Float, Keep };

Tensor unary_op(OpId op, const Tensor& x, Kind kind, const void* params = nullptr) {
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op_name(op));
  DType t = kind == Kind::Float && !is_floating(x.dtype()) ? kFloat32 : x.dtype();
  STRATA_CHECK(t != kBool, "[{}] not supported for bool tensors", op_name(op));
  Tensor in = x.to(t);
  Tensor out = detail::make_tensor(x.shape(), t, x.device());
  run_kernel(op, t, KernelCall{{&in, 1}, {&out, 1}, params});
  return out;
}

// `recorded` is the out-of-place op, which runs instead under autograd (Note [In-place under
// autograd]); it reads a copy of x, as clamp and relu keep their input or output.
const Tensor& unary_inplace(OpId op, const Tensor& written, const std::function<Tensor(const Tensor&)>& recorded,
                            const void* params = nullptr) {
  Tensor x = written;  // another handle on the same tensor
  STRATA_CHECK(x.dtype() != kBool, "[{}_] not supported for bool tensors", op_name(op));
  const std::string name = fmt::format("{}_", op_name(op));
  detail::check_writable(x, name);
  if (autograd::detail::inplace_records(x)) {
    autograd::record_inplace(x, name.c_str(), true, recorded);
    return written;
  }
  Tensor in = x, out = x;
  run_kernel(op, x.dtype(), KernelCall{{&in, 1}, {&out, 1}, params});
  x.storage()->bump_version();
  return written;
}

double bound(const std::optional<Scalar>& s, double fallback) { return s ? s->to_double() : fallback; }

// clamp's bounds, as doubles and, exactly, as integers when neither is floating.
UnaryScalarParams clamp_params(const std::optional<Scalar>& min, const std::optional<Scalar>& max) {
  const double inf = std::numeric_limits<double>::infinity();
  UnaryScalarParams p{bound(min, -inf), bound(max, inf)};
  p.ia = min ? min->to_int() : std::numeric_limits<int64_t>::min();
  p.ib = max ? max->to_int() : std::numeric_limits<int64_t>::max();
  p.integral = !(min && min->is_floating()) && !(max && max->is_floating());
  return p;
}

}  // namespace

namespace detail {
void register_unary_kernels(KernelTable& table) {
  constexpr auto CPU = DeviceType::CPU;
  table.set(OpId::exp, CPU, kFloatDTypes, cpu_unary<math::Exp, DTypeSet::Floating>);
  table.set(OpId::log, CPU, kFloatDTypes, cpu_unary<math::Log, DTypeSet::Floating>);
  table.set(OpId::sqrt, CPU, kFloatDTypes, cpu_unary<math::Sqrt, DTypeSet::Floating>);
  table.set(OpId::rsqrt, CPU, kFloatDTypes, cpu_unary<math::Rsqrt, DTypeSet::Floating>);
  table.set(OpId::sin, CPU, kFloatDTypes, cpu_sin_or_cos<math::Sin>);
  table.set(OpId::cos, CPU, kFloatDTypes, cpu_sin_or_cos<math::Cos>);
  table.set(OpId::tanh, CPU, kFloatDTypes, cpu_unary<math::Tanh, DTypeSet::Floating>);
  table.set(OpId::sigmoid, CPU, kFloatDTypes, cpu_unary<math::Sigmoid, DTypeSet::Floating>);
  table.set(OpId::gelu, CPU, kFloatDTypes, cpu_unary<math::GeluErf, DTypeSet::Floating>);
  table.set(OpId::gelu_tanh, CPU, kFloatDTypes, cpu_unary<math::GeluTanh, DTypeSet::Floating>);
  table.set(OpId::silu, CPU, kFloatDTypes, cpu_unary<math::Silu, DTypeSet::Floating>);
  table.set(OpId::reciprocal, CPU, kFloatDTypes, cpu_unary<math::Reciprocal, DTypeSet::Floating>);
  table.set(OpId::leaky_relu, CPU, kFloatDTypes, cpu_unary<math::LeakyRelu, DTypeSet::Floating>);
  table.set(OpId::log1p, CPU, kFloatDTypes, cpu_unary<math::Log1p, DTypeSet::Floating>);
  table.set(OpId::expm1, CPU, kFloatDTypes, cpu_unary<math::Expm1, DTypeSet::Floating>);
  table.set(OpId::floor, CPU, kFloatDTypes, cpu_unary<math::Floor, DTypeSet::Floating>);
  table.set(OpId::ceil, CPU, kFloatDTypes, cpu_unary<math::Ceil, DTypeSet::Floating>);
  table.set(OpId::round, CPU, kFloatDTypes, cpu_unary<math::Round, DTypeSet::Floating>);
  table.set(OpId::trunc, CPU, kFloatDTypes, cpu_unary<math::Trunc, DTypeSet::Floating>);
  table.set(OpId::tan, CPU, kFloatDTypes, cpu_unary<math::Tan, DTypeSet::Floating>);
  table.set(OpId::asin, CPU, kFloatDTypes, cpu_unary<math::Asin, DTypeSet::Floating>);
  table.set(OpId::acos, CPU, kFloatDTypes, cpu_unary<math::Acos, DTypeSet::Floating>);
  table.set(OpId::atan, CPU, kFloatDTypes, cpu_unary<math::Atan, DTypeSet::Floating>);
  table.set(OpId::sinh, CPU, kFloatDTypes, cpu_unary<math::Sinh, DTypeSet::Floating>);
  table.set(OpId::cosh, CPU, kFloatDTypes, cpu_unary<math::Cosh, DTypeSet::Floating>);
  table.set(OpId::asinh, CPU, kFloatDTypes, cpu_unary<math::Asinh, DTypeSet::Floating>);
  table.set(OpId::acosh, CPU, kFloatDTypes, cpu_unary<math::Acosh, DTypeSet::Floating>);
  table.set(OpId::atanh, CPU, kFloatDTypes, cpu_unary<math::Atanh, DTypeSet::Floating>);
  table.set(OpId::log2, CPU, kFloatDTypes, cpu_unary<math::Log2, DTypeSet::Floating>);
  table.set(OpId::log10, CPU, kFloatDTypes, cpu_unary<math::Log10, DTypeSet::Floating>);
  table.set(OpId::exp2, CPU, kFloatDTypes, cpu_unary<math::Exp2, DTypeSet::Floating>);
  table.set(OpId::neg, CPU, kNumericDTypes, cpu_unary<math::Neg, DTypeSet::Numeric>);
  table.set(OpId::abs, CPU, kNumericDTypes, cpu_unary<math::Abs, DTypeSet::Numeric>);
  table.set(OpId::sign, CPU, kNumericDTypes, cpu_unary<math::Sign, DTypeSet::Numeric>);
  table.set(OpId::relu, CPU, kNumericDTypes, cpu_unary<math::Relu, DTypeSet::Numeric>);
  table.set(OpId::square, CPU, kNumericDTypes, cpu_unary<math::Square, DTypeSet::Numeric>);
  table.set(OpId::pow_scalar, CPU, kNumericDTypes, cpu_unary<math::PowScalar, DTypeSet::Numeric>);
  table.set(OpId::clamp, CPU, kNumericDTypes, cpu_unary<math::Clamp, DTypeSet::Numeric>);
  table.set(OpId::erf, CPU, kFloatDTypes, cpu_unary<math::Erf, DTypeSet::Floating>);
  table.set(OpId::logical_not, CPU, kAllDTypes, cpu_logical_not);
}
}  // namespace detail

namespace {

using autograd::Grads;
using autograd::Saved;

// Records y = f(x) with backward g -> g * df(x, y), df written with strata ops.
template <class Df>
Tensor with_grad(const char* name, const Tensor& x, Tensor y, bool save_x, bool save_y, Df df) {
  if (!autograd::any_requires_grad({&x})) return y;
  std::vector<Tensor> saved;
  if (save_x) saved.push_back(x);
  if (save_y) saved.push_back(y);
  autograd::record(name, {x}, {y}, saved, [df, save_x](const Grads& g, const Saved& s) {
    const Tensor& sx = save_x ? s[0] : Tensor();
    const Tensor& sy = save_x ? (s.size() > 1 ? s[1] : Tensor()) : (s.empty() ? Tensor() : s[0]);
    return Grads{df(g[0], sx, sy)};
  });
  return y;
}

}  // namespace

Tensor neg(const Tensor& x) {
  return with_grad("neg", x, unary_op(OpId::neg, x, Kind::Keep), false, false,
                   [](const Tensor& g, const Tensor&, const Tensor&) { return -g; });
}
Tensor abs(const Tensor& x) {
  return with_grad("abs", x, unary_op(OpId::abs, x, Kind::Keep), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return g * sign(x); });
}
// Its gradient is 0, recorded as in PyTorch, so a loss reaching x only through sign has one.
Tensor sign(const Tensor& x) {
  if (x.defined() && x.dtype() == kBool) return x.clone();  // a bool is its own sign, as in PyTorch
  return with_grad("sign", x, unary_op(OpId::sign, x, Kind::Keep), false, false,
                   [](const Tensor& g, const Tensor&, const Tensor&) { return zeros_like(g); });
}
Tensor exp(const Tensor& x) {
  amp::detail::AutocastScope amp_scope("exp", x);
  if (amp_scope.cast()) return exp(amp_scope[0]);
  return with_grad("exp", x, unary_op(OpId::exp, x, Kind::Float), false, true,
                   [](const Tensor& g, const Tensor&, const Tensor& y) { return g * y; });
}
Tensor log(const Tensor& x) {
  amp::detail::AutocastScope amp_scope("log", x);
  if (amp_scope.cast()) return log(amp_scope[0]);
  return with_grad("log", x, unary_op(OpId::log, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return g / x; });
}
Tensor sqrt(const Tensor& x) {
  return with_grad("sqrt", x, unary_op(OpId::sqrt, x, Kind::Float), false, true,
                   [](const Tensor& g, const Tensor&, const Tensor& y) { return g / (y * 2); });
}
Tensor rsqrt(const Tensor& x) {
  amp::detail::AutocastScope amp_scope("rsqrt", x);
  if (amp_scope.cast()) return rsqrt(amp_scope[0]);
  return with_grad("rsqrt", x, unary_op(OpId::rsqrt, x, Kind::Float), false, true,
                   [](const Tensor& g, const Tensor&, const Tensor& y) { return g * y * y * y * -0.5; });
}
Tensor sin(const Tensor& x) {
  return with_grad("sin", x, unary_op(OpId::sin, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return g * cos(x); });
}
Tensor cos(const Tensor& x) {
  return with_grad("cos", x, unary_op(OpId::cos, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return -(g * sin(x)); });
}
Tensor tanh(const Tensor& x) {
  return with_grad("tanh", x, unary_op(OpId::tanh, x, Kind::Float), false, true,
                   [](const Tensor& g, const Tensor&, const Tensor& y) { return tanh_backward(g, y); });
}
Tensor sigmoid(const Tensor& x) {
  return with_grad("sigmoid", x, unary_op(OpId::sigmoid, x, Kind::Float), false, true,
                   [](const Tensor& g, const Tensor&, const Tensor& y) { return sigmoid_backward(g, y); });
}
Tensor relu(const Tensor& x) {
  return with_grad("relu", x, unary_op(OpId::relu, x, Kind::Keep), false, true,
                   [](const Tensor& g, const Tensor&, const Tensor& y) { return relu_backward(g, y); });
}
Tensor silu(const Tensor& x) {
  return with_grad("silu", x, unary_op(OpId::silu, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return silu_backward(g, x); });
}
Tensor erf(const Tensor& x) {
  return with_grad("erf", x, unary_op(OpId::erf, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) {
                     return g * exp(-(x * x)) * 1.12837916709551257390;  // 2 / sqrt(pi)
                   });
}
Tensor log1p(const Tensor& x) {
  amp::detail::AutocastScope amp_scope("log1p", x);
  if (amp_scope.cast()) return log1p(amp_scope[0]);
  return with_grad("log1p", x, unary_op(OpId::log1p, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return g / (x + 1); });
}
Tensor expm1(const Tensor& x) {
  amp::detail::AutocastScope amp_scope("expm1", x);
  if (amp_scope.cast()) return expm1(amp_scope[0]);
  return with_grad("expm1", x, unary_op(OpId::expm1, x, Kind::Float), false, true,
                   [](const Tensor& g, const Tensor&, const Tensor& y) { return g * (y + 1); });
}

namespace {
// An integer is its own floor, ceil, round and trunc (a copy, as PyTorch gives); the gradient
// is 0, recorded as sign's.
Tensor rounding(OpId op, const char* name, const Tensor& x) {
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", name);
  STRATA_CHECK(x.dtype() != kBool, "[{}] not supported for bool tensors", name);
  if (!is_floating(x.dtype())) return x.clone();
  return with_grad(name, x, unary_op(op, x, Kind::Keep), false, false,
                   [](const Tensor& g, const Tensor&, const Tensor&) { return zeros_like(g); });
}
}  // namespace

Tensor floor(const Tensor& x) { return rounding(OpId::floor, "floor", x); }
Tensor ceil(const Tensor& x) { return rounding(OpId::ceil, "ceil", x); }
Tensor round(const Tensor& x) { return rounding(OpId::round, "round", x); }
Tensor trunc(const Tensor& x) { return rounding(OpId::trunc, "trunc", x); }

// d/dx from the input or the output, whichever is cheaper; integer inputs give float32.
Tensor tan(const Tensor& x) {
  amp::detail::AutocastScope amp_scope("tan", x);
  if (amp_scope.cast()) return tan(amp_scope[0]);
  return with_grad("tan", x, unary_op(OpId::tan, x, Kind::Float), false, true,
                   [](const Tensor& g, const Tensor&, const Tensor& y) { return g * (y * y + 1); });
}
Tensor asin(const Tensor& x) {
  amp::detail::AutocastScope amp_scope("asin", x);
  if (amp_scope.cast()) return asin(amp_scope[0]);
  return with_grad("asin", x, unary_op(OpId::asin, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return g * rsqrt(1 - x * x); });
}
Tensor acos(const Tensor& x) {
  amp::detail::AutocastScope amp_scope("acos", x);
  if (amp_scope.cast()) return acos(amp_scope[0]);
  return with_grad("acos", x, unary_op(OpId::acos, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return -(g * rsqrt(1 - x * x)); });
}
Tensor atan(const Tensor& x) {
  return with_grad("atan", x, unary_op(OpId::atan, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return g / (x * x + 1); });
}
Tensor sinh(const Tensor& x) {
  amp::detail::AutocastScope amp_scope("sinh", x);
  if (amp_scope.cast()) return sinh(amp_scope[0]);
  return with_grad("sinh", x, unary_op(OpId::sinh, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return g * cosh(x); });
}
Tensor cosh(const Tensor& x) {
  amp::detail::AutocastScope amp_scope("cosh", x);
  if (amp_scope.cast()) return cosh(amp_scope[0]);
  return with_grad("cosh", x, unary_op(OpId::cosh, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return g * sinh(x); });
}
Tensor asinh(const Tensor& x) {
  return with_grad("asinh", x, unary_op(OpId::asinh, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return g * rsqrt(x * x + 1); });
}
Tensor acosh(const Tensor& x) {
  return with_grad("acosh", x, unary_op(OpId::acosh, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return g * rsqrt((x - 1) * (x + 1)); });
}
Tensor atanh(const Tensor& x) {
  return with_grad("atanh", x, unary_op(OpId::atanh, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return g / (1 - x * x); });
}
Tensor log2(const Tensor& x) {
  amp::detail::AutocastScope amp_scope("log2", x);
  if (amp_scope.cast()) return log2(amp_scope[0]);
  return with_grad("log2", x, unary_op(OpId::log2, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return g / (x * 0.69314718055994530942); });
}
Tensor log10(const Tensor& x) {
  amp::detail::AutocastScope amp_scope("log10", x);
  if (amp_scope.cast()) return log10(amp_scope[0]);
  return with_grad("log10", x, unary_op(OpId::log10, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return g / (x * 2.30258509299404568402); });
}
Tensor exp2(const Tensor& x) {
  return with_grad("exp2", x, unary_op(OpId::exp2, x, Kind::Float), false, true,
                   [](const Tensor& g, const Tensor&, const Tensor& y) { return g * y * 0.69314718055994530942; });
}

Tensor square(const Tensor& x) {
  if (x.defined() && x.dtype() == kBool) return pow(x, 2);  // int64, as PyTorch's x ** 2
  return with_grad("square", x, unary_op(OpId::square, x, Kind::Keep), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return g * x * 2; });
}
Tensor reciprocal(const Tensor& x) {
  amp::detail::AutocastScope amp_scope("reciprocal", x);
  if (amp_scope.cast()) return reciprocal(amp_scope[0]);
  return with_grad("reciprocal", x, unary_op(OpId::reciprocal, x, Kind::Float), false, true,
                   [](const Tensor& g, const Tensor&, const Tensor& y) { return -(g * y * y); });
}
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator~(const Tensor& x) {
  STRATA_CHECK(x.defined() && x.dtype() == kBool, "[operator~] takes a bool tensor (a mask), got {}",
               x.defined() ? fmt::format("{}", x.dtype()) : std::string("an undefined tensor"));
  return logical_not(x);
}

Tensor gelu(const Tensor& x, std::string_view approximate) {
  STRATA_CHECK(approximate == "none" || approximate == "tanh",
               "[gelu] approximate must be \"none\" or \"tanh\", got \"{}\"", approximate);
  if (approximate == "tanh") {
    return with_grad("gelu_tanh", x, unary_op(OpId::gelu_tanh, x, Kind::Float), true, false,
                     [](const Tensor& g, const Tensor& x, const Tensor&) { return gelu_tanh_backward(g, x); });
  }
  return with_grad("gelu", x, unary_op(OpId::gelu, x, Kind::Float), true, false,
                   [](const Tensor& g, const Tensor& x, const Tensor&) { return gelu_backward(g, x); });
}

Tensor leaky_relu(const Tensor& x, double negative_slope) {
  UnaryScalarParams p{negative_slope, 0};
  return with_grad("leaky_relu", x, unary_op(OpId::leaky_relu, x, Kind::Float, &p), true, false,
                   [negative_slope](const Tensor& g, const Tensor& x, const Tensor&) {
                     return where(x > 0, g, g * negative_slope);
                   });
}

Tensor logical_not(const Tensor& x) {
  STRATA_CHECK(x.defined(), "[logical_not] input tensor is undefined");
  Tensor out = detail::make_tensor(x.shape(), kBool, x.device());
  run_kernel(OpId::logical_not, x.dtype(), KernelCall{{&x, 1}, {&out, 1}});
  return out;
}

Tensor pow(const Tensor& x, Scalar exponent) {
  amp::detail::AutocastScope amp_scope("pow", x);
  if (amp_scope.cast()) return pow(amp_scope[0], exponent);
  STRATA_CHECK(x.defined(), "[pow] input tensor is undefined");
  UnaryScalarParams p{exponent.to_double(), 0};
  if (is_floating(x.dtype()) || exponent.is_floating()) {
    double e = p.a;
    return with_grad("pow", x, unary_op(OpId::pow_scalar, x, Kind::Float, &p), true, false,
                     [e](const Tensor& g, const Tensor& x, const Tensor&) {
                       if (e == 0) return zeros_like(g);
                       return e == 2 ? g * x * 2 : g * pow(x, e - 1) * e;
                     });
  }
  // bool ** int is int64, as type promotion gives in PyTorch
  if (x.dtype() == kBool && exponent.kind() == Scalar::Kind::Int) return pow(x.to(kInt64), exponent);
  STRATA_CHECK(exponent.to_int() >= 0, "[pow] integer tensors cannot be raised to the negative power {}",
               exponent.to_int());
  p.ia = exponent.to_int();  // exact: 2^63 - 1 is not a double
  return unary_op(OpId::pow_scalar, x, Kind::Keep, &p);
}

Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  STRATA_CHECK(min || max, "[clamp] at least one of min and max must be given");
  // a bool tensor between integer bounds is clamped as int64, as type promotion gives in PyTorch
  auto is_int = [](const std::optional<Scalar>& s) { return !s || s->kind() == Scalar::Kind::Int; };
  if (x.defined() && x.dtype() == kBool && is_int(min) && is_int(max)) return clamp(x.to(kInt64), min, max);
  const UnaryScalarParams p = clamp_params(min, max);
  const bool float_bound = !p.integral;
  // the gradient passes where lo <= x <= hi
  return with_grad("clamp", x, unary_op(OpId::clamp, x, float_bound ? Kind::Float : Kind::Keep, &p), true, false,
                   [p](const Tensor& g, const Tensor& x, const Tensor&) {
                     return where(logical_and(x >= p.a, x <= p.b), g, 0);
                   });
}

const Tensor& Tensor::clamp_(std::optional<Scalar> min, std::optional<Scalar> max) const {
  STRATA_CHECK(min || max, "[clamp_] at least one of min and max must be given");
  const UnaryScalarParams p = clamp_params(min, max);
  // a floating bound promotes the result to floating (clamp), which an integer tensor cannot
  // hold, as add_ refuses a floating scalar; PyTorch refuses it too
  STRATA_CHECK(is_floating(dtype()) || p.integral,
               "[clamp_] a floating bound (min {}, max {}) gives a floating result, which the {} tensor cannot "
               "hold; use clamp() for a new tensor",
               p.a, p.b, dtype());
  return unary_inplace(OpId::clamp, *this, [&](const Tensor& x) { return strata::clamp(x, min, max); }, &p);
}

const Tensor& Tensor::relu_() const {
  return unary_inplace(OpId::relu, *this, [](const Tensor& x) { return strata::relu(x); });
}

Tensor Tensor::exp() const { return strata::exp(*this); }
Tensor Tensor::log() const { return strata::log(*this); }
Tensor Tensor::sqrt() const { return strata::sqrt(*this); }
Tensor Tensor::abs() const { return strata::abs(*this); }
Tensor Tensor::neg() const { return strata::neg(*this); }
Tensor Tensor::relu() const { return strata::relu(*this); }
Tensor Tensor::sigmoid() const { return strata::sigmoid(*this); }
Tensor Tensor::tanh() const { return strata::tanh(*this); }
Tensor Tensor::pow(Scalar exponent) const { return strata::pow(*this, exponent); }
Tensor Tensor::clamp(std::optional<Scalar> min, std::optional<Scalar> max) const {
  return strata::clamp(*this, min, max);
}

}  // namespace strata
