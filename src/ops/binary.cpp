// Binary elementwise ops with broadcasting and type promotion, where, and masked_fill, with
// their backward. Both inputs are converted to the promoted dtype before the kernel runs, so
// every kernel sees one dtype; comparisons write bool. Gradients may come back broadcast:
// the autograd engine sums them down to each input's shape.
#include <cmath>

#include <strata/amp/autocast.hpp>
#include <strata/autograd/graph.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

#include "autograd/views.h"
#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/common/binary_math.h"
#include "kernels/common/convert.h"
#include "kernels/cpu/elementwise.h"
#include "ops/dispatch.h"
#include "ops/loop.h"

namespace strata {

namespace {

template <class F, DTypeSet Set, bool BoolOut>
void cpu_binary(const KernelCall& call) {
  const Tensor& a = call.inputs[0];
  const Tensor& b = call.inputs[1];
  Tensor& out = call.outputs[0];
  auto loop = make_loop<3>(out, {&a, &b}, "binary");
  dispatch<Set>(a.dtype(), "binary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    using Out = std::conditional_t<BoolOut, bool, T>;
    cpu::elementwise(loop, static_cast<Out*>(out.data()),
                     [](T x, T y) { return static_cast<Out>(F{}(static_cast<C>(x), static_cast<C>(y))); },
                     static_cast<const T*>(a.data()), static_cast<const T*>(b.data()));
  });
}

void cpu_where(const KernelCall& call) {
  const Tensor& cond = call.inputs[0];
  const Tensor& a = call.inputs[1];
  const Tensor& b = call.inputs[2];
  Tensor& out = call.outputs[0];
  auto loop = make_loop<4>(out, {&cond, &a, &b}, "where");
  // the condition is read as bytes: gcc does not vectorize the select through bool loads
  // (2x slower); a bool tensor holds only 0 and 1
  dispatch(a.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::elementwise(loop, static_cast<T*>(out.data()), [](uint8_t c, T x, T y) { return c ? x : y; },
                     static_cast<const uint8_t*>(cond.data()), static_cast<const T*>(a.data()),
                     static_cast<const T*>(b.data()));
  });
}

int category(DType t) { return t == kBool ? 0 : is_integral(t) ? 1 : 2; }

enum class Kind { Arith, TrueDiv, Compare, Logical };

void check_pair(const Tensor& a, const Tensor& b, OpId op) {
  STRATA_CHECK(a.defined() && b.defined(), "[{}] input tensor is undefined", op_name(op));
  STRATA_CHECK(a.device() == b.device(), "[{}] inputs are on different devices: {} and {}", op_name(op), a.device(),
               b.device());
}

Tensor binary_op(OpId op, const Tensor& a, const Tensor& b, Kind kind) {
  check_pair(a, b, op);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), op_name(op));
  DType t = kind == Kind::Logical ? kBool : result_type(a, b);
  if (kind == Kind::TrueDiv && !is_floating(t)) t = kFloat32;
  Tensor ca = a.to(t), cb = b.to(t);
  DType out_t = kind == Kind::Compare || kind == Kind::Logical ? kBool : t;
  Tensor out = detail::make_tensor(shape, out_t, a.device());
  const Tensor ins[2] = {ca, cb};
  run_kernel(op, t, KernelCall{ins, {&out, 1}});
  return out;
}

// The out-of-place op of an in-place arithmetic op, as autograd records it.
Tensor out_of_place(OpId op, const Tensor& a, const Tensor& b) {
  switch (op) {
    case OpId::add: return add(a, b);
    case OpId::sub: return sub(a, b);
    case OpId::mul: return mul(a, b);
    default: return div(a, b);
  }
}

