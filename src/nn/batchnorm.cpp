// batch_norm and its backward (fused per-channel kernels from kernels/cpu/batch_norm.h), and
// the BatchNorm1d / BatchNorm2d layers with PyTorch's running-statistics rules.
//
// Kernel contracts (x, y, gy, gx share one dense layout, viewed as (N, C, S); per-channel
// tensors are (C) contiguous in the statistics dtype: f32 for f16/bf16/f32 data, f64 for f64):
//   batch_norm           inputs (x, weight?, bias?, mean?, var?, residual?)  outputs (y, mean, var)
//                        training: mean / biased var of the batch are computed and written;
//                        eval: the given mean / var are used and copied out; with
//                        params.relu, y = relu(normalized + residual) (residual: x's layout)
//   batch_norm_backward  inputs (gy, x, weight?, mean, var, y?)    outputs (gx, gweight?, gbias?)
//                        with y (the output of batch_norm_relu), gy is the gradient of y and
//                        the ReLU's mask is applied as it is read: ReluBackward(gy, y)
// Double backward is not supported: the backward runs the kernel directly and records nothing.
//
// Note [ReLU mask in the backward]
// After batch_norm_relu, the gradient of the normalized values is the incoming gradient where
// the output is positive (ReluBackward). Written out by relu_backward it costs a pass that
// reads the gradient and the output and writes a third tensor, which the backward kernel then
// reads twice (its sums, then its affine pass). Instead the kernel takes the output as a mask
// and applies it as it reads the gradient in both passes: a tensor's worth of traffic less and
// no extra launch. When the residual needs a gradient (that same masked tensor), it is written
// once and the kernel reads it as before.
#include <cmath>
#include <vector>

#include <strata/autograd/graph.hpp>
#include <strata/nn/batchnorm.hpp>
#include <strata/nn/functional_conv.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>

#include "core/registry_internal.h"
#include "core/tensor_internal.h"
#include "kernels/cpu/batch_norm.h"
#include "nn/memory_format.h"
#include "ops/activation_grad.h"
#include "ops/dispatch.h"

