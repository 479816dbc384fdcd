// conv2d and conv_transpose2d: argument checks, output shapes, memory formats and autograd
// here; the CPU kernels hand pointer/stride descriptions to kernels/cpu/conv.h.
//
// Three ops do all the work: conv2d (forward), conv2d_backward_input and
// conv2d_backward_weight. A transposed convolution is conv2d_backward_input, and its
// backward is conv2d forward and conv2d_backward_weight with the roles of its input and
// output swapped.
//
// Kernel contracts (4-d operands in any strided layout, one floating dtype: f32 or f64, and on
// CUDA also f16 and bf16):
//   conv2d                  inputs (x, w[, bias])  outputs (y)
//   conv2d_backward_input   inputs (gy, w)         outputs (gx)
//   conv2d_backward_weight  inputs (gy, x)         outputs (gw[, gbias])
// with x (N, C, H, W), w (O, C / groups, kH, kW), y (N, O, oH, oW), params Conv2dArgs.
//
// Double backward is not supported: the backward functions run the kernels directly and
// record nothing, so a gradient computed with create_graph has no history through conv.
#include <stdexcept>

#include <strata/amp/autocast.hpp>
#include <strata/autograd/graph.hpp>
#include <strata/nn/functional_conv.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/reduce.hpp>

#include "core/registry_internal.h"
#include "kernels/cpu/conv.h"
#include "nn/conv_internal.h"
#include "nn/memory_format.h"
#include "nn/window_shape.h"