// self is a handle on the written tensor; the writes go through it to every handle.
const Tensor& binary_inplace(OpId op, const Tensor& written, const Tensor& other, bool true_div = false) {
  Tensor self = written;
  check_pair(self, other, op);
  const std::string name = fmt::format("{}_", op_name(op));
  detail::check_writable(self, name);
  Shape shape = broadcast_shapes(self.shape(), other.shape(), op_name(op));
  STRATA_CHECK(shape == self.shape(), "[{}_] result of shape {} does not fit the destination of shape {}",
               op_name(op), shape, self.shape());
  DType t = result_type(self, other);
  if (true_div && !is_floating(t)) t = kFloat32;
  STRATA_CHECK(category(t) <= category(self.dtype()), "[{}_] result dtype {} cannot be written in place to a {} tensor",
               op_name(op), t, self.dtype());
  if (autograd::detail::inplace_records(self, {&other})) {  // Note [In-place under autograd]
    // x.mul_(x): the operand is self too, so it is read from the copy as well, which its
    // backward keeps; any other tensor on self's memory (h[0].add_(h[1]), h.sub_(h[0]), a
    // detached alias, with its own history or none) is copied first, as the write would change
    // it under the value the backward keeps. The operand is
    // cast to self's dtype first, as below, so that a float16 tensor gets the same values with
    // grad and without.
    const bool reads_self = op == OpId::mul || op == OpId::div;
    autograd::record_inplace(self, name.c_str(), reads_self, [&](const Tensor& value) {
      if (other.is_same(self)) return out_of_place(op, value, value);
      Tensor operand = other.to(self.dtype());
      return out_of_place(op, value, operand.storage() == self.storage() ? operand.clone() : operand);
    });
    return written;
  }
  Tensor cother = detail::unaliased(other.to(self.dtype()), self);
  const Tensor ins[2] = {self, cother};
  Tensor out = self;
  run_kernel(op, self.dtype(), KernelCall{ins, {&out, 1}});
  self.storage()->bump_version();
  return written;
}

// s as a 0-d tensor of the result type of `like` (x) s; a value that type cannot hold raises,
// naming `op`.
Tensor scalar_like(Scalar s, const Tensor& like, std::string_view op) {
  const DType t = result_type(like, s);
  detail::check_scalar_fits(s, t, op);
  return detail::scalar_operand(s, t, like.device());
}

// True when arithmetic of `t` (x) `s` needs s at float32 precision: a float16/bfloat16 result
// whose type cannot hold s at all, as it overflows to inf (1e5 in float16), vanishes to 0 (1e-8)
// or keeps only a few bits among the subnormals. Those go through float32, rounding once, as
// PyTorch's kernels do. Other scalars are rounded to the 16-bit type first, which keeps one
// fast pass but can differ from PyTorch by an ulp (3.3 becomes 3.30078125 in float16); taking
// the scalar as a float kernel parameter would remove that difference.
bool needs_float_scalar(const Tensor& t, Scalar s) {
  const DType r = result_type(t, s);
  if (r != kFloat16 && r != kBFloat16) return false;
  const auto f = static_cast<float>(s.to_double());
  if (!std::isfinite(f)) return false;  // inf and NaN are the same in either type
  const float h = r == kFloat16 ? static_cast<float>(Half(f)) : static_cast<float>(BFloat16(f));
  if (!std::isfinite(h)) return true;
  if (h == 0.0f) return f != 0.0f;
  return std::fabs(h - f) > std::fabs(f) * 0x1p-8f;  // among the subnormals
}

// `a` op `s` (or `s` op `a` when scalar_first) for the four arithmetic ops, with the scalar at
// float32 precision where needs_float_scalar says so: computed in float32, rounded once.
template <class Op>
Tensor with_scalar(const Tensor& a, Scalar s, Op op, OpId id, bool scalar_first = false) {
  if (!needs_float_scalar(a, s)) {
    const Tensor c = scalar_like(s, a, op_name(id));
    return scalar_first ? op(c, a) : op(a, c);
  }
  const Tensor a32 = a.to(kFloat32), c = detail::scalar_operand(s, kFloat32, a.device());
  return (scalar_first ? op(c, a32) : op(a32, c)).to(result_type(a, s));
}

// The in-place form: self op= s.
template <class Op>
const Tensor& with_scalar_inplace(const Tensor& self, Scalar s, Op op, OpId id) {
  if (!needs_float_scalar(self, s)) {
    op(self, scalar_like(s, self, op_name(id)));
    return self;
  }
  check_pair(self, self, id);
  detail::check_writable(self, fmt::format("{}_", op_name(id)));
  Tensor r = self.to(kFloat32);
  op(r, detail::scalar_operand(s, kFloat32, self.device()));
  return self.copy_(r);
}

