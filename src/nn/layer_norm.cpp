// layer_norm, rms_norm and group_norm. All three run one dedicated kernel pair
// (kernels/cpu/layer_norm.h) that normalizes the rows of a contiguous (rows, n) view and keeps
// each row's mean and 1/std for the backward kernel; group_norm is that kernel over
// (N * groups) rows followed by the per-channel affine. When the backward is itself recorded
// (create_graph), the gradient is composed from strata ops instead, so that it can be
// differentiated again.
#include <limits>

#include <strata/amp/autocast.hpp>
#include <strata/autograd/graph.hpp>
#include <strata/nn/functional.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/cpu/layer_norm.h"
#include "ops/dispatch.h"

namespace strata::nn {

namespace {

template <class T> const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.data()) : nullptr;
}
template <class T> T* mut_ptr_or_null(const Tensor& t) { return t.defined() ? static_cast<T*>(t.data()) : nullptr; }

// inputs (x (rows, n), weight (n) or undefined, bias (n) or undefined); outputs (y, mean, rstd).
void cpu_layer_norm(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  const auto& p = call.param<LayerNormParams>();
  const int64_t rows = x.size(0), n = x.size(1);
  dispatch<DTypeSet::Floating>(x.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using S = compute_t<T>;
    cpu::layer_norm_forward<T, S>(static_cast<const T*>(x.data()), ptr_or_null<T>(call.inputs[1]),
                                  ptr_or_null<T>(call.inputs[2]), static_cast<T*>(call.outputs[0].data()),
                                  static_cast<S*>(call.outputs[1].data()), static_cast<S*>(call.outputs[2].data()), rows,
                                  n, p.eps, p.rms);
  });
}

// inputs (g, x, mean, rstd, weight or undefined); outputs (gx, gw or undefined, gb or undefined).
void cpu_layer_norm_backward(const KernelCall& call) {
  const Tensor& g = call.inputs[0];
  const Tensor& x = call.inputs[1];
  const auto& p = call.param<LayerNormParams>();
  const int64_t rows = x.size(0), n = x.size(1);
  dispatch<DTypeSet::Floating>(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using S = compute_t<T>;
    cpu::layer_norm_backward<T, S>(static_cast<const T*>(g.data()), static_cast<const T*>(x.data()),
                                   static_cast<const S*>(call.inputs[2].data()),
                                   static_cast<const S*>(call.inputs[3].data()), ptr_or_null<T>(call.inputs[4]),
                                   static_cast<T*>(call.outputs[0].data()), mut_ptr_or_null<T>(call.outputs[1]),
                                   mut_ptr_or_null<T>(call.outputs[2]), rows, n, p.rms);
  });
}

struct NormForward {
  Tensor y, mean, rstd;  // y (rows, n); mean, rstd (rows)
};

// x2 contiguous (rows, n); w1, b1 contiguous (n) of x2's dtype, or undefined.
NormForward run_norm_forward(const Tensor& x2, const Tensor& w1, const Tensor& b1, const LayerNormParams& p) {
  const int64_t rows = x2.size(0);
  NormForward f;
  f.y = detail::make_tensor(x2.shape(), x2.dtype(), x2.device());
  f.mean = detail::make_tensor({rows}, detail::compute_dtype(x2.dtype()), x2.device());
  f.rstd = detail::make_tensor({rows}, detail::compute_dtype(x2.dtype()), x2.device());
  if (x2.numel() == 0) {
    f.mean.fill_(0);
    f.rstd.fill_(std::numeric_limits<double>::quiet_NaN());
    return f;
  }
  const Tensor ins[3] = {x2, w1, b1};
  Tensor outs[3] = {f.y, f.mean, f.rstd};
  run_kernel(OpId::layer_norm, x2.dtype(), KernelCall{ins, outs, &p});
  return f;
}

// The gradients of the rows normalization composed from strata ops (differentiable again).
autograd::Grads composed_norm_backward(const Tensor& g, const Tensor& x, const Tensor& w, int64_t rows, int64_t n,
                                       const LayerNormParams& p, bool need_w, const Shape* bias_shape) {
  Tensor xr = x.reshape({rows, n}), gr = g.reshape({rows, n});
  Tensor xc = p.rms ? xr : xr - mean(xr, {1}, true);
  Tensor rs = rsqrt(mean(xc * xc, {1}, true) + p.eps);
  Tensor xhat = xc * rs;
  Tensor gh = w.defined() ? gr * w.reshape({n}) : gr;
  Tensor inner = gh - xhat * mean(gh * xhat, {1}, true);
  if (!p.rms) inner = inner - mean(gh, {1}, true);
  autograd::Grads out{(rs * inner).view(x.shape()), Tensor(), Tensor()};
  if (need_w) out[1] = (gr * xhat).sum({0}).view(w.shape());
  if (bias_shape) out[2] = gr.sum({0}).view(*bias_shape);
  return out;
}