namespace strata::nn {

namespace F = functional;
using detail::dense_in;
using detail::empty_in;
using detail::conv_out;
using detail::suggested_format;

namespace {

constexpr int64_t kMaxArg = int64_t(1) << 31;  // keeps every size product inside int64

cpu::Array4 array4(const Tensor& t) {
  cpu::Array4 a;
  a.data = t.data();
  const bool nchw = t.is_contiguous(), nhwc = !nchw && t.is_contiguous(MemoryFormat::ChannelsLast);
  Strides s = nchw || nhwc ? detail::canonical_strides(t.shape(), nchw ? MemoryFormat::Contiguous : MemoryFormat::ChannelsLast)
                           : t.strides();
  for (int i = 0; i < 4; ++i) a.stride[i] = s[i];
  return a;
}

// The geometry of a kernel call, checked so that no kernel reads or writes out of bounds
// whatever the caller passes: y's spatial size may be below the largest possible (a
// transposed convolution's output_padding leaves input rows that no window reaches).
cpu::ConvGeometry geometry(const Tensor& x, const Tensor& w, const Tensor& y, const F::Conv2dArgs& a) {
  STRATA_CHECK(x.dim() == 4 && w.dim() == 4 && y.dim() == 4, "[conv2d] kernel needs 4-d operands, got {}, {}, {}",
               x.shape(), w.shape(), y.shape());
  cpu::ConvGeometry g{x.size(0), x.size(1), x.size(2), x.size(3), y.size(1), y.size(2), y.size(3), w.size(2),
                      w.size(3), a.stride.h, a.stride.w, a.padding.h, a.padding.w, a.dilation.h, a.dilation.w,
                      a.groups};
  STRATA_CHECK(g.groups > 0 && g.c_in % g.groups == 0 && g.c_out % g.groups == 0 && w.size(0) == g.c_out &&
                   w.size(1) * g.groups == g.c_in && y.size(0) == g.n && g.kh > 0 && g.kw > 0,
               "[conv2d] kernel operands do not match: x {}, w {}, y {}, groups {}", x.shape(), w.shape(), y.shape(),
               g.groups);
  STRATA_CHECK(g.stride_h > 0 && g.stride_w > 0 && g.dil_h > 0 && g.dil_w > 0 && g.pad_h >= 0 && g.pad_w >= 0,
               "[conv2d] bad kernel arguments");
  STRATA_CHECK(g.h_out >= 1 && g.w_out >= 1 && g.h_out <= conv_out(g.h_in, g.kh, g.stride_h, g.pad_h, g.dil_h) &&
                   g.w_out <= conv_out(g.w_in, g.kw, g.stride_w, g.pad_w, g.dil_w),
               "[conv2d] output {} does not fit the input {}", y.shape(), x.shape());
  return g;
}

cpu::ConvType conv_type(DType t) {
  STRATA_CHECK(t == kFloat32 || t == kFloat64, "[conv2d] kernel supports float32 and float64, got {}", t);
  return t == kFloat64 ? cpu::ConvType::F64 : cpu::ConvType::F32;
}

template <class Fn>
void run_guarded(Fn fn, const cpu::ConvProblem& p) {
  try {
    fn(p);
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const Error*>(&e)) throw;
    strata::detail::throw_error("{}", e.what());
  }
}

const Tensor* optional_input(const KernelCall& call, size_t i) {
  return call.inputs.size() > i && call.inputs[i].defined() ? &call.inputs[i] : nullptr;
}

void* bias_data(const Tensor* b, int64_t c, DType t) {
  if (!b) return nullptr;
  STRATA_CHECK(b->dim() == 1 && b->size(0) == c && b->is_contiguous() && b->dtype() == t,
               "[conv2d] kernel needs a contiguous {} bias of {} values, got {} {}", t, c, b->dtype(), b->shape());
  return b->data();
}

void cpu_conv2d(const KernelCall& call) {
  const Tensor &x = call.inputs[0], &w = call.inputs[1];
  Tensor& y = call.outputs[0];
  cpu::ConvProblem p{conv_type(x.dtype()), geometry(x, w, y, call.param<F::Conv2dArgs>()), array4(x), array4(w),
                     array4(y), nullptr};
  p.bias = bias_data(optional_input(call, 2), p.g.c_out, x.dtype());
  run_guarded(cpu::conv_forward, p);
}

void cpu_conv2d_backward_input(const KernelCall& call) {
  const Tensor &gy = call.inputs[0], &w = call.inputs[1];
  Tensor& gx = call.outputs[0];
  cpu::ConvProblem p{conv_type(gy.dtype()), geometry(gx, w, gy, call.param<F::Conv2dArgs>()), array4(gx), array4(w),
                     array4(gy), nullptr};
  run_guarded(cpu::conv_backward_data, p);
}

void cpu_conv2d_backward_weight(const KernelCall& call) {
  const Tensor &gy = call.inputs[0], &x = call.inputs[1];
  Tensor& gw = call.outputs[0];
  cpu::ConvProblem p{conv_type(x.dtype()), geometry(x, gw, gy, call.param<F::Conv2dArgs>()), array4(x), array4(gw),
                     array4(gy), nullptr};
  if (call.outputs.size() > 1 && call.outputs[1].defined())
    p.bias = bias_data(&call.outputs[1], p.g.c_out, x.dtype());
  run_guarded(cpu::conv_backward_weights, p);
}

// ---- argument checks ------------------------------------------------------------------------

void check_args(const char* op, Size2 stride, Size2 padding, Size2 dilation, int64_t groups) {
  STRATA_CHECK(stride.h > 0 && stride.w > 0 && stride.h < kMaxArg && stride.w < kMaxArg,
               "[{}] stride must be in [1, 2^31), got {}", op, stride);
  STRATA_CHECK(padding.h >= 0 && padding.w >= 0 && padding.h < kMaxArg && padding.w < kMaxArg,
               "[{}] padding must be in [0, 2^31), got {}", op, padding);
  STRATA_CHECK(dilation.h > 0 && dilation.w > 0 && dilation.h < kMaxArg && dilation.w < kMaxArg,
               "[{}] dilation must be in [1, 2^31), got {}", op, dilation);
  STRATA_CHECK(groups > 0, "[{}] groups must be positive, got {}", op, groups);
}


// float16 / bfloat16 run through the float32 kernels (and are rounded back), unless the
// device has kernels of its own for them (CUDA: cuDNN, accumulating in float32).
bool via_f32(const Tensor& t) {
  const DType d = t.dtype();
  return (d == kFloat16 || d == kBFloat16) && !ext::has_kernel(OpId::conv2d, t.device().type, d);
}
Tensor to_f32(const Tensor& t) { return t.defined() ? t.to(kFloat32) : t; }

Tensor dense_weight(const Tensor& w) {
  return w.is_contiguous() || w.is_contiguous(MemoryFormat::ChannelsLast) ? w : w.contiguous();
}

// ---- the three ops, without autograd ----------------------------------------------------------

Tensor forward_op(const Tensor& x, const Tensor& w, const Tensor& b, const F::Conv2dArgs& a, const Shape& out,
                  MemoryFormat f) {
  NoGradGuard no_grad;
  Tensor y = empty_in(out, x.dtype(), x.device(), f);
  if (y.numel() == 0) return y.zero_();
  const Tensor ins[3] = {dense_in(x, f), dense_weight(w), b.defined() ? b.contiguous() : b};
  run_kernel(OpId::conv2d, x.dtype(), KernelCall{{ins, b.defined() ? 3u : 2u}, {&y, 1}, &a});
  return y;
}

Tensor backward_input_op(const Shape& in, const Tensor& w, const Tensor& gy, const F::Conv2dArgs& a, MemoryFormat f) {
  NoGradGuard no_grad;
  Tensor gx = empty_in(in, gy.dtype(), gy.device(), f);
  if (gx.numel() == 0) return gx;
  if (gy.numel() == 0) return gx.zero_();
  const Tensor ins[2] = {dense_in(gy, f), dense_weight(w)};
  run_kernel(OpId::conv2d_backward_input, gy.dtype(), KernelCall{ins, {&gx, 1}, &a});
  return gx;
}

F::Conv2dWeightGrads backward_weight_op(const Tensor& x, const Shape& ws, const Tensor& gy, const F::Conv2dArgs& a,
                                        bool with_bias, MemoryFormat f, MemoryFormat wf) {
  NoGradGuard no_grad;
  Tensor outs[2] = {empty_in(ws, x.dtype(), x.device(), wf),
                    with_bias ? strata::detail::make_tensor({ws[0]}, x.dtype(), x.device()) : Tensor()};
  if (gy.numel() == 0 || x.numel() == 0) {
    outs[0].zero_();
    if (with_bias) outs[1].zero_();
    return {outs[0], outs[1]};
  }
  const Tensor ins[2] = {dense_in(gy, f), dense_in(x, f)};
  run_kernel(OpId::conv2d_backward_weight, x.dtype(), KernelCall{ins, {outs, with_bias ? 2u : 1u}, &a});
  return {outs[0], outs[1]};
}

MemoryFormat weight_format(const Tensor& w) {
  return !w.is_contiguous() && w.is_contiguous(MemoryFormat::ChannelsLast) ? MemoryFormat::ChannelsLast
                                                                           : MemoryFormat::Contiguous;
}

}  // namespace

}  // namespace strata::nn

