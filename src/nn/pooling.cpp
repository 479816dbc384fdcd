// max_pool2d, avg_pool2d and adaptive_avg_pool2d with their backward, and the pooling
// layers. Output sizes, argument checks (with PyTorch's rules and messages), memory formats
// and autograd are here; the loops are in kernels/cpu/pool.h.
//
// Kernel contracts (4-d (n, c, h, w) operands, any strides, one floating dtype):
//   max_pool2d                    inputs (x)           outputs (y, indices int64, y's strides)
//   max_pool2d_backward           inputs (gy, indices) outputs (gx)
//   avg_pool2d(_backward)         inputs (x) / (gy)    outputs (y) / (gx)      params Pool2dParams
//   adaptive_avg_pool2d(_backward) as avg_pool2d, without params
//
// Double backward is not supported: the backward functions run the kernels directly and
// record nothing.
#include <strata/autograd/graph.hpp>
#include <strata/nn/functional_conv.hpp>
#include <strata/nn/pooling.hpp>

#include "core/registry_internal.h"
#include "kernels/cpu/pool.h"
#include "nn/memory_format.h"
#include "nn/window_shape.h"
#include "ops/dispatch.h"

namespace strata::nn {

namespace F = functional;
using detail::dense_in;
using detail::empty_in;
using detail::every_window_has_a_tap;
using detail::pool_out;
using detail::suggested_format;

namespace {

constexpr int64_t kMaxArg = int64_t(1) << 31;

cpu::Strides4 strides4(const Tensor& t) {
  const bool nchw = t.is_contiguous(), nhwc = !nchw && t.is_contiguous(MemoryFormat::ChannelsLast);
  Strides s = nchw || nhwc ? detail::canonical_strides(t.shape(), nchw ? MemoryFormat::Contiguous : MemoryFormat::ChannelsLast)
                           : t.strides();
  return {s[0], s[1], s[2], s[3]};
}

bool same_strides(const cpu::Strides4& a, const cpu::Strides4& b) {
  return a.n == b.n && a.c == b.c && a.h == b.h && a.w == b.w;
}

// x: the (gradient of the) input, y: the (gradient of the) output.
cpu::Pool2dGeometry geometry(const char* op, const Tensor& x, const Tensor& y, const Pool2dParams* p) {
  STRATA_CHECK(x.dim() == 4 && y.dim() == 4 && x.size(0) == y.size(0) && x.size(1) == y.size(1) &&
                   x.dtype() == y.dtype() && y.size(2) > 0 && y.size(3) > 0,
               "[{}] kernel operands do not match: {} {} and {} {}", op, x.shape(), x.dtype(), y.shape(), y.dtype());
  cpu::Pool2dGeometry g{x.size(0), x.size(1), x.size(2), x.size(3), y.size(2), y.size(3)};
  if (p) {
    g.kh = p->kernel.h, g.kw = p->kernel.w, g.sh = p->stride.h, g.sw = p->stride.w;
    g.ph = p->padding.h, g.pw = p->padding.w, g.dh = p->dilation.h, g.dw = p->dilation.w;
    STRATA_CHECK(g.kh > 0 && g.kw > 0 && g.sh > 0 && g.sw > 0 && g.dh > 0 && g.dw > 0 && g.ph >= 0 && g.pw >= 0,
                 "[{}] bad kernel arguments", op);
  }
  return g;
}

void check_indices(const Tensor& idx, const Tensor& y) {
  STRATA_CHECK(idx.dtype() == kInt64 && idx.shape() == y.shape() && same_strides(strides4(idx), strides4(y)),
               "[max_pool2d] indices ({} {}) must be int64 laid out as the output ({})", idx.dtype(), idx.shape(),
               y.shape());
}

template <class Fn>
void run_checked(const char* op, Fn fn) {
  try {
    fn();
  } catch (const std::out_of_range&) {
    strata::detail::throw_error("[{}] an index lies outside its input plane", op);
  }
}

void cpu_max_pool2d(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor &y = call.outputs[0], &idx = call.outputs[1];
  const auto g = geometry("max_pool2d", x, y, &call.param<Pool2dParams>());
  check_indices(idx, y);
  dispatch<DTypeSet::Floating>(x.dtype(), "max_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::max_pool2d_forward(static_cast<const T*>(x.data()), strides4(x), static_cast<T*>(y.data()),
                            static_cast<int64_t*>(idx.data()), strides4(y), g);
  });
}

