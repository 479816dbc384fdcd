// CUDA launchers of the pooling ops (max_pool2d, avg_pool2d, adaptive_avg_pool2d and their
// backward; src/nn/pooling.cpp has the argument checks, shapes and autograd): tensors ->
// pointers, shapes and strides, checked as the CPU launchers check them, then the kernels of
// kernels/cuda/pool.cu on the tensors' device and current stream.
#include <strata/nn/functional_conv.hpp>

#include "core/registry_internal.h"
#include "kernels/cuda/nn_ops.h"
#include "ops/cuda/launch.h"
#include "ops/dispatch.h"

namespace strata {

namespace {

namespace ck = cuda_kernels;
using nn::Pool2dParams;

// Dense NCHW and channels-last tensors get their canonical strides (a size-1 dim may carry
// any stride), so the kernels see one description per layout; other views keep theirs.
ck::Strides4 strides4(const Tensor& t) {
  if (t.is_contiguous()) return {t.size(1) * t.size(2) * t.size(3), t.size(2) * t.size(3), t.size(3), 1};
  if (t.is_contiguous(MemoryFormat::ChannelsLast))
    return {t.size(1) * t.size(2) * t.size(3), 1, t.size(3) * t.size(1), t.size(1)};
  return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

bool same_strides(const ck::Strides4& a, const ck::Strides4& b) {
  return a.n == b.n && a.c == b.c && a.h == b.h && a.w == b.w;
}

// x: the (gradient of the) input, y: the (gradient of the) output.
ck::Pool2dShape geometry(const char* op, const Tensor& x, const Tensor& y, const Pool2dParams* p) {
  STRATA_CHECK(x.dim() == 4 && y.dim() == 4 && x.size(0) == y.size(0) && x.size(1) == y.size(1) &&
                   x.dtype() == y.dtype() && y.size(2) > 0 && y.size(3) > 0 && x.size(2) > 0 && x.size(3) > 0,
               "[{}] kernel operands do not match: {} {} and {} {}", op, x.shape(), x.dtype(), y.shape(), y.dtype());
  STRATA_CHECK(x.device() == y.device(), "[{}] operands on {} and {}", op, x.device(), y.device());
  ck::Pool2dShape g{x.size(0), x.size(1), x.size(2), x.size(3), y.size(2), y.size(3)};
  if (p) {
    g.kh = p->kernel.h, g.kw = p->kernel.w, g.sh = p->stride.h, g.sw = p->stride.w;
    g.ph = p->padding.h, g.pw = p->padding.w, g.dh = p->dilation.h, g.dw = p->dilation.w;
    STRATA_CHECK(g.kh > 0 && g.kw > 0 && g.sh > 0 && g.sw > 0 && g.dh > 0 && g.dw > 0 && g.ph >= 0 && g.pw >= 0,
                 "[{}] bad kernel arguments", op);
  }
  return g;
}

void check_indices(const Tensor& idx, const Tensor& y) {
  STRATA_CHECK(idx.dtype() == kInt64 && idx.shape() == y.shape() && idx.device() == y.device() &&
                   same_strides(strides4(idx), strides4(y)),
               "[max_pool2d] indices ({} {}) must be int64 laid out as the output ({})", idx.dtype(), idx.shape(),
               y.shape());
}

template <class T> const T* in_ptr(const Tensor& t) { return static_cast<const T*>(t.data()); }
template <class T> T* out_ptr(Tensor& t) { return static_cast<T*>(t.data()); }

void cuda_max_pool2d(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor &y = call.outputs[0], &idx = call.outputs[1];
  const auto g = geometry("max_pool2d", x, y, &call.param<Pool2dParams>());
  check_indices(idx, y);
  cuda::DeviceGuard guard(y.device().index);
  dispatch<DTypeSet::Floating>(x.dtype(), "max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(ck::max_pool2d_forward<T>(g, cuda_launch::stream_for(y), in_ptr<T>(x), strides4(x),
                                                        out_ptr<T>(y), out_ptr<int64_t>(idx), strides4(y)),
                              "max_pool2d");
  });
}

