// CUDA launcher of sort and topk (src/ops/sort.cpp): the same slice views as the CPU kernel,
// then kernels/cuda/sort.cu, which orders each slice as the CPU does (stable, NaN above every
// number) with CUB sorts or, for a small k, a per-slice block top-k.
#include <strata/ops/sort.hpp>

#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/cuda/index_ops.h"
#include "ops/cuda/launch.h"
#include "ops/cuda/scratch.h"
#include "ops/dispatch.h"
#include "ops/loop.h"

namespace strata {

namespace {

namespace ck = cuda_kernels;

// inputs (x), outputs (values, indices), each at least 1-d; see cpu_sort in src/ops/sort.cpp.
void cuda_sort(const KernelCall& call, std::string_view op) {
  const Tensor& x = call.inputs[0];
  Tensor& values = call.outputs[0];
  Tensor& indices = call.outputs[1];
  const auto& p = call.param<SortParams>();
  const ck::SliceDim d{x.size(p.dim), x.stride(p.dim), values.stride(p.dim), indices.stride(p.dim)};
  Shape outer_shape = x.shape();
  outer_shape[p.dim] = 1;
  const Tensor xv = detail::make_view(x, outer_shape, x.strides(), 0);
  const Tensor vv = detail::make_view(values, outer_shape, values.strides(), 0);
  const Tensor iv = detail::make_view(indices, outer_shape, indices.strides(), 0);
  const auto outer = make_loop<3>(xv, {&vv, &iv}, op);
  cuda::DeviceGuard guard(x.device().index);
  cuda_launch::DeviceScratch scratch(x.device());
  dispatch(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(ck::sort_slices(outer, d, p.k, p.descending, cuda_launch::stream_for(x),
                                              static_cast<const T*>(x.data()), static_cast<T*>(values.data()),
                                              static_cast<int64_t*>(indices.data()), scratch.handle()),
                              op);
  });
}

}  // namespace

namespace detail {
void register_cuda_sort_kernels(KernelTable& table) {
  table.set(OpId::sort, DeviceType::CUDA, kAllDTypes, [](const KernelCall& c) { cuda_sort(c, "sort"); });
  table.set(OpId::topk, DeviceType::CUDA, kAllDTypes, [](const KernelCall& c) { cuda_sort(c, "topk"); });
}
}  // namespace detail

}  // namespace strata
