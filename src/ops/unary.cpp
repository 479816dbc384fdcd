// Unary elementwise ops. Float ops (exp, log, ...) on integer or bool inputs compute in
// float32; the rest keep the input dtype. The math is in kernels/common/unary_math.h.
#include <limits>

#include <strata/ops/unary.hpp>

#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/common/convert.h"
#include "kernels/common/unary_math.h"
#include "kernels/cpu/elementwise.h"
#include "ops/dispatch.h"
#include "ops/loop.h"

namespace strata {

namespace {

template <class F> F make_functor(const KernelCall&) { return F{}; }
template <> math::PowScalar make_functor(const KernelCall& c) { return {c.param<UnaryScalarParams>().a}; }
template <> math::Clamp make_functor(const KernelCall& c) {
  return {c.param<UnaryScalarParams>().a, c.param<UnaryScalarParams>().b};
}
template <> math::LeakyRelu make_functor(const KernelCall& c) { return {c.param<UnaryScalarParams>().a}; }

// out = f(x) with out and x of the same dtype.
template <class F, DTypeSet Set>
void cpu_unary(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& out = call.outputs[0];
  const F f = make_functor<F>(call);
  auto loop = make_loop<2>(out, {&x}, "unary");
  dispatch<Set>(x.dtype(), "unary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    cpu::elementwise(loop, static_cast<T*>(out.data()), [f](T v) { return static_cast<T>(f(static_cast<C>(v))); },
                     static_cast<const T*>(x.data()));
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

Tensor& unary_inplace(OpId op, Tensor& x, const void* params = nullptr) {
  STRATA_CHECK(x.dtype() != kBool, "[{}_] not supported for bool tensors", op_name(op));
  Tensor in = x, out = x;
  run_kernel(op, x.dtype(), KernelCall{{&in, 1}, {&out, 1}, params});
  x.storage()->bump_version();
  return x;
}

double bound(const std::optional<Scalar>& s, double fallback) { return s ? s->to_double() : fallback; }

}  // namespace

namespace detail {
void register_unary_kernels(KernelTable& table) {
  constexpr auto CPU = DeviceType::CPU;
  table.set(OpId::exp, CPU, kFloatDTypes, cpu_unary<math::Exp, DTypeSet::Floating>);
  table.set(OpId::log, CPU, kFloatDTypes, cpu_unary<math::Log, DTypeSet::Floating>);
  table.set(OpId::sqrt, CPU, kFloatDTypes, cpu_unary<math::Sqrt, DTypeSet::Floating>);
  table.set(OpId::rsqrt, CPU, kFloatDTypes, cpu_unary<math::Rsqrt, DTypeSet::Floating>);
  table.set(OpId::sin, CPU, kFloatDTypes, cpu_unary<math::Sin, DTypeSet::Floating>);
  table.set(OpId::cos, CPU, kFloatDTypes, cpu_unary<math::Cos, DTypeSet::Floating>);
  table.set(OpId::tanh, CPU, kFloatDTypes, cpu_unary<math::Tanh, DTypeSet::Floating>);
  table.set(OpId::sigmoid, CPU, kFloatDTypes, cpu_unary<math::Sigmoid, DTypeSet::Floating>);
  table.set(OpId::gelu, CPU, kFloatDTypes, cpu_unary<math::GeluErf, DTypeSet::Floating>);
  table.set(OpId::gelu_tanh, CPU, kFloatDTypes, cpu_unary<math::GeluTanh, DTypeSet::Floating>);
  table.set(OpId::silu, CPU, kFloatDTypes, cpu_unary<math::Silu, DTypeSet::Floating>);
  table.set(OpId::reciprocal, CPU, kFloatDTypes, cpu_unary<math::Reciprocal, DTypeSet::Floating>);
  table.set(OpId::leaky_relu, CPU, kFloatDTypes, cpu_unary<math::LeakyRelu, DTypeSet::Floating>);
  table.set(OpId::neg, CPU, kNumericDTypes, cpu_unary<math::Neg, DTypeSet::Numeric>);
  table.set(OpId::abs, CPU, kNumericDTypes, cpu_unary<math::Abs, DTypeSet::Numeric>);
  table.set(OpId::sign, CPU, kNumericDTypes, cpu_unary<math::Sign, DTypeSet::Numeric>);
  table.set(OpId::relu, CPU, kNumericDTypes, cpu_unary<math::Relu, DTypeSet::Numeric>);
  table.set(OpId::square, CPU, kNumericDTypes, cpu_unary<math::Square, DTypeSet::Numeric>);
  table.set(OpId::pow_scalar, CPU, kNumericDTypes, cpu_unary<math::PowScalar, DTypeSet::Numeric>);
  table.set(OpId::clamp, CPU, kNumericDTypes, cpu_unary<math::Clamp, DTypeSet::Numeric>);
  table.set(OpId::logical_not, CPU, kAllDTypes, cpu_logical_not);
}
}  // namespace detail

Tensor neg(const Tensor& x) { return unary_op(OpId::neg, x, Kind::Keep); }
Tensor abs(const Tensor& x) { return unary_op(OpId::abs, x, Kind::Keep); }
Tensor sign(const Tensor& x) { return unary_op(OpId::sign, x, Kind::Keep); }
Tensor exp(const Tensor& x) { return unary_op(OpId::exp, x, Kind::Float); }
Tensor log(const Tensor& x) { return unary_op(OpId::log, x, Kind::Float); }
Tensor sqrt(const Tensor& x) { return unary_op(OpId::sqrt, x, Kind::Float); }
Tensor rsqrt(const Tensor& x) { return unary_op(OpId::rsqrt, x, Kind::Float); }
Tensor sin(const Tensor& x) { return unary_op(OpId::sin, x, Kind::Float); }
Tensor cos(const Tensor& x) { return unary_op(OpId::cos, x, Kind::Float); }
Tensor tanh(const Tensor& x) { return unary_op(OpId::tanh, x, Kind::Float); }
Tensor sigmoid(const Tensor& x) { return unary_op(OpId::sigmoid, x, Kind::Float); }
Tensor relu(const Tensor& x) { return unary_op(OpId::relu, x, Kind::Keep); }
Tensor silu(const Tensor& x) { return unary_op(OpId::silu, x, Kind::Float); }
Tensor square(const Tensor& x) { return unary_op(OpId::square, x, Kind::Keep); }
Tensor reciprocal(const Tensor& x) { return unary_op(OpId::reciprocal, x, Kind::Float); }
Tensor operator-(const Tensor& x) { return neg(x); }

Tensor gelu(const Tensor& x, std::string_view approximate) {
  STRATA_CHECK(approximate == "none" || approximate == "tanh",
               "[gelu] approximate must be \"none\" or \"tanh\", got \"{}\"", approximate);
  return unary_op(approximate == "tanh" ? OpId::gelu_tanh : OpId::gelu, x, Kind::Float);
}

Tensor leaky_relu(const Tensor& x, double negative_slope) {
  UnaryScalarParams p{negative_slope, 0};
  return unary_op(OpId::leaky_relu, x, Kind::Float, &p);
}

Tensor logical_not(const Tensor& x) {
  STRATA_CHECK(x.defined(), "[logical_not] input tensor is undefined");
  Tensor out = detail::make_tensor(x.shape(), kBool, x.device());
  run_kernel(OpId::logical_not, x.dtype(), KernelCall{{&x, 1}, {&out, 1}});
  return out;
}

Tensor pow(const Tensor& x, Scalar exponent) {
  STRATA_CHECK(x.defined(), "[pow] input tensor is undefined");
  UnaryScalarParams p{exponent.to_double(), 0};
  if (is_floating(x.dtype()) || exponent.is_floating()) return unary_op(OpId::pow_scalar, x, Kind::Float, &p);
  STRATA_CHECK(exponent.to_int() >= 0, "[pow] integer tensors cannot be raised to the negative power {}",
               exponent.to_int());
  return unary_op(OpId::pow_scalar, x, Kind::Keep, &p);
}

Tensor clamp(const Tensor& x, std::optional<Scalar> min, std::optional<Scalar> max) {
  STRATA_CHECK(min || max, "[clamp] at least one of min and max must be given");
  const double inf = std::numeric_limits<double>::infinity();
  UnaryScalarParams p{bound(min, -inf), bound(max, inf)};
  bool float_bound = (min && min->is_floating()) || (max && max->is_floating());
  return unary_op(OpId::clamp, x, float_bound ? Kind::Float : Kind::Keep, &p);
}

Tensor& Tensor::clamp_(std::optional<Scalar> min, std::optional<Scalar> max) {
  STRATA_CHECK(min || max, "[clamp_] at least one of min and max must be given");
  const double inf = std::numeric_limits<double>::infinity();
  UnaryScalarParams p{bound(min, -inf), bound(max, inf)};
  return unary_inplace(OpId::clamp, *this, &p);
}

Tensor& Tensor::relu_() { return unary_inplace(OpId::relu, *this); }

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