// The four ops, for with_scalar.
const auto kAdd = [](const Tensor& x, const Tensor& y) { return add(x, y); };
const auto kSub = [](const Tensor& x, const Tensor& y) { return sub(x, y); };
const auto kMul = [](const Tensor& x, const Tensor& y) { return mul(x, y); };
const auto kDiv = [](const Tensor& x, const Tensor& y) { return div(x, y); };

}  // namespace

namespace detail {
void register_binary_kernels(KernelTable& table) {
  constexpr auto CPU = DeviceType::CPU;
  table.set(OpId::add, CPU, kNumericDTypes, cpu_binary<math::Add, DTypeSet::Numeric, false>);
  table.set(OpId::add, CPU, kBool, cpu_binary<math::LogicalOr, DTypeSet::All, true>);  // bool + bool = or
  table.set(OpId::sub, CPU, kNumericDTypes, cpu_binary<math::Sub, DTypeSet::Numeric, false>);
  table.set(OpId::mul, CPU, kNumericDTypes, cpu_binary<math::Mul, DTypeSet::Numeric, false>);
  table.set(OpId::mul, CPU, kBool, cpu_binary<math::LogicalAnd, DTypeSet::All, true>);  // bool * bool = and
  table.set(OpId::div, CPU, kFloatDTypes, cpu_binary<math::Div, DTypeSet::Floating, false>);
  table.set(OpId::maximum, CPU, kNumericDTypes, cpu_binary<math::Maximum, DTypeSet::Numeric, false>);
  table.set(OpId::minimum, CPU, kNumericDTypes, cpu_binary<math::Minimum, DTypeSet::Numeric, false>);
  table.set(OpId::maximum, CPU, kBool, cpu_binary<math::LogicalOr, DTypeSet::All, true>);   // max of bools = or
  table.set(OpId::minimum, CPU, kBool, cpu_binary<math::LogicalAnd, DTypeSet::All, true>);  // min of bools = and
  table.set(OpId::pow, CPU, kNumericDTypes, cpu_binary<math::Pow, DTypeSet::Numeric, false>);
  table.set(OpId::fmod, CPU, kNumericDTypes, cpu_binary<math::Fmod, DTypeSet::Numeric, false>);
  table.set(OpId::remainder, CPU, kNumericDTypes, cpu_binary<math::Remainder, DTypeSet::Numeric, false>);
  table.set(OpId::atan2, CPU, kFloatDTypes, cpu_binary<math::Atan2, DTypeSet::Floating, false>);
  table.set(OpId::eq, CPU, kAllDTypes, cpu_binary<math::Eq, DTypeSet::All, true>);
  table.set(OpId::ne, CPU, kAllDTypes, cpu_binary<math::Ne, DTypeSet::All, true>);
  table.set(OpId::lt, CPU, kAllDTypes, cpu_binary<math::Lt, DTypeSet::All, true>);
  table.set(OpId::le, CPU, kAllDTypes, cpu_binary<math::Le, DTypeSet::All, true>);
  table.set(OpId::gt, CPU, kAllDTypes, cpu_binary<math::Gt, DTypeSet::All, true>);
  table.set(OpId::ge, CPU, kAllDTypes, cpu_binary<math::Ge, DTypeSet::All, true>);
  table.set(OpId::logical_and, CPU, kBool, cpu_binary<math::LogicalAnd, DTypeSet::All, true>);
  table.set(OpId::logical_or, CPU, kBool, cpu_binary<math::LogicalOr, DTypeSet::All, true>);
  table.set(OpId::where, CPU, kAllDTypes, cpu_where);
}
}  // namespace detail

DType result_type(const Tensor& a, const Tensor& b) {
  // PyTorch: a 0-d tensor takes part like a scalar unless it lifts the category.
  bool a0 = a.dim() == 0, b0 = b.dim() == 0;
  if (a0 == b0) return promote_types(a.dtype(), b.dtype());
  const Tensor& dimmed = a0 ? b : a;
  const Tensor& zero = a0 ? a : b;
  if (category(zero.dtype()) > category(dimmed.dtype())) return zero.dtype();
  return dimmed.dtype();
}

DType result_type(const Tensor& a, Scalar b) {
  DType s = b.default_dtype();
  return category(s) > category(a.dtype()) ? s : a.dtype();
}

using autograd::Grads;
using autograd::Saved;

