// conv3d and conv_transpose3d: the argument checks (naming the 3-d shapes), then the native 3-d
// ops (Note [Native 3-d convolution] in nn/conv3d_native.cpp) where they apply, else the
// composition of the 2-d convolutions below; and the depth gather that the 3-d pooling ops share
// (nn/pooling3d.cpp).
//
// Note [3-d over 2-d]
// The 3-d pooling ops, and the convolutions where no native 3-d kernel runs (float64 on the CPU,
// builds without oneDNN, set_native_conv3d off), are composed of their 2-d counterparts, which have CPU
// (oneDNN, im2col + GEMM) and CUDA (cuDNN) kernels for every floating dtype and their own
// backward passes; autograd differentiates the composition:
// - conv3d gathers the kD input slices that each output depth reads (one index_select along
//   depth; a zero slice stands for the padding) into the channels of one 2-d image,
//   (N * D_out, groups * kD * C_in/groups, H, W), and convolves it in one conv2d call with the
//   weight laid out to match, (C_out, kD * C_in/groups, kH, kW). The price: a copy of the input
//   kD / stride_d times over.
// - conv_transpose3d runs one conv_transpose2d over the (N * D, C_in, H, W) slices with the kD
//   depth taps as extra output channels, then adds each tap's result at its output depth (one
//   index_add).
// - max pooling is separable: max_pool2d over (H, W) of each depth slice, then the maximum over
//   the depth taps. The divisor of average pooling is a product of one factor per dim, so
//   avg_pool2d followed by a weighted sum along depth (one matmul with a (D_out, D) matrix) is
//   PyTorch's result, and so for adaptive average pooling.
#include <algorithm>

#include <strata/amp/autocast.hpp>
#include <strata/nn/functional_conv3d.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/join.hpp>

#include "nn/conv_internal.h"
#include "nn/volume_internal.h"
#include "nn/window_shape.h"

namespace strata::nn {

namespace detail {

std::vector<int64_t> tap_depths(int64_t depth, int64_t out, int64_t k, int64_t stride, int64_t pad, int64_t dil) {
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(out * k));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t t = 0; t < k; ++t) {
      const int64_t d = o * stride - pad + t * dil;
      rows.push_back(d < 0 || d >= depth ? -1 : d);
    }
  return rows;
}

Tensor gather_depths(const Tensor& x, std::vector<int64_t> rows, double fill) {
  const int64_t depth = x.size(2);
  const bool outside = std::any_of(rows.begin(), rows.end(), [](int64_t d) { return d < 0; });
  Tensor source = x;
  if (outside) {
    Shape slice = x.shape();
    slice[2] = 1;
    source = cat({x, full(slice, fill, x.options())}, 2);
    for (int64_t& d : rows) d = d < 0 ? depth : d;  // the fill slice appended
  }
  return source.index_select(2, from_vector(rows).to(x.device()));
}

}  // namespace detail