void cpu_max_pool2d_backward(const KernelCall& call) {
  const Tensor &gy = call.inputs[0], &idx = call.inputs[1];
  Tensor& gx = call.outputs[0];
  const auto g = geometry("max_pool2d_backward", gx, gy, nullptr);
  check_indices(idx, gy);
  run_checked("max_pool2d_backward", [&] {
    dispatch<DTypeSet::Floating>(gy.dtype(), "max_pool2d_backward", [&](auto tag) {
      using T = typename decltype(tag)::type;
      cpu::max_pool2d_backward(static_cast<const T*>(gy.data()), static_cast<const int64_t*>(idx.data()),
                               strides4(gy), static_cast<T*>(gx.data()), strides4(gx), g);
    });
  });
}

void cpu_avg_pool2d(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  const Pool2dParams& p = call.param<Pool2dParams>();
  const auto g = geometry("avg_pool2d", x, y, &p);
  dispatch<DTypeSet::Floating>(x.dtype(), "avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::avg_pool2d_forward(static_cast<const T*>(x.data()), strides4(x), static_cast<T*>(y.data()), strides4(y), g,
                            p.count_include_pad, p.divisor);
  });
}

void cpu_avg_pool2d_backward(const KernelCall& call) {
  const Tensor& gy = call.inputs[0];
  Tensor& gx = call.outputs[0];
  const Pool2dParams& p = call.param<Pool2dParams>();
  const auto g = geometry("avg_pool2d_backward", gx, gy, &p);
  dispatch<DTypeSet::Floating>(gy.dtype(), "avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::avg_pool2d_backward(static_cast<const T*>(gy.data()), strides4(gy), static_cast<T*>(gx.data()),
                             strides4(gx), g, p.count_include_pad, p.divisor);
  });
}

void cpu_adaptive_avg_pool2d(const KernelCall& call) {
  const Tensor& x = call.inputs[0];
  Tensor& y = call.outputs[0];
  const auto g = geometry("adaptive_avg_pool2d", x, y, nullptr);
  dispatch<DTypeSet::Floating>(x.dtype(), "adaptive_avg_pool2d", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::adaptive_avg_pool2d_forward(static_cast<const T*>(x.data()), strides4(x), static_cast<T*>(y.data()),
                                     strides4(y), g);
  });
}

void cpu_adaptive_avg_pool2d_backward(const KernelCall& call) {
  const Tensor& gy = call.inputs[0];
  Tensor& gx = call.outputs[0];
  const auto g = geometry("adaptive_avg_pool2d_backward", gx, gy, nullptr);
  dispatch<DTypeSet::Floating>(gy.dtype(), "adaptive_avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    cpu::adaptive_avg_pool2d_backward(static_cast<const T*>(gy.data()), strides4(gy), static_cast<T*>(gx.data()),
                                      strides4(gx), g);
  });
}

// ---- shapes and checks ------------------------------------------------------------------------

void check_input(const char* op, const Tensor& x) {
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", op);
  STRATA_CHECK(x.dim() == 3 || x.dim() == 4, "[{}] expects a 4-d (N, C, H, W) or 3-d (C, H, W) input, got shape {}",
               op, x.shape());
  STRATA_CHECK(is_floating(x.dtype()), "[{}] expects a floating input, got {}", op, x.dtype());
  const int64_t d = x.dim();
  STRATA_CHECK(x.size(d - 3) > 0 && x.size(d - 2) > 0 && x.size(d - 1) > 0,
               "[{}] expects non-empty channel and spatial dims, got input of shape {}", op, x.shape());
}

