// CUDA launchers of the fused cross entropy (cross_entropy_fused and its backward, used by
// nn::functional::cross_entropy, Note [Fused cross entropy] in src/nn/loss.cpp): the same
// inputs, outputs and CrossEntropyParams as the CPU kernels there, launched on the current
// stream of the tensors' device. The kernels are in kernels/cuda/cross_entropy.cu.
#include <strata/nn/functional.hpp>

#include "core/registry_internal.h"
#include "kernels/cuda/nn_norm_ops.h"
#include "ops/cuda/launch.h"
#include "ops/dispatch.h"

namespace strata {

namespace {

namespace ck = cuda_kernels;

template <class T> const T* ptr_or_null(const Tensor& t) { return t.defined() ? static_cast<const T*>(t.data()) : nullptr; }

void check_layout(const Tensor& x, const Tensor& target, const Tensor& w, std::string_view op) {
  STRATA_CHECK(x.dim() == 2 && x.is_contiguous() && target.dtype() == kInt64 && target.is_contiguous() &&
                   target.numel() == x.size(0) && (!w.defined() || (w.is_contiguous() && w.dtype() == x.dtype())),
               "[{}] kernel needs contiguous (N, C) logits, N int64 targets and C weights of the logits' dtype", op);
}

// inputs (x (N, C), target (N) int64, weight (C) or undefined); outputs (loss (N), lse (N)).
void cuda_cross_entropy_fused(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  check_layout(x, call.inputs[1], call.inputs[2], "cross_entropy_fused");
  const auto& p = call.param<nn::CrossEntropyParams>();
  cuda::DeviceGuard guard(x.device().index);
  dispatch<DTypeSet::Floating>(x.dtype(), "cross_entropy_fused", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(
        ck::cross_entropy_forward<T>(cuda_launch::stream_for(x), static_cast<const T*>(x.data()),
                                     static_cast<const int64_t*>(call.inputs[1].data()), ptr_or_null<T>(call.inputs[2]),
                                     static_cast<T*>(call.outputs[0].data()),
                                     static_cast<compute_t<T>*>(call.outputs[1].data()), x.size(0), x.size(1),
                                     p.ignore_index, p.label_smoothing, p.total_weight),
        "cross_entropy_fused");
  });
}

// inputs (g 0-d or (N), x, target, lse, weight or undefined); outputs (gx (N, C)).
void cuda_cross_entropy_fused_backward(const KernelCall& call) {
  const Tensor& g = call.inputs[0];
  const Tensor& x = call.inputs[1];
  check_layout(x, call.inputs[2], call.inputs[4], "cross_entropy_fused_backward");
  STRATA_CHECK(g.dtype() == x.dtype() && (g.dim() == 0 || (g.dim() == 1 && g.size(0) == x.size(0))) &&
                   call.outputs[0].is_contiguous(),
               "[cross_entropy_fused_backward] the gradient must be 0-d or (N) of the logits' dtype, got {} {}",
               g.dtype(), g.shape());
  const auto& p = call.param<nn::CrossEntropyParams>();
  cuda::DeviceGuard guard(x.device().index);
  dispatch<DTypeSet::Floating>(x.dtype(), "cross_entropy_fused_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cuda_launch::check_launch(
        ck::cross_entropy_backward<T>(cuda_launch::stream_for(x), static_cast<const T*>(g.data()),
                                      g.dim() == 0 ? 0 : g.stride(0), static_cast<const T*>(x.data()),
                                      static_cast<const int64_t*>(call.inputs[2].data()),
                                      static_cast<const compute_t<T>*>(call.inputs[3].data()),
                                      ptr_or_null<T>(call.inputs[4]), static_cast<T*>(call.outputs[0].data()),
                                      x.size(0), x.size(1), p.ignore_index, p.label_smoothing, p.total_weight),
        "cross_entropy_fused_backward");
  });
}

}  // namespace

namespace detail {
void register_cuda_cross_entropy_kernels(KernelTable& table) {
  table.set(OpId::cross_entropy_fused, DeviceType::CUDA, kFloatDTypes, cuda_cross_entropy_fused);
  table.set(OpId::cross_entropy_fused_backward, DeviceType::CUDA, kFloatDTypes, cuda_cross_entropy_fused_backward);
}
}  // namespace detail

}  // namespace strata
