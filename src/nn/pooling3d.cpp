// The 3-d pools as native ops: max_pool3d (with indices), avg_pool3d, adaptive_avg_pool3d and
// adaptive_max_pool3d with their backward, and the layers. Argument checks (PyTorch's rules),
// output sizes and autograd are here; the CPU launchers are in nn/pooling3d_kernels.cpp, the CUDA
// ones in ops/cuda/pool3d.cpp, the window math in kernels/common/pool_window.h. Both max pools
// share max_pool3d_backward, a scatter by the saved indices. Double backward is not supported
// (the backward functions run kernels and record nothing).
#include <strata/autograd/graph.hpp>
#include <strata/autograd/grad_mode.hpp>
#include <strata/nn/functional_conv3d.hpp>
#include <strata/nn/pooling.hpp>
#include <strata/ops/creation.hpp>

#include "core/registry_internal.h"
#include "nn/volume_internal.h"
#include "nn/window_shape.h"

namespace strata::nn {

namespace functional {

namespace {

void check_input(const char* op, const Tensor& x) {
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op);
  STRATA_CHECK(x.dim() == 4 || x.dim() == 5,
               "[{}] expects a 5-d (N, C, D, H, W) or 4-d (C, D, H, W) input, got shape {}", op, x.shape());
  STRATA_CHECK(is_floating(x.dtype()), "[{}] expects a floating input, got {}", op, x.dtype());
  const int64_t d = x.dim();
  STRATA_CHECK(x.size(d - 4) > 0 && x.size(d - 3) > 0 && x.size(d - 2) > 0 && x.size(d - 1) > 0,
               "[{}] expects non-empty channel and spatial dims, got input of shape {}", op, x.shape());
}

// Checks the arguments against x (N, C, D, H, W) as PyTorch does; returns the output size.
Size3 pool_size(const char* op, const Tensor& x, Size3 k, Size3 s, Size3 pad, Size3 dil, bool ceil_mode, bool is_max) {
  STRATA_CHECK(detail::in_arg_range(k, 1), "[{}] kernel_size must be in [1, 2^31), got {}", op, k);
  STRATA_CHECK(detail::in_arg_range(s, 1), "[{}] stride must be in [1, 2^31), got {}", op, s);
  STRATA_CHECK(detail::in_arg_range(dil, 1), "[{}] dilation must be in [1, 2^31), got {}", op, dil);
  // the largest padding that leaves every window a real element
  const Size3 span = is_max ? Size3((k.d - 1) * dil.d + 1, (k.h - 1) * dil.h + 1, (k.w - 1) * dil.w + 1) : k;
  STRATA_CHECK(pad.d >= 0 && pad.h >= 0 && pad.w >= 0 && pad.d <= span.d / 2 && pad.h <= span.h / 2 &&
                   pad.w <= span.w / 2,
               "[{}] padding {} must be non-negative and at most half the {}kernel size {}", op, pad,
               is_max ? "effective " : "", span);
  const int64_t in[3] = {x.size(2), x.size(3), x.size(4)};
  const int64_t ks[3] = {k.d, k.h, k.w}, ss[3] = {s.d, s.h, s.w}, ps[3] = {pad.d, pad.h, pad.w};
  const int64_t ds[3] = {dil.d, dil.h, dil.w};
  int64_t out[3];
  for (int i = 0; i < 3; ++i) out[i] = detail::pool_out(in[i], ks[i], ps[i], ss[i], ds[i], ceil_mode);
  STRATA_CHECK(out[0] > 0 && out[1] > 0 && out[2] > 0,
               "[{}] input of shape {} is too small for kernel {} (stride {}, padding {}, dilation {}): the output "
               "would be ({}, {}, {})",
               op, x.shape(), k, s, pad, dil, out[0], out[1], out[2]);
  for (int i = 0; i < 3; ++i)
    STRATA_CHECK(detail::every_window_has_a_tap(in[i], ks[i], ps[i], ss[i], ds[i], out[i]),
                 "[{}] with kernel {}, stride {}, padding {} and dilation {}, a window of the input of shape {} "
                 "holds only padding: its maximum would have no element",
                 op, k, s, pad, dil, x.shape());
  return {out[0], out[1], out[2]};
}

void check_adaptive(const char* op, const Tensor& x, Size3 output_size) {
  check_input(op, x);
  STRATA_CHECK(detail::in_arg_range(output_size, 1), "[{}] output_size must be in [1, 2^31), got {}", op, output_size);
}

Shape out_shape(const Tensor& x, Size3 out) { return {x.size(0), x.size(1), out.d, out.h, out.w}; }

// One forward kernel call on x made contiguous; outputs (y, and indices when asked) of shape out.
Tensor run_forward(OpId op, const Tensor& x, const Shape& out, const Pool3dParams& p, Tensor* indices = nullptr) {
  NoGradGuard no_grad;
  const TensorOptions on(x.dtype(), x.device());
  Tensor outs[2] = {empty(out, on), indices ? empty(out, TensorOptions(kInt64, x.device())) : Tensor()};
  if (outs[0].numel() > 0) {
    const Tensor in = x.contiguous();
    run_kernel(op, x.dtype(), KernelCall{{&in, 1}, {outs, indices ? 2u : 1u}, &p});
  }
  if (indices) *indices = outs[1];
  return outs[0];
}

Tensor run_backward(OpId op, const Tensor& gy, const Tensor& indices, const Shape& in, const Pool3dParams& p) {
  NoGradGuard no_grad;
  Tensor gx = empty(in, TensorOptions(gy.dtype(), gy.device()));
  if (gy.numel() == 0) return gx.zero_();
  const Tensor ins[2] = {gy.contiguous(), indices.defined() ? indices.contiguous() : indices};
  run_kernel(op, gy.dtype(), KernelCall{{ins, indices.defined() ? 2u : 1u}, {&gx, 1}, &p});
  return gx;
}

// max_pool3d or adaptive_max_pool3d of a checked 5-d x; the gradient scattered by the indices.
MaxPoolResult max_with_indices(const char* op, OpId forward, const Tensor& x, Size3 out, const Pool3dParams& p) {
  Tensor indices;
  Tensor y = run_forward(forward, x, out_shape(x, out), p, &indices);
  autograd::record(op, {x}, {y}, {indices},
                   [op, p, in = x.shape()](const autograd::Grads& g, const autograd::Saved& s) {
                     autograd::check_once_differentiable(op, g, s);
                     return autograd::Grads{run_backward(OpId::max_pool3d_backward, g[0], s[0], in, p)};
                   });
  return {y, indices};
}

// avg_pool3d or adaptive_avg_pool3d of a checked 5-d x.
Tensor average(const char* op, OpId forward, OpId backward, const Tensor& x, Size3 out, const Pool3dParams& p) {
  Tensor y = run_forward(forward, x, out_shape(x, out), p);
  autograd::record(op, {x}, {y}, {},
                   [op, backward, p, in = x.shape()](const autograd::Grads& g, const autograd::Saved& s) {
                     autograd::check_once_differentiable(op, g, s);
                     return autograd::Grads{run_backward(backward, g[0], Tensor(), in, p)};
                   });
  return y;
}

}  // namespace

MaxPoolResult max_pool3d_with_indices(const Tensor& input, Size3 kernel_size, const MaxPool3dArgs& args) {
  check_input("max_pool3d", input);
  if (input.dim() == 4) {
    MaxPoolResult r = max_pool3d_with_indices(input.unsqueeze(0), kernel_size, args);
    return {r.output.squeeze(0), r.indices.squeeze(0)};
  }
  const Size3 s = args.stride.value_or(kernel_size);
  const Size3 out = pool_size("max_pool3d", input, kernel_size, s, args.padding, args.dilation, args.ceil_mode, true);
  return max_with_indices("max_pool3d", OpId::max_pool3d, input, out,
                          Pool3dParams{kernel_size, s, args.padding, args.dilation});
}

Tensor max_pool3d(const Tensor& input, Size3 kernel_size, const MaxPool3dArgs& args) {
  return max_pool3d_with_indices(input, kernel_size, args).output;
}

Tensor avg_pool3d(const Tensor& input, Size3 kernel_size, const AvgPool3dArgs& args) {
  check_input("avg_pool3d", input);
  STRATA_CHECK(!args.divisor_override || *args.divisor_override != 0, "[avg_pool3d] divisor_override must be nonzero");
  if (input.dim() == 4) return avg_pool3d(input.unsqueeze(0), kernel_size, args).squeeze(0);
  const Size3 s = args.stride.value_or(kernel_size);
  const Size3 out = pool_size("avg_pool3d", input, kernel_size, s, args.padding, 1, args.ceil_mode, false);
  Pool3dParams p{kernel_size, s, args.padding, 1};
  p.count_include_pad = args.count_include_pad;
  p.divisor = args.divisor_override.value_or(0);
  return average("avg_pool3d", OpId::avg_pool3d, OpId::avg_pool3d_backward, input, out, p);
}

Tensor adaptive_avg_pool3d(const Tensor& input, Size3 output_size) {
  check_adaptive("adaptive_avg_pool3d", input, output_size);
  if (input.dim() == 4) return adaptive_avg_pool3d(input.unsqueeze(0), output_size).squeeze(0);
  Pool3dParams p;
  p.adaptive = true;
  return average("adaptive_avg_pool3d", OpId::adaptive_avg_pool3d, OpId::adaptive_avg_pool3d_backward, input,
                 output_size, p);
}

MaxPoolResult adaptive_max_pool3d_with_indices(const Tensor& input, Size3 output_size) {
  check_adaptive("adaptive_max_pool3d", input, output_size);
  if (input.dim() == 4) {
    MaxPoolResult r = adaptive_max_pool3d_with_indices(input.unsqueeze(0), output_size);
    return {r.output.squeeze(0), r.indices.squeeze(0)};
  }
  Pool3dParams p;
  p.adaptive = true;
  return max_with_indices("adaptive_max_pool3d", OpId::adaptive_max_pool3d, input, output_size, p);
}

Tensor adaptive_max_pool3d(const Tensor& input, Size3 output_size) {
  return adaptive_max_pool3d_with_indices(input, output_size).output;
}

}  // namespace functional

