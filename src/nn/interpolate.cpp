// F::interpolate, one spatial dim at a time: every mode here is separable, so each dim is a sum
// over a few taps (1 nearest, 2 linear, 4 cubic) of index_select along that dim times a weight
// per output position. The source positions and weights follow PyTorch's upsample kernels
// (aten/src/ATen/native/UpSample.h): coordinates in float for float32/16-bit inputs and in
// double for float64, the nearest modes always in float.
#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <vector>

#include <strata/nn/functional_resample.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/index.hpp>

#include "nn/spatial_view.h"

namespace strata::nn::functional {

namespace {

const char* mode_name(InterpolateMode m) {
  switch (m) {
    case InterpolateMode::Nearest: return "nearest";
    case InterpolateMode::NearestExact: return "nearest-exact";
    case InterpolateMode::Linear: return "linear";
    case InterpolateMode::Bilinear: return "bilinear";
    case InterpolateMode::Bicubic: return "bicubic";
    case InterpolateMode::Trilinear: return "trilinear";
  }
  return "?";
}

bool is_nearest(InterpolateMode m) { return m == InterpolateMode::Nearest || m == InterpolateMode::NearestExact; }

// The input rank a linear mode needs (0: any of 3 to 5).
int64_t required_rank(InterpolateMode m) {
  switch (m) {
    case InterpolateMode::Linear: return 3;
    case InterpolateMode::Bilinear:
    case InterpolateMode::Bicubic: return 4;
    case InterpolateMode::Trilinear: return 5;
    default: return 0;
  }
}

// The taps of one dim: output position j reads index[k][j] with weight weight[k][j].
struct Taps {
  std::vector<std::vector<int64_t>> index;
  std::vector<std::vector<double>> weight;  // empty for the nearest modes
};

// Input positions per output position (PyTorch's compute_scales_value).
template <class T>
T step(int64_t in, int64_t out, std::optional<double> factor) {
  return factor ? static_cast<T>(1.0 / *factor) : static_cast<T>(in) / static_cast<T>(out);
}

Taps nearest_taps(bool exact, int64_t in, int64_t out, std::optional<double> factor) {
  Taps t{{std::vector<int64_t>(static_cast<size_t>(out))}, {}};
  const float scale = step<float>(in, out, factor);
  for (int64_t j = 0; j < out; ++j) {
    int64_t i = 0;
    if (exact) i = static_cast<int64_t>(std::floor(static_cast<float>((static_cast<double>(j) + 0.5) * scale)));
    else if (out == in) i = j;
    else if (out == 2 * in) i = j >> 1;
    else i = static_cast<int64_t>(std::floor(static_cast<float>(j) * scale));
    t.index[0][static_cast<size_t>(j)] = std::min(i, in - 1);
  }
  return t;
}

// A 4-tap cubic convolution kernel's weights for a source fraction x (Keys, A = -0.75).
template <class T>
std::array<T, 4> cubic_weights(T x) {
  const T a = T(-0.75);
  auto near = [a](T d) { return ((a + 2) * d - (a + 3)) * d * d + 1; };          // |d| <= 1
  auto far = [a](T d) { return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a; };      // 1 < |d| < 2
  return {far(x + 1), near(x), near(1 - x), far(2 - x)};
}

template <class T>
Taps smooth_taps(bool cubic, int64_t in, int64_t out, std::optional<double> factor, bool align_corners) {
  const size_t k_taps = cubic ? 4 : 2;
  Taps t{std::vector<std::vector<int64_t>>(k_taps, std::vector<int64_t>(static_cast<size_t>(out))),
         std::vector<std::vector<double>>(k_taps, std::vector<double>(static_cast<size_t>(out)))};
  T scale = 0;
  if (align_corners) scale = out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : T(0);
  else scale = step<T>(in, out, factor);
  for (int64_t j = 0; j < out; ++j) {
    const size_t o = static_cast<size_t>(j);
    T src = align_corners ? scale * static_cast<T>(j) : scale * (static_cast<T>(j) + T(0.5)) - T(0.5);
    if (cubic) {
      const T floor_src = std::floor(src);
      const auto w = cubic_weights<T>(src - floor_src);
      for (size_t k = 0; k < 4; ++k) {
        t.index[k][o] = std::clamp<int64_t>(static_cast<int64_t>(floor_src) - 1 + static_cast<int64_t>(k), 0, in - 1);
        t.weight[k][o] = static_cast<double>(w[k]);
      }
      continue;
    }
    if (!align_corners && src < 0) src = 0;  // the first half pixel repeats the edge
    const int64_t i0 = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
    const T lambda = std::clamp(src - static_cast<T>(i0), T(0), T(1));
    t.index[0][o] = i0;
    t.index[1][o] = i0 + (i0 < in - 1 ? 1 : 0);
    t.weight[0][o] = static_cast<double>(T(1) - lambda);
    t.weight[1][o] = static_cast<double>(lambda);
  }
  return t;
}

// x resampled along its dim d by the taps: sum over k of x[index_k] * weight_k.
Tensor apply_taps(const Tensor& x, int64_t d, const Taps& taps, DType compute) {
  Shape weight_shape(static_cast<size_t>(x.dim()), 1);
  weight_shape[static_cast<size_t>(d)] = -1;
  Tensor sum;
  for (size_t k = 0; k < taps.index.size(); ++k) {
    Tensor g = index_select(x, d, from_vector(taps.index[k]).to(x.device()));
    if (!taps.weight.empty()) g = g * from_vector(taps.weight[k]).to(x.device(), compute).view(weight_shape);
    sum = sum.defined() ? sum + g : g;
  }
  return sum;
}

// One entry for every spatial dim: a single one repeated, else v as given.
template <class T>
std::vector<T> per_dim(const std::vector<T>& v, int64_t spatial) {
  return v.size() == 1 ? std::vector<T>(static_cast<size_t>(spatial), v[0]) : v;
}

}  // namespace

Tensor interpolate(const Tensor& input, const InterpolateArgs& args) {
  const char* mode = mode_name(args.mode);
  STRATA_CHECK(input.defined(), "[interpolate] input tensor is undefined");
  const int64_t rank = input.dim(), spatial = rank - 2;
  STRATA_CHECK(rank >= 3 && rank <= 5, "[interpolate] expects an (N, C, ...) input with 1 to 3 spatial dims, got "
               "shape {}", input.shape());
  const int64_t need = required_rank(args.mode);
  STRATA_CHECK(need == 0 || need == rank, "[interpolate] {} mode needs a {}-d input, got shape {}", mode, need,
               input.shape());
  STRATA_CHECK(is_nearest(args.mode) || is_floating(input.dtype()), "[interpolate] {} mode takes floating tensors, "
               "got {}", mode, dtype_name(input.dtype()));
  STRATA_CHECK(!is_nearest(args.mode) || !args.align_corners.has_value(),
               "[interpolate] align_corners only applies to the linear and cubic modes, not {}", mode);
  STRATA_CHECK(args.size.empty() != args.scale_factor.empty(),
               "[interpolate] give exactly one of size and scale_factor (got {} and {} entries)", args.size.size(),
               args.scale_factor.size());
  const size_t given = std::max(args.size.size(), args.scale_factor.size());
  STRATA_CHECK(given == 1 || given == static_cast<size_t>(spatial),
               "[interpolate] size or scale_factor needs 1 or {} entries for an input of shape {}, got {}", spatial,
               input.shape(), given);
  for (int64_t k = 0; k < spatial; ++k)
    STRATA_CHECK(input.size(2 + k) > 0, "[interpolate] input of shape {} has an empty spatial dim", input.shape());

  const std::vector<int64_t> size = per_dim(args.size, spatial);
  const std::vector<double> factor = per_dim(args.scale_factor, spatial);
  std::vector<int64_t> out_size(static_cast<size_t>(spatial));
  for (size_t k = 0; k < out_size.size(); ++k) {
    const int64_t in = input.size(2 + static_cast<int64_t>(k));
    if (!size.empty()) {
      out_size[k] = size[k];
    } else {
      STRATA_CHECK(std::isfinite(factor[k]) && factor[k] > 0, "[interpolate] scale_factor must be positive and "
                   "finite, got {}", factor[k]);
      out_size[k] = static_cast<int64_t>(std::floor(static_cast<double>(in) * factor[k]));
    }
    STRATA_CHECK(out_size[k] > 0, "[interpolate] output size {} of spatial dim {} (input of shape {}) must be "
                 "positive", out_size[k], k, input.shape());
  }

  const bool align = args.align_corners.value_or(false);
  const bool double_coords = input.dtype() == kFloat64;
  const DType compute = double_coords ? kFloat64 : kFloat32;
  const detail::SpatialView v(input);
  Tensor out = v.tensor;
  for (int64_t k = 0; k < spatial; ++k) {
    const int64_t in = input.size(2 + k), n_out = out_size[static_cast<size_t>(k)];
    std::optional<double> f;
    if (!factor.empty() && !args.recompute_scale_factor) f = factor[static_cast<size_t>(k)];
    Taps taps;
    if (is_nearest(args.mode)) {
      taps = nearest_taps(args.mode == InterpolateMode::NearestExact, in, n_out, f);
    } else {
      const bool cubic = args.mode == InterpolateMode::Bicubic;
      taps = double_coords ? smooth_taps<double>(cubic, in, n_out, f, align)
                           : smooth_taps<float>(cubic, in, n_out, f, align);
    }
    out = apply_taps(out, v.physical(2 + k), taps, compute);
  }
  return v.restore(out.to(input.dtype()));
}

}  // namespace strata::nn::functional
