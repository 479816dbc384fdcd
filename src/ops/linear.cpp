// linear: y = x W^T + b, optionally GELU(tanh)'d, the op behind nn::functional::linear. The
// public function checks, promotes dtypes and folds x's leading dims into rows; the kernels
// see x (rows, in) of any strides, weight (out, in) of any strides, bias (out) contiguous or
// undefined, and a contiguous y (rows, out). The CPU kernel is one GEMM (kernels/cpu/gemm.h)
// then one pass over y adding the bias (and applying GELU); the CUDA kernel
// (src/ops/cuda/matmul.cpp) does both inside cuBLASLt's epilogue. The backward is written
// with matmul and sum below the forward.
#include <algorithm>
#include <stdexcept>
#include <string_view>
#include <type_traits>

#include <strata/amp/autocast.hpp>
#include <strata/autograd/graph.hpp>
#include <strata/ops/matmul.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/common/unary_math.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "ops/dispatch.h"
#include "ops/matmul_plan.h"

namespace strata {

namespace {

// y[r, j] = gelu?(y[r, j] + bias[j]) in the compute type, rounded once.
template <class T>
void bias_and_gelu_rows(T* y, const T* bias, int64_t rows, int64_t n, bool gelu) {
  using C = compute_t<T>;
  const int64_t grain = std::max<int64_t>(1, cpu::kDefaultGrain / std::max<int64_t>(n, 1));
  cpu::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* row = y + r * n;
      if (bias)
        for (int64_t j = 0; j < n; ++j) row[j] = static_cast<T>(static_cast<C>(row[j]) + static_cast<C>(bias[j]));
      if constexpr (std::is_floating_point_v<C>) {
        if (gelu)
          for (int64_t j = 0; j < n; ++j) row[j] = static_cast<T>(math::GeluTanh{}(static_cast<C>(row[j])));
      }
    }
  });
}

void cpu_linear(const KernelCall& call) {
  Tensor x = call.inputs[0], wt = call.inputs[1].t();  // (rows, in), (in, out)
  const Tensor& bias = call.inputs[2];
  Tensor& y = call.outputs[0];
  const bool gelu = call.param<LinearParams>().gelu_tanh;
  if (y.numel() == 0) return;
  const detail::GemmPlan plan = detail::plan_gemm(x, wt, y);
  cpu::GemmProblem p;
  p.type = detail::cpu_gemm_type(y.dtype(), "linear");
  p.m = plan.m;
  p.n = plan.n;
  p.k = plan.k;
  if (plan.k > 0) {
    p.a = cpu::GemmInput{x.data(), plan.a.ld, 0, plan.a.trans};
    p.b = cpu::GemmInput{wt.data(), plan.b.ld, 0, plan.b.trans};
  }
  p.c = cpu::GemmOutput{y.data(), plan.ldc, 0};
  try {
    cpu::gemm(p);
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const Error*>(&e)) throw;
    detail::throw_error("[linear] {} (input {}, weight {})", e.what(), x.shape(), call.inputs[1].shape());
  }
  if (!bias.defined() && !gelu) return;
  dispatch<DTypeSet::Numeric>(y.dtype(), "linear", [&](auto tag) {
    using T = typename decltype(tag)::type;
    bias_and_gelu_rows<T>(static_cast<T*>(y.data()), bias.defined() ? static_cast<const T*>(bias.data()) : nullptr,
                          y.size(0), y.size(1), gelu);
  });
}

