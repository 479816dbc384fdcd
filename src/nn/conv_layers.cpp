// Conv1d/2d/3d and ConvTranspose1d/2d/3d: configuration checks, PyTorch's parameter shapes and default
// initialization, and the input checks that name the layer; the work is in nn/conv.cpp.
#include <cmath>
#include <type_traits>

#include <strata/nn/conv.hpp>
#include <strata/nn/init.hpp>
#include <strata/ops/creation.hpp>

namespace strata::nn {

namespace {

// Whether pred holds for every component of a Size2 or Size3.
template <class Pred>
bool each(Size2 s, Pred pred) {
  return pred(s.h) && pred(s.w);
}
template <class Pred>
bool each(Size3 s, Pred pred) {
  return pred(s.d) && pred(s.h) && pred(s.w);
}

template <class S>
void check_config(const std::string& layer, int64_t in, int64_t out, S k, S stride, S padding, S dilation,
                  int64_t groups) {
  auto positive = [](int64_t v) { return v > 0; };
  STRATA_CHECK(in > 0 && out > 0, "[{}] in_channels ({}) and out_channels ({}) must be positive", layer, in, out);
  STRATA_CHECK(groups > 0, "[{}] groups must be positive, got {}", layer, groups);
  STRATA_CHECK(in % groups == 0, "[{}] in_channels ({}) must be divisible by groups ({})", layer, in, groups);
  STRATA_CHECK(out % groups == 0, "[{}] out_channels ({}) must be divisible by groups ({})", layer, out, groups);
  STRATA_CHECK(each(k, positive), "[{}] kernel_size must be positive, got {}", layer, k);
  STRATA_CHECK(each(stride, positive), "[{}] stride must be positive, got {}", layer, stride);
  STRATA_CHECK(each(padding, [](int64_t v) { return v >= 0; }), "[{}] padding must be non-negative, got {}", layer,
               padding);
  STRATA_CHECK(each(dilation, positive), "[{}] dilation must be positive, got {}", layer, dilation);
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

template <class S>
std::string describe(const char* layer, int64_t in, int64_t out, S k, S stride) {
  return fmt::format("{}({}, {}, kernel_size={}, stride={})", layer, in, out, k, stride);
}

// An input of `spatial` dims after the channels, batched or not, with the layer's channels.
void check_input(const std::string& layer, const Tensor& x, int64_t channels, int64_t spatial) {
  const char* dims = spatial == 1 ? "L" : spatial == 2 ? "H, W" : "D, H, W";
  STRATA_CHECK(x.defined(), "[{}] input tensor is undefined", layer);
  STRATA_CHECK(x.dim() == spatial + 1 || x.dim() == spatial + 2,
               "[{}] expects an input of shape (N, {}, {}) or ({}, {}), got a {}-d input of shape {}", layer, channels,
               dims, channels, dims, x.dim(), x.shape());
  const int64_t c = x.size(x.dim() - 1 - spatial);
  STRATA_CHECK(c == channels, "[{}] expects {} input channels, got input of shape {} ({} channels)", layer, channels,
               x.shape(), c);
}

functional::PadMode pad_mode(PaddingMode m) {
  switch (m) {
    case PaddingMode::Reflect: return functional::PadMode::Reflect;
    case PaddingMode::Replicate: return functional::PadMode::Replicate;
    default: return functional::PadMode::Circular;
  }
}

void check_transposed_padding_mode(const std::string& layer, PaddingMode m) {
  STRATA_CHECK(m == PaddingMode::Zeros, "[{}] transposed convolutions pad with zeros only (PaddingMode::Zeros)",
               layer);
}

template <class S>
void check_output_padding(const std::string& layer, S op, S stride, S dilation) {
  STRATA_CHECK(op.h >= 0 && op.w >= 0 && (op.h < stride.h || op.h < dilation.h) &&
                   (op.w < stride.w || op.w < dilation.w),
               "[{}] output_padding {} must be non-negative and smaller than stride or dilation", layer, op);
  if constexpr (std::is_same_v<S, Size3>)
    STRATA_CHECK(op.d >= 0 && (op.d < stride.d || op.d < dilation.d),
                 "[{}] output_padding {} must be non-negative and smaller than stride or dilation", layer, op);
}

}  // namespace

Conv2d::Conv2d(int64_t in, int64_t out, Size2 k, Conv2dOptions o)
    : in_channels(in), out_channels(out), kernel_size(k), options(o) {
  check_config(describe("Conv2d", in, out, k, o.stride), in, out, k, o.stride, o.padding, o.dilation, o.groups);
  weight = register_parameter("weight", empty({out, in / o.groups, k.h, k.w}));
  if (o.bias) bias = register_parameter("bias", empty({out}));
  reset_parameters(o.generator);
}

void Conv2d::reset_parameters(Generator* gen) {
  STRATA_CHECK(weight.defined(), "[Conv2d] reset_parameters: the float weight was replaced by the form \"{}\"",
               form_.name());
  init_conv(weight, bias, gen);
}

Conv2dForm& Conv2d::set_form(std::string name, std::unique_ptr<Conv2dForm> form) {
  return form_.set(*this, std::move(name), std::move(form));
}

std::unique_ptr<Conv2dForm> Conv2d::take_form() { return form_.take(*this); }

Tensor Conv2d::forward(const Tensor& input) {
  check_input(describe("Conv2d", in_channels, out_channels, kernel_size, options.stride), input, in_channels, 2);
  if (form_.get()) return form_.get()->forward_layer(*this, input);
  const Size2 p = options.padding;
  if (options.padding_mode == PaddingMode::Zeros)
    return functional::conv2d(input, weight, bias, {options.stride, p, options.dilation, options.groups});
  const Tensor padded = functional::pad(input, {p.w, p.w, p.h, p.h}, pad_mode(options.padding_mode));
  return functional::conv2d(padded, weight, bias, {options.stride, 0, options.dilation, options.groups});
}

ConvTranspose2d::ConvTranspose2d(int64_t in, int64_t out, Size2 k, ConvTranspose2dOptions o)
    : in_channels(in), out_channels(out), kernel_size(k), options(o) {
  const std::string layer = describe("ConvTranspose2d", in, out, k, o.stride);
  check_config(layer, in, out, k, o.stride, o.padding, o.dilation, o.groups);
  check_output_padding(layer, o.output_padding, o.stride, o.dilation);
  check_transposed_padding_mode(layer, o.padding_mode);
  weight = register_parameter("weight", empty({in, out / o.groups, k.h, k.w}));
  if (o.bias) bias = register_parameter("bias", empty({out}));
  reset_parameters(o.generator);
}

void ConvTranspose2d::reset_parameters(Generator* gen) {
  STRATA_CHECK(weight.defined(), "[ConvTranspose2d] reset_parameters: the float weight was replaced by the form "
               "\"{}\"", form_.name());
  init_conv(weight, bias, gen);
}

ConvTranspose2dForm& ConvTranspose2d::set_form(std::string name, std::unique_ptr<ConvTranspose2dForm> form) {
  return form_.set(*this, std::move(name), std::move(form));
}

std::unique_ptr<ConvTranspose2dForm> ConvTranspose2d::take_form() { return form_.take(*this); }

Tensor ConvTranspose2d::forward(const Tensor& input) {
  check_input(describe("ConvTranspose2d", in_channels, out_channels, kernel_size, options.stride), input,
              in_channels, 2);
  if (form_.get()) return form_.get()->forward_layer(*this, input);
  return functional::conv_transpose2d(
      input, weight, bias, {options.stride, options.padding, options.output_padding, options.groups, options.dilation});
}

Conv1d::Conv1d(int64_t in, int64_t out, int64_t k, Conv1dOptions o)
    : in_channels(in), out_channels(out), kernel_size(k), options(o) {
  check_config(describe("Conv1d", in, out, k, o.stride), in, out, Size2{1, k}, Size2{1, o.stride},
               Size2{0, o.padding}, Size2{1, o.dilation}, o.groups);
  weight = register_parameter("weight", empty({out, in / o.groups, k}));
  if (o.bias) bias = register_parameter("bias", empty({out}));
  reset_parameters(o.generator);
}

void Conv1d::reset_parameters(Generator* gen) {
  STRATA_CHECK(weight.defined(), "[Conv1d] reset_parameters: the float weight was replaced by the form \"{}\"",
               form_.name());
  init_conv(weight, bias, gen);
}

Conv1dForm& Conv1d::set_form(std::string name, std::unique_ptr<Conv1dForm> form) {
  return form_.set(*this, std::move(name), std::move(form));
}

std::unique_ptr<Conv1dForm> Conv1d::take_form() { return form_.take(*this); }

Tensor Conv1d::forward(const Tensor& input) {
  check_input(describe("Conv1d", in_channels, out_channels, kernel_size, options.stride), input, in_channels,
              1);
  if (form_.get()) return form_.get()->forward_layer(*this, input);
  const int64_t p = options.padding;
  if (options.padding_mode == PaddingMode::Zeros)
    return functional::conv1d(input, weight, bias, {options.stride, p, options.dilation, options.groups});
  const Tensor padded = functional::pad(input, {p, p}, pad_mode(options.padding_mode));
  return functional::conv1d(padded, weight, bias, {options.stride, 0, options.dilation, options.groups});
}

ConvTranspose1d::ConvTranspose1d(int64_t in, int64_t out, int64_t k, ConvTranspose1dOptions o)
    : in_channels(in), out_channels(out), kernel_size(k), options(o) {
  const std::string layer = describe("ConvTranspose1d", in, out, k, o.stride);
  check_config(layer, in, out, Size2{1, k}, Size2{1, o.stride}, Size2{0, o.padding}, Size2{1, o.dilation}, o.groups);
  check_output_padding(layer, Size2{0, o.output_padding}, Size2{1, o.stride}, Size2{1, o.dilation});
  check_transposed_padding_mode(layer, o.padding_mode);
  weight = register_parameter("weight", empty({in, out / o.groups, k}));
  if (o.bias) bias = register_parameter("bias", empty({out}));
  reset_parameters(o.generator);
}

void ConvTranspose1d::reset_parameters(Generator* gen) { init_conv(weight, bias, gen); }

Tensor ConvTranspose1d::forward(const Tensor& input) {
  check_input(describe("ConvTranspose1d", in_channels, out_channels, kernel_size, options.stride), input,
              in_channels, 1);
  return functional::conv_transpose1d(
      input, weight, bias, {options.stride, options.padding, options.output_padding, options.groups, options.dilation});
}

Conv3d::Conv3d(int64_t in, int64_t out, Size3 k, Conv3dOptions o)
    : in_channels(in), out_channels(out), kernel_size(k), options(o) {
  check_config(describe("Conv3d", in, out, k, o.stride), in, out, k, o.stride, o.padding, o.dilation, o.groups);
  weight = register_parameter("weight", empty({out, in / o.groups, k.d, k.h, k.w}));
  if (o.bias) bias = register_parameter("bias", empty({out}));
  reset_parameters(o.generator);
}

void Conv3d::reset_parameters(Generator* gen) { init_conv(weight, bias, gen); }

Tensor Conv3d::forward(const Tensor& input) {
  check_input(describe("Conv3d", in_channels, out_channels, kernel_size, options.stride), input, in_channels, 3);
  const Size3 p = options.padding;
  if (options.padding_mode == PaddingMode::Zeros)
    return functional::conv3d(input, weight, bias, {options.stride, p, options.dilation, options.groups});
  const Tensor padded = functional::pad(input, {p.w, p.w, p.h, p.h, p.d, p.d}, pad_mode(options.padding_mode));
  return functional::conv3d(padded, weight, bias, {options.stride, 0, options.dilation, options.groups});
}

ConvTranspose3d::ConvTranspose3d(int64_t in, int64_t out, Size3 k, ConvTranspose3dOptions o)
    : in_channels(in), out_channels(out), kernel_size(k), options(o) {
  const std::string layer = describe("ConvTranspose3d", in, out, k, o.stride);
  check_config(layer, in, out, k, o.stride, o.padding, o.dilation, o.groups);
  check_output_padding(layer, o.output_padding, o.stride, o.dilation);
  check_transposed_padding_mode(layer, o.padding_mode);
  weight = register_parameter("weight", empty({in, out / o.groups, k.d, k.h, k.w}));
  if (o.bias) bias = register_parameter("bias", empty({out}));
  reset_parameters(o.generator);
}

void ConvTranspose3d::reset_parameters(Generator* gen) { init_conv(weight, bias, gen); }

Tensor ConvTranspose3d::forward(const Tensor& input) {
  check_input(describe("ConvTranspose3d", in_channels, out_channels, kernel_size, options.stride), input,
              in_channels, 3);
  return functional::conv_transpose3d(
      input, weight, bias, {options.stride, options.padding, options.output_padding, options.groups, options.dilation});
}

}  // namespace strata::nn
