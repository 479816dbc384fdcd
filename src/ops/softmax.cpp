// Ops along one dim: softmax, log_softmax (and their fused gradients), cumsum and cumprod.
// The input is made contiguous and seen as (outer, n, inner) around the dim; the loops are in
// kernels/cpu/softmax.h and kernels/cpu/scan.h.
#include <algorithm>

#include <strata/amp/autocast.hpp>
#include <strata/autograd/grad_mode.hpp>
#include <strata/autograd/graph.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/join.hpp>
#include <strata/ops/unary.hpp>
#include <strata/ops/reduce.hpp>

#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/cpu/scan.h"
#include "kernels/cpu/softmax.h"
#include "ops/dispatch.h"
#include "ops/softmax_internal.h"

namespace strata {

namespace {

struct Extent {
  int64_t outer = 1, n = 1, inner = 1;
};

// (outer, n, inner) of a contiguous tensor around `dim`; a 0-d tensor is one element.
Extent extent_of(const Tensor& x, int64_t dim) {
  Extent e;
  for (int64_t d = 0; d < x.dim(); ++d) {
    int64_t s = x.shape()[d];
    if (d < dim) e.outer *= s;
    else if (d == dim) e.n = s;
    else e.inner *= s;
  }
  return e;
}

void check_contiguous_pair(const Tensor& x, const Tensor& y, std::string_view op) {
  STRATA_CHECK(x.is_contiguous() && y.is_contiguous() && x.shape() == y.shape() && x.dtype() == y.dtype(),
               "[{}] kernel needs contiguous input and output of one shape and dtype", op);
}

template <bool Log>
void cpu_softmax(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  check_contiguous_pair(x, y, "softmax");
  const SoftmaxParams& p = call.param<SoftmaxParams>();
  Extent e = extent_of(x, p.dim);
  STRATA_CHECK(p.causal_rows == 0 || e.inner == 1, "[softmax] a causal mask needs the last dim");
  dispatch<DTypeSet::Floating>(x.dtype(), "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::softmax(static_cast<const T*>(x.data()), static_cast<T*>(y.data()), e.outer, e.n, e.inner, Log,
                 p.causal_rows);
  });
}

// inputs y, g; output dx: contiguous, of one shape and dtype.
template <bool Log>
void cpu_softmax_backward(const KernelCall& call) {
  const char* op = Log ? "log_softmax_backward" : "softmax_backward";
  const Tensor &y = call.inputs[0], &g = call.inputs[1];
  Tensor& dx = call.outputs[0];
  check_contiguous_pair(y, dx, op);
  check_contiguous_pair(g, dx, op);
  Extent e = extent_of(y, call.param<SoftmaxParams>().dim);
  dispatch<DTypeSet::Floating>(y.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::softmax_backward(static_cast<const T*>(y.data()), static_cast<const T*>(g.data()), static_cast<T*>(dx.data()),
                          e.outer, e.n, e.inner, Log);
  });
}

template <bool IsProd>
void cpu_scan(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  check_contiguous_pair(x, y, "cumsum");
  Extent e = extent_of(x, call.param<DimParams>().dim);
  dispatch(x.dtype(), "cumsum", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::scan<IsProd>(static_cast<const T*>(x.data()), static_cast<T*>(y.data()), e.outer, e.n, e.inner);
  });
}

Tensor along_dim(OpId op, const Tensor& x, int64_t dim, DType dtype, int64_t causal_rows = 0) {
  SoftmaxParams p;
  p.dim = normalize_dim(dim, x.dim(), op_name(op));
  p.causal_rows = causal_rows;
  Tensor in = x.to(dtype).contiguous();
  Tensor out = detail::make_tensor(in.shape(), dtype, in.device());
  if (out.numel() > 0) run_kernel(op, dtype, KernelCall{{&in, 1}, {&out, 1}, &p});
  return out;
}