// Normalizes x seen as (rows, n) in C order, with optional weight and bias of n elements (any
// shape), and records the backward. Arguments are checked by the callers.
Tensor normalize_rows(const Tensor& x, int64_t rows, int64_t n, const Tensor& weight, const Tensor& bias,
                      const LayerNormParams& p, const char* name) {
  // mixed dtypes: the casts are recorded, so gradients return in the parameters' dtype
  const Tensor w = weight.defined() ? weight.to(x.dtype()) : weight;
  const Tensor b = bias.defined() ? bias.to(x.dtype()) : bias;
  NormForward f;
  {
    NoGradGuard no_grad;
    Tensor x2 = x.contiguous().view({rows, n});
    Tensor w1 = w.defined() ? w.contiguous().view({n}) : w;
    Tensor b1 = b.defined() ? b.contiguous().view({n}) : b;
    f = run_norm_forward(x2, w1, b1, p);
  }
  Tensor y = f.y.view(x.shape());
  const bool need_w = w.defined() && w.requires_grad(), need_b = b.defined() && b.requires_grad();
  const Shape bshape = b.defined() ? b.shape() : Shape{};
  autograd::record(name, {x, w, b}, {y}, {x, w, f.mean, f.rstd},
                   [rows, n, p, need_w, need_b, bshape](const autograd::Grads& g, const autograd::Saved& s) {
                     const Tensor &x = s[0], &w = s[1];
                     if (autograd::is_grad_enabled())
                       return composed_norm_backward(g[0], x, w, rows, n, p, need_w, need_b ? &bshape : nullptr);
                     const Shape wshape = w.defined() ? w.shape() : Shape{};
                     const Tensor ins[5] = {g[0].contiguous().view({rows, n}), x.contiguous().view({rows, n}), s[2],
                                            s[3], w.defined() ? w.contiguous().view({n}) : w};
                     Tensor outs[3] = {strata::detail::make_tensor({rows, n}, x.dtype(), x.device()), Tensor(), Tensor()};
                     if (need_w) outs[1] = strata::detail::make_tensor({n}, x.dtype(), x.device());
                     if (need_b) outs[2] = strata::detail::make_tensor({n}, x.dtype(), x.device());
                     run_kernel(OpId::layer_norm_backward, x.dtype(), KernelCall{ins, outs, &p});
                     return autograd::Grads{outs[0].view(x.shape()), need_w ? outs[1].view(wshape) : Tensor(),
                                            need_b ? outs[2].view(bshape) : Tensor()};
                   });
  return y;
}


// Elements in the trailing normalized_shape of x; checks x, the shape and the parameters.
int64_t check_normalized(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                         std::string_view op) {
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op);
  STRATA_CHECK(is_floating(x.dtype()), "[{}] needs a floating input, got {}", op, x.dtype());
  STRATA_CHECK(!normalized_shape.empty(), "[{}] normalized_shape must not be empty", op);
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  bool ok = x.dim() >= k;
  for (int64_t i = 0; ok && i < k; ++i) ok = x.size(x.dim() - k + i) == normalized_shape[i];
  STRATA_CHECK(ok, "[{}] input of shape {} does not end in normalized_shape {}", op, x.shape(), normalized_shape);
  for (const Tensor* t : {&weight, &bias}) {
    if (!t->defined()) continue;
    STRATA_CHECK(t->shape() == normalized_shape, "[{}] {} of shape {} does not match normalized_shape {}", op,
                 t == &weight ? "weight" : "bias", t->shape(), normalized_shape);
    STRATA_CHECK(t->device() == x.device(), "[{}] {} is on {} but the input is on {}", op,
                 t == &weight ? "weight" : "bias", t->device(), x.device());
  }
  return checked_numel(normalized_shape, op);
}

