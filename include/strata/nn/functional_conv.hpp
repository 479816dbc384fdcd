// nn::functional for images and sequences: 2-d and 1-d convolution (and their transposes),
// pooling and batch normalization, with torch.nn.functional's semantics. Image inputs are
// (N, C, H, W), or unbatched (C, H, W) where PyTorch accepts that; a channels-last input (NHWC strides, see
// Tensor::to(MemoryFormat::ChannelsLast)) gives a channels-last result, computed without
// transposing copies.
//
//   namespace F = strata::nn::functional;
//   auto y = F::conv2d(x, w, b, {.stride = 2, .padding = 1});
//   auto p = F::max_pool2d(y, 3, {.stride = 2, .padding = 1});
//
// The argument structs double as the parameters of the kernels of the op table
// (conv2d, max_pool2d, ..., batch_norm).
#pragma once

#include <cstdint>
#include <optional>

#include <strata/core/tensor.hpp>

namespace strata::nn {

/// A (height, width) pair that a single value converts to: `.stride = 2` or `.stride = {2, 1}`.
struct Size2 {
  int64_t h = 0, w = 0;
  constexpr Size2() = default;
  constexpr Size2(int64_t v) : h(v), w(v) {}  // NOLINT: implicit by design
  constexpr Size2(int64_t h_, int64_t w_) : h(h_), w(w_) {}
  constexpr bool operator==(const Size2&) const = default;
};

}  // namespace strata::nn

template <>
struct fmt::formatter<strata::nn::Size2> : fmt::formatter<int64_t> {
  template <class Ctx> auto format(const strata::nn::Size2& s, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "({}, {})", s.h, s.w);
  }
};

namespace strata::nn::functional {

// ---- convolution -------------------------------------------------------------------------

struct Conv2dArgs {
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 dilation = 1;
  int64_t groups = 1;
};

/// input (N, C_in, H, W), weight (C_out, C_in / groups, kH, kW), bias (C_out) or undefined.
/// Floating dtypes; all three must share it (f16/bf16 compute in f32).
STRATA_API Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
                         const Conv2dArgs& args = {});

struct ConvTranspose2dArgs {
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 output_padding = 0;  // extra rows/columns on the bottom/right; below stride or dilation
  int64_t groups = 1;
  Size2 dilation = 1;
};

/// input (N, C_in, H, W), weight (C_in, C_out / groups, kH, kW), bias (C_out) or undefined:
/// the gradient of conv2d with respect to its input, plus bias. Output height
/// (H - 1) * stride - 2 * padding + dilation * (kH - 1) + output_padding + 1, and so for width.
STRATA_API Tensor conv_transpose2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
                                   const ConvTranspose2dArgs& args = {});

/// The gradient of conv2d with respect to an input of shape input_shape (as torch.nn.grad.
/// conv2d_input). Not differentiable itself.
STRATA_API Tensor conv2d_input_grad(const Shape& input_shape, const Tensor& weight, const Tensor& grad_output,
                                    const Conv2dArgs& args = {});

struct Conv2dWeightGrads {
  Tensor weight;
  Tensor bias;  // undefined unless asked for
};

/// The gradients of conv2d with respect to a weight of shape weight_shape and, when
/// with_bias, the bias (as torch.nn.grad.conv2d_weight). Not differentiable themselves.
STRATA_API Conv2dWeightGrads conv2d_weight_grad(const Tensor& input, const Shape& weight_shape,
                                                const Tensor& grad_output, const Conv2dArgs& args = {},
                                                bool with_bias = false);

// ---- 1-d convolution: conv2d over a height-1 view of the input ------------------------

struct Conv1dArgs {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  int64_t groups = 1;
};

/// input (N, C_in, L) or (C_in, L), weight (C_out, C_in / groups, k), bias (C_out) or
/// undefined. An input whose channel stride is 1 (a transposed (N, L, C) sequence) is read
/// in place, as a channels-last image, and so is the result laid out.
STRATA_API Tensor conv1d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
                         const Conv1dArgs& args = {});

struct ConvTranspose1dArgs {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t output_padding = 0;
  int64_t groups = 1;
  int64_t dilation = 1;
};

/// input (N, C_in, L) or (C_in, L), weight (C_in, C_out / groups, k), bias (C_out) or
/// undefined: the gradient of conv1d with respect to its input, plus bias.
STRATA_API Tensor conv_transpose1d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
                                   const ConvTranspose1dArgs& args = {});

// ---- pooling -----------------------------------------------------------------------------

struct MaxPool2dArgs {
  std::optional<Size2> stride;  // default: the kernel size
  Size2 padding = 0;            // at most half the (dilated) kernel
  Size2 dilation = 1;           // every window must keep a tap inside the input (refused else)
  bool ceil_mode = false;       // round the output size up (windows must start inside the input)
};

struct MaxPoolResult {
  Tensor output;
  Tensor indices;  // int64: the argmax's flat index h * W + w within its (n, c) plane
};