// dx of softmax (or log_softmax) from its output y and the gradient g in y, along dim d. One
// fused kernel; while the backward itself records a graph (create_graph), the same formula
// in differentiable ops.
Tensor softmax_backward(OpId forward, const Tensor& y, const Tensor& g, int64_t d) {
  const bool log = forward == OpId::log_softmax;
  if (autograd::is_grad_enabled() && autograd::any_requires_grad({&y, &g}))
    return log ? g - exp(y) * sum(g, {d}, true) : y * (g - sum(g * y, {d}, true));
  const OpId op = log ? OpId::log_softmax_backward : OpId::softmax_backward;
  Tensor ins[2] = {y.contiguous(), g.to(y.dtype()).contiguous()};
  STRATA_CHECK(ins[1].shape() == y.shape() && ins[1].device() == y.device(),
               "[{}] gradient {} on {} does not match the output {} on {}", op_name(op), ins[1].shape(),
               ins[1].device(), y.shape(), y.device());
  Tensor dx = detail::make_tensor(y.shape(), y.dtype(), y.device());
  SoftmaxParams p;
  p.dim = d;
  if (dx.numel() > 0) run_kernel(op, y.dtype(), KernelCall{ins, {&dx, 1}, &p});
  return dx;
}

Tensor softmax_op(OpId op, const Tensor& x, int64_t dim, std::optional<DType> dtype, int64_t causal_rows = 0) {
  amp::detail::AutocastScope amp_scope(op_name(op), x);
  if (amp_scope.cast()) return softmax_op(op, amp_scope[0], dim, dtype, causal_rows);
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op_name(op));
  DType t = dtype ? *dtype : x.dtype();
  STRATA_CHECK(is_floating(t), "[{}] needs a floating input or dtype, got {}", op_name(op), t);
  Tensor in = x.to(t);
  Tensor y = along_dim(op, in, dim, t, causal_rows);
  if (autograd::any_requires_grad({&in})) {
    const int64_t d = normalize_dim(dim, x.dim(), op_name(op));
    // a causal softmax's masked outputs are 0 whatever the input: the plain softmax gradient,
    // y (g - sum g y), is 0 there too
    const char* name = op == OpId::softmax ? "softmax" : "log_softmax";
    autograd::record(name, {in}, {y}, {y}, [op, d](const autograd::Grads& g, const autograd::Saved& s) {
      return autograd::Grads{softmax_backward(op, s[0], g[0], d)};
    });
    if (y.grad_fn()) y.grad_fn()->dims = {d};
  }
  return y;
}

// cumprod's gradient as a recorded formula that holds at any zeros, for create_graph: x_k's is
// (prod_{l<k} x_l) sum_{j>=k} g_j prod_{k<l<=j} x_l, one suffix product per k (n^2 / 2
// multiplies), as PyTorch's double-backward formula. Without zeros y / x is exact to all orders.
Tensor cumprod_grad_recorded(const Tensor& x, const Tensor& g, int64_t d) {
  const int64_t n = x.size(d);
  Shape one_shape = x.shape();
  one_shape[static_cast<size_t>(d)] = 1;
  const Tensor one = ones(one_shape, TensorOptions().dtype(x.dtype()).device(x.device()));
  std::vector<Tensor> sums;
  for (int64_t k = 0; k < n; ++k) {
    const Tensor tail = cumprod(cat({one, x.narrow(d, k + 1, n - k - 1)}, d), d);
    sums.push_back(sum(g.narrow(d, k, n - k) * tail, {d}, true));
  }
  const Tensor prefix = cumprod(cat({one, x.narrow(d, 0, n - 1)}, d), d);
  return prefix * cat(sums, d);
}

