// 3-d max, average and adaptive average pooling over the 2-d ops (Note [3-d over 2-d] in
// nn/conv3d.cpp): the (H, W) part by max_pool2d / avg_pool2d / adaptive_avg_pool2d on the
// (N, C * D, H, W) view, the depth part by a gather of the depth taps (max) or a weighted sum
// along depth (averages). The argument checks name the 3-d op and shapes; and the layers.
#include <algorithm>

#include <strata/autograd/grad_mode.hpp>
#include <strata/nn/functional_conv3d.hpp>
#include <strata/nn/pooling.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>
#include <strata/ops/matmul.hpp>
#include <strata/ops/reduce.hpp>

#include "nn/volume_internal.h"
#include "nn/window_shape.h"

namespace strata::nn {

Tensor detail::depth_weighted(const Tensor& x, const std::vector<double>& weights, int64_t out) {
  const int64_t n = x.size(0), c = x.size(1), depth = x.size(2), h = x.size(3), w = x.size(4);
  const Tensor m = from_vector(weights, Shape{out, depth}).to(x.device(), x.dtype());
  return matmul(m, x.reshape({n * c, depth, h * w})).view({n, c, out, h, w});
}

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

// (N, C * D, h, w) results of a 2-d op as (N, C, D, h, w).
Tensor as_volume(const Tensor& planes, const Tensor& x) {
  return planes.reshape({x.size(0), x.size(1), x.size(2), planes.size(2), planes.size(3)});
}

Tensor as_planes(const Tensor& x) { return x.reshape({x.size(0), x.size(1) * x.size(2), x.size(3), x.size(4)}); }

}  // namespace

MaxPoolResult max_pool3d_with_indices(const Tensor& input, Size3 kernel_size, const MaxPool3dArgs& args) {
  check_input("max_pool3d", input);
  if (input.dim() == 4) {
    MaxPoolResult r = max_pool3d_with_indices(input.unsqueeze(0), kernel_size, args);
    return {r.output.squeeze(0), r.indices.squeeze(0)};
  }
  const Size3 k = kernel_size, s = args.stride.value_or(k), p = args.padding, dl = args.dilation;
  const Size3 out = pool_size("max_pool3d", input, k, s, p, dl, args.ceil_mode, true);
  // the maximum of each depth slice's (H, W) windows, then over the window's depth taps
  const MaxPoolResult planes = max_pool2d_with_indices(as_planes(input), k.hw(), {s.hw(), p.hw(), dl.hw(),
                                                                                   args.ceil_mode});
  const Tensor slices = as_volume(planes.output, input);  // (N, C, D, oh, ow)
  const Shape taps_shape = {input.size(0), input.size(1), out.d, k.d, out.h, out.w};
  // A tap in the padding repeats its window's first tap inside the input: the maximum is the
  // same, and a window of equal values (all -inf) names that element, as PyTorch's kernel, which
  // starts each argmax there, so neither the index nor the gradient lands on the padding.
  std::vector<int64_t> rows = detail::tap_depths(input.size(2), out.d, k.d, s.d, p.d, dl.d);
  for (int64_t o = 0; o < out.d; ++o) {
    const auto window = rows.begin() + o * k.d;
    const int64_t first_inside = *std::find_if(window, window + k.d, [](int64_t d) { return d >= 0; });
    std::replace(window, window + k.d, int64_t(-1), first_inside);
  }
  const MinMaxResult best = max(detail::gather_depths(slices, rows, 0).view(taps_shape), 3);
  NoGradGuard no_grad;
  // the flat index (d * H + h) * W + w: the winning tap's depth, and its slice's own h * W + w
  const Tensor plane_index = detail::gather_depths(as_volume(planes.indices, input), rows, 0)
                                 .view(taps_shape)
                                 .gather(3, best.indices.unsqueeze(3))
                                 .squeeze(3);
  const TensorOptions int64_on(kInt64, input.device());
  const Tensor tap = arange(out.d, int64_on).view({1, 1, out.d, 1, 1}) * k.d + best.indices;  // o * kD + t
  const Tensor depth = from_vector(rows).to(input.device()).index_select(0, tap.flatten()).view(tap.shape());
  return {best.values, depth * (input.size(3) * input.size(4)) + plane_index};
}

Tensor max_pool3d(const Tensor& input, Size3 kernel_size, const MaxPool3dArgs& args) {
  return max_pool3d_with_indices(input, kernel_size, args).output;
}

Tensor avg_pool3d(const Tensor& input, Size3 kernel_size, const AvgPool3dArgs& args) {
  check_input("avg_pool3d", input);
  STRATA_CHECK(!args.divisor_override || *args.divisor_override != 0, "[avg_pool3d] divisor_override must be nonzero");
  if (input.dim() == 4) return avg_pool3d(input.unsqueeze(0), kernel_size, args).squeeze(0);
  const Size3 k = kernel_size, s = args.stride.value_or(k), p = args.padding;
  const Size3 out = pool_size("avg_pool3d", input, k, s, p, 1, args.ceil_mode, false);
  // the divisor is a product of one factor per dim: (H, W)'s from avg_pool2d (a plain sum with
  // divisor_override), depth's in the weights
  const std::optional<int64_t> plane_divisor = args.divisor_override ? std::optional<int64_t>(1) : std::nullopt;
  const Tensor planes = avg_pool2d(as_planes(input), k.hw(),
                                   {s.hw(), p.hw(), args.ceil_mode, args.count_include_pad, plane_divisor});
  const int64_t depth = input.size(2);
  std::vector<double> weights(static_cast<size_t>(out.d * depth), 0.0);
  for (int64_t o = 0; o < out.d; ++o) {
    const int64_t d0 = o * s.d - p.d, d1 = std::min(d0 + k.d, depth + p.d);
    const int64_t first = std::max<int64_t>(d0, 0), end = std::min(d1, depth);
    const double divisor = args.divisor_override ? double(*args.divisor_override)
                           : args.count_include_pad ? double(d1 - d0)
                                                    : double(end - first);
    for (int64_t d = first; d < end; ++d) weights[static_cast<size_t>(o * depth + d)] = 1 / divisor;
  }
  return detail::depth_weighted(as_volume(planes, input), weights, out.d);
}

Tensor adaptive_avg_pool3d(const Tensor& input, Size3 output_size) {
  check_input("adaptive_avg_pool3d", input);
  STRATA_CHECK(detail::in_arg_range(output_size, 1),
               "[adaptive_avg_pool3d] output_size must be in [1, 2^31), got {}", output_size);
  if (input.dim() == 4) return adaptive_avg_pool3d(input.unsqueeze(0), output_size).squeeze(0);
  const Tensor planes = adaptive_avg_pool2d(as_planes(input), output_size.hw());
  const int64_t depth = input.size(2), out = output_size.d;
  std::vector<double> weights(static_cast<size_t>(out * depth), 0.0);
  for (int64_t o = 0; o < out; ++o) {
    const int64_t first = o * depth / out, end = ((o + 1) * depth + out - 1) / out;
    for (int64_t d = first; d < end; ++d) weights[static_cast<size_t>(o * depth + d)] = 1.0 / double(end - first);
  }
  return detail::depth_weighted(as_volume(planes, input), weights, out);
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