namespace {
// As PyTorch: a fractional alpha would turn an integer sum into a float one (or truncate
// in place), and a bool alpha means nothing for numbers.
void check_alpha(const Tensor& a, const Tensor& b, Scalar alpha, const char* op) {
  if (!a.defined() || !b.defined()) return;  // binary_op names the undefined operand
  const DType t = result_type(a, b);
  STRATA_CHECK(is_floating(t) || !alpha.is_floating(),
               "[{}] alpha must not be a floating value for {} operands, got {}", op, t, alpha.to_double());
  STRATA_CHECK(t == kBool || alpha.kind() != Scalar::Kind::Bool, "[{}] a bool alpha needs bool operands, got {}", op,
               t);
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  check_alpha(a, b, alpha, "add");
  if (alpha.to_double() != 1.0) return add(a, mul(b, alpha));
  Tensor out = binary_op(OpId::add, a, b, Kind::Arith);
  autograd::record("add", {a, b}, {out}, {}, [](const Grads& g, const Saved&) { return Grads{g[0], g[0]}; });
  return out;
}
namespace {
// As PyTorch, no subtraction takes a bool operand, a tensor's or a scalar's: true - x is
// most often a mistaken logical_not.
void check_sub_operands(bool a_is_bool, bool b_is_bool) {
  STRATA_CHECK(!a_is_bool && !b_is_bool, "[sub] subtraction with a bool operand is not supported; use "
               "logical_not, or ne for the exclusive or of two bools, or convert the bool tensor first");
}
bool is_bool(const Tensor& t) { return t.defined() && t.dtype() == kBool; }
bool is_bool(Scalar s) { return s.kind() == Scalar::Kind::Bool; }
}  // namespace

Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  check_sub_operands(is_bool(a), is_bool(b));
  check_alpha(a, b, alpha, "sub");
  if (alpha.to_double() != 1.0) return sub(a, mul(b, alpha));
  Tensor out = binary_op(OpId::sub, a, b, Kind::Arith);
  autograd::record("sub", {a, b}, {out}, {}, [](const Grads& g, const Saved&) { return Grads{g[0], -g[0]}; });
  return out;
}
Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_op(OpId::mul, a, b, Kind::Arith);
  // gradients only for inputs that need them: x * 0.5 or x * mask would otherwise compute a
  // full product for the constant, only to have it dropped
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  // and each operand saved only for the other's gradient, so a constant is not kept alive (nor
  // checked for later in-place writes) for nothing
  autograd::record("mul", {a, b}, {out}, {need_b ? a : Tensor(), need_a ? b : Tensor()},
                   [need_a, need_b](const Grads& g, const Saved& s) {
    return Grads{need_a ? g[0] * s[1] : Tensor(), need_b ? g[0] * s[0] : Tensor()};
  });
  return out;
}
Tensor div(const Tensor& a, const Tensor& b) {
  Tensor out = binary_op(OpId::div, a, b, Kind::TrueDiv);
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();
  // d/db = -g a / b^2, as -(g (a / b)) / b: at b = 0 its own derivative is then +-inf, not the
  // 0 * inf = NaN that b * b gives
  autograd::record("div", {a, b}, {out}, {need_b ? a : Tensor(), b}, [need_a, need_b](const Grads& g,
                                                                                      const Saved& s) {
    return Grads{need_a ? g[0] / s[1] : Tensor(), need_b ? -(g[0] * (s[0] / s[1])) / s[1] : Tensor()};
  });
  return out;
}
// Where a == b the gradient is split evenly, as PyTorch does; an operand is masked only where
// it strictly loses, so a NaN (which the result carries) passes the gradient to both.
Tensor maximum(const Tensor& a, const Tensor& b) {
  Tensor out = binary_op(OpId::maximum, a, b, Kind::Arith);
  autograd::record("maximum", {a, b}, {out}, {a, b}, [](const Grads& g, const Saved& s) {
    Tensor share = where(s[0] == s[1], g[0] * 0.5, g[0]);
    return Grads{where(s[0] < s[1], 0, share), where(s[1] < s[0], 0, share)};
  });
  return out;
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  Tensor out = binary_op(OpId::minimum, a, b, Kind::Arith);
  autograd::record("minimum", {a, b}, {out}, {a, b}, [](const Grads& g, const Saved& s) {
    Tensor share = where(s[0] == s[1], g[0] * 0.5, g[0]);
    return Grads{where(s[0] > s[1], 0, share), where(s[1] > s[0], 0, share)};
  });
  return out;
}
Tensor pow(const Tensor& a, const Tensor& b) {
  amp::detail::AutocastScope amp_scope("pow", a, b);
  if (amp_scope.cast()) return pow(amp_scope[0], amp_scope[1]);
  Tensor out = binary_op(OpId::pow, a, b, Kind::Arith);
  autograd::record("pow", {a, b}, {out}, {a, b, out}, [](const Grads& g, const Saved& s) {
    const Tensor &x = s[0], &e = s[1], &y = s[2];
    // d/dx = e x^(e-1), 0 where e == 0 (x^-1 is infinite at x = 0); d/de = y log(x), 0 where
    // x == 0 and e >= 0 (the limit), as in PyTorch
    return Grads{where(e == 0, 0, g[0] * e * pow(x, e - 1)),
                 where(logical_and(x == 0, e >= 0), 0, g[0] * y * log(x))};
  });
  return out;
}
namespace {
// Integer division by zero has no value (and traps on x86): refused, as PyTorch's CPU does.
Tensor modulo_op(OpId op, const Tensor& a, const Tensor& b) {
  check_pair(a, b, op);
  const DType t = result_type(a, b);
  STRATA_CHECK(t != kBool, "[{}] not supported for bool tensors", op_name(op));
  if (!is_floating(t)) {
    NoGradGuard no_grad;
    STRATA_CHECK(!any(b == 0).item<bool>(), "[{}] integer division by zero (a divisor in the {} operand of shape {})",
                 op_name(op), t, b.shape());
  }
  return binary_op(op, a, b, Kind::Arith);
}
}  // namespace