namespace strata::detail {
void register_conv_kernels(KernelTable& table) {
  for (DType t : {kFloat32, kFloat64}) {
    table.set(OpId::conv2d, DeviceType::CPU, t, nn::cpu_conv2d);
    table.set(OpId::conv2d_backward_input, DeviceType::CPU, t, nn::cpu_conv2d_backward_input);
    table.set(OpId::conv2d_backward_weight, DeviceType::CPU, t, nn::cpu_conv2d_backward_weight);
  }
}
}  // namespace strata::detail

namespace strata::nn {

namespace detail {

void check_conv_operands(const char* op, const Tensor& x, const Tensor& w, const Tensor& b, int spatial) {
  const char* shapes = spatial == 2 ? "4-d (N, C, H, W) or 3-d (C, H, W)" : "5-d (N, C, D, H, W) or 4-d (C, D, H, W)";
  STRATA_CHECK(x.defined() && w.defined(), "[{}] input or weight is undefined", op);
  STRATA_CHECK(x.dim() == spatial + 1 || x.dim() == spatial + 2, "[{}] expects a {} input, got shape {}", op, shapes,
               x.shape());
  STRATA_CHECK(w.dim() == spatial + 2, "[{}] expects a {}-d weight, got shape {}", op, spatial + 2, w.shape());
  STRATA_CHECK(is_floating(x.dtype()), "[{}] expects a floating input, got {}", op, x.dtype());
  STRATA_CHECK(w.dtype() == x.dtype() && (!b.defined() || b.dtype() == x.dtype()),
               "[{}] input ({}), weight ({}) and bias ({}) must have the same dtype", op, x.dtype(), w.dtype(),
               b.defined() ? fmt::format("{}", b.dtype()) : "none");
  STRATA_CHECK(w.device() == x.device() && (!b.defined() || b.device() == x.device()),
               "[{}] input ({}), weight ({}) and bias must be on the same device", op, x.device(), w.device());
  for (int64_t i = 2; i < w.dim(); ++i)
    STRATA_CHECK(w.size(i) > 0, "[{}] kernel size must be positive, got weight of shape {}", op, w.shape());
}

}  // namespace detail

namespace functional {

Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv2dArgs& args) {
  amp::detail::AutocastScope amp_scope("conv2d", input, weight, bias);
  if (amp_scope.cast()) return conv2d(amp_scope[0], amp_scope[1], amp_scope[2], args);
  detail::check_conv_operands("conv2d", input, weight, bias, 2);
  check_args("conv2d", args.stride, args.padding, args.dilation, args.groups);
  if (input.dim() == 3) return conv2d(input.unsqueeze(0), weight, bias, args).squeeze(0);
  const int64_t c = input.size(1), o = weight.size(0);
  STRATA_CHECK(o % args.groups == 0, "[conv2d] out channels ({}, weight of shape {}) must be divisible by groups={}",
               o, weight.shape(), args.groups);
  STRATA_CHECK(weight.size(1) * args.groups == c,
               "[conv2d] input of shape {} has {} channels, but weight of shape {} with groups={} expects {}",
               input.shape(), c, weight.shape(), args.groups, weight.size(1) * args.groups);
  STRATA_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == o),
               "[conv2d] bias must have shape ({}), got {}", o, bias.shape());
  const int64_t oh = conv_out(input.size(2), weight.size(2), args.stride.h, args.padding.h, args.dilation.h);
  const int64_t ow = conv_out(input.size(3), weight.size(3), args.stride.w, args.padding.w, args.dilation.w);
  STRATA_CHECK(oh > 0 && ow > 0,
               "[conv2d] input of shape {} is too small for kernel ({}, {}) with padding {} and dilation {}: the "
               "output would be empty",
               input.shape(), weight.size(2), weight.size(3), args.padding, args.dilation);
  if (via_f32(input)) return conv2d(to_f32(input), to_f32(weight), to_f32(bias), args).to(input.dtype());

  const MemoryFormat f = suggested_format(input);
  Tensor y = forward_op(input, weight, bias, args, {input.size(0), o, oh, ow}, f);
  const bool need_x = input.requires_grad(), need_w = weight.requires_grad(), need_b = bias.defined() && bias.requires_grad();
  autograd::record("conv2d", {input, weight, bias}, {y}, {input, weight},
                   [args, f, need_x, need_w, need_b](const autograd::Grads& g, const autograd::Saved& s) {
                     autograd::check_once_differentiable("conv2d", g, s);
                     const Tensor &x = s[0], &w = s[1];
                     autograd::Grads out(3);
                     if (need_x) out[0] = backward_input_op(x.shape(), w, g[0], args, f);
                     if (need_w || need_b) {
                       auto r = backward_weight_op(x, w.shape(), g[0], args, need_b, f, weight_format(w));
                       if (need_w) out[1] = r.weight;
                       out[2] = r.bias;
                     }
                     return out;
                   });
  return y;
}

