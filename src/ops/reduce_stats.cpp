// The two-pass and floating-only reductions: var and std (mean first, then squared
// deviations from it), logsumexp (max first, then the sum of shifted exponentials) and the
// vector norms.
#include <strata/amp/autocast.hpp>
#include <strata/autograd/graph.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/unary.hpp>
#include <algorithm>
#include <cmath>
#include <limits>

#include <strata/ops/reduce.hpp>

#include "core/registry_internal.h"
#include "ops/reduce_grad.h"
#include "core/tensor_internal.h"
#include "kernels/common/convert.h"
#include "kernels/common/reduce_ops.h"
#include "ops/dispatch.h"
#include "ops/reduce_plan.h"

namespace strata {

namespace {

void cpu_var(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& out = call.outputs[0];
  const auto& p = call.param<ReduceParams>();
  auto plan = detail::make_reduce_plan(x, out, p.dims, "var");
  STRATA_CHECK(out.dtype() == x.dtype(), "[var] output dtype {} should be {}", out.dtype(), x.dtype());
  dispatch<DTypeSet::Floating>(x.dtype(), "var", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = math::acc_t<T>;
    const T* in = static_cast<const T*>(x.data());
    const Acc n = static_cast<Acc>(plan.num_red);
    std::vector<Acc> mean(static_cast<size_t>(plan.num_out));
    Acc* m = mean.data();
    cpu::reduce(plan, in, math::SumReduce<T>{}, [=](int64_t, int64_t o, Acc acc) { m[o] = acc / n; });
    const Acc divisor = std::max(Acc(0), n - static_cast<Acc>(p.correction));
    const bool take_sqrt = p.take_sqrt;
    T* y = static_cast<T*>(out.data());
    cpu::reduce(plan, in, math::SquaredDeviationReduce<T>{m}, [=](int64_t off, int64_t, Acc acc) {
      Acc v = acc / divisor;
      y[off] = convert<T>(take_sqrt ? std::sqrt(v) : v);
    });
  });
}

void cpu_logsumexp(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& out = call.outputs[0];
  auto plan = detail::make_reduce_plan(x, out, call.param<ReduceParams>().dims, "logsumexp");
  STRATA_CHECK(out.dtype() == x.dtype(), "[logsumexp] output dtype {} should be {}", out.dtype(), x.dtype());
  dispatch<DTypeSet::Floating>(x.dtype(), "logsumexp", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    using Acc = math::acc_t<T>;
    const T* in = static_cast<const T*>(x.data());
    std::vector<C> shift(static_cast<size_t>(plan.num_out));
    C* s = shift.data();
    // an infinite max would give inf - inf: shift by 0 instead, which keeps inf and -inf
    cpu::reduce(plan, in, math::MaxReduce<T>{}, [=](int64_t, int64_t o, C m) { s[o] = std::isinf(m) ? C(0) : m; });
    T* y = static_cast<T*>(out.data());
    cpu::reduce(plan, in, math::ShiftedExpReduce<T>{s}, [=](int64_t off, int64_t o, Acc acc) {
      y[off] = convert<T>(static_cast<Acc>(s[o]) + std::log(acc));
    });
  });
}

template <math::NormKind K>
void norm_kind(const cpu::ReducePlan& plan, const Tensor& x, Tensor& out, double p) {
  dispatch<DTypeSet::Floating>(x.dtype(), "norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = math::acc_t<T>;
    const Acc inv_p = static_cast<Acc>(1 / p);
    T* y = static_cast<T*>(out.data());
    cpu::reduce(plan, static_cast<const T*>(x.data()), math::NormReduce<T, K>{static_cast<Acc>(p)},
                [=](int64_t off, int64_t, Acc acc) {
                  if constexpr (K == math::NormKind::Two) y[off] = convert<T>(std::sqrt(acc));
                  else if constexpr (K == math::NormKind::General) y[off] = convert<T>(std::pow(acc, inv_p));
                  else y[off] = convert<T>(acc);
                });
  });
}

void cpu_norm(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& out = call.outputs[0];
  const auto& params = call.param<ReduceParams>();
  auto plan = detail::make_reduce_plan(x, out, params.dims, "norm");
  STRATA_CHECK(out.dtype() == x.dtype(), "[norm] output dtype {} should be {}", out.dtype(), x.dtype());
  const double p = params.p, inf = std::numeric_limits<double>::infinity();
  if (p == 2) norm_kind<math::NormKind::Two>(plan, x, out, p);
  else if (p == 1) norm_kind<math::NormKind::One>(plan, x, out, p);
  else if (p == 0) norm_kind<math::NormKind::Zero>(plan, x, out, p);
  else if (p == inf) norm_kind<math::NormKind::Inf>(plan, x, out, p);
  else if (p == -inf) norm_kind<math::NormKind::NegInf>(plan, x, out, p);
  else norm_kind<math::NormKind::General>(plan, x, out, p);
}

ReduceParams float_params(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, std::string_view op) {
  ReduceParams p;
  p.dims = detail::reduce_dims(x, dims, op);
  p.keepdim = keepdim;
  STRATA_CHECK(is_floating(x.dtype()), "[{}] needs a floating input, got {}", op, x.dtype());
  return p;
}

}  // namespace

namespace detail {
void register_reduce_stats_kernels(KernelTable& table) {
  constexpr auto CPU = DeviceType::CPU;
  table.set(OpId::var, CPU, kFloatDTypes, cpu_var);
  table.set(OpId::logsumexp, CPU, kFloatDTypes, cpu_logsumexp);
  table.set(OpId::norm, CPU, kFloatDTypes, cpu_norm);
}
}  // namespace detail