namespace strata::nn {

namespace F = functional;

namespace {

struct ChannelView {
  cpu::ChannelShape shape;
  cpu::ChannelStrides strides;
};

MemoryFormat format_of(const Tensor& x) { return x.dim() == 4 ? detail::suggested_format(x) : MemoryFormat::Contiguous; }

Tensor dense(const Tensor& x, MemoryFormat f) { return x.dim() == 4 ? detail::dense_in(x, f) : x.contiguous(); }

// (N, C, S) view of a tensor that dense() produced.
ChannelView channel_view(const Tensor& t) {
  STRATA_CHECK(t.dim() >= 2, "[batch_norm] kernel needs (N, C, *) data, got shape {}", t.shape());
  int64_t s = 1;
  for (int64_t d = 2; d < t.dim(); ++d) s *= t.size(d);
  if (t.dim() == 4 && !t.is_contiguous() && t.is_contiguous(MemoryFormat::ChannelsLast))
    return {{t.size(0), t.size(1), s}, {s * t.size(1), 1, t.size(1)}};
  STRATA_CHECK(t.is_contiguous(), "[batch_norm] kernel needs NCHW or channels-last data, got strides {}", t.strides());
  return {{t.size(0), t.size(1), s}, {s * t.size(1), s, 1}};
}

bool same_layout(const ChannelView& a, const ChannelView& b) {
  return a.shape.n == b.shape.n && a.shape.c == b.shape.c && a.shape.s == b.shape.s && a.strides.n == b.strides.n &&
         a.strides.c == b.strides.c && a.strides.s == b.strides.s;
}

// A per-channel operand of a kernel: null when absent, else checked to be (C) contiguous.
template <class S>
const S* channel_param(const KernelCall& call, size_t i, int64_t c) {
  if (call.inputs.size() <= i || !call.inputs[i].defined()) return nullptr;
  const Tensor& t = call.inputs[i];
  STRATA_CHECK(t.dim() == 1 && t.size(0) == c && t.is_contiguous() && t.dtype() == dtype_of_v<S>,
               "[batch_norm] kernel needs per-channel tensors of shape ({}) and dtype {}, got {} {}", c,
               dtype_of_v<S>, t.shape(), t.dtype());
  return static_cast<const S*>(t.data());
}

template <class S>
S* channel_out(const KernelCall& call, size_t i, int64_t c) {
  if (call.outputs.size() <= i || !call.outputs[i].defined()) return nullptr;
  Tensor& t = call.outputs[i];
  STRATA_CHECK(t.dim() == 1 && t.size(0) == c && t.is_contiguous() && t.dtype() == dtype_of_v<S>,
               "[batch_norm] kernel needs per-channel outputs of shape ({}) and dtype {}", c, dtype_of_v<S>);
  return static_cast<S*>(t.data());
}

void cpu_batch_norm(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  const BatchNormParams& p = call.param<BatchNormParams>();
  const ChannelView v = channel_view(x);
  STRATA_CHECK(y.dtype() == x.dtype() && same_layout(v, channel_view(y)), "[batch_norm] output layout differs");
  const int64_t C = v.shape.c, M = v.shape.n * v.shape.s;
  const Tensor* residual = call.inputs.size() > 5 && call.inputs[5].defined() ? &call.inputs[5] : nullptr;
  STRATA_CHECK(!residual || (residual->dtype() == x.dtype() && same_layout(v, channel_view(*residual))),
               "[batch_norm] the residual must share the input's dtype and layout");
  dispatch<DTypeSet::Floating>(x.dtype(), "batch_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using S = compute_t<T>;
    const T* xp = static_cast<const T*>(x.data());
    const S *w = channel_param<S>(call, 1, C), *b = channel_param<S>(call, 2, C);
    S *mean = channel_out<S>(call, 1, C), *var = channel_out<S>(call, 2, C);
    STRATA_CHECK(mean && var, "[batch_norm] kernel needs mean and var outputs");
    if (p.training) {
      STRATA_CHECK(M > 0, "[batch_norm] no values per channel");
      std::vector<double> shift(static_cast<size_t>(C)), s1(static_cast<size_t>(C)), s2(static_cast<size_t>(C));
      for (int64_t c = 0; c < C; ++c) shift[c] = static_cast<double>(xp[c * v.strides.c]);
      cpu::channel_sums(xp, xp, v.shape, v.strides, shift.data(), shift.data(), s1.data(), s2.data());
      for (int64_t c = 0; c < C; ++c) {
        const double m1 = s1[c] / double(M);
        mean[c] = static_cast<S>(shift[c] + m1);
        var[c] = static_cast<S>(std::max(s2[c] / double(M) - m1 * m1, 0.0));
      }
    } else {
      const S *rm = channel_param<S>(call, 3, C), *rv = channel_param<S>(call, 4, C);
      STRATA_CHECK(rm && rv, "[batch_norm] eval mode needs running mean and var");
      std::copy(rm, rm + C, mean);
      std::copy(rv, rv + C, var);
    }
    std::vector<S> a(static_cast<size_t>(C)), k(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      const double inv = 1.0 / std::sqrt(double(var[c]) + p.eps);
      const double scale = (w ? double(w[c]) : 1.0) * inv;
      a[c] = static_cast<S>(scale);
      k[c] = static_cast<S>((b ? double(b[c]) : 0.0) - double(mean[c]) * scale);
    }
    cpu::channel_affine<T>(xp, nullptr, static_cast<T*>(y.data()), v.shape, v.strides, a.data(), nullptr, k.data(),
                           {residual ? static_cast<const T*>(residual->data()) : nullptr, p.relu});
  });
}

void cpu_batch_norm_backward(const KernelCall& call) {
  const Tensor &gy = call.inputs[0], &x = call.inputs[1];
  Tensor& gx = call.outputs[0];
  const BatchNormParams& p = call.param<BatchNormParams>();
  const ChannelView v = channel_view(x);
  STRATA_CHECK(gy.dtype() == x.dtype() && gx.dtype() == x.dtype() && same_layout(v, channel_view(gy)) &&
                   same_layout(v, channel_view(gx)),
               "[batch_norm_backward] gradients must share the input's dtype and layout");
  const Tensor* relu_out = call.inputs.size() > 5 && call.inputs[5].defined() ? &call.inputs[5] : nullptr;
  STRATA_CHECK(!relu_out || (relu_out->dtype() == x.dtype() && same_layout(v, channel_view(*relu_out))),
               "[batch_norm_backward] the ReLU's output must share the input's dtype and layout");
  const int64_t C = v.shape.c, M = v.shape.n * v.shape.s;
  dispatch<DTypeSet::Floating>(x.dtype(), "batch_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using S = compute_t<T>;
    const T *gp = static_cast<const T*>(gy.data()), *xp = static_cast<const T*>(x.data());
    const T* mask = relu_out ? static_cast<const T*>(relu_out->data()) : nullptr;
    const S *w = channel_param<S>(call, 2, C), *mean = channel_param<S>(call, 3, C), *var = channel_param<S>(call, 4, C);
    STRATA_CHECK(mean && var, "[batch_norm_backward] kernel needs the saved mean and var");
    S *gw = channel_out<S>(call, 1, C), *gb = channel_out<S>(call, 2, C);
    std::vector<double> m(static_cast<size_t>(C)), sg(static_cast<size_t>(C), 0.0), sgx(static_cast<size_t>(C), 0.0);
    for (int64_t c = 0; c < C; ++c) m[c] = double(mean[c]);
    if (p.training || gw || gb)
      cpu::channel_sums(gp, xp, v.shape, v.strides, nullptr, m.data(), sg.data(), sgx.data(), mask);
    std::vector<S> k1(static_cast<size_t>(C)), k2(static_cast<size_t>(C)), k3(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      const double inv = 1.0 / std::sqrt(double(var[c]) + p.eps), wc = w ? double(w[c]) : 1.0;
      if (gw) gw[c] = static_cast<S>(sgx[c] * inv);
      if (gb) gb[c] = static_cast<S>(sg[c]);
      k1[c] = static_cast<S>(wc * inv);
      if (p.training && M > 0) {
        // gx = w * inv * (gy - mean(gy) - (x - mean) * inv^2 * mean(gy * (x - mean)))
        const double b2 = -wc * inv * inv * inv * sgx[c] / double(M);
        k2[c] = static_cast<S>(b2);
        k3[c] = static_cast<S>(-wc * inv * sg[c] / double(M) - b2 * m[c]);
      } else {
        k2[c] = S(0), k3[c] = S(0);
      }
    }
    cpu::channel_affine<T>(gp, p.training ? xp : nullptr, static_cast<T*>(gx.data()), v.shape, v.strides, k1.data(),
                           p.training ? k2.data() : nullptr, k3.data(), {}, mask);
  });
}