Tensor conv2d_input_grad(const Shape& input_shape, const Tensor& weight, const Tensor& grad_output,
                         const Conv2dArgs& args) {
  STRATA_CHECK(weight.defined() && grad_output.defined(), "[conv2d_input_grad] weight or grad_output is undefined");
  check_args("conv2d_input_grad", args.stride, args.padding, args.dilation, args.groups);
  STRATA_CHECK(input_shape.size() == 4 && weight.dim() == 4 && grad_output.dim() == 4,
               "[conv2d_input_grad] expects 4-d shapes, got input {}, weight {}, grad_output {}", input_shape,
               weight.shape(), grad_output.shape());
  STRATA_CHECK(is_floating(weight.dtype()) && weight.dtype() == grad_output.dtype(),
               "[conv2d_input_grad] weight ({}) and grad_output ({}) must share a floating dtype", weight.dtype(),
               grad_output.dtype());
  for (int64_t s : input_shape) STRATA_CHECK(s >= 0, "[conv2d_input_grad] bad input shape {}", input_shape);
  const int64_t oh = conv_out(input_shape[2], weight.size(2), args.stride.h, args.padding.h, args.dilation.h);
  const int64_t ow = conv_out(input_shape[3], weight.size(3), args.stride.w, args.padding.w, args.dilation.w);
  STRATA_CHECK(weight.size(1) * args.groups == input_shape[1] && weight.size(0) % args.groups == 0 &&
                   grad_output.size(0) == input_shape[0] && grad_output.size(1) == weight.size(0) &&
                   grad_output.size(2) == oh && grad_output.size(3) == ow,
               "[conv2d_input_grad] grad_output of shape {} does not match input {} and weight {} (groups={})",
               grad_output.shape(), input_shape, weight.shape(), args.groups);
  if (via_f32(weight))
    return conv2d_input_grad(input_shape, to_f32(weight), to_f32(grad_output), args).to(weight.dtype());
  return backward_input_op(input_shape, weight, grad_output, args, suggested_format(grad_output));
}

