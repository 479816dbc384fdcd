// CUDA launchers of the activation gradients (src/ops/activation_grad.cpp); kernels in
// kernels/cuda/activation_grad.cu.
#include "core/registry_internal.h"
#include "kernels/common/activation_grad_math.h"
#include "kernels/cuda/elementwise_ops.h"
#include "ops/cuda/launch.h"
#include "ops/dispatch.h"
#include "ops/loop.h"

namespace strata {

namespace {

template <class F>
void cuda_activation_grad(const KernelCall& call) {
  const Tensor& g = call.inputs[0];
  const Tensor& saved = call.inputs[1];
  Tensor& out = call.outputs[0];
  auto loop = make_loop<3>(out, {&g, &saved}, "activation_grad");
  cuda::DeviceGuard guard(out.device().index);
  dispatch<DTypeSet::Floating>(g.dtype(), "activation_grad", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(
        cuda_kernels::activation_grad(loop, cuda_launch::stream_for(out), static_cast<T*>(out.data()),
                                      static_cast<const T*>(g.data()), static_cast<const T*>(saved.data()), F{}),
        "activation_grad");
  });
}

}  // namespace

namespace detail {
void register_cuda_activation_grad_kernels(KernelTable& table) {
  constexpr auto CUDA = DeviceType::CUDA;
  table.set(OpId::relu_backward, CUDA, kFloatDTypes, cuda_activation_grad<math::ReluBackward>);
  table.set(OpId::tanh_backward, CUDA, kFloatDTypes, cuda_activation_grad<math::TanhBackward>);
  table.set(OpId::sigmoid_backward, CUDA, kFloatDTypes, cuda_activation_grad<math::SigmoidBackward>);
  table.set(OpId::silu_backward, CUDA, kFloatDTypes, cuda_activation_grad<math::SiluBackward>);
  table.set(OpId::gelu_backward, CUDA, kFloatDTypes, cuda_activation_grad<math::GeluBackward>);
  table.set(OpId::gelu_tanh_backward, CUDA, kFloatDTypes, cuda_activation_grad<math::GeluTanhBackward>);
}
}  // namespace detail

}  // namespace strata
