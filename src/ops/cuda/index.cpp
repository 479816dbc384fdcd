// CUDA launchers of the indexing ops (src/ops/index.cpp): gather and index_select, scatter,
// scatter_add and index_add, and tril / triu. The operands arrive as the CPU kernels receive
// them; the views and loops are built the same way. Kernels: kernels/cuda/index.cu and
// triangular.cu.
//
// Index values are checked here, on the device, before any write: a kernel finds the first
// position holding a value outside [0, size), and its copy back to the host (which waits for
// the stream) decides whether the op raises the CPU's Error or goes on. src/ops/index.cpp
// leaves CUDA indices to this check instead of copying them to the host.
//
// scatter_add and index_add add with atomics (no fixed order of float additions) unless
// cuda::deterministic() is on; then float adds are sorted by destination and summed in order.
#include <strata/ops/index.hpp>

#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/common/convert.h"
#include "kernels/cuda/index_ops.h"
#include "ops/cuda/launch.h"
#include "ops/cuda/scratch.h"
#include "ops/dispatch.h"
#include "ops/loop.h"

namespace strata {

namespace {

namespace ck = cuda_kernels;
using detail::make_view;

template <class F>
decltype(auto) dispatch_index(DType t, F&& f) {
  if (t == kInt64) return f(type_tag<int64_t>{});
  return f(type_tag<int32_t>{});
}

// Kernels that only move elements see unsigned integers of the element's size.
template <class F>
decltype(auto) dispatch_bits(DType t, std::string_view op, F&& f) {
  switch (itemsize(t)) {
    case 1: return f(type_tag<uint8_t>{});
    case 2: return f(type_tag<uint16_t>{});
    case 4: return f(type_tag<uint32_t>{});
    case 8: return f(type_tag<uint64_t>{});
  }
  detail::throw_error("[{}] not supported for dtype {}", op, t);
}

// A view holding each distinct element of t once: size 1 wherever the stride is 0 (an index
// broadcast across the other dims, as index_select and index_add pass it).
Tensor distinct_elements(const Tensor& t) {
  Shape shape = t.shape();
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.stride(d) == 0) shape[d] = 1;
  return make_view(t, shape, t.strides(), t.storage_offset());
}

// Raises the CPU's Error ("[op] index v is out of range for dim d of size n") when an index
// value lies outside [0, size). Waits for the stream.
void check_index_values(const Tensor& index, int64_t size, int64_t dim, std::string_view op) {
  const Tensor ix = distinct_elements(index);
  if (ix.numel() == 0) return;
  const auto loop = make_loop<1>(ix, {}, op);
  Tensor result = empty({2}, TensorOptions(kInt64, index.device()));
  cudaStream_t stream = cuda_launch::stream_for(index);
  dispatch_index(index.dtype(), [&](auto itag) {
    using I = typename decltype(itag)::type;
    cuda_launch::check_launch(ck::find_bad_index(loop, stream, static_cast<const I*>(ix.data()), size,
                                                 static_cast<int64_t*>(result.data())),
                              op);
  });
  int64_t bad[2] = {0, 0};  // {position, value}; position -1 when every value is in range
  STRATA_CUDA_CHECK(cudaMemcpyAsync(bad, result.data(), sizeof bad, cudaMemcpyDeviceToHost, stream), op);
  STRATA_CUDA_CHECK(cudaStreamSynchronize(stream), op);
  if (bad[0] < 0) return;
  STRATA_CHECK(bad[1] >= 0, "[{}] index {} is out of range for dim {} of size {} (negative indices are not allowed)",
               op, bad[1], dim, size);
  detail::throw_error("[{}] index {} is out of range for dim {} of size {}", op, bad[1], dim, size);
}

// inputs (x, index), outputs (out of index's shape); see cpu_gather in src/ops/index.cpp.
void cuda_gather(const KernelCall& call, std::string_view op) {
  const Tensor& x = call.inputs[0];
  const Tensor& index = call.inputs[1];
  Tensor& out = call.outputs[0];
  const int64_t dim = call.param<IndexParams>().dim;
  cuda::DeviceGuard guard(out.device().index);
  check_index_values(index, x.size(dim), dim, op);
  if (out.numel() == 0) return;
  Strides xs = x.strides();
  const int64_t x_dim_stride = xs[dim];
  xs[dim] = 0;
  const Tensor xv = make_view(x, index.shape(), xs, x.storage_offset());
  const auto loop = make_loop<3>(out, {&xv, &index}, op);
  cudaStream_t stream = cuda_launch::stream_for(out);
  dispatch_bits(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_index(index.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      cuda_launch::check_launch(ck::gather(loop, stream, static_cast<T*>(out.data()), static_cast<const T*>(x.data()),
                                           static_cast<const I*>(index.data()), x_dim_stride),
                                op);
    });
  });
}

// One past the largest element offset of t, or -1 when a stride is negative.
int64_t extent(const Tensor& t) {
  int64_t reach = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) < 0) return -1;
    reach += (t.size(d) - 1) * t.stride(d);
  }
  return reach + 1;
}