Tensor var(const Tensor& x, const std::vector<int64_t>& dims, double correction, bool keepdim) {
  ReduceParams p = float_params(x, dims, keepdim, "var");
  STRATA_CHECK(std::isfinite(correction), "[var] correction must be finite, got {}", correction);
  p.correction = correction;
  Tensor r = detail::run_reduction(OpId::var, x, p, x.dtype());
  if (autograd::any_requires_grad({&x})) {
    double denom = static_cast<double>(detail::reduced_numel(x.shape(), p.dims)) - correction;
    autograd::record("var", {x}, {r}, {x}, [d = p.dims, keep = p.keepdim, denom](const autograd::Grads& g,
                                                                                const autograd::Saved& s) {
      Tensor centered = s[0] - mean(s[0], d, true);
      return autograd::Grads{detail::unreduce(g[0], d, keep) * centered * (2.0 / denom)};
    });
  }
  return r;
}

Tensor std(const Tensor& x, const std::vector<int64_t>& dims, double correction, bool keepdim) {
  ReduceParams p = float_params(x, dims, keepdim, "std");
  STRATA_CHECK(std::isfinite(correction), "[std] correction must be finite, got {}", correction);
  p.correction = correction;
  p.take_sqrt = true;
  Tensor r = detail::run_reduction(OpId::var, x, p, x.dtype());
  if (autograd::any_requires_grad({&x})) {
    // var's gradient / (2 std), and 0 where std is 0 (a constant group), as in PyTorch: the
    // derivative of sqrt there is infinite, and 0 * inf would be NaN
    double denom = static_cast<double>(detail::reduced_numel(x.shape(), p.dims)) - correction;
    autograd::record("std", {x}, {r}, {x, r}, [d = p.dims, keep = p.keepdim, denom](const autograd::Grads& g,
                                                                                   const autograd::Saved& s) {
      const Tensor centered = s[0] - mean(s[0], d, true), sd = detail::unreduce(s[1], d, keep);
      const Tensor constant = sd == 0;
      return autograd::Grads{
          where(constant, 0, detail::unreduce(g[0], d, keep) * centered / (where(constant, 1, sd) * denom))};
    });
  }
  return r;
}

Tensor logsumexp(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  amp::detail::AutocastScope amp_scope("logsumexp", x);
  if (amp_scope.cast()) return logsumexp(amp_scope[0], dims, keepdim);
  STRATA_CHECK(x.defined(), "[logsumexp] input tensor is undefined");
  // integers and bool compute in float32, as in PyTorch
  Tensor in = is_floating(x.dtype()) ? x : x.to(kFloat32);
  ReduceParams p = float_params(in, dims, keepdim, "logsumexp");
  Tensor r = detail::run_reduction(OpId::logsumexp, in, p, in.dtype());
  if (autograd::any_requires_grad({&in})) {
    autograd::record("logsumexp", {in}, {r}, {in, r}, [d = p.dims, keep = p.keepdim](const autograd::Grads& g,
                                                                                     const autograd::Saved& s) {
      return autograd::Grads{detail::unreduce(g[0], d, keep) * exp(s[0] - detail::unreduce(s[1], d, keep))};
    });
  }
  return r;
}

Tensor norm(const Tensor& x, double p, const std::vector<int64_t>& dims, bool keepdim) {
  amp::detail::AutocastScope amp_scope("norm", x);
  if (amp_scope.cast()) return norm(amp_scope[0], p, dims, keepdim);
  ReduceParams params = float_params(x, dims, keepdim, "norm");
  STRATA_CHECK(!std::isnan(p), "[norm] p must not be NaN");
  const bool infinite = std::isinf(p);
  STRATA_CHECK(!infinite || detail::reduced_numel(x.shape(), params.dims) > 0,
               "[norm] the {} norm of no elements is undefined (shape {}, dims {})", p, x.shape(), params.dims);
  params.p = p;
  Tensor r = detail::run_reduction(OpId::norm, x, params, x.dtype());
  if (autograd::any_requires_grad({&x})) {
    autograd::record("norm", {x}, {r}, {x, r}, [d = params.dims, keep = params.keepdim, p](const autograd::Grads& g,
                                                                                          const autograd::Saved& s) {
      Tensor gu = detail::unreduce(g[0], d, keep), n = detail::unreduce(s[1], d, keep);
      const Tensor& x = s[0];
      if (std::isinf(p)) {  // shared among the elements of extreme magnitude
        Tensor mask = (abs(x) == n).to(x.dtype());
        return autograd::Grads{gu * sign(x) * mask / sum(mask, d, true)};
      }
      if (p == 0) return autograd::Grads{zeros_like(x)};  // a count: constant almost everywhere
      if (p == 1) return autograd::Grads{gu * sign(x)};
      if (p == 2) return autograd::Grads{where(n == 0, 0, gu * x / n)};
      // d||x||_p / dx = sign(x) |x|^(p-1) / ||x||^(p-1); for p < 1, |x|^(p-1) is infinite at
      // x = 0, where PyTorch takes 0
      const Tensor scaled = p < 1 ? where(x == 0, 0, sign(x) * pow(abs(where(x == 0, 1, x)), p - 1))
                                  : sign(x) * pow(abs(x), p - 1);
      return autograd::Grads{where(n == 0, 0, gu * scaled / pow(where(n == 0, 1, n), p - 1))};
    });
  }
  return r;
}

Tensor norm(const Tensor& x, std::string_view p, const std::vector<int64_t>& dims, bool keepdim) {
  STRATA_CHECK(p == "fro", "[norm] unknown norm \"{}\": use \"fro\" or a number", p);
  return norm(x, 2.0, dims, keepdim);
}

}  // namespace strata