// Checks the arguments and returns the kernel parameters and the output size.
Pool2dParams pool_params(const char* op, const Tensor& x, Size2 k, std::optional<Size2> stride, Size2 pad,
                         Size2 dil, bool ceil_mode, bool is_max, int64_t& oh, int64_t& ow) {
  const Size2 s = stride.value_or(k);
  STRATA_CHECK(k.h > 0 && k.w > 0 && k.h < kMaxArg && k.w < kMaxArg, "[{}] kernel_size must be in [1, 2^31), got {}",
               op, k);
  STRATA_CHECK(s.h > 0 && s.w > 0 && s.h < kMaxArg && s.w < kMaxArg, "[{}] stride must be in [1, 2^31), got {}", op, s);
  STRATA_CHECK(dil.h > 0 && dil.w > 0 && dil.h < kMaxArg && dil.w < kMaxArg,
               "[{}] dilation must be in [1, 2^31), got {}", op, dil);
  // the largest padding that leaves every window a real element
  const Size2 half = is_max ? Size2(((k.h - 1) * dil.h + 1) / 2, ((k.w - 1) * dil.w + 1) / 2) : Size2(k.h / 2, k.w / 2);
  STRATA_CHECK(pad.h >= 0 && pad.w >= 0 && pad.h <= half.h && pad.w <= half.w,
               "[{}] padding {} must be non-negative and at most half the {}kernel size {}", op, pad,
               is_max ? "effective " : "", is_max ? Size2((k.h - 1) * dil.h + 1, (k.w - 1) * dil.w + 1) : k);
  const int64_t d = x.dim();
  const int64_t ih = x.size(d - 2), iw = x.size(d - 1);
  oh = pool_out(ih, k.h, pad.h, s.h, dil.h, ceil_mode);
  ow = pool_out(iw, k.w, pad.w, s.w, dil.w, ceil_mode);
  STRATA_CHECK(oh > 0 && ow > 0,
               "[{}] input of shape {} is too small for kernel {} (stride {}, padding {}, dilation {}): the output "
               "would be ({}, {})",
               op, x.shape(), k, s, pad, dil, oh, ow);
  STRATA_CHECK(every_window_has_a_tap(ih, k.h, pad.h, s.h, dil.h, oh) &&
                   every_window_has_a_tap(iw, k.w, pad.w, s.w, dil.w, ow),
               "[{}] with kernel {}, stride {}, padding {} and dilation {}, a window of the input of shape {} "
               "holds only padding: its maximum would have no element",
               op, k, s, pad, dil, x.shape());
  return Pool2dParams{k, s, pad, dil};
}

Shape out_shape(const Tensor& x4, int64_t oh, int64_t ow) { return {x4.size(0), x4.size(1), oh, ow}; }

// ---- the ops without autograd --------------------------------------------------------------------

// One forward kernel call: x made dense in f, outputs allocated in f.
Tensor run_forward(OpId op, const Tensor& x, const Shape& out, MemoryFormat f, const void* params,
                   Tensor* indices = nullptr) {
  NoGradGuard no_grad;
  Tensor outs[2] = {empty_in(out, x.dtype(), x.device(), f),
                    indices ? empty_in(out, kInt64, x.device(), f) : Tensor()};
  if (outs[0].numel() > 0) {
    const Tensor in = dense_in(x, f);
    run_kernel(op, x.dtype(), KernelCall{{&in, 1}, {outs, indices ? 2u : 1u}, params});
  }
  if (indices) *indices = outs[1];
  return outs[0];
}

Tensor run_backward(OpId op, const Tensor& gy, const Tensor& indices, const Shape& in, MemoryFormat f,
                    const void* params) {
  NoGradGuard no_grad;
  Tensor gx = empty_in(in, gy.dtype(), gy.device(), f);
  if (gy.numel() == 0) return gx.zero_();
  // the saved indices are laid out as the output was, unless a saved-tensor hook changed that
  const Tensor ins[2] = {dense_in(gy, f), indices.defined() ? dense_in(indices, f) : indices};
  run_kernel(op, gy.dtype(), KernelCall{{ins, indices.defined() ? 2u : 1u}, {&gx, 1}, params});
  return gx;
}

}  // namespace

}  // namespace strata::nn

namespace strata::detail {
void register_pool_kernels(KernelTable& table) {
  const auto CPU = DeviceType::CPU;
  const auto& fl = kFloatDTypes;
  table.set(OpId::max_pool2d, CPU, fl, nn::cpu_max_pool2d);
  table.set(OpId::max_pool2d_backward, CPU, fl, nn::cpu_max_pool2d_backward);
  table.set(OpId::avg_pool2d, CPU, fl, nn::cpu_avg_pool2d);
  table.set(OpId::avg_pool2d_backward, CPU, fl, nn::cpu_avg_pool2d_backward);
  table.set(OpId::adaptive_avg_pool2d, CPU, fl, nn::cpu_adaptive_avg_pool2d);
  table.set(OpId::adaptive_avg_pool2d_backward, CPU, fl, nn::cpu_adaptive_avg_pool2d_backward);
}
}  // namespace strata::detail