// ---- layers ----------------------------------------------------------------------------------------

MaxPool3d::MaxPool3d(Size3 k, functional::MaxPool3dArgs o) : kernel_size(k), options(o) {
  STRATA_CHECK(k.d > 0 && k.h > 0 && k.w > 0, "[MaxPool3d] kernel_size must be positive, got {}", k);
}
Tensor MaxPool3d::forward(const Tensor& input) { return functional::max_pool3d(input, kernel_size, options); }
functional::MaxPoolResult MaxPool3d::forward_with_indices(const Tensor& input) {
  return functional::max_pool3d_with_indices(input, kernel_size, options);
}

AvgPool3d::AvgPool3d(Size3 k, functional::AvgPool3dArgs o) : kernel_size(k), options(o) {
  STRATA_CHECK(k.d > 0 && k.h > 0 && k.w > 0, "[AvgPool3d] kernel_size must be positive, got {}", k);
}
Tensor AvgPool3d::forward(const Tensor& input) { return functional::avg_pool3d(input, kernel_size, options); }

AdaptiveAvgPool3d::AdaptiveAvgPool3d(Size3 s) : output_size(s) {
  STRATA_CHECK(s.d > 0 && s.h > 0 && s.w > 0, "[AdaptiveAvgPool3d] output_size must be positive, got {}", s);
}
Tensor AdaptiveAvgPool3d::forward(const Tensor& input) { return functional::adaptive_avg_pool3d(input, output_size); }

}  // namespace strata::nn