Conv2dWeightGrads conv2d_weight_grad(const Tensor& input, const Shape& weight_shape, const Tensor& grad_output,
                                     const Conv2dArgs& args, bool with_bias) {
  STRATA_CHECK(input.defined() && grad_output.defined(), "[conv2d_weight_grad] input or grad_output is undefined");
  check_args("conv2d_weight_grad", args.stride, args.padding, args.dilation, args.groups);
  STRATA_CHECK(input.dim() == 4 && weight_shape.size() == 4 && grad_output.dim() == 4,
               "[conv2d_weight_grad] expects 4-d shapes, got input {}, weight {}, grad_output {}", input.shape(),
               weight_shape, grad_output.shape());
  STRATA_CHECK(is_floating(input.dtype()) && input.dtype() == grad_output.dtype(),
               "[conv2d_weight_grad] input ({}) and grad_output ({}) must share a floating dtype", input.dtype(),
               grad_output.dtype());
  STRATA_CHECK(weight_shape[2] > 0 && weight_shape[3] > 0 && weight_shape[0] >= 0,
               "[conv2d_weight_grad] bad weight shape {}", weight_shape);
  const int64_t oh = conv_out(input.size(2), weight_shape[2], args.stride.h, args.padding.h, args.dilation.h);
  const int64_t ow = conv_out(input.size(3), weight_shape[3], args.stride.w, args.padding.w, args.dilation.w);
  STRATA_CHECK(weight_shape[1] * args.groups == input.size(1) && weight_shape[0] % args.groups == 0 &&
                   grad_output.size(0) == input.size(0) && grad_output.size(1) == weight_shape[0] &&
                   grad_output.size(2) == oh && grad_output.size(3) == ow,
               "[conv2d_weight_grad] grad_output of shape {} does not match input {} and weight {} (groups={})",
               grad_output.shape(), input.shape(), weight_shape, args.groups);
  if (via_f32(input)) {
    auto r = conv2d_weight_grad(to_f32(input), weight_shape, to_f32(grad_output), args, with_bias);
    return {r.weight.to(input.dtype()), r.bias.defined() ? r.bias.to(input.dtype()) : Tensor()};
  }
  return backward_weight_op(input, weight_shape, grad_output, args, with_bias, suggested_format(input),
                            MemoryFormat::Contiguous);
}

Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias, const ConvTranspose2dArgs& a) {
  amp::detail::AutocastScope amp_scope("conv_transpose2d", input, weight, bias);
  if (amp_scope.cast()) return conv_transpose2d(amp_scope[0], amp_scope[1], amp_scope[2], a);
  detail::check_conv_operands("conv_transpose2d", input, weight, bias, 2);
  check_args("conv_transpose2d", a.stride, a.padding, a.dilation, a.groups);
  if (input.dim() == 3) return conv_transpose2d(input.unsqueeze(0), weight, bias, a).squeeze(0);
  const int64_t c = input.size(1), o = weight.size(1) * a.groups;
  STRATA_CHECK(c % a.groups == 0, "[conv_transpose2d] input channels ({}) must be divisible by groups={}", c,
               a.groups);
  STRATA_CHECK(weight.size(0) == c,
               "[conv_transpose2d] input of shape {} has {} channels, but weight of shape {} expects {}",
               input.shape(), c, weight.shape(), weight.size(0));
  STRATA_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == o),
               "[conv_transpose2d] bias must have shape ({}), got {}", o, bias.shape());
  const Size2 op = a.output_padding;
  STRATA_CHECK(op.h >= 0 && op.w >= 0 && (op.h < a.stride.h || op.h < a.dilation.h) &&
                   (op.w < a.stride.w || op.w < a.dilation.w),
               "[conv_transpose2d] output_padding {} must be non-negative and smaller than stride {} or dilation {}",
               op, a.stride, a.dilation);
  const Size2 st = a.stride, pd = a.padding, dl = a.dilation;
  const int64_t oh = detail::conv_transpose_out(input.size(2), weight.size(2), st.h, pd.h, dl.h, op.h);
  const int64_t ow = detail::conv_transpose_out(input.size(3), weight.size(3), st.w, pd.w, dl.w, op.w);
  STRATA_CHECK(input.size(2) > 0 && input.size(3) > 0 && oh > 0 && ow > 0,
               "[conv_transpose2d] input of shape {} with weight {}, stride {}, padding {} gives an empty output "
               "({}, {})",
               input.shape(), weight.shape(), a.stride, a.padding, oh, ow);
  if (via_f32(input))
    return conv_transpose2d(to_f32(input), to_f32(weight), to_f32(bias), a).to(input.dtype());

  const Conv2dArgs conv{a.stride, a.padding, a.dilation, a.groups};
  const MemoryFormat f = suggested_format(input);
  Tensor y = backward_input_op({input.size(0), o, oh, ow}, weight, input, conv, f);
  if (bias.defined()) {
    NoGradGuard no_grad;
    y.add_(bias.view({1, o, 1, 1}));
  }
  const bool need_x = input.requires_grad(), need_w = weight.requires_grad(), need_b = bias.defined() && bias.requires_grad();
  autograd::record("conv_transpose2d", {input, weight, bias}, {y}, {input, weight},
                   [conv, f, need_x, need_w, need_b](const autograd::Grads& g, const autograd::Saved& s) {
                     autograd::check_once_differentiable("conv_transpose2d", g, s);
                     const Tensor &x = s[0], &w = s[1];
                     autograd::Grads out(3);
                     if (need_x) out[0] = forward_op(g[0], w, Tensor(), conv, x.shape(), f);
                     if (need_w) out[1] = backward_weight_op(g[0], w.shape(), x, conv, false, f, weight_format(w)).weight;
                     if (need_b) {
                       NoGradGuard no_grad;
                       out[2] = g[0].sum({0, 2, 3});
                     }
                     return out;
                   });
  return y;
}

}  // namespace functional

}  // namespace strata::nn
