// The native 3-d convolution ops (Note [Native 3-d convolution]): conv3d, conv3d_backward_input
// and conv3d_backward_weight, their CPU kernels over oneDNN (kernels/cpu/conv.h), and the
// autograd of conv3d and conv_transpose3d through them. nn/conv3d.cpp checks the arguments and
// picks this path or the composed one.
//
// Note [Native 3-d convolution]
// Kernel contracts, as the 2-d ops' (src/nn/conv.cpp) with a depth dim, on contiguous (NCDHW)
// operands of one floating dtype:
//   conv3d                  inputs (x, w[, bias])  outputs (y)
//   conv3d_backward_input   inputs (gy, w)         outputs (gx)
//   conv3d_backward_weight  inputs (gy, x)         outputs (gw[, gbias])
// with x (N, C, D, H, W), w (O, C / groups, kD, kH, kW), y (N, O, oD, oH, oW), params Conv3dArgs;
// y is the full output of x. (A transposed convolution whose output_padding reaches past the
// stride has a smaller one, which oneDNN refuses at stride 1; the ops below pad the gradient
// with zeros to the full size, or crop a full result, instead.) A
// transposed convolution is conv3d_backward_input, and its backward is conv3d and
// conv3d_backward_weight with the roles of its input and output swapped.
// Kernels: float32 on the CPU in a build with oneDNN (float16 and bfloat16 through it, as the
// 2-d ops); every floating dtype on CUDA through cuDNN's Nd descriptors (src/ops/cuda/conv.cpp).
// Where no kernel is registered (float64 on the CPU, builds without oneDNN) or the path is
// switched off (set_native_conv3d), the ops run composed of the 2-d ones.
#include <array>
#include <atomic>
#include <stdexcept>

#include <strata/autograd/graph.hpp>
#include <strata/nn/functional_conv3d.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/reduce.hpp>

#include "core/registry_internal.h"
#include "kernels/cpu/conv.h"
#include "nn/volume_internal.h"
#include "nn/window_shape.h"

