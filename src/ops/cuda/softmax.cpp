// CUDA launchers of softmax, log_softmax, their gradients, cumsum and cumprod
// (src/ops/softmax.cpp), whose public ops hand the kernels a contiguous input and output seen
// as (outer, n, inner) around the dim. Kernels: kernels/cuda/softmax.cu and kernels/cuda/scan.cu.
#include <strata/ops/reduce.hpp>

#include "core/registry_internal.h"
#include "kernels/cuda/reduce_ops.h"
#include "ops/cuda/launch.h"
#include "ops/cuda/scratch.h"
#include "ops/dispatch.h"

namespace strata {

namespace {

namespace ck = cuda_kernels;

struct Extent {
  int64_t outer = 1, n = 1, inner = 1;
};

// (outer, n, inner) of a contiguous input and output of one shape, dtype and device.
Extent extent_of(const KernelCall& call, std::string_view op) {
  const Tensor& x = call.inputs[0];
  const Tensor& y = call.outputs[0];
  STRATA_CHECK(x.is_contiguous() && y.is_contiguous() && x.shape() == y.shape() && x.dtype() == y.dtype() &&
                   x.device() == y.device(),
               "[{}] kernel needs contiguous input and output of one shape, dtype and device", op);
  const int64_t dim = call.param<DimParams>().dim;
  Extent e;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const int64_t s = x.shape()[d];
    if (d < dim) e.outer *= s;
    else if (d == dim) e.n = s;
    else e.inner *= s;
  }
  return e;
}

template <bool Log>
void cuda_softmax(const KernelCall& call) {
  const char* op = Log ? "log_softmax" : "softmax";
  const Extent e = extent_of(call, op);
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  const int64_t causal_rows = call.param<SoftmaxParams>().causal_rows;
  STRATA_CHECK(causal_rows == 0 || e.inner == 1, "[{}] a causal mask needs the last dim", op);
  cuda::DeviceGuard guard(y.device().index);
  dispatch<DTypeSet::Floating>(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(ck::softmax(cuda_launch::stream_for(y), static_cast<T*>(y.data()),
                                          static_cast<const T*>(x.data()), e.outer, e.n, e.inner, Log, causal_rows),
                              op);
  });
}

// inputs y, g; output dx: contiguous, of one shape, dtype and device.
template <bool Log>
void cuda_softmax_backward(const KernelCall& call) {
  const char* op = Log ? "log_softmax_backward" : "softmax_backward";
  const Extent e = extent_of(call, op);
  const Tensor &y = call.inputs[0], &g = call.inputs[1];
  Tensor& dx = call.outputs[0];
  STRATA_CHECK(g.is_contiguous() && g.shape() == y.shape() && g.dtype() == y.dtype() && g.device() == y.device(),
               "[{}] kernel needs a contiguous gradient of the output's shape, dtype and device", op);
  cuda::DeviceGuard guard(dx.device().index);
  dispatch<DTypeSet::Floating>(y.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(ck::softmax_backward(cuda_launch::stream_for(dx), static_cast<T*>(dx.data()),
                                                   static_cast<const T*>(y.data()), static_cast<const T*>(g.data()),
                                                   e.outer, e.n, e.inner, Log),
                              op);
  });
}

// cumsum / cumprod for int64 and the floating dtypes (the public ops scan integers as int64).
template <bool IsProd>
void cuda_scan(const KernelCall& call) {
  const char* op = IsProd ? "cumprod" : "cumsum";
  const Extent e = extent_of(call, op);
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  STRATA_CHECK(x.dtype() == kInt64 || is_floating(x.dtype()), "[{}] CUDA kernel not available for dtype {}", op,
               x.dtype());
  cuda::DeviceGuard guard(y.device().index);
  cuda_launch::DeviceScratch pool(y.device());
  const cudaStream_t stream = cuda_launch::stream_for(y);
  auto launch = [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out = static_cast<T*>(y.data());
    const T* in = static_cast<const T*>(x.data());
    if constexpr (IsProd) return ck::cumprod(stream, out, in, e.outer, e.n, e.inner, pool.handle());
    else return ck::cumsum(stream, out, in, e.outer, e.n, e.inner, pool.handle());
  };
  const cudaError_t err = x.dtype() == kInt64 ? launch(type_tag<int64_t>{})
                                               : dispatch<DTypeSet::Floating>(x.dtype(), op, launch);
  cuda_launch::check_launch(err, op);
}

}  // namespace

namespace detail {
void register_cuda_softmax_kernels(KernelTable& table) {
  constexpr auto CUDA = DeviceType::CUDA;
  table.set(OpId::softmax, CUDA, kFloatDTypes, cuda_softmax<false>);
  table.set(OpId::log_softmax, CUDA, kFloatDTypes, cuda_softmax<true>);
  table.set(OpId::softmax_backward, CUDA, kFloatDTypes, cuda_softmax_backward<false>);
  table.set(OpId::log_softmax_backward, CUDA, kFloatDTypes, cuda_softmax_backward<true>);
  for (DType t : {kInt64, kFloat16, kBFloat16, kFloat32, kFloat64}) {
    table.set(OpId::cumsum, CUDA, t, cuda_scan<false>);
    table.set(OpId::cumprod, CUDA, t, cuda_scan<true>);
  }
}
}  // namespace detail

}  // namespace strata