// d/db = -floor(a / b) and -trunc(a / b), away from the jumps (as PyTorch's)
Tensor remainder(const Tensor& a, const Tensor& b) {
  Tensor out = modulo_op(OpId::remainder, a, b);
  autograd::record("remainder", {a, b}, {out}, {a, b}, [](const Grads& g, const Saved& s) {
    return Grads{g[0], -(g[0] * floor(s[0] / s[1]))};
  });
  return out;
}
Tensor fmod(const Tensor& a, const Tensor& b) {
  Tensor out = modulo_op(OpId::fmod, a, b);
  autograd::record("fmod", {a, b}, {out}, {a, b}, [](const Grads& g, const Saved& s) {
    return Grads{g[0], -(g[0] * trunc(s[0] / s[1]))};
  });
  return out;
}
Tensor atan2(const Tensor& a, const Tensor& b) {
  Tensor out = binary_op(OpId::atan2, a, b, Kind::TrueDiv);
  autograd::record("atan2", {a, b}, {out}, {a, b}, [](const Grads& g, const Saved& s) {
    const Tensor scale = g[0] / (s[0] * s[0] + s[1] * s[1]);
    return Grads{scale * s[1], -(scale * s[0])};
  });
  return out;
}
Tensor eq(const Tensor& a, const Tensor& b) { return binary_op(OpId::eq, a, b, Kind::Compare); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary_op(OpId::ne, a, b, Kind::Compare); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary_op(OpId::lt, a, b, Kind::Compare); }
Tensor le(const Tensor& a, const Tensor& b) { return binary_op(OpId::le, a, b, Kind::Compare); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary_op(OpId::gt, a, b, Kind::Compare); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary_op(OpId::ge, a, b, Kind::Compare); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return binary_op(OpId::logical_and, a, b, Kind::Logical); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return binary_op(OpId::logical_or, a, b, Kind::Logical); }

