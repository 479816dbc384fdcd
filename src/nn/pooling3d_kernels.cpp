// CPU launchers of the 3-d pooling ops (src/nn/pooling3d.cpp has the argument checks, shapes and
// autograd): tensors -> pointers and a Pool3dShape, then the loops of kernels/cpu/pool3d.h.
//
// Kernel contracts (contiguous 5-d (N, C, D, H, W) operands of one floating dtype, params
// Pool3dParams):
//   max_pool3d, adaptive_max_pool3d   inputs (x)           outputs (y, indices int64)
//   max_pool3d_backward               inputs (gy, indices) outputs (gx)   (either max pool)
//   avg_pool3d, adaptive_avg_pool3d   inputs (x)           outputs (y)
//   *_avg_pool3d_backward             inputs (gy)          outputs (gx)
#include "core/registry_internal.h"
#include "kernels/cpu/pool3d.h"
#include "nn/pool3d_shape.h"
#include "ops/dispatch.h"

namespace strata::nn {

namespace {

using detail::pool3d_shape;

template <class T> const T* in_ptr(const Tensor& t) { return static_cast<const T*>(t.data()); }
template <class T> T* out_ptr(Tensor& t) { return static_cast<T*>(t.data()); }

void cpu_max_pool3d(const KernelCall& call, const char* op) {
  const Tensor& x = call.inputs[0];
  Tensor &y = call.outputs[0], &idx = call.outputs[1];
  const auto g = pool3d_shape(op, x, y, call.param<Pool3dParams>(), &idx);
  dispatch<DTypeSet::Floating>(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::max_pool3d_forward(in_ptr<T>(x), out_ptr<T>(y), out_ptr<int64_t>(idx), g);
  });
}

void cpu_max_pool3d_backward(const KernelCall& call) {
  const Tensor &gy = call.inputs[0], &idx = call.inputs[1];
  Tensor& gx = call.outputs[0];
  const auto g = pool3d_shape("max_pool3d_backward", gx, gy, call.param<Pool3dParams>(), &idx);
  try {
    dispatch<DTypeSet::Floating>(gy.dtype(), "max_pool3d_backward", [&](auto tag) {
      using T = typename decltype(tag)::type;
      cpu::max_pool3d_backward(in_ptr<T>(gy), in_ptr<int64_t>(idx), out_ptr<T>(gx), g);
    });
  } catch (const std::out_of_range&) {
    strata::detail::throw_error("[max_pool3d_backward] an index lies outside its input volume {}", gx.shape());
  }
}

void cpu_avg_pool3d(const KernelCall& call, const char* op) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  const auto g = pool3d_shape(op, x, y, call.param<Pool3dParams>());
  dispatch<DTypeSet::Floating>(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::avg_pool3d_forward(in_ptr<T>(x), out_ptr<T>(y), g);
  });
}

void cpu_avg_pool3d_backward(const KernelCall& call, const char* op) {
  const Tensor& gy = call.inputs[0];
  Tensor& gx = call.outputs[0];
  const auto g = pool3d_shape(op, gx, gy, call.param<Pool3dParams>());
  dispatch<DTypeSet::Floating>(gy.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::avg_pool3d_backward(in_ptr<T>(gy), out_ptr<T>(gx), g);
  });
}

}  // namespace

}  // namespace strata::nn

namespace strata::detail {
void register_pool3d_kernels(KernelTable& table) {
  const auto CPU = DeviceType::CPU;
  const auto& fl = kFloatDTypes;
  using KC = const KernelCall&;
  table.set(OpId::max_pool3d, CPU, fl, [](KC c) { nn::cpu_max_pool3d(c, "max_pool3d"); });
  table.set(OpId::adaptive_max_pool3d, CPU, fl, [](KC c) { nn::cpu_max_pool3d(c, "adaptive_max_pool3d"); });
  table.set(OpId::max_pool3d_backward, CPU, fl, nn::cpu_max_pool3d_backward);
  table.set(OpId::avg_pool3d, CPU, fl, [](KC c) { nn::cpu_avg_pool3d(c, "avg_pool3d"); });
  table.set(OpId::adaptive_avg_pool3d, CPU, fl, [](KC c) { nn::cpu_avg_pool3d(c, "adaptive_avg_pool3d"); });
  table.set(OpId::avg_pool3d_backward, CPU, fl, [](KC c) { nn::cpu_avg_pool3d_backward(c, "avg_pool3d_backward"); });
  table.set(OpId::adaptive_avg_pool3d_backward, CPU, fl,
            [](KC c) { nn::cpu_avg_pool3d_backward(c, "adaptive_avg_pool3d_backward"); });
}
}  // namespace strata::detail