namespace functional {

namespace {

void check_args(const char* op, Size3 stride, Size3 padding, Size3 dilation, int64_t groups) {
  STRATA_CHECK(detail::in_arg_range(stride, 1), "[{}] stride must be in [1, 2^31), got {}", op, stride);
  STRATA_CHECK(detail::in_arg_range(padding, 0), "[{}] padding must be in [0, 2^31), got {}", op, padding);
  STRATA_CHECK(detail::in_arg_range(dilation, 1), "[{}] dilation must be in [1, 2^31), got {}", op, dilation);
  STRATA_CHECK(groups > 0, "[{}] groups must be positive, got {}", op, groups);
}

void check_bias(const char* op, const Tensor& b, int64_t out_channels) {
  STRATA_CHECK(!b.defined() || (b.dim() == 1 && b.size(0) == out_channels), "[{}] bias must have shape ({}), got {}",
               op, out_channels, b.shape());
}

}  // namespace

Tensor conv3d(const Tensor& input, const Tensor& weight, const Tensor& bias, const Conv3dArgs& args) {
  amp::detail::AutocastScope amp_scope("conv3d", input, weight, bias);
  if (amp_scope.cast()) return conv3d(amp_scope[0], amp_scope[1], amp_scope[2], args);
  detail::check_conv_operands("conv3d", input, weight, bias, 3);
  STRATA_CHECK(input.numel() > 0, "[conv3d] expects a non-empty input, got shape {}", input.shape());
  check_args("conv3d", args.stride, args.padding, args.dilation, args.groups);
  if (input.dim() == 4) return conv3d(input.unsqueeze(0), weight, bias, args).squeeze(0);
  const int64_t n = input.size(0), c = input.size(1), o = weight.size(0), g = args.groups;
  STRATA_CHECK(o % g == 0, "[conv3d] out channels ({}, weight of shape {}) must be divisible by groups={}", o,
               weight.shape(), g);
  STRATA_CHECK(weight.size(1) * g == c,
               "[conv3d] input of shape {} has {} channels, but weight of shape {} with groups={} expects {}",
               input.shape(), c, weight.shape(), g, weight.size(1) * g);
  check_bias("conv3d", bias, o);
  const Size3 s = args.stride, p = args.padding, dl = args.dilation;
  const int64_t kd = weight.size(2), kh = weight.size(3), kw = weight.size(4);
  const int64_t depth = input.size(2), h = input.size(3), w = input.size(4);
  const int64_t od = detail::conv_out(depth, kd, s.d, p.d, dl.d), oh = detail::conv_out(h, kh, s.h, p.h, dl.h),
                ow = detail::conv_out(w, kw, s.w, p.w, dl.w);
  STRATA_CHECK(od > 0 && oh > 0 && ow > 0,
               "[conv3d] input of shape {} is too small for kernel ({}, {}, {}) with padding {} and dilation {}: the "
               "output would be empty",
               input.shape(), kd, kh, kw, p, dl);
  if (detail::native_conv3d_applies(input)) return detail::native_conv3d(input, weight, bias, args, {n, o, od, oh, ow});
  // each output depth's kD input slices as the channels of one image, grouped as the weight is
  const int64_t cg = c / g;
  const std::vector<int64_t> rows = detail::tap_depths(depth, od, kd, s.d, p.d, dl.d);
  const Tensor image = detail::gather_depths(input, rows, 0.0)  // (N, C, od * kd, H, W)
                           .view({n, g, cg, od, kd, h, w})
                           .permute({0, 3, 1, 4, 2, 5, 6})
                           .reshape({n * od, g * kd * cg, h, w});
  const Tensor flat_weight = weight.permute({0, 2, 1, 3, 4}).reshape({o, kd * cg, kh, kw});
  const Tensor y = conv2d(image, flat_weight, bias, {s.hw(), p.hw(), dl.hw(), g});  // (N * od, O, oh, ow)
  return y.reshape({n, od, o, oh, ow}).permute({0, 2, 1, 3, 4}).contiguous();
}

Tensor conv_transpose3d(const Tensor& input, const Tensor& weight, const Tensor& bias,
                        const ConvTranspose3dArgs& a) {
  amp::detail::AutocastScope amp_scope("conv_transpose3d", input, weight, bias);
  if (amp_scope.cast()) return conv_transpose3d(amp_scope[0], amp_scope[1], amp_scope[2], a);
  detail::check_conv_operands("conv_transpose3d", input, weight, bias, 3);
  STRATA_CHECK(input.numel() > 0, "[conv_transpose3d] expects a non-empty input, got shape {}", input.shape());
  check_args("conv_transpose3d", a.stride, a.padding, a.dilation, a.groups);
  if (input.dim() == 4) return conv_transpose3d(input.unsqueeze(0), weight, bias, a).squeeze(0);
  const int64_t n = input.size(0), c = input.size(1), g = a.groups, og = weight.size(1), o = og * g;
  STRATA_CHECK(c % g == 0, "[conv_transpose3d] input channels ({}) must be divisible by groups={}", c, g);
  STRATA_CHECK(weight.size(0) == c,
               "[conv_transpose3d] input of shape {} has {} channels, but weight of shape {} expects {}",
               input.shape(), c, weight.shape(), weight.size(0));
  check_bias("conv_transpose3d", bias, o);
  const Size3 s = a.stride, p = a.padding, dl = a.dilation, op = a.output_padding;
  STRATA_CHECK(op.d >= 0 && op.h >= 0 && op.w >= 0 && (op.d < s.d || op.d < dl.d) && (op.h < s.h || op.h < dl.h) &&
                   (op.w < s.w || op.w < dl.w),
               "[conv_transpose3d] output_padding {} must be non-negative and smaller than stride {} or dilation {}",
               op, s, dl);
  const int64_t kd = weight.size(2), kh = weight.size(3), kw = weight.size(4), depth = input.size(2);
  const int64_t od = detail::conv_transpose_out(depth, kd, s.d, p.d, dl.d, op.d),
                oh = detail::conv_transpose_out(input.size(3), kh, s.h, p.h, dl.h, op.h),
                ow = detail::conv_transpose_out(input.size(4), kw, s.w, p.w, dl.w, op.w);
  STRATA_CHECK(od > 0 && oh > 0 && ow > 0,
               "[conv_transpose3d] input of shape {} with weight {}, stride {}, padding {} gives an empty output "
               "({}, {}, {})",
               input.shape(), weight.shape(), s, p, od, oh, ow);
  if (detail::native_conv3d_applies(input))
    return detail::native_conv_transpose3d(input, weight, bias, a, {n, o, od, oh, ow});
  // every input slice through the kD taps at once: (N * D, groups * kD * og, oh, ow)
  const Tensor slices = input.permute({0, 2, 1, 3, 4}).reshape({n * depth, c, input.size(3), input.size(4)});
  const Tensor flat_weight = weight.permute({0, 2, 1, 3, 4}).reshape({c, kd * og, kh, kw});
  const Tensor y2 = conv_transpose2d(slices, flat_weight, Tensor(), {s.hw(), p.hw(), op.hw(), g, dl.hw()});
  const Tensor by_tap = y2.reshape({n, depth, g, kd, og, oh, ow})
                            .permute({0, 3, 1, 2, 4, 5, 6})
                            .reshape({n, kd * depth, o, oh, ow});  // (tap, input depth) order
  // tap t of input depth i lands on depth i * stride + t * dilation before the padding is cut
  std::vector<int64_t> rows;
  for (int64_t t = 0; t < kd; ++t)
    for (int64_t i = 0; i < depth; ++i) rows.push_back(i * s.d + t * dl.d);
  const int64_t full_depth = od + 2 * p.d;  // before the padding is cut
  // by_tap's dtype, not the input's: under autocast conv_transpose2d computes in lower precision
  Tensor y = index_add(zeros({n, full_depth, o, oh, ow}, by_tap.options()), 1, from_vector(rows).to(input.device()),
                       by_tap)
                 .narrow(1, p.d, od)
                 .permute({0, 2, 1, 3, 4})
                 .contiguous();
  return bias.defined() ? y + bias.to(y.dtype()).view({1, o, 1, 1, 1}) : y;
}

}  // namespace functional

}  // namespace strata::nn
