// CUDA launchers of batch_norm and batch_norm_backward (src/nn/batchnorm.cpp has the checks,
// the running-statistics update and autograd): the same (N, C, S) view and per-channel
// operand checks as the CPU launchers, a scratch buffer from the caching allocator, then the
// kernels of kernels/cuda/batch_norm.cu on the data's device and current stream.
//
// Kernel contracts (as on the CPU; per-channel tensors (C) contiguous in the statistics dtype,
// f32 for f16/bf16/f32 data, f64 for f64):
//   batch_norm           inputs (x, weight?, bias?, mean?, var?, residual?)  outputs (y, mean, var)
//   batch_norm_backward  inputs (gy, x, weight?, mean, var, y?)    outputs (gx, gweight?, gbias?)
#include <strata/nn/functional_conv.hpp>
#include <strata/ops/creation.hpp>

#include "core/registry_internal.h"
#include "kernels/cuda/nn_ops.h"
#include "ops/cuda/launch.h"
#include "ops/dispatch.h"

namespace strata {

namespace {

namespace ck = cuda_kernels;
using nn::BatchNormParams;

// (N, C, S) view of dense NCHW (or (N, C, *) contiguous) or 4-d channels-last data.
ck::ChannelLayout channel_layout(const Tensor& t) {
  STRATA_CHECK(t.dim() >= 2, "[batch_norm] kernel needs (N, C, *) data, got shape {}", t.shape());
  int64_t s = 1;
  for (int64_t d = 2; d < t.dim(); ++d) s *= t.size(d);
  if (t.dim() == 4 && !t.is_contiguous() && t.is_contiguous(MemoryFormat::ChannelsLast))
    return {t.size(0), t.size(1), s, true};
  STRATA_CHECK(t.is_contiguous(), "[batch_norm] kernel needs NCHW or channels-last data, got strides {}", t.strides());
  // (N, C) data (BatchNorm1d, or 1x1 maps) is N rows of C channels, as channels-last is: the
  // channel-inner kernels read it coalesced and 16 bytes at a time, where NCHW with S = 1
  // would read each channel with a stride of C
  if (s == 1) return {t.size(0), t.size(1), 1, true};
  return {t.size(0), t.size(1), s, false};
}

bool same_layout(const ck::ChannelLayout& a, const ck::ChannelLayout& b) {
  return a.n == b.n && a.c == b.c && a.s == b.s && (a.channels_inner == b.channels_inner || a.c == 1);
}

void check_device(const Tensor& t, const Tensor& x) {
  STRATA_CHECK(t.device() == x.device(), "[batch_norm] operands on {} and {}", t.device(), x.device());
}

// A per-channel operand: null when absent, else checked to be (C) contiguous of dtype S.
template <class S>
const S* channel_param(const KernelCall& call, size_t i, const Tensor& x) {
  if (call.inputs.size() <= i || !call.inputs[i].defined()) return nullptr;
  const Tensor& t = call.inputs[i];
  STRATA_CHECK(t.dim() == 1 && t.size(0) == x.size(1) && t.is_contiguous() && t.dtype() == dtype_of_v<S>,
               "[batch_norm] kernel needs per-channel tensors of shape ({}) and dtype {}, got {} {}", x.size(1),
               dtype_of_v<S>, t.shape(), t.dtype());
  check_device(t, x);
  return static_cast<const S*>(t.data());
}

template <class S>
S* channel_out(const KernelCall& call, size_t i, const Tensor& x) {
  if (call.outputs.size() <= i || !call.outputs[i].defined()) return nullptr;
  Tensor& t = call.outputs[i];
  STRATA_CHECK(t.dim() == 1 && t.size(0) == x.size(1) && t.is_contiguous() && t.dtype() == dtype_of_v<S>,
               "[batch_norm] kernel needs per-channel outputs of shape ({}) and dtype {}", x.size(1), dtype_of_v<S>);
  check_device(t, x);
  return static_cast<S*>(t.data());
}

Tensor scratch_for(const ck::ChannelLayout& l, Device device) {
  return empty({ck::batch_norm_scratch_doubles(l)}, TensorOptions(kFloat64, device));
}

void cuda_batch_norm(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  const BatchNormParams& p = call.param<BatchNormParams>();
  const ck::ChannelLayout l = channel_layout(x);
  STRATA_CHECK(y.dtype() == x.dtype() && same_layout(l, channel_layout(y)), "[batch_norm] output layout differs");
  check_device(y, x);
  STRATA_CHECK(!p.training || l.n * l.s > 0, "[batch_norm] no values per channel");
  const Tensor* residual = call.inputs.size() > 5 && call.inputs[5].defined() ? &call.inputs[5] : nullptr;
  if (residual) {
    STRATA_CHECK(residual->dtype() == x.dtype() && same_layout(l, channel_layout(*residual)),
                 "[batch_norm] the residual must share the input's dtype and layout");
    check_device(*residual, x);
  }
  cuda::DeviceGuard guard(x.device().index);
  dispatch<DTypeSet::Floating>(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using S = compute_t<T>;
    const S *w = channel_param<S>(call, 1, x), *b = channel_param<S>(call, 2, x);
    const S *rm = p.training ? nullptr : channel_param<S>(call, 3, x);
    const S *rv = p.training ? nullptr : channel_param<S>(call, 4, x);
    S *mean = channel_out<S>(call, 1, x), *var = channel_out<S>(call, 2, x);
    STRATA_CHECK(mean && var, "[batch_norm] kernel needs mean and var outputs");
    STRATA_CHECK(p.training || (rm && rv), "[batch_norm] eval mode needs running mean and var");
    Tensor scratch = scratch_for(l, x.device());
    cuda_launch::check_launch(ck::batch_norm_forward<T>(l, cuda_launch::stream_for(x), static_cast<const T*>(x.data()),
                                                        static_cast<T*>(y.data()), w, b, rm, rv, mean, var, p.eps,
                                                        p.training,
                                                        residual ? static_cast<const T*>(residual->data()) : nullptr,
                                                        p.relu, static_cast<double*>(scratch.data())),
                              "batch_norm");
  });
}

void cuda_batch_norm_backward(const KernelCall& call) {
  const Tensor &gy = call.inputs[0], &x = call.inputs[1];
  Tensor& gx = call.outputs[0];
  const BatchNormParams& p = call.param<BatchNormParams>();
  const ck::ChannelLayout l = channel_layout(x);
  STRATA_CHECK(gy.dtype() == x.dtype() && gx.dtype() == x.dtype() && same_layout(l, channel_layout(gy)) &&
                   same_layout(l, channel_layout(gx)),
               "[batch_norm_backward] gradients must share the input's dtype and layout");
  check_device(gy, x);
  check_device(gx, x);
  const Tensor* relu_out = call.inputs.size() > 5 && call.inputs[5].defined() ? &call.inputs[5] : nullptr;
  if (relu_out) {
    STRATA_CHECK(relu_out->dtype() == x.dtype() && same_layout(l, channel_layout(*relu_out)),
                 "[batch_norm_backward] the ReLU's output must share the input's dtype and layout");
    check_device(*relu_out, x);
  }
  cuda::DeviceGuard guard(x.device().index);
  dispatch<DTypeSet::Floating>(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using S = compute_t<T>;
    const S *w = channel_param<S>(call, 2, x), *mean = channel_param<S>(call, 3, x), *var = channel_param<S>(call, 4, x);
    STRATA_CHECK(mean && var, "[batch_norm_backward] kernel needs the saved mean and var");
    S *gw = channel_out<S>(call, 1, x), *gb = channel_out<S>(call, 2, x);
    Tensor scratch = scratch_for(l, x.device());
    cuda_launch::check_launch(
        ck::batch_norm_backward<T>(l, cuda_launch::stream_for(x), static_cast<const T*>(gy.data()),
                                   static_cast<const T*>(x.data()), static_cast<T*>(gx.data()), w, mean, var, gw, gb,
                                   p.eps, p.training, relu_out ? static_cast<const T*>(relu_out->data()) : nullptr,
                                   static_cast<double*>(scratch.data())),
        "batch_norm_backward");
  });
}

}  // namespace

namespace detail {
void register_cuda_batch_norm_kernels(KernelTable& table) {
  table.set(OpId::batch_norm, DeviceType::CUDA, kFloatDTypes, cuda_batch_norm);
  table.set(OpId::batch_norm_backward, DeviceType::CUDA, kFloatDTypes, cuda_batch_norm_backward);
}
}  // namespace detail

}  // namespace strata