Tensor add(const Tensor& a, Scalar b) { return with_scalar(a, b, kAdd, OpId::add); }
Tensor sub(const Tensor& a, Scalar b) {
  check_sub_operands(is_bool(a), is_bool(b));
  return with_scalar(a, b, kSub, OpId::sub);
}
Tensor mul(const Tensor& a, Scalar b) { return with_scalar(a, b, kMul, OpId::mul); }
Tensor div(const Tensor& a, Scalar b) { return with_scalar(a, b, kDiv, OpId::div); }
Tensor maximum(const Tensor& a, Scalar b) { return maximum(a, scalar_like(b, a, "maximum")); }
Tensor remainder(const Tensor& a, Scalar b) { return remainder(a, scalar_like(b, a, "remainder")); }
Tensor fmod(const Tensor& a, Scalar b) { return fmod(a, scalar_like(b, a, "fmod")); }
Tensor operator%(const Tensor& a, const Tensor& b) { return remainder(a, b); }
Tensor operator%(const Tensor& a, Scalar b) { return remainder(a, b); }
Tensor minimum(const Tensor& a, Scalar b) { return minimum(a, scalar_like(b, a, "minimum")); }
Tensor eq(const Tensor& a, Scalar b) { return eq(a, scalar_like(b, a, "eq")); }
Tensor ne(const Tensor& a, Scalar b) { return ne(a, scalar_like(b, a, "ne")); }
Tensor lt(const Tensor& a, Scalar b) { return lt(a, scalar_like(b, a, "lt")); }
Tensor le(const Tensor& a, Scalar b) { return le(a, scalar_like(b, a, "le")); }
Tensor gt(const Tensor& a, Scalar b) { return gt(a, scalar_like(b, a, "gt")); }
Tensor ge(const Tensor& a, Scalar b) { return ge(a, scalar_like(b, a, "ge")); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  STRATA_CHECK(cond.defined() && a.defined() && b.defined(), "[where] input tensor is undefined");
  STRATA_CHECK(cond.dtype() == kBool, "[where] condition must be bool, got {}", cond.dtype());
  STRATA_CHECK(cond.device() == a.device() && a.device() == b.device(),
               "[where] inputs are on different devices: {}, {} and {}", cond.device(), a.device(), b.device());
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  DType t = result_type(a, b);
  Tensor ca = a.to(t), cb = b.to(t);
  Tensor out = detail::make_tensor(shape, t, a.device());
  const Tensor ins[3] = {cond, ca, cb};
  run_kernel(OpId::where, t, KernelCall{ins, {&out, 1}});
  const bool need_a = a.requires_grad(), need_b = b.requires_grad();  // masked_fill's value needs none
  autograd::record("where", {a, b}, {out}, {cond}, [need_a, need_b](const Grads& g, const Saved& s) {
    return Grads{need_a ? where(s[0], g[0], 0) : Tensor(), need_b ? where(s[0], 0, g[0]) : Tensor()};
  });
  return out;
}
Tensor where(const Tensor& cond, const Tensor& a, Scalar b) { return where(cond, a, scalar_like(b, a, "where")); }
Tensor where(const Tensor& cond, Scalar a, const Tensor& b) { return where(cond, scalar_like(a, b, "where"), b); }

Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value) {
  STRATA_CHECK(x.defined(), "[masked_fill] input tensor is undefined");
  STRATA_CHECK(mask.defined() && mask.dtype() == kBool, "[masked_fill] mask must be a bool tensor");
  Shape b = broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  STRATA_CHECK(b == x.shape(), "[masked_fill] mask of shape {} does not broadcast to the tensor's shape {}",
               mask.shape(), x.shape());
  detail::check_fill_value(value, x.dtype(), "masked_fill");
  return where(mask, full({}, value, TensorOptions(x.dtype(), x.device())), x);
}

const Tensor& Tensor::masked_fill_(const Tensor& mask, Scalar value) const {
  STRATA_CHECK(mask.defined() && mask.dtype() == kBool, "[masked_fill] mask must be a bool tensor, got {}",
               mask.defined() ? fmt::format("{}", mask.dtype()) : std::string("undefined"));
  STRATA_CHECK(mask.device() == device(), "[masked_fill] mask is on {} but the tensor is on {}", mask.device(),
               device());
  Shape b = broadcast_shapes(shape(), mask.shape(), "masked_fill");
  STRATA_CHECK(b == shape(), "[masked_fill] mask of shape {} does not broadcast to the tensor's shape {}",
               mask.shape(), shape());
  detail::check_writable(*this, "masked_fill_");
  detail::check_fill_value(value, dtype(), "masked_fill");
  Tensor self = *this;
  if (autograd::detail::inplace_records(self)) {  // Note [In-place under autograd]
    autograd::record_inplace(self, "masked_fill_", false,
                             [&](const Tensor& x) { return strata::masked_fill(x, mask, value); });
    return *this;
  }
  Tensor v = full({}, value, TensorOptions(dtype(), device()));
  const Tensor ins[3] = {detail::unaliased(mask, *this), v, *this};  // a mask in self's memory is read whole first
  Tensor out = self;
  run_kernel(OpId::where, dtype(), KernelCall{ins, {&out, 1}});
  storage()->bump_version();
  return *this;
}