// A per-channel tensor in the statistics dtype, contiguous (the tensor itself when it is).
Tensor as_stat(const Tensor& t, DType s) { return t.defined() ? t.to(s).contiguous() : t; }

void check_channel_tensor(const char* what, const Tensor& t, const Tensor& x) {
  if (!t.defined()) return;
  STRATA_CHECK(t.dim() == 1 && t.size(0) == x.size(1),
               "[batch_norm] {} must have shape ({}) for input of shape {}, got {}", what, x.size(1), x.shape(),
               t.shape());
  STRATA_CHECK(is_floating(t.dtype()), "[batch_norm] {} must be floating, got {}", what, t.dtype());
  STRATA_CHECK(t.device() == x.device(), "[batch_norm] {} is on {}, the input on {}", what, t.device(), x.device());
}

}  // namespace

}  // namespace strata::nn

namespace strata::detail {
void register_batch_norm_kernels(KernelTable& table) {
  table.set(OpId::batch_norm, DeviceType::CPU, kFloatDTypes, nn::cpu_batch_norm);
  table.set(OpId::batch_norm_backward, DeviceType::CPU, kFloatDTypes, nn::cpu_batch_norm_backward);
}
}  // namespace strata::detail

namespace strata::nn {

namespace {

// batch_norm, and batch_norm_relu when `relu`: y = relu(normalized + residual), the ReLU's
// gradient mask taken from y in the backward.
Tensor batch_norm_op(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                     const Tensor& bias, const F::BatchNormArgs& args, bool relu, const Tensor& residual) {
  const char* op = relu ? "batch_norm_relu" : "batch_norm";
  STRATA_CHECK(input.defined(), "[{}] input tensor is undefined", op);
  STRATA_CHECK(input.dim() >= 2, "[{}] expects an input of shape (N, C, *), got {}", op, input.shape());
  STRATA_CHECK(is_floating(input.dtype()), "[{}] expects a floating input, got {}", op, input.dtype());
  check_channel_tensor("weight", weight, input);
  check_channel_tensor("bias", bias, input);
  check_channel_tensor("running_mean", running_mean, input);
  check_channel_tensor("running_var", running_var, input);
  if (residual.defined()) {
    STRATA_CHECK(residual.shape() == input.shape() && residual.dtype() == input.dtype() &&
                     residual.device() == input.device(),
                 "[{}] the residual ({} {} on {}) must match the input ({} {} on {})", op, residual.shape(),
                 residual.dtype(), residual.device(), input.shape(), input.dtype(), input.device());
  }
  STRATA_CHECK(args.eps >= 0 && std::isfinite(args.eps), "[{}] eps must be non-negative, got {}", op, args.eps);
  if (args.training && running_mean.defined() && running_var.defined()) {  // checked before either is written
    STRATA_CHECK(args.momentum >= 0 && args.momentum <= 1, "[{}] momentum must be in [0, 1], got {}", op,
                 args.momentum);
    strata::detail::check_writable(running_mean, op);
    strata::detail::check_writable(running_var, op);
  }
  const int64_t C = input.size(1), M = C > 0 ? input.numel() / C : 0;
  if (args.training) {  // an empty batch passes, as in PyTorch (its statistics are left alone)
    STRATA_CHECK(M != 1, "[{}] expects more than 1 value per channel when training, got input of shape {}", op,
                 input.shape());
  } else {
    STRATA_CHECK(running_mean.defined() && running_var.defined(),
                 "[{}] needs running_mean and running_var when not training", op);
  }
  const DType s = strata::detail::compute_dtype(input.dtype());
  const MemoryFormat f = format_of(input);
  const BatchNormParams params{args.training, args.eps, relu};
  Tensor xd, rd, w, y, mean, var;
  {
    NoGradGuard no_grad;
    xd = dense(input, f);
    if (residual.defined()) rd = dense(residual, f);
    w = as_stat(weight, s);
    y = detail::empty_in(input.shape(), input.dtype(), input.device(), f);
    mean = strata::detail::make_tensor({C}, s, input.device());
    var = strata::detail::make_tensor({C}, s, input.device());
    if (input.numel() == 0) {  // no values: the running statistics, or none to speak of
      if (running_mean.defined() && running_var.defined()) {
        mean.copy_(running_mean);
        var.copy_(running_var);
      } else {
        mean.zero_();
        var.fill_(1);
      }
    } else {
      const Tensor ins[6] = {xd, w, as_stat(bias, s), args.training ? Tensor() : as_stat(running_mean, s),
                             args.training ? Tensor() : as_stat(running_var, s), rd};
      Tensor outs[3] = {y, mean, var};
      run_kernel(OpId::batch_norm, input.dtype(), KernelCall{ins, outs, &params});
    }
    if (args.training && running_mean.defined() && running_var.defined() && M > 0) {
      const double m = args.momentum;
      Tensor unbiased = mul(var, static_cast<double>(M) / static_cast<double>(M - 1));
      Tensor rm = running_mean, rv = running_var;  // handles to the caller's buffers, updated in place
      rm.copy_(add(mul(rm.to(s), 1 - m), mul(mean, m)));
      rv.copy_(add(mul(rv.to(s), 1 - m), mul(unbiased, m)));
    }
  }
  const bool need_w = weight.defined() && weight.requires_grad(), need_b = bias.defined() && bias.requires_grad();
  const bool need_x = input.requires_grad(), need_r = residual.defined() && residual.requires_grad();
  std::vector<Tensor> saved{xd, w, mean, var};
  if (relu) saved.push_back(y);
  autograd::record(op, {input, weight, bias, residual}, {y}, saved,
                   [op, params, f, s, need_x, need_w, need_b, need_r](const autograd::Grads& g,
                                                                      const autograd::Saved& sv) {
                     autograd::check_once_differentiable(op, g, sv);
                     NoGradGuard no_grad;
                     const Tensor x = dense(sv[0], f);  // a saved-tensor hook may have changed its layout
                     // the gradient of the normalized values: the ReLU's mask applied. The residual's
                     // gradient is that too, so it is written out when the residual needs one; else
                     // the kernel applies the mask as it reads (Note [ReLU mask in the backward])
                     const bool mask_in_kernel = params.relu && !need_r;
                     const Tensor gn = params.relu && need_r ? dense(relu_backward(dense(g[0], f), dense(sv[4], f)), f)
                                                             : dense(g[0], f);
                     // gx is always computed (the kernel's first output) and dropped when not needed
                     Tensor outs[3] = {detail::empty_in(x.shape(), x.dtype(), x.device(), f),
                                       need_w ? strata::detail::make_tensor({x.size(1)}, s, x.device()) : Tensor(),
                                       need_b ? strata::detail::make_tensor({x.size(1)}, s, x.device()) : Tensor()};
                     if (x.numel() == 0) {
                       for (Tensor& o : outs)
                         if (o.defined()) o.zero_();
                     } else {
                       const Tensor ins[6] = {gn, x, sv[1], sv[2], sv[3], mask_in_kernel ? dense(sv[4], f) : Tensor()};
                       run_kernel(OpId::batch_norm_backward, x.dtype(), KernelCall{ins, outs, &params});
                     }
                     return autograd::Grads{need_x ? outs[0] : Tensor(), outs[1], outs[2], need_r ? gn : Tensor()};
                   });
  return y;
}

}  // namespace

namespace functional {

Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, const BatchNormArgs& args) {
  return batch_norm_op(input, running_mean, running_var, weight, bias, args, false, Tensor());
}

Tensor batch_norm_relu(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                       const Tensor& weight, const Tensor& bias, const BatchNormArgs& args, const Tensor& residual) {
  return batch_norm_op(input, running_mean, running_var, weight, bias, args, true, residual);
}

}  // namespace functional

