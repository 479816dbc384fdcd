// sort, argsort and topk along one dim. One kernel orders each slice and keeps its first k
// entries (k = the whole slice for sort); see kernels/cpu/sort.h for the order used. The
// gradient of the values goes back to the positions the indices name.
#include <strata/autograd/graph.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/sort.hpp>

#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/cpu/sort.h"
#include "ops/dispatch.h"
#include "ops/loop.h"

namespace strata {

namespace {

// inputs (x), outputs (values, indices), each at least 1-d.
void cpu_sort(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& values = call.outputs[0];
  Tensor& indices = call.outputs[1];
  const auto& p = call.param<SortParams>();
  cpu::SliceDim d{x.size(p.dim), x.stride(p.dim), values.stride(p.dim), indices.stride(p.dim)};
  Shape outer_shape = x.shape();
  outer_shape[p.dim] = 1;
  Tensor xv = detail::make_view(x, outer_shape, x.strides(), 0);
  Tensor vv = detail::make_view(values, outer_shape, values.strides(), 0);
  Tensor iv = detail::make_view(indices, outer_shape, indices.strides(), 0);
  auto outer = make_loop<3>(xv, {&vv, &iv}, "sort");
  dispatch(x.dtype(), "sort", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::sort_slices(outer, d, p.k, p.descending, static_cast<const T*>(x.data()), static_cast<T*>(values.data()),
                     static_cast<int64_t*>(indices.data()));
  });
}

std::tuple<Tensor, Tensor> ordered(OpId op, const Tensor& x, int64_t dim, int64_t k, bool k_given, bool descending) {
  std::string_view name = op_name(op);
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", name);
  // a 0-d tensor orders as one element
  Tensor xs = x.dim() == 0 ? detail::make_view(x, {1}, {1}, x.storage_offset()) : x;
  int64_t d = normalize_dim(dim, xs.dim(), name);
  int64_t n = xs.size(d);
  if (!k_given) k = n;
  STRATA_CHECK(k >= 0 && k <= n, "[{}] k = {} is out of range for dim {} of size {} (shape {})", name, k, d, n,
               x.shape());
  Shape shape = xs.shape();
  shape[d] = k;
  Tensor values = detail::make_tensor(shape, x.dtype(), x.device());
  Tensor indices = detail::make_tensor(shape, kInt64, x.device());
  if (values.numel() > 0) {
    SortParams p{d, k, descending};
    Tensor outs[2] = {values, indices};
    run_kernel(op, x.dtype(), KernelCall{{&xs, 1}, outs, &p});
  }
  if (x.dim() == 0 && k == 1) {
    values = values.view({});
    indices = indices.view({});
  }
  if (autograd::any_requires_grad({&x})) {
    autograd::record(op == OpId::sort ? "sort" : "topk", {x}, {values}, {indices},
                     [shape = x.shape(), dim](const autograd::Grads& g, const autograd::Saved& s) {
                       Tensor zero = zeros(shape, TensorOptions(g[0].dtype(), g[0].device()));
                       return autograd::Grads{scatter_add(zero, dim, s[0], g[0])};
                     });
  }
  return {values, indices};
}

}  // namespace

namespace detail {
void register_sort_kernels(KernelTable& table) {
  table.set(OpId::sort, DeviceType::CPU, kAllDTypes, cpu_sort);
  table.set(OpId::topk, DeviceType::CPU, kAllDTypes, cpu_sort);
}
}  // namespace detail

std::tuple<Tensor, Tensor> sort(const Tensor& x, int64_t dim, bool descending, bool /*stable*/) {
  return ordered(OpId::sort, x, dim, 0, false, descending);
}

Tensor argsort(const Tensor& x, int64_t dim, bool descending, bool stable) {
  return std::get<1>(sort(x, dim, descending, stable));
}

std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim, bool largest, bool /*sorted*/) {
  return ordered(OpId::topk, x, dim, k, true, largest);
}

}  // namespace strata
