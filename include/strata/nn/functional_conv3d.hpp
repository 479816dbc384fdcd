// nn::functional for volumes: 3-d convolution (and its transpose) and 3-d max, average and
// adaptive average and max pooling, with torch.nn.functional's semantics. Inputs are (N, C, D, H, W), or
// unbatched (C, D, H, W).
//
//   namespace F = strata::nn::functional;
//   auto y = F::conv3d(x, w, b, {.stride = {1, 2, 2}, .padding = 1});
//   auto p = F::max_pool3d(y, 2);
//
// The pools are native ops (src/nn/pooling3d.cpp); the convolutions run native kernels or are
// composed of the 2-d ops (Note [3-d over 2-d] in src/nn/conv3d.cpp).
#pragma once

#include <cstdint>
#include <optional>

#include <strata/nn/functional_conv.hpp>

namespace strata::nn {

/// A (depth, height, width) triple that a single value converts to: `.stride = 2` or
/// `.stride = {1, 2, 2}`.
struct Size3 {
  int64_t d = 0, h = 0, w = 0;
  constexpr Size3() = default;
  constexpr Size3(int64_t v) : d(v), h(v), w(v) {}  // NOLINT: implicit by design
  constexpr Size3(int64_t d_, int64_t h_, int64_t w_) : d(d_), h(h_), w(w_) {}
  constexpr bool operator==(const Size3&) const = default;
  /// The (height, width) part.
  constexpr Size2 hw() const { return {h, w}; }
};

}  // namespace strata::nn

template <>
struct fmt::formatter<strata::nn::Size3> : fmt::formatter<int64_t> {
  template <class Ctx> auto format(const strata::nn::Size3& s, Ctx& ctx) const {
    return fmt::format_to(ctx.out(), "({}, {}, {})", s.d, s.h, s.w);
  }
};

namespace strata::nn::functional {

// ---- convolution -------------------------------------------------------------------------

struct Conv3dArgs {
  Size3 stride = 1;
  Size3 padding = 0;
  Size3 dilation = 1;
  int64_t groups = 1;
};

/// input (N, C_in, D, H, W) or (C_in, D, H, W), weight (C_out, C_in / groups, kD, kH, kW), bias
/// (C_out) or undefined. Floating dtypes; all three must share it.
STRATA_API Tensor conv3d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
                         const Conv3dArgs& args = {});

struct ConvTranspose3dArgs {
  Size3 stride = 1;
  Size3 padding = 0;
  Size3 output_padding = 0;  // below stride or dilation, per dim
  int64_t groups = 1;
  Size3 dilation = 1;
};

/// input (N, C_in, D, H, W) or unbatched, weight (C_in, C_out / groups, kD, kH, kW), bias (C_out)
/// or undefined: the gradient of conv3d with respect to its input, plus bias. Output depth
/// (D - 1) * stride - 2 * padding + dilation * (kD - 1) + output_padding + 1, and so for H and W.
STRATA_API Tensor conv_transpose3d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(),
                                   const ConvTranspose3dArgs& args = {});

/// Whether conv3d and conv_transpose3d run native 3-d kernels on tensors of `device` (oneDNN's
/// 3-d convolutions on the CPU for float32, bfloat16 and float16; cuDNN's Nd ones on CUDA) rather
/// than composed of the 2-d ones (docs/conv3d.md). On by default on the CPU; off on CUDA, whose
/// 3-d cuDNN path has not yet run on a GPU. Process-wide, like torch.backends.cudnn.enabled.
STRATA_API void set_native_conv3d(DeviceType device, bool enabled);
STRATA_API bool native_conv3d_enabled(DeviceType device);

// ---- pooling -----------------------------------------------------------------------------

struct MaxPool3dArgs {
  std::optional<Size3> stride;  // default: the kernel size
  Size3 padding = 0;            // at most half the (dilated) kernel
  Size3 dilation = 1;           // every window must keep a tap inside the input (refused else)
  bool ceil_mode = false;       // round the output size up (windows must start inside the input)
};

/// indices: the argmax's flat index (d * H + h) * W + w within its (n, c) volume.
STRATA_API Tensor max_pool3d(const Tensor& input, Size3 kernel_size, const MaxPool3dArgs& args = {});
STRATA_API MaxPoolResult max_pool3d_with_indices(const Tensor& input, Size3 kernel_size,
                                                 const MaxPool3dArgs& args = {});

struct AvgPool3dArgs {
  std::optional<Size3> stride;  // default: the kernel size
  Size3 padding = 0;            // at most half the kernel
  bool ceil_mode = false;
  bool count_include_pad = true;            // padded zeros count in the divisor
  std::optional<int64_t> divisor_override;  // nonzero; replaces the divisor
};

STRATA_API Tensor avg_pool3d(const Tensor& input, Size3 kernel_size, const AvgPool3dArgs& args = {});

/// Average over the windows [floor(i * In / Out), ceil((i + 1) * In / Out)) of each dim.
STRATA_API Tensor adaptive_avg_pool3d(const Tensor& input, Size3 output_size);
/// Maximum over the same windows; indices as max_pool3d_with_indices's (the first of equal
/// maxima, which alone receives the gradient, as in PyTorch).
STRATA_API Tensor adaptive_max_pool3d(const Tensor& input, Size3 output_size);
STRATA_API MaxPoolResult adaptive_max_pool3d_with_indices(const Tensor& input, Size3 output_size);

}  // namespace strata::nn::functional

namespace strata::nn {

/// Kernel parameters of the 3-d pooling ops (max_pool3d, avg_pool3d, the adaptive ones and their
/// backward), for kernels registered at run time. adaptive: adaptive windows (the window fields
/// unused); max_pool3d_backward serves both max pools and receives the forward's parameters.
struct Pool3dParams {
  Size3 kernel = 1, stride = 1, padding = 0, dilation = 1;
  bool count_include_pad = true;
  int64_t divisor = 0;  // 0: no override
  bool adaptive = false;
};

}  // namespace strata::nn