// ---- layers ----------------------------------------------------------------------------------------

BatchNormBase::BatchNormBase(int64_t n, BatchNormOptions o) : num_features(n), options(o) {
  STRATA_CHECK(n > 0, "[BatchNorm] num_features must be positive, got {}", n);
  STRATA_CHECK(o.eps >= 0, "[BatchNorm] eps must be non-negative, got {}", o.eps);
  STRATA_CHECK(!o.momentum || (*o.momentum >= 0 && *o.momentum <= 1), "[BatchNorm] momentum must be in [0, 1], got {}",
               o.momentum.value_or(0));
  if (o.affine) {
    weight = register_parameter("weight", ones({n}));
    bias = register_parameter("bias", zeros({n}));
  }
  if (o.track_running_stats) {
    running_mean = register_buffer("running_mean", zeros({n}));
    running_var = register_buffer("running_var", ones({n}));
    num_batches_tracked = register_buffer("num_batches_tracked", zeros({}, kInt64));
  }
}

std::vector<std::string> BatchNormBase::optional_state_keys() const {
  if (!num_batches_tracked.defined()) return {};
  return {"num_batches_tracked"};
}

void BatchNormBase::reset_running_stats() {
  if (!options.track_running_stats) return;
  NoGradGuard no_grad;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void BatchNormBase::reset_parameters() {
  reset_running_stats();
  if (!options.affine) return;
  NoGradGuard no_grad;
  weight.fill_(1);
  bias.zero_();
}

std::string BatchNormBase::describe() const { return fmt::format("{}({})", name(), num_features); }

Tensor BatchNormBase::forward(const Tensor& input) { return run(input, false, Tensor()); }

Tensor BatchNormBase::forward_relu(const Tensor& input, const Tensor& residual) { return run(input, true, residual); }

Tensor BatchNormBase::run(const Tensor& input, bool relu, const Tensor& residual) {
  STRATA_CHECK(input.defined(), "[{}] input tensor is undefined", describe());
  check_rank(input);
  STRATA_CHECK(input.size(1) == num_features, "[{}] expects {} channels (dim 1), got input of shape {}", describe(),
               num_features, input.shape());
  // checked here too, so that a failing call does not count as a tracked batch
  STRATA_CHECK(!is_training() || input.numel() / num_features != 1,
               "[{}] expects more than 1 value per channel when training, got input of shape {}", describe(),
               input.shape());
  STRATA_CHECK(!residual.defined() || (residual.shape() == input.shape() && residual.dtype() == input.dtype() &&
                                        residual.device() == input.device()),
               "[{}] the residual ({} {} on {}) must match the input ({} {} on {})", describe(), residual.shape(),
               residual.dtype(), residual.device(), input.shape(), input.dtype(), input.device());
  double factor = options.momentum.value_or(0.0);
  const bool track = is_training() && options.track_running_stats;
  // momentum = None: the cumulative average over the batches seen so far, this one included
  if (track && !options.momentum) factor = 1.0 / static_cast<double>(num_batches_tracked.item<int64_t>() + 1);
  const bool use_batch_stats = is_training() || !options.track_running_stats;
  const bool update = !is_training() || options.track_running_stats;
  const Tensor rm = update ? running_mean : Tensor(), rv = update ? running_var : Tensor();
  const F::BatchNormArgs args{use_batch_stats, factor, options.eps};
  Tensor y = relu ? F::batch_norm_relu(input, rm, rv, weight, bias, args, residual)
                  : F::batch_norm(input, rm, rv, weight, bias, args);
  if (track) {  // counted once the call succeeded
    NoGradGuard no_grad;
    num_batches_tracked.add_(1);
  }
  return y;
}

void BatchNorm1d::check_rank(const Tensor& input) const {
  STRATA_CHECK(input.dim() == 2 || input.dim() == 3,
               "[{}] expects a 2-d (N, {}) or 3-d (N, {}, L) input, got shape {}", describe(), num_features,
               num_features, input.shape());
}

void BatchNorm2d::check_rank(const Tensor& input) const {
  STRATA_CHECK(input.dim() == 4, "[{}] expects a 4-d (N, {}, H, W) input, got shape {}", describe(), num_features,
               input.shape());
}

}  // namespace strata::nn