void cuda_max_pool2d_backward(const KernelCall& call) {
  const Tensor &gy = call.inputs[0], &idx = call.inputs[1];
  Tensor& gx = call.outputs[0];
  // The CPU kernel scatters by index alone; this one gathers over the windows that contain
  // each input element, so it needs the forward's window (which the op passes along).
  STRATA_CHECK(call.params != nullptr, "[max_pool2d_backward] the CUDA kernel needs the forward's window parameters");
  const auto g = geometry("max_pool2d_backward", gx, gy, &call.param<Pool2dParams>());
  check_indices(idx, gy);
  cuda::DeviceGuard guard(gx.device().index);
  dispatch<DTypeSet::Floating>(gy.dtype(), "max_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(ck::max_pool2d_backward<T>(g, cuda_launch::stream_for(gx), in_ptr<T>(gy),
                                                         in_ptr<int64_t>(idx), strides4(gy), out_ptr<T>(gx),
                                                         strides4(gx)),
                              "max_pool2d_backward");
  });
}

void cuda_avg_pool2d(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  const Pool2dParams& p = call.param<Pool2dParams>();
  const auto g = geometry("avg_pool2d", x, y, &p);
  cuda::DeviceGuard guard(y.device().index);
  dispatch<DTypeSet::Floating>(x.dtype(), "avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(ck::avg_pool2d_forward<T>(g, cuda_launch::stream_for(y), in_ptr<T>(x), strides4(x),
                                                        out_ptr<T>(y), strides4(y), p.count_include_pad, p.divisor),
                              "avg_pool2d");
  });
}

void cuda_avg_pool2d_backward(const KernelCall& call) {
  const Tensor& gy = call.inputs[0];
  Tensor& gx = call.outputs[0];
  const Pool2dParams& p = call.param<Pool2dParams>();
  const auto g = geometry("avg_pool2d_backward", gx, gy, &p);
  cuda::DeviceGuard guard(gx.device().index);
  dispatch<DTypeSet::Floating>(gy.dtype(), "avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(ck::avg_pool2d_backward<T>(g, cuda_launch::stream_for(gx), in_ptr<T>(gy), strides4(gy),
                                                         out_ptr<T>(gx), strides4(gx), p.count_include_pad, p.divisor),
                              "avg_pool2d_backward");
  });
}

void cuda_adaptive_avg_pool2d(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  const auto g = geometry("adaptive_avg_pool2d", x, y, nullptr);
  cuda::DeviceGuard guard(y.device().index);
  dispatch<DTypeSet::Floating>(x.dtype(), "adaptive_avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(ck::adaptive_avg_pool2d_forward<T>(g, cuda_launch::stream_for(y), in_ptr<T>(x),
                                                                 strides4(x), out_ptr<T>(y), strides4(y)),
                              "adaptive_avg_pool2d");
  });
}

void cuda_adaptive_avg_pool2d_backward(const KernelCall& call) {
  const Tensor& gy = call.inputs[0];
  Tensor& gx = call.outputs[0];
  const auto g = geometry("adaptive_avg_pool2d_backward", gx, gy, nullptr);
  cuda::DeviceGuard guard(gx.device().index);
  dispatch<DTypeSet::Floating>(gy.dtype(), "adaptive_avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(ck::adaptive_avg_pool2d_backward<T>(g, cuda_launch::stream_for(gx), in_ptr<T>(gy),
                                                                  strides4(gy), out_ptr<T>(gx), strides4(gx)),
                              "adaptive_avg_pool2d_backward");
  });
}

}  // namespace

namespace detail {
void register_cuda_pool_kernels(KernelTable& table) {
  constexpr auto CUDA = DeviceType::CUDA;
  table.set(OpId::max_pool2d, CUDA, kFloatDTypes, cuda_max_pool2d);
  table.set(OpId::max_pool2d_backward, CUDA, kFloatDTypes, cuda_max_pool2d_backward);
  table.set(OpId::avg_pool2d, CUDA, kFloatDTypes, cuda_avg_pool2d);
  table.set(OpId::avg_pool2d_backward, CUDA, kFloatDTypes, cuda_avg_pool2d_backward);
  table.set(OpId::adaptive_avg_pool2d, CUDA, kFloatDTypes, cuda_adaptive_avg_pool2d);
  table.set(OpId::adaptive_avg_pool2d_backward, CUDA, kFloatDTypes, cuda_adaptive_avg_pool2d_backward);
}
}  // namespace detail

}  // namespace strata