namespace strata::nn {

namespace F = functional;

namespace {

// CPU and CUDA; CUDA starts off until its kernels have run on a GPU (scripts/gpu-check.sh).
std::array<std::atomic<bool>, 2> g_native{true, false};

std::atomic<bool>& native_flag(DeviceType device) { return g_native[device == DeviceType::CUDA ? 1 : 0]; }

int64_t at(Size3 s, int i) { return i == 0 ? s.d : i == 1 ? s.h : s.w; }

// ---- the CPU kernels -----------------------------------------------------------------------------

cpu::Array5 array5(const Tensor& t) {
  STRATA_CHECK(t.dim() == 5 && t.is_contiguous(), "[conv3d] kernel needs contiguous 5-d operands, got {}",
               t.shape());
  cpu::Array5 a;
  a.data = t.data();
  const Strides s = contiguous_strides(t.shape());
  for (int i = 0; i < 5; ++i) a.stride[i] = s[i];
  return a;
}

// The geometry of a kernel call, checked so that no kernel reads or writes out of bounds.
cpu::Conv3dGeometry geometry(const Tensor& x, const Tensor& w, const Tensor& y, const F::Conv3dArgs& a) {
  STRATA_CHECK(x.dim() == 5 && w.dim() == 5 && y.dim() == 5, "[conv3d] kernel needs 5-d operands, got {}, {}, {}",
               x.shape(), w.shape(), y.shape());
  cpu::Conv3dGeometry g;
  g.n = x.size(0), g.c_in = x.size(1), g.c_out = y.size(1), g.groups = a.groups;
  STRATA_CHECK(g.groups > 0 && g.c_in % g.groups == 0 && g.c_out % g.groups == 0 && w.size(0) == g.c_out &&
                   w.size(1) * g.groups == g.c_in && y.size(0) == g.n,
               "[conv3d] kernel operands do not match: x {}, w {}, y {}, groups {}", x.shape(), w.shape(), y.shape(),
               g.groups);
  for (int i = 0; i < 3; ++i) {
    g.in[i] = x.size(2 + i), g.out[i] = y.size(2 + i), g.k[i] = w.size(2 + i);
    g.stride[i] = at(a.stride, i), g.pad[i] = at(a.padding, i), g.dil[i] = at(a.dilation, i);
    STRATA_CHECK(g.k[i] > 0 && g.stride[i] > 0 && g.dil[i] > 0 && g.pad[i] >= 0, "[conv3d] bad kernel arguments");
    STRATA_CHECK(g.out[i] >= 1 && g.out[i] == detail::conv_out(g.in[i], g.k[i], g.stride[i], g.pad[i], g.dil[i]),
                 "[conv3d] output {} is not the full output of the input {}", y.shape(), x.shape());
  }
  return g;
}

void* bias_data(const Tensor* b, int64_t c) {
  if (!b || !b->defined()) return nullptr;
  STRATA_CHECK(b->dim() == 1 && b->size(0) == c && b->is_contiguous() && b->dtype() == kFloat32,
               "[conv3d] kernel needs a contiguous float32 bias of {} values, got {} {}", c, b->dtype(), b->shape());
  return b->data();
}

// Runs one oneDNN entry point; its failures become Errors.
void run_dnnl(bool (*fn)(const cpu::Conv3dProblem&), const cpu::Conv3dProblem& p) {
  bool done = false;
  try {
    done = fn(p);
  } catch (const std::runtime_error& e) {
    if (dynamic_cast<const Error*>(&e)) throw;
    strata::detail::throw_error("{}", e.what());
  }
  STRATA_CHECK(done, "[conv3d] oneDNN took no 3-d convolution of input channels {}, output channels {}", p.g.c_in,
               p.g.c_out);
}

void cpu_conv3d(const KernelCall& call) {
  const Tensor &x = call.inputs[0], &w = call.inputs[1];
  Tensor& y = call.outputs[0];
  cpu::Conv3dProblem p{geometry(x, w, y, call.param<F::Conv3dArgs>()), array5(x), array5(w), array5(y), nullptr};
  p.bias = bias_data(call.inputs.size() > 2 ? &call.inputs[2] : nullptr, p.g.c_out);
  run_dnnl(cpu::conv3d_forward_dnnl, p);
}

void cpu_conv3d_backward_input(const KernelCall& call) {
  const Tensor &gy = call.inputs[0], &w = call.inputs[1];
  Tensor& gx = call.outputs[0];
  run_dnnl(cpu::conv3d_backward_data_dnnl,
           {geometry(gx, w, gy, call.param<F::Conv3dArgs>()), array5(gx), array5(w), array5(gy), nullptr});
}

void cpu_conv3d_backward_weight(const KernelCall& call) {
  const Tensor &gy = call.inputs[0], &x = call.inputs[1];
  Tensor& gw = call.outputs[0];
  cpu::Conv3dProblem p{geometry(x, gw, gy, call.param<F::Conv3dArgs>()), array5(x), array5(gw), array5(gy), nullptr};
  p.bias = bias_data(call.outputs.size() > 1 ? &call.outputs[1] : nullptr, p.g.c_out);
  run_dnnl(cpu::conv3d_backward_weights_dnnl, p);
}

// ---- the three ops, without autograd -------------------------------------------------------------

// The full output shape of convolving an input of shape `in` with a weight of shape `w`.
Shape full_output(const Shape& in, const Shape& w, const F::Conv3dArgs& a) {
  Shape s{in[0], w[0], 0, 0, 0};
  for (int i = 0; i < 3; ++i) s[2 + i] = detail::conv_out(in[2 + i], w[2 + i], at(a.stride, i), at(a.padding, i),
                                                          at(a.dilation, i));
  return s;
}

// gy zero-padded at the end of each spatial dim to `full`: the missing outputs add nothing.
Tensor padded_to(const Tensor& gy, const Shape& full) {
  if (gy.shape() == full) return gy;
  Tensor out = zeros(full, gy.options());
  out.narrow(2, 0, gy.size(2)).narrow(3, 0, gy.size(3)).narrow(4, 0, gy.size(4)).copy_(gy);
  return out;
}

Tensor forward_op(const Tensor& x, const Tensor& w, const Tensor& b, const F::Conv3dArgs& a, const Shape& out) {
  NoGradGuard no_grad;
  const Shape full = full_output(x.shape(), w.shape(), a);
  if (full != out)
    return forward_op(x, w, b, a, full).narrow(2, 0, out[2]).narrow(3, 0, out[3]).narrow(4, 0, out[4]).contiguous();
  Tensor y = empty(out, x.options());
  if (y.numel() == 0 || x.numel() == 0) return b.defined() ? y.copy_(b.view({1, -1, 1, 1, 1}).expand(out)) : y.zero_();
  const Tensor ins[3] = {x.contiguous(), w.contiguous(), b.defined() ? b.contiguous() : b};
  run_kernel(OpId::conv3d, x.dtype(), KernelCall{{ins, b.defined() ? 3u : 2u}, {&y, 1}, &a});
  return y;
}

Tensor backward_input_op(const Shape& in, const Tensor& w, const Tensor& gy, const F::Conv3dArgs& a) {
  NoGradGuard no_grad;
  Tensor gx = empty(in, gy.options());
  if (gx.numel() == 0) return gx;
  if (gy.numel() == 0 || w.numel() == 0) return gx.zero_();
  const Tensor ins[2] = {padded_to(gy, full_output(in, w.shape(), a)).contiguous(), w.contiguous()};
  run_kernel(OpId::conv3d_backward_input, gy.dtype(), KernelCall{ins, {&gx, 1}, &a});
  return gx;
}

// The weight's gradient and, when with_bias, the bias's.
std::pair<Tensor, Tensor> backward_weight_op(const Tensor& x, const Shape& ws, const Tensor& gy,
                                             const F::Conv3dArgs& a, bool with_bias) {
  NoGradGuard no_grad;
  Tensor outs[2] = {empty(ws, x.options()), with_bias ? empty({ws[0]}, x.options()) : Tensor()};
  if (gy.numel() == 0 || x.numel() == 0) {
    outs[0].zero_();
    if (with_bias) outs[1].zero_();
    return {outs[0], outs[1]};
  }
  const Tensor ins[2] = {padded_to(gy, full_output(x.shape(), ws, a)).contiguous(), x.contiguous()};
  run_kernel(OpId::conv3d_backward_weight, x.dtype(), KernelCall{ins, {outs, with_bias ? 2u : 1u}, &a});
  return {outs[0], outs[1]};
}

// float16 / bfloat16 without kernels of their own run through the float32 ones, as conv2d's.
bool via_f32(const Tensor& t) {
  const DType d = t.dtype();
  return (d == kFloat16 || d == kBFloat16) && !ext::has_kernel(OpId::conv3d, t.device().type, d);
}
Tensor to_f32(const Tensor& t) { return t.defined() ? t.to(kFloat32) : t; }

}  // namespace

namespace detail {

bool native_conv3d_applies(const Tensor& x) {
  const DeviceType dev = x.device().type;
  if (!native_flag(dev).load(std::memory_order_relaxed)) return false;
  return ext::has_kernel(OpId::conv3d, dev, via_f32(x) ? kFloat32 : x.dtype());
}

Tensor native_conv3d(const Tensor& input, const Tensor& weight, const Tensor& bias, const F::Conv3dArgs& args,
                     const Shape& out) {
  if (via_f32(input)) return native_conv3d(to_f32(input), to_f32(weight), to_f32(bias), args, out).to(input.dtype());
  Tensor y = forward_op(input, weight, bias, args, out);
  const bool need_x = input.requires_grad(), need_w = weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  autograd::record("conv3d", {input, weight, bias}, {y}, {input, weight},
                   [args, need_x, need_w, need_b](const autograd::Grads& g, const autograd::Saved& s) {
                     autograd::check_once_differentiable("conv3d", g, s);
                     const Tensor &x = s[0], &w = s[1];
                     autograd::Grads grads(3);
                     if (need_x) grads[0] = backward_input_op(x.shape(), w, g[0], args);
                     if (need_w || need_b) {
                       auto [gw, gb] = backward_weight_op(x, w.shape(), g[0], args, need_b);
                       if (need_w) grads[1] = gw;
                       grads[2] = gb;
                     }
                     return grads;
                   });
  return y;
}

Tensor native_conv_transpose3d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                               const F::ConvTranspose3dArgs& a, const Shape& out) {
  if (via_f32(input))
    return native_conv_transpose3d(to_f32(input), to_f32(weight), to_f32(bias), a, out).to(input.dtype());
  const F::Conv3dArgs conv{a.stride, a.padding, a.dilation, a.groups};
  Tensor y = backward_input_op(out, weight, input, conv);
  if (bias.defined()) {
    NoGradGuard no_grad;
    y.add_(bias.view({1, out[1], 1, 1, 1}));
  }
  const bool need_x = input.requires_grad(), need_w = weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  autograd::record("conv_transpose3d", {input, weight, bias}, {y}, {input, weight},
                   [conv, need_x, need_w, need_b](const autograd::Grads& g, const autograd::Saved& s) {
                     autograd::check_once_differentiable("conv_transpose3d", g, s);
                     const Tensor &x = s[0], &w = s[1];
                     autograd::Grads grads(3);
                     if (need_x) grads[0] = forward_op(g[0], w, Tensor(), conv, x.shape());
                     if (need_w) grads[1] = backward_weight_op(g[0], w.shape(), x, conv, false).first;
                     if (need_b) {
                       NoGradGuard no_grad;
                       grads[2] = g[0].sum({0, 2, 3, 4});
                     }
                     return grads;
                   });
  return y;
}

}  // namespace detail

namespace functional {

void set_native_conv3d(DeviceType device, bool enabled) {
  native_flag(device).store(enabled, std::memory_order_relaxed);
}
bool native_conv3d_enabled(DeviceType device) { return native_flag(device).load(std::memory_order_relaxed); }

}  // namespace functional

}  // namespace strata::nn

namespace strata::detail {
void register_conv3d_kernels(KernelTable& table) {
  if (!cpu::conv_dnnl_available()) return;  // the ops run composed of the 2-d ones
  table.set(OpId::conv3d, DeviceType::CPU, kFloat32, nn::cpu_conv3d);
  table.set(OpId::conv3d_backward_input, DeviceType::CPU, kFloat32, nn::cpu_conv3d_backward_input);
  table.set(OpId::conv3d_backward_weight, DeviceType::CPU, kFloat32, nn::cpu_conv3d_backward_weight);
}
}  // namespace strata::detail