int64_t leading_rows(const Tensor& x, int64_t trailing_dims) {
  int64_t rows = 1;
  for (int64_t d = 0; d < x.dim() - trailing_dims; ++d) rows *= x.size(d);
  return rows;
}

// The epsilon of the type the norm is computed in, as PyTorch's kernels take it: float's for
// float16 and bfloat16 (their own, 2^-10 and 2^-7, would shrink every output by up to 1%).
double machine_epsilon(DType t) {
  return t == kFloat64 ? std::numeric_limits<double>::epsilon() : std::numeric_limits<float>::epsilon();
}

}  // namespace

namespace functional {

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  amp::detail::AutocastScope amp_scope("layer_norm", x, weight, bias);
  if (amp_scope.cast()) return layer_norm(amp_scope[0], normalized_shape, amp_scope[1], amp_scope[2], eps);
  const int64_t n = check_normalized(x, normalized_shape, weight, bias, "layer_norm");
  STRATA_CHECK(eps >= 0, "[layer_norm] eps must be non-negative, got {}", eps);
  const int64_t rows = leading_rows(x, static_cast<int64_t>(normalized_shape.size()));
  return normalize_rows(x, rows, n, weight, bias, LayerNormParams{eps, false}, "layer_norm");
}

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, std::optional<double> eps) {
  amp::detail::AutocastScope amp_scope("rms_norm", x, weight);
  if (amp_scope.cast()) return rms_norm(amp_scope[0], normalized_shape, amp_scope[1], eps);
  const int64_t n = check_normalized(x, normalized_shape, weight, Tensor(), "rms_norm");
  const double e = eps ? *eps : machine_epsilon(x.dtype());
  STRATA_CHECK(e >= 0, "[rms_norm] eps must be non-negative, got {}", e);
  const int64_t rows = leading_rows(x, static_cast<int64_t>(normalized_shape.size()));
  return normalize_rows(x, rows, n, weight, Tensor(), LayerNormParams{e, true}, "rms_norm");
}

Tensor group_norm(const Tensor& x, int64_t num_groups, const Tensor& weight, const Tensor& bias, double eps) {
  amp::detail::AutocastScope amp_scope("group_norm", x, weight, bias);
  if (amp_scope.cast()) return group_norm(amp_scope[0], num_groups, amp_scope[1], amp_scope[2], eps);
  STRATA_CHECK(x.defined(), "[group_norm] input tensor is undefined");
  STRATA_CHECK(is_floating(x.dtype()), "[group_norm] needs a floating input, got {}", x.dtype());
  STRATA_CHECK(x.dim() >= 2, "[group_norm] expects an input of shape (N, C, *), got {}", x.shape());
  const int64_t c = x.size(1);
  STRATA_CHECK(num_groups > 0 && c % num_groups == 0,
               "[group_norm] num_groups ({}) must be positive and divide the {} channels of input {}", num_groups, c,
               x.shape());
  for (const Tensor* t : {&weight, &bias}) {
    if (!t->defined()) continue;
    STRATA_CHECK(t->shape() == Shape{c}, "[group_norm] {} of shape {} does not match the {} channels of input {}",
                 t == &weight ? "weight" : "bias", t->shape(), c, x.shape());
    STRATA_CHECK(t->device() == x.device(), "[group_norm] parameters are on {} but the input is on {}", t->device(),
                 x.device());
  }
  STRATA_CHECK(eps >= 0, "[group_norm] eps must be non-negative, got {}", eps);
  const int64_t rows = x.size(0) * num_groups;
  const int64_t n = rows == 0 ? 0 : x.numel() / rows;
  Tensor y = normalize_rows(x, rows, n, Tensor(), Tensor(), LayerNormParams{eps, false}, "group_norm");
  Shape per_channel(static_cast<size_t>(x.dim()), 1);
  per_channel[1] = c;
  if (weight.defined()) y = y * weight.to(x.dtype()).view(per_channel);
  if (bias.defined()) y = y + bias.to(x.dtype()).view(per_channel);
  return y;
}

}  // namespace functional

}  // namespace strata::nn

namespace strata::detail {
void register_layer_norm_kernels(KernelTable& table) {
  table.set(OpId::layer_norm, DeviceType::CPU, kFloatDTypes, nn::cpu_layer_norm);
  table.set(OpId::layer_norm_backward, DeviceType::CPU, kFloatDTypes, nn::cpu_layer_norm_backward);
}
}  // namespace strata::detail