STRATA_API Tensor max_pool2d(const Tensor& input, Size2 kernel_size, const MaxPool2dArgs& args = {});
STRATA_API MaxPoolResult max_pool2d_with_indices(const Tensor& input, Size2 kernel_size,
                                                 const MaxPool2dArgs& args = {});

struct AvgPool2dArgs {
  std::optional<Size2> stride;  // default: the kernel size
  Size2 padding = 0;            // at most half the kernel
  bool ceil_mode = false;
  bool count_include_pad = true;            // padded zeros count in the divisor
  std::optional<int64_t> divisor_override;  // nonzero; replaces the divisor
};

STRATA_API Tensor avg_pool2d(const Tensor& input, Size2 kernel_size, const AvgPool2dArgs& args = {});

/// Average over the windows [floor(i * In / Out), ceil((i + 1) * In / Out)) of each dim.
STRATA_API Tensor adaptive_avg_pool2d(const Tensor& input, Size2 output_size);

// ---- 1-d pooling: the 2-d ops over a height-1 view of (N, C, L) or (C, L) -----------------

struct MaxPool1dArgs {
  std::optional<int64_t> stride;  // default: the kernel size
  int64_t padding = 0;
  int64_t dilation = 1;
  bool ceil_mode = false;
};

struct AvgPool1dArgs {
  std::optional<int64_t> stride;  // default: the kernel size
  int64_t padding = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;
};

STRATA_API Tensor max_pool1d(const Tensor& input, int64_t kernel_size, const MaxPool1dArgs& args = {});
/// indices: the argmax's position along L.
STRATA_API MaxPoolResult max_pool1d_with_indices(const Tensor& input, int64_t kernel_size,
                                                 const MaxPool1dArgs& args = {});
STRATA_API Tensor avg_pool1d(const Tensor& input, int64_t kernel_size, const AvgPool1dArgs& args = {});
STRATA_API Tensor adaptive_avg_pool1d(const Tensor& input, int64_t output_size);

/// Maximum over the windows [floor(i * In / Out), ceil((i + 1) * In / Out)) of each dim, of
/// (N, C, H, W) or (C, H, W) (2d) and (N, C, L) or (C, L) (1d): max_pool2d's kernel when the
/// sizes divide, else one amax per output row and column (max is separable). The gradient goes
/// to the maximum (shared evenly among equal maxima on the second path).
STRATA_API Tensor adaptive_max_pool2d(const Tensor& input, Size2 output_size);
STRATA_API Tensor adaptive_max_pool1d(const Tensor& input, int64_t output_size);

// ---- batch normalization -----------------------------------------------------------------

struct BatchNormArgs {
  bool training = false;  // normalize with the batch's statistics (and update the running ones)
  double momentum = 0.1;  // running = (1 - momentum) * running + momentum * batch
  double eps = 1e-5;
};

/// input (N, C, *) normalized per channel: (x - mean) / sqrt(var + eps) * weight + bias.
/// training: batch mean and biased variance, and running_mean / running_var (when defined)
/// are updated in place with the unbiased variance; otherwise the running statistics are
/// used (and must be defined). weight, bias: (C) or undefined.
STRATA_API Tensor batch_norm(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                             const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                             const BatchNormArgs& args = {});

struct InstanceNormArgs {
  bool use_input_stats = true;  // each instance's own statistics (else the running ones)
  double momentum = 0.1;
  double eps = 1e-5;
};

/// input (N, C, *) normalized per instance and channel over the remaining dims, as
/// torch.nn.functional.instance_norm: batch_norm over the (1, N * C, *) view. running_mean and
/// running_var (C), when defined, move by momentum towards the batch's mean instance statistics
/// (with use_input_stats), or normalize (without). weight, bias: (C) or undefined.
STRATA_API Tensor instance_norm(const Tensor& input, const Tensor& running_mean = Tensor(),
                                const Tensor& running_var = Tensor(), const Tensor& weight = Tensor(),
                                const Tensor& bias = Tensor(), const InstanceNormArgs& args = {});

/// relu(batch_norm(input, ...) + residual), residual optional (same shape as input), with
/// the normalization, the residual add and the ReLU in one pass over the data: ResNet's
/// "BN, ReLU" and "BN, add the shortcut, ReLU". The same values and gradients as the three
/// ops (the ReLU's gradient is 0 where the output is 0).
STRATA_API Tensor batch_norm_relu(const Tensor& input, const Tensor& running_mean, const Tensor& running_var,
                                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                                  const BatchNormArgs& args = {}, const Tensor& residual = Tensor());

}  // namespace strata::nn::functional

namespace strata::nn {

/// Kernel parameters of the pooling ops (max_pool2d, avg_pool2d and their backward).
struct Pool2dParams {
  Size2 kernel, stride, padding, dilation = 1;
  bool count_include_pad = true;
  int64_t divisor = 0;  // 0: no override
};

/// Kernel parameters of batch_norm and batch_norm_backward. relu (forward only): the output
/// is relu(normalized + residual), the residual being the forward's optional 6th input.
struct BatchNormParams {
  bool training = false;
  double eps = 1e-5;
  bool relu = false;
};

}  // namespace strata::nn
