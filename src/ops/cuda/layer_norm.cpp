// CUDA launchers of layer_norm and layer_norm_backward (src/nn/layer_norm.cpp, which also
// serves rms_norm and group_norm): the same inputs, outputs and LayerNormParams as the CPU
// kernels there, contiguous (rows, n) arrays, launched on the current stream of the tensors'
// device. The kernels are in kernels/cuda/layer_norm.cu.
#include <algorithm>

#include <strata/nn/functional.hpp>
#include <strata/ops/creation.hpp>

#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/cuda/nn_norm_ops.h"
#include "ops/cuda/launch.h"
#include "ops/dispatch.h"

namespace strata {

namespace {

namespace ck = cuda_kernels;

template <class T> const T* ptr_or_null(const Tensor& t) { return t.defined() ? static_cast<const T*>(t.data()) : nullptr; }
template <class T> T* mut_ptr_or_null(const Tensor& t) { return t.defined() ? static_cast<T*>(t.data()) : nullptr; }

// The kernels index raw rows: every tensor they touch must be contiguous.
void check_contiguous(std::initializer_list<const Tensor*> ts, std::string_view op) {
  for (const Tensor* t : ts)
    STRATA_CHECK(!t->defined() || t->is_contiguous(), "[{}] CUDA kernel needs contiguous tensors, got strides {}", op,
                 t->strides());
}

// inputs (x (rows, n), weight (n) or undefined, bias (n) or undefined); outputs (y, mean, rstd).
void cuda_layer_norm(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  check_contiguous({&x, &call.inputs[1], &call.inputs[2], &call.outputs[0]}, "layer_norm");
  const auto& p = call.param<nn::LayerNormParams>();
  cuda::DeviceGuard guard(x.device().index);
  dispatch<DTypeSet::Floating>(x.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using S = compute_t<T>;
    cuda_launch::check_launch(
        ck::layer_norm_forward<T>(cuda_launch::stream_for(x), static_cast<const T*>(x.data()),
                                  ptr_or_null<T>(call.inputs[1]), ptr_or_null<T>(call.inputs[2]),
                                  static_cast<T*>(call.outputs[0].data()), static_cast<S*>(call.outputs[1].data()),
                                  static_cast<S*>(call.outputs[2].data()), x.size(0), x.size(1), p.eps, p.rms),
        "layer_norm");
  });
}

// inputs (g, x, mean, rstd, weight or undefined); outputs (gx, gw or undefined, gb or undefined).
void cuda_layer_norm_backward(const KernelCall& call) {
  const Tensor& g = call.inputs[0];
  const Tensor& x = call.inputs[1];
  check_contiguous({&g, &x, &call.inputs[4], &call.outputs[0]}, "layer_norm_backward");
  const auto& p = call.param<nn::LayerNormParams>();
  const int64_t rows = x.size(0), n = x.size(1);
  const Tensor& gw = call.outputs[1];
  const Tensor& gb = call.outputs[2];
  cuda::DeviceGuard guard(x.device().index);
  const cudaStream_t stream = cuda_launch::stream_for(x);
  dispatch<DTypeSet::Floating>(x.dtype(), "layer_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using S = compute_t<T>;
    const auto* mean = static_cast<const S*>(call.inputs[2].data());
    const auto* rstd = static_cast<const S*>(call.inputs[3].data());
    cuda_launch::check_launch(
        ck::layer_norm_backward_input<T>(stream, static_cast<const T*>(g.data()), static_cast<const T*>(x.data()), mean,
                                         rstd, ptr_or_null<T>(call.inputs[4]), static_cast<T*>(call.outputs[0].data()),
                                         rows, n, p.rms),
        "layer_norm_backward");
    if (!gw.defined() && !gb.defined()) return;
    // the per-chunk column sums of the first stage, from the caching allocator
    const int64_t chunks = ck::layer_norm_param_chunks(rows, n);
    const Tensor partial = strata::empty({std::max<int64_t>(1, 2 * chunks * n)},
                                         TensorOptions(detail::compute_dtype(x.dtype()), x.device()));
    cuda_launch::check_launch(ck::layer_norm_backward_params<T>(stream, static_cast<const T*>(g.data()),
                                                                static_cast<const T*>(x.data()), mean, rstd,
                                                                mut_ptr_or_null<T>(gw), mut_ptr_or_null<T>(gb),
                                                                partial.data(), rows, n),
                              "layer_norm_backward");
  });
}

}  // namespace

namespace detail {
void register_cuda_layer_norm_kernels(KernelTable& table) {
  table.set(OpId::layer_norm, DeviceType::CUDA, kFloatDTypes, cuda_layer_norm);
  table.set(OpId::layer_norm_backward, DeviceType::CUDA, kFloatDTypes, cuda_layer_norm_backward);
}
}  // namespace detail

}  // namespace strata