const Tensor& Tensor::add_(const Tensor& other, Scalar alpha) const {
  check_alpha(*this, other, alpha, "add_");
  return binary_inplace(OpId::add, *this, alpha.to_double() == 1.0 ? other : strata::mul(other, alpha));
}
const Tensor& Tensor::add_(Scalar other) const {
  return with_scalar_inplace(*this, other, [](const Tensor& x, const Tensor& y) { x.add_(y); }, OpId::add);
}
const Tensor& Tensor::sub_(const Tensor& other, Scalar alpha) const {
  check_sub_operands(is_bool(*this), is_bool(other));
  check_alpha(*this, other, alpha, "sub_");
  return binary_inplace(OpId::sub, *this, alpha.to_double() == 1.0 ? other : strata::mul(other, alpha));
}
const Tensor& Tensor::sub_(Scalar other) const {
  check_sub_operands(is_bool(*this), is_bool(other));
  return with_scalar_inplace(*this, other, [](const Tensor& x, const Tensor& y) { x.sub_(y); }, OpId::sub);
}
const Tensor& Tensor::mul_(const Tensor& other) const { return binary_inplace(OpId::mul, *this, other); }
const Tensor& Tensor::mul_(Scalar other) const {
  return with_scalar_inplace(*this, other, [](const Tensor& x, const Tensor& y) { x.mul_(y); }, OpId::mul);
}
const Tensor& Tensor::div_(const Tensor& other) const { return binary_inplace(OpId::div, *this, other, true); }
const Tensor& Tensor::div_(Scalar other) const {
  return with_scalar_inplace(*this, other, [](const Tensor& x, const Tensor& y) { x.div_(y); }, OpId::div);
}

Tensor Tensor::pow(const Tensor& exponent) const { return strata::pow(*this, exponent); }

namespace {
void check_masks(const Tensor& a, const Tensor& b, const char* op) {
  auto dtype = [](const Tensor& t) { return t.defined() ? fmt::format("{}", t.dtype()) : std::string("undefined"); };
  STRATA_CHECK(a.defined() && b.defined() && a.dtype() == kBool && b.dtype() == kBool,
               "[{}] takes two bool tensors (masks), got {} and {}", op, dtype(a), dtype(b));
}
}  // namespace

Tensor operator&(const Tensor& a, const Tensor& b) {
  check_masks(a, b, "operator&");
  return logical_and(a, b);
}
Tensor operator|(const Tensor& a, const Tensor& b) {
  check_masks(a, b, "operator|");
  return logical_or(a, b);
}
Tensor operator^(const Tensor& a, const Tensor& b) {
  check_masks(a, b, "operator^");
  return ne(a, b);
}
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
Tensor operator+(Scalar a, const Tensor& b) { return with_scalar(b, a, kAdd, OpId::add, true); }
Tensor operator-(Scalar a, const Tensor& b) {
  check_sub_operands(is_bool(a), is_bool(b));
  return with_scalar(b, a, kSub, OpId::sub, true);
}
Tensor operator*(Scalar a, const Tensor& b) { return with_scalar(b, a, kMul, OpId::mul, true); }
Tensor operator/(Scalar a, const Tensor& b) { return with_scalar(b, a, kDiv, OpId::div, true); }
Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
Tensor operator==(const Tensor& a, Scalar b) { return eq(a, b); }
Tensor operator!=(const Tensor& a, Scalar b) { return ne(a, b); }
Tensor operator<(const Tensor& a, Scalar b) { return lt(a, b); }
Tensor operator<=(const Tensor& a, Scalar b) { return le(a, b); }
Tensor operator>(const Tensor& a, Scalar b) { return gt(a, b); }
Tensor operator>=(const Tensor& a, Scalar b) { return ge(a, b); }

}  // namespace strata