Tensor scan_op(OpId op, const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  amp::detail::AutocastScope amp_scope(op_name(op), x);
  if (amp_scope.cast()) return scan_op(op, amp_scope[0], dim, dtype);
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op_name(op));
  // integers and bool accumulate in int64, as in PyTorch
  DType t = dtype ? *dtype : is_floating(x.dtype()) ? x.dtype() : kInt64;
  if (!is_floating(t) && t != kInt64) return along_dim(op, x, dim, kInt64).to(t);
  Tensor in = x.to(t);
  Tensor y = along_dim(op, in, dim, t);
  if (is_floating(t) && autograd::any_requires_grad({&in})) {
    int64_t d = normalize_dim(dim, x.dim(), op_name(op));
    // the gradient of a prefix sum is the suffix sum of g: a prefix sum of g reversed along d,
    // reversed back (total - prefix + g would cancel small entries against large ones)
    auto suffix_sum = [d](const Tensor& g) {
      if (g.dim() == 0) return g;
      const int64_t n = g.size(d);
      const Tensor backwards = arange(n - 1, -1, -1, TensorOptions().dtype(kInt64).device(g.device()));
      return index_select(cumsum(index_select(g, d, backwards), d), d, backwards);
    };
    if (op == OpId::cumsum) {
      autograd::record("cumsum", {in}, {y}, {}, [suffix_sum](const autograd::Grads& g, const autograd::Saved&) {
        return autograd::Grads{suffix_sum(g[0])};
      });
    } else {
      // cumprod: d y_j / d x_i = y_j / x_i for j >= i where x_i != 0. At a row's first zero k,
      // sum_{j >= k} g_j prod_{l <= j, l != k} x_l: the same suffix sum over the cumprod of x
      // with that zero replaced by 1. Past it every y_j holds x_k = 0: a zero gradient.
      autograd::record("cumprod", {in}, {y}, {in, y}, [suffix_sum, d](const autograd::Grads& g,
                                                                      const autograd::Saved& s) {
        const Tensor& x = s[0];
        const Tensor zero = x == 0;
        if (autograd::is_grad_enabled() && sum(zero).item<int64_t>() > 0)
          return autograd::Grads{cumprod_grad_recorded(x, g[0], d)};
        const Tensor first_zero = logical_and(zero, cumsum(zero, d) == 1);
        const Tensor nonzero = where(zero, 1, x);
        const Tensor at_first_zero = suffix_sum(g[0] * cumprod(where(first_zero, 1, x), d));
        return autograd::Grads{
            where(zero, where(first_zero, at_first_zero, 0), suffix_sum(g[0] * s[1]) / nonzero)};
      });
    }
  }
  return y;
}

}  // namespace

namespace detail {
void register_softmax_kernels(KernelTable& table) {
  constexpr auto CPU = DeviceType::CPU;
  table.set(OpId::softmax, CPU, kFloatDTypes, cpu_softmax<false>);
  table.set(OpId::log_softmax, CPU, kFloatDTypes, cpu_softmax<true>);
  table.set(OpId::softmax_backward, CPU, kFloatDTypes, cpu_softmax_backward<false>);
  table.set(OpId::log_softmax_backward, CPU, kFloatDTypes, cpu_softmax_backward<true>);
  for (DType t : {kInt64, kFloat16, kBFloat16, kFloat32, kFloat64}) {
    table.set(OpId::cumsum, CPU, t, cpu_scan<false>);
    table.set(OpId::cumprod, CPU, t, cpu_scan<true>);
  }
}

Tensor causal_softmax(const Tensor& scores) {
  STRATA_CHECK(scores.defined() && scores.dim() >= 2, "[softmax] a causal softmax needs (..., L, S) scores, got {}",
               scores.defined() ? scores.shape() : Shape{});
  return softmax_op(OpId::softmax, scores, -1, std::nullopt, std::max<int64_t>(scores.size(-2), 1));
}
}  // namespace detail

Tensor softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  return softmax_op(OpId::softmax, x, dim, dtype);
}
Tensor log_softmax(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  return softmax_op(OpId::log_softmax, x, dim, dtype);
}
Tensor cumsum(const Tensor& x, int64_t dim, std::optional<DType> dtype) { return scan_op(OpId::cumsum, x, dim, dtype); }
Tensor cumprod(const Tensor& x, int64_t dim, std::optional<DType> dtype) {
  return scan_op(OpId::cumprod, x, dim, dtype);
}

}  // namespace strata