// Runs the op; no autograd here. Returns y of shape (*, out).
Tensor linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, bool gelu, std::string_view op) {
  STRATA_CHECK(x.defined() && weight.defined(), "[{}] input or weight is undefined", op);
  STRATA_CHECK(weight.dim() == 2, "[{}] weight must be 2-d (out_features, in_features), got shape {}", op,
               weight.shape());
  STRATA_CHECK(x.dim() >= 1, "[{}] input must have at least 1 dim, got a 0-d tensor", op);
  STRATA_CHECK(x.size(-1) == weight.size(1),
               "[{}] input of shape {} has {} features in its last dim, but weight of shape {} expects {}", op,
               x.shape(), x.size(-1), weight.shape(), weight.size(1));
  STRATA_CHECK(!bias.defined() || bias.shape() == Shape{weight.size(0)},
               "[{}] bias of shape {} does not match weight of shape {}", op, bias.shape(), weight.shape());
  STRATA_CHECK(x.device() == weight.device() && (!bias.defined() || bias.device() == x.device()),
               "[{}] input, weight and bias must be on one device, got {}, {} and {}", op, x.device(),
               weight.device(), bias.defined() ? bias.device() : x.device());
  DType t = promote_types(x.dtype(), weight.dtype());
  if (bias.defined()) t = promote_types(t, bias.dtype());
  STRATA_CHECK(t != kBool, "[{}] not supported for bool tensors", op);
  STRATA_CHECK(!gelu || is_floating(t), "[{}] needs floating-point tensors, got {}", op, t);

  const int64_t in = weight.size(1), out = weight.size(0);
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  Shape shape = x.shape();
  shape.back() = out;
  NoGradGuard no_grad;  // the casts and reshapes are not part of the graph
  const Tensor ins[3] = {x.to(t).reshape({rows, in}), weight.to(t),
                         bias.defined() ? bias.to(t).contiguous() : Tensor()};
  Tensor y = detail::make_tensor({rows, out}, t, x.device());
  const LinearParams params{gelu};
  run_kernel(OpId::linear, t, KernelCall{ins, {&y, 1}, &params});
  return y.view(shape);
}

// The gradients of x W^T + b, with x's leading dims folded into rows: gx = g W, gW = g^T x,
// gb = the column sums of g. Inputs that did not require grad get none. gW is the product
// g^T x itself, so it comes out contiguous like W: (x^T g)^T would be a transposed view that
// the optimizer copies into a contiguous tensor on every step.
// x is saved only for gW and W only for gx (an unsaved one is undefined here), so a frozen
// weight or a constant input is neither kept alive nor checked for later in-place writes.
autograd::Grads linear_backward(const Tensor& g, const Tensor& x, const Tensor& w, const Shape& x_shape,
                                int64_t in, bool need_x, bool need_w, bool need_b) {
  int64_t rows = 1;  // from x's shape: g has no elements to count when W has no rows
  for (size_t d = 0; d + 1 < x_shape.size(); ++d) rows *= x_shape[d];
  const int64_t out = g.dim() > 0 ? g.size(-1) : 1;
  const Tensor g2 = g.reshape({rows, out});
  autograd::Grads grads(3);
  if (need_x) grads[0] = matmul(g2, w).reshape(x_shape);
  if (need_w) grads[1] = matmul(g2.t(), x.reshape({rows, in}));
  if (need_b) grads[2] = sum(g2, {0});
  return grads;
}

}  // namespace

namespace detail {
void register_linear_kernels(KernelTable& table) {
  table.set(OpId::linear, DeviceType::CPU, kNumericDTypes, cpu_linear);
}
}  // namespace detail

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  amp::detail::AutocastScope amp_scope("linear", x, weight, bias);
  if (amp_scope.cast()) return linear(amp_scope[0], amp_scope[1], amp_scope[2]);
  Tensor y = linear_forward(x, weight, bias, false, "linear");
  const bool need_x = x.requires_grad(), need_w = weight.requires_grad(), need_b = bias.defined() && bias.requires_grad();
  autograd::record("linear", {x, weight, bias}, {y}, {need_w ? x : Tensor(), need_x ? weight : Tensor()},
                   [need_x, need_w, need_b, x_shape = x.shape(), in = weight.size(1)](const autograd::Grads& g,
                                                                                      const autograd::Saved& s) {
                     return linear_backward(g[0], s[0], s[1], x_shape, in, need_x, need_w, need_b);
                   });
  return y;
}

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  amp::detail::AutocastScope amp_scope("linear_gelu", x, weight, bias);
  if (amp_scope.cast()) return linear_gelu(amp_scope[0], amp_scope[1], amp_scope[2]);
  // the fused op keeps no GELU input, so training goes through the two recorded ops
  if (autograd::any_requires_grad({&x, &weight, &bias})) return gelu(linear(x, weight, bias), "tanh");
  return linear_forward(x, weight, bias, true, "linear_gelu");
}

}  // namespace strata
