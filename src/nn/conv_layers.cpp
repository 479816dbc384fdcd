// Conv2d and ConvTranspose2d: configuration checks, PyTorch's parameter shapes and default
// initialization, and the input checks that name the layer; the work is in nn/conv.cpp.
#include <cmath>

#include <strata/nn/conv.hpp>
#include <strata/nn/init.hpp>
#include <strata/ops/creation.hpp>

namespace strata::nn {

namespace {

void check_config(const std::string& layer, int64_t in, int64_t out, Size2 k, Size2 stride, Size2 padding,
                  Size2 dilation, int64_t groups) {
  STRATA_CHECK(in > 0 && out > 0, "[{}] in_channels ({}) and out_channels ({}) must be positive", layer, in, out);
  STRATA_CHECK(groups > 0, "[{}] groups must be positive, got {}", layer, groups);
  STRATA_CHECK(in % groups == 0, "[{}] in_channels ({}) must be divisible by groups ({})", layer, in, groups);
  STRATA_CHECK(out % groups == 0, "[{}] out_channels ({}) must be divisible by groups ({})", layer, out, groups);
  STRATA_CHECK(k.h > 0 && k.w > 0, "[{}] kernel_size must be positive, got {}", layer, k);
  STRATA_CHECK(stride.h > 0 && stride.w > 0, "[{}] stride must be positive, got {}", layer, stride);
  STRATA_CHECK(padding.h >= 0 && padding.w >= 0, "[{}] padding must be non-negative, got {}", layer, padding);
  STRATA_CHECK(dilation.h > 0 && dilation.w > 0, "[{}] dilation must be positive, got {}", layer, dilation);
}

// kaiming_uniform(a = sqrt(5)) for the weight and U(+-1/sqrt(fan_in)) for the bias, as
// torch.nn's _ConvNd.reset_parameters.
void init_conv(Tensor& weight, Tensor& bias, Generator* gen) {
  init::kaiming_uniform_(weight, std::sqrt(5.0), "fan_in", "leaky_relu", gen);
  if (!bias.defined()) return;
  const int64_t fan_in = init::calculate_fan_in_and_fan_out(weight).fan_in;
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  init::uniform_(bias, -bound, bound, gen);
}

std::string describe(const char* layer, int64_t in, int64_t out, Size2 k, Size2 stride) {
  return fmt::format("{}({}, {}, kernel_size={}, stride={})", layer, in, out, k, stride);
}

void check_input(const std::string& layer, const Tensor& x, int64_t channels) {
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", layer);
  STRATA_CHECK(x.dim() == 3 || x.dim() == 4,
               "[{}] expects an input of shape (N, {}, H, W) or ({}, H, W), got a {}-d input of shape {}", layer,
               channels, channels, x.dim(), x.shape());
  const int64_t c = x.size(x.dim() - 3);
  STRATA_CHECK(c == channels, "[{}] expects {} input channels, got input of shape {} ({} channels)", layer, channels,
               x.shape(), c);
}

}  // namespace

Conv2d::Conv2d(int64_t in, int64_t out, Size2 k, Conv2dOptions o)
    : in_channels(in), out_channels(out), kernel_size(k), options(o) {
  check_config(describe("Conv2d", in, out, k, o.stride), in, out, k, o.stride, o.padding, o.dilation, o.groups);
  weight = register_parameter("weight", empty({out, in / o.groups, k.h, k.w}));
  if (o.bias) bias = register_parameter("bias", empty({out}));
  reset_parameters(o.generator);
}

void Conv2d::reset_parameters(Generator* gen) { init_conv(weight, bias, gen); }

Tensor Conv2d::forward(const Tensor& input) {
  check_input(describe("Conv2d", in_channels, out_channels, kernel_size, options.stride), input, in_channels);
  return functional::conv2d(input, weight, bias, {options.stride, options.padding, options.dilation, options.groups});
}

ConvTranspose2d::ConvTranspose2d(int64_t in, int64_t out, Size2 k, ConvTranspose2dOptions o)
    : in_channels(in), out_channels(out), kernel_size(k), options(o) {
  const std::string layer = describe("ConvTranspose2d", in, out, k, o.stride);
  check_config(layer, in, out, k, o.stride, o.padding, o.dilation, o.groups);
  const Size2 op = o.output_padding;
  STRATA_CHECK(op.h >= 0 && op.w >= 0 && (op.h < o.stride.h || op.h < o.dilation.h) &&
                   (op.w < o.stride.w || op.w < o.dilation.w),
               "[{}] output_padding {} must be non-negative and smaller than stride or dilation", layer, op);
  weight = register_parameter("weight", empty({in, out / o.groups, k.h, k.w}));
  if (o.bias) bias = register_parameter("bias", empty({out}));
  reset_parameters(o.generator);
}

void ConvTranspose2d::reset_parameters(Generator* gen) { init_conv(weight, bias, gen); }

Tensor ConvTranspose2d::forward(const Tensor& input) {
  check_input(describe("ConvTranspose2d", in_channels, out_channels, kernel_size, options.stride), input,
              in_channels);
  return functional::conv_transpose2d(
      input, weight, bias, {options.stride, options.padding, options.output_padding, options.groups, options.dilation});
}

}  // namespace strata::nn
