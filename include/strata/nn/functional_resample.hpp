// nn::functional padding and resampling with torch.nn.functional's semantics: pad (constant,
// reflect, replicate, circular) and interpolate (nearest, nearest-exact, linear, bilinear,
// bicubic, trilinear). Both are composed of index_select, multiplies and adds, so they run on
// every device those do, and their gradients (to any order) come from those ops. A
// channels-last input gives a channels-last result.
//
//   namespace F = strata::nn::functional;
//   auto p = F::pad(x, {1, 1, 2, 2}, F::PadMode::Reflect);  // W by 1 each side, H by 2
//   auto u = F::interpolate(x, {.scale_factor = {2}, .mode = F::InterpolateMode::Bilinear});
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include <strata/core/tensor.hpp>

namespace strata::nn::functional {

enum class PadMode : uint8_t {
  Constant,   // the value
  Reflect,    // mirrored about the edge element, which is not repeated (pads below the size)
  Replicate,  // the edge element repeated
  Circular,   // wrapped around (pads at most the size)
};

/// Pads the last len(padding) / 2 dims: padding = {left of the last dim, right of the last
/// dim, left of the one before, ...}, as torch.nn.functional.pad. Negative entries crop.
/// Constant mode takes any dtype and a value the dtype can hold; the other modes take
/// floating tensors and any number of padded dims (PyTorch: 1 to 3), and need a non-empty
/// padded dim and a non-empty result.
STRATA_API Tensor pad(const Tensor& input, const std::vector<int64_t>& padding, PadMode mode = PadMode::Constant,
                      double value = 0);

enum class InterpolateMode : uint8_t {
  Nearest,       // source index floor(i * scale), as PyTorch's "nearest"
  NearestExact,  // floor((i + 0.5) * scale), PyTorch's "nearest-exact" (as PIL and scikit-image)
  Linear,        // (N, C, W) inputs
  Bilinear,      // (N, C, H, W)
  Bicubic,       // (N, C, H, W), cubic convolution with A = -0.75; may overshoot the inputs
  Trilinear,     // (N, C, D, H, W)
};

struct InterpolateArgs {
  /// The output's spatial size, one entry per spatial dim or one for all; or else
  std::vector<int64_t> size;
  /// the factor per spatial dim (or one for all): output size floor(input size * factor).
  std::vector<double> scale_factor;
  InterpolateMode mode = InterpolateMode::Nearest;
  /// Linear modes: true maps the corner pixels' centres onto each other, false (the default)
  /// their outer edges. Refused for the nearest modes, as in PyTorch.
  std::optional<bool> align_corners;
  /// With scale_factor: place samples by input size / output size rather than 1 / factor.
  bool recompute_scale_factor = false;
};

/// Resamples the spatial dims (all after the first two) of a floating (N, C, ...) input with
/// 1 to 3 spatial dims (the linear modes need exactly theirs), as
/// torch.nn.functional.interpolate; float16/bfloat16 compute in float32 and round once.
STRATA_API Tensor interpolate(const Tensor& input, const InterpolateArgs& args);

/// (*, C * r^2, H, W) -> (*, C, H * r, W * r), as torch.nn.functional.pixel_shuffle, and its
/// inverse (*, C, H * r, W * r) -> (*, C * r^2, H, W).
STRATA_API Tensor pixel_shuffle(const Tensor& input, int64_t upscale_factor);
STRATA_API Tensor pixel_unshuffle(const Tensor& input, int64_t downscale_factor);

}  // namespace strata::nn::functional
