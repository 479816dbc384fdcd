// tril / triu: the lower or upper triangle of the last two dims, batched over the others.
// The gradient of either is the same mask applied to the gradient.
#include <strata/autograd/graph.hpp>
#include <strata/ops/index.hpp>

#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/cpu/triangular.h"
#include "ops/dispatch.h"
#include "ops/loop.h"

namespace strata {

namespace {

template <bool Upper>
void cpu_triangular(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& out = call.outputs[0];
  const int64_t nd = x.dim();
  cpu::MatrixDims m{x.size(-2), x.size(-1), x.stride(-2), x.stride(-1), out.stride(-2), out.stride(-1)};
  // the leading (batch) dims of both operands
  Shape batch(x.shape().begin(), x.shape().end() - 2);
  Tensor xb = detail::make_view(x, batch, Strides(x.strides().begin(), x.strides().begin() + nd - 2), 0);
  Tensor ob = detail::make_view(out, batch, Strides(out.strides().begin(), out.strides().begin() + nd - 2), 0);
  auto loop = make_loop<2>(ob, {&xb}, Upper ? "triu" : "tril");
  dispatch(x.dtype(), Upper ? "triu" : "tril", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::triangular(loop, m, call.param<TriangularParams>().diagonal, Upper, static_cast<T*>(out.data()),
                    static_cast<const T*>(x.data()));
  });
}

Tensor triangular(OpId op, const Tensor& x, int64_t diagonal) {
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op_name(op));
  STRATA_CHECK(x.dim() >= 2, "[{}] expects a tensor of at least 2 dims, got shape {}", op_name(op), x.shape());
  Tensor out = detail::make_tensor(x.shape(), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  TriangularParams p{diagonal};
  run_kernel(op, x.dtype(), KernelCall{{&x, 1}, {&out, 1}, &p});
  if (autograd::any_requires_grad({&x})) {
    autograd::record(op == OpId::tril ? "tril" : "triu", {x}, {out}, {},
                     [op, diagonal](const autograd::Grads& g, const autograd::Saved&) {
                       return autograd::Grads{triangular(op, g[0], diagonal)};
                     });
  }
  return out;
}

}  // namespace

namespace detail {
void register_triangular_kernels(KernelTable& table) {
  table.set(OpId::tril, DeviceType::CPU, kAllDTypes, cpu_triangular<false>);
  table.set(OpId::triu, DeviceType::CPU, kAllDTypes, cpu_triangular<true>);
}
}  // namespace detail

Tensor tril(const Tensor& x, int64_t diagonal) { return triangular(OpId::tril, x, diagonal); }
Tensor triu(const Tensor& x, int64_t diagonal) { return triangular(OpId::triu, x, diagonal); }

}  // namespace strata