// inputs (src, index), outputs (self); see cpu_scatter in src/ops/index.cpp.
template <bool Add>
void cuda_scatter(const KernelCall& call, std::string_view op) {
  const Tensor& src = call.inputs[0];
  const Tensor& index = call.inputs[1];
  Tensor& self = call.outputs[0];
  const auto& p = call.param<IndexParams>();
  cuda::DeviceGuard guard(self.device().index);
  check_index_values(index, self.size(p.dim), p.dim, op);
  if (index.numel() == 0) return;
  // every index position, with self's stride along the dim applied through the index
  Strides ss = self.strides();
  ss[p.dim] = 0;
  const Tensor self_full = make_view(self, index.shape(), ss, self.storage_offset());
  const Tensor src_full = make_view(src, index.shape(), src.strides(), src.storage_offset());
  const auto full = make_loop<3>(self_full, {&index, &src_full}, op);
  cudaStream_t stream = cuda_launch::stream_for(self);
  cuda_launch::DeviceScratch scratch(self.device());
  if constexpr (Add) {
    dispatch(self.dtype(), op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      dispatch_index(index.dtype(), [&](auto itag) {
        using I = typename decltype(itag)::type;
        cuda_launch::check_launch(
            ck::scatter_add(full, stream, static_cast<T*>(self.data()), static_cast<const I*>(index.data()),
                            static_cast<const T*>(src.data()), self.stride(p.dim), p.alpha.to<compute_t<T>>(),
                            cuda::deterministic(), extent(self), scratch.handle()),
            op);
      });
    });
  } else {
    // the rows along the dim, one per position of the other dims
    Shape outer_shape = index.shape();
    outer_shape[p.dim] = 1;
    const Tensor so = make_view(self, outer_shape, self.strides(), self.storage_offset());
    const Tensor io = make_view(index, outer_shape, index.strides(), index.storage_offset());
    const Tensor co = make_view(src, outer_shape, src.strides(), src.storage_offset());
    const auto outer = make_loop<3>(so, {&io, &co}, op);
    const ck::ScatterDim d{index.size(p.dim), self.stride(p.dim), index.stride(p.dim), src.stride(p.dim)};
    dispatch_bits(self.dtype(), op, [&](auto tag) {
      using T = typename decltype(tag)::type;
      dispatch_index(index.dtype(), [&](auto itag) {
        using I = typename decltype(itag)::type;
        cuda_launch::check_launch(ck::scatter(outer, full, d, stream, static_cast<T*>(self.data()),
                                              static_cast<const I*>(index.data()), static_cast<const T*>(src.data()),
                                              extent(self), scratch.handle()),
                                  op);
      });
    });
  }
}

// inputs (x), outputs (out), both at least 2-d; see cpu_triangular in src/ops/triangular.cpp.
template <bool Upper>
void cuda_triangular(const KernelCall& call) {
  constexpr std::string_view op = Upper ? "triu" : "tril";
  const Tensor& x = call.inputs[0];
  Tensor& out = call.outputs[0];
  const int64_t nd = x.dim();
  const ck::MatrixDims m{x.size(-2), x.size(-1), x.stride(-2), x.stride(-1), out.stride(-2), out.stride(-1)};
  Shape batch(x.shape().begin(), x.shape().end() - 2);
  const Tensor xb = make_view(x, batch, Strides(x.strides().begin(), x.strides().begin() + nd - 2), 0);
  const Tensor ob = make_view(out, batch, Strides(out.strides().begin(), out.strides().begin() + nd - 2), 0);
  const auto loop = make_loop<2>(ob, {&xb}, op);
  cuda::DeviceGuard guard(out.device().index);
  dispatch(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(ck::triangular(loop, m, call.param<TriangularParams>().diagonal, Upper,
                                             cuda_launch::stream_for(out), static_cast<T*>(out.data()),
                                             static_cast<const T*>(x.data())),
                              op);
  });
}

}  // namespace

namespace detail {
void register_cuda_index_kernels(KernelTable& table) {
  constexpr auto CUDA = DeviceType::CUDA;
  table.set(OpId::gather, CUDA, kAllDTypes, [](const KernelCall& c) { cuda_gather(c, "gather"); });
  table.set(OpId::index_select, CUDA, kAllDTypes, [](const KernelCall& c) { cuda_gather(c, "index_select"); });
  table.set(OpId::scatter, CUDA, kAllDTypes, [](const KernelCall& c) { cuda_scatter<false>(c, "scatter"); });
  table.set(OpId::scatter_add, CUDA, kAllDTypes, [](const KernelCall& c) { cuda_scatter<true>(c, "scatter_add"); });
  table.set(OpId::index_add, CUDA, kAllDTypes, [](const KernelCall& c) { cuda_scatter<true>(c, "index_add"); });
  table.set(OpId::tril, CUDA, kAllDTypes, cuda_triangular<false>);
  table.set(OpId::triu, CUDA, kAllDTypes, cuda_triangular<true>);
}
}  // namespace detail

}  // namespace strata
