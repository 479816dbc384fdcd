// CUDA launchers of the 3-d pooling ops (src/nn/pooling3d.cpp has the argument checks, shapes and
// autograd; contracts as nn/pooling3d_kernels.cpp's): tensors -> pointers and a Pool3dShape,
// then the kernels of kernels/cuda/pool3d.cu on the tensors' device and current stream.
#include "core/registry_internal.h"
#include "kernels/cuda/pool3d.h"
#include "nn/pool3d_shape.h"
#include "ops/cuda/launch.h"
#include "ops/dispatch.h"

namespace strata {

namespace {

namespace ck = cuda_kernels;
using nn::Pool3dParams;
using nn::detail::pool3d_shape;

template <class T> const T* in_ptr(const Tensor& t) { return static_cast<const T*>(t.data()); }
template <class T> T* out_ptr(Tensor& t) { return static_cast<T*>(t.data()); }

void cuda_max_pool3d(const KernelCall& call, const char* op) {
  const Tensor& x = call.inputs[0];
  Tensor &y = call.outputs[0], &idx = call.outputs[1];
  const auto g = pool3d_shape(op, x, y, call.param<Pool3dParams>(), &idx);
  cuda::DeviceGuard guard(y.device().index);
  dispatch<DTypeSet::Floating>(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(
        ck::max_pool3d_forward<T>(g, cuda_launch::stream_for(y), in_ptr<T>(x), out_ptr<T>(y), out_ptr<int64_t>(idx)),
        op);
  });
}

void cuda_max_pool3d_backward(const KernelCall& call) {
  const Tensor &gy = call.inputs[0], &idx = call.inputs[1];
  Tensor& gx = call.outputs[0];
  // a gather over the windows that hold each input element: it needs the forward's windows
  STRATA_CHECK(call.params != nullptr, "[max_pool3d_backward] the CUDA kernel needs the forward's window parameters");
  const auto g = pool3d_shape("max_pool3d_backward", gx, gy, call.param<Pool3dParams>(), &idx);
  cuda::DeviceGuard guard(gx.device().index);
  dispatch<DTypeSet::Floating>(gy.dtype(), "max_pool3d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(ck::max_pool3d_backward<T>(g, cuda_launch::stream_for(gx), in_ptr<T>(gy),
                                                         in_ptr<int64_t>(idx), out_ptr<T>(gx)),
                              "max_pool3d_backward");
  });
}

void cuda_avg_pool3d(const KernelCall& call, const char* op) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  const auto g = pool3d_shape(op, x, y, call.param<Pool3dParams>());
  cuda::DeviceGuard guard(y.device().index);
  dispatch<DTypeSet::Floating>(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(ck::avg_pool3d_forward<T>(g, cuda_launch::stream_for(y), in_ptr<T>(x), out_ptr<T>(y)),
                              op);
  });
}

void cuda_avg_pool3d_backward(const KernelCall& call, const char* op) {
  const Tensor& gy = call.inputs[0];
  Tensor& gx = call.outputs[0];
  const auto g = pool3d_shape(op, gx, gy, call.param<Pool3dParams>());
  cuda::DeviceGuard guard(gx.device().index);
  dispatch<DTypeSet::Floating>(gy.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(
        ck::avg_pool3d_backward<T>(g, cuda_launch::stream_for(gx), in_ptr<T>(gy), out_ptr<T>(gx)), op);
  });
}

}  // namespace

namespace detail {
void register_cuda_pool3d_kernels(KernelTable& table) {
  constexpr auto CUDA = DeviceType::CUDA;
  const auto& fl = kFloatDTypes;
  using KC = const KernelCall&;
  table.set(OpId::max_pool3d, CUDA, fl, [](KC c) { cuda_max_pool3d(c, "max_pool3d"); });
  table.set(OpId::adaptive_max_pool3d, CUDA, fl, [](KC c) { cuda_max_pool3d(c, "adaptive_max_pool3d"); });
  table.set(OpId::max_pool3d_backward, CUDA, fl, cuda_max_pool3d_backward);
  table.set(OpId::avg_pool3d, CUDA, fl, [](KC c) { cuda_avg_pool3d(c, "avg_pool3d"); });
  table.set(OpId::adaptive_avg_pool3d, CUDA, fl, [](KC c) { cuda_avg_pool3d(c, "adaptive_avg_pool3d"); });
  table.set(OpId::avg_pool3d_backward, CUDA, fl, [](KC c) { cuda_avg_pool3d_backward(c, "avg_pool3d_backward"); });
  table.set(OpId::adaptive_avg_pool3d_backward, CUDA, fl,
            [](KC c) { cuda_avg_pool3d_backward(c, "adaptive_avg_pool3d_backward"); });
}
}  // namespace detail

}  // namespace strata