namespace strata::nn {

namespace functional {

MaxPoolResult max_pool2d_with_indices(const Tensor& input, Size2 kernel_size, const MaxPool2dArgs& args) {
  check_input("max_pool2d", input);
  int64_t oh = 0, ow = 0;
  const Pool2dParams p = pool_params("max_pool2d", input, kernel_size, args.stride, args.padding, args.dilation,
                                     args.ceil_mode, true, oh, ow);
  if (input.dim() == 3) {
    MaxPoolResult r = max_pool2d_with_indices(input.unsqueeze(0), kernel_size, args);
    return {r.output.squeeze(0), r.indices.squeeze(0)};
  }
  const MemoryFormat f = suggested_format(input);
  Tensor indices;
  Tensor y = run_forward(OpId::max_pool2d, input, out_shape(input, oh, ow), f, &p, &indices);
  autograd::record("max_pool2d", {input}, {y}, {indices},
                   [p, in = input.shape(), f](const autograd::Grads& g, const autograd::Saved& s) {
                     autograd::check_once_differentiable("max_pool2d", g, s);
                     return autograd::Grads{run_backward(OpId::max_pool2d_backward, g[0], s[0], in, f, &p)};
                   });
  return {y, indices};
}

Tensor max_pool2d(const Tensor& input, Size2 kernel_size, const MaxPool2dArgs& args) {
  return max_pool2d_with_indices(input, kernel_size, args).output;
}

Tensor avg_pool2d(const Tensor& input, Size2 kernel_size, const AvgPool2dArgs& args) {
  check_input("avg_pool2d", input);
  int64_t oh = 0, ow = 0;
  Pool2dParams p =
      pool_params("avg_pool2d", input, kernel_size, args.stride, args.padding, 1, args.ceil_mode, false, oh, ow);
  STRATA_CHECK(!args.divisor_override || *args.divisor_override != 0, "[avg_pool2d] divisor_override must be nonzero");
  p.count_include_pad = args.count_include_pad;
  p.divisor = args.divisor_override.value_or(0);
  if (input.dim() == 3) return avg_pool2d(input.unsqueeze(0), kernel_size, args).squeeze(0);
  const MemoryFormat f = suggested_format(input);
  Tensor y = run_forward(OpId::avg_pool2d, input, out_shape(input, oh, ow), f, &p);
  autograd::record("avg_pool2d", {input}, {y}, {},
                   [p, in = input.shape(), f](const autograd::Grads& g, const autograd::Saved& s) {
                     autograd::check_once_differentiable("avg_pool2d", g, s);
                     return autograd::Grads{run_backward(OpId::avg_pool2d_backward, g[0], Tensor(), in, f, &p)};
                   });
  return y;
}

Tensor adaptive_avg_pool2d(const Tensor& input, Size2 output_size) {
  check_input("adaptive_avg_pool2d", input);
  STRATA_CHECK(output_size.h > 0 && output_size.w > 0 && output_size.h < kMaxArg && output_size.w < kMaxArg,
               "[adaptive_avg_pool2d] output_size must be in [1, 2^31), got {}", output_size);
  if (input.dim() == 3) return adaptive_avg_pool2d(input.unsqueeze(0), output_size).squeeze(0);
  const MemoryFormat f = suggested_format(input);
  Tensor y = run_forward(OpId::adaptive_avg_pool2d, input, out_shape(input, output_size.h, output_size.w), f, nullptr);
  autograd::record("adaptive_avg_pool2d", {input}, {y}, {},
                   [in = input.shape(), f](const autograd::Grads& g, const autograd::Saved& s) {
                     autograd::check_once_differentiable("adaptive_avg_pool2d", g, s);
                     return autograd::Grads{
                         run_backward(OpId::adaptive_avg_pool2d_backward, g[0], Tensor(), in, f, nullptr)};
                   });
  return y;
}

}  // namespace functional

// ---- layers ----------------------------------------------------------------------------------------

MaxPool2d::MaxPool2d(Size2 k, functional::MaxPool2dArgs o) : kernel_size(k), options(o) {
  STRATA_CHECK(k.h > 0 && k.w > 0, "[MaxPool2d] kernel_size must be positive, got {}", k);
}
Tensor MaxPool2d::forward(const Tensor& input) { return functional::max_pool2d(input, kernel_size, options); }
functional::MaxPoolResult MaxPool2d::forward_with_indices(const Tensor& input) {
  return functional::max_pool2d_with_indices(input, kernel_size, options);
}

AvgPool2d::AvgPool2d(Size2 k, functional::AvgPool2dArgs o) : kernel_size(k), options(o) {
  STRATA_CHECK(k.h > 0 && k.w > 0, "[AvgPool2d] kernel_size must be positive, got {}", k);
}
Tensor AvgPool2d::forward(const Tensor& input) { return functional::avg_pool2d(input, kernel_size, options); }

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Size2 s) : output_size(s) {
  STRATA_CHECK(s.h > 0 && s.w > 0, "[AdaptiveAvgPool2d] output_size must be positive, got {}", s);
}
Tensor AdaptiveAvgPool2d::forward(const Tensor& input) { return functional::adaptive_avg_pool2d(input, output_size); }

}  // namespace strata::nn
