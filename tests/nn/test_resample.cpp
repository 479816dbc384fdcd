// functional::pad, functional::interpolate and their layers against torch.nn's published
// examples and float64 references written here (padding by index arithmetic per element;
// bilinear, bicubic and trilinear as direct sums over each output element's neighbours with
// the Keys kernel written by distance), in NCHW, channels-last and sliced layouts; finite
// differences to second order; and bad input.
#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

#include "nn/image_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::as_image;
using strata::testing::check_cases_to_second_order;
using strata::testing::expected_format;
using strata::testing::has_format;
using strata::testing::Image;
using strata::testing::throws_with;
using strata::testing::unravel;
using strata::testing::values;
namespace F = strata::nn::functional;
using F::InterpolateMode;
using F::PadMode;
using V = const std::vector<Tensor>&;

namespace {

int64_t ravel(const std::vector<int64_t>& idx, const Shape& shape) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
  return flat;
}

// pad by the definition: each output index of a padded dim maps back to an input index (or
// to the fill value) one element at a time.
std::vector<double> pad_reference(const Tensor& x, const std::vector<int64_t>& pad, PadMode mode, double value) {
  const std::vector<double> xv = values(x);
  Shape out_shape = x.shape();
  const size_t padded = pad.size() / 2;
  for (size_t k = 0; k < padded; ++k) out_shape[out_shape.size() - 1 - k] += pad[2 * k] + pad[2 * k + 1];
  int64_t numel = 1;
  for (int64_t s : out_shape) numel *= s;
  std::vector<double> out(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) {
    std::vector<int64_t> idx = unravel(i, out_shape);
    bool inside = true;
    for (size_t k = 0; k < padded; ++k) {
      const size_t d = out_shape.size() - 1 - k;
      const int64_t size = x.size(static_cast<int64_t>(d));
      int64_t j = idx[d] - pad[2 * k];
      if (mode == PadMode::Constant) {
        inside = inside && j >= 0 && j < size;
      } else if (mode == PadMode::Replicate) {
        j = j < 0 ? 0 : j >= size ? size - 1 : j;
      } else if (mode == PadMode::Circular) {
        while (j < 0) j += size;
        while (j >= size) j -= size;
      } else {  // mirror about the first and last element
        if (j < 0) j = -j;
        if (j > size - 1) j = (size - 1) - (j - (size - 1));
      }
      idx[d] = j;
    }
    out[static_cast<size_t>(i)] = inside ? xv[static_cast<size_t>(ravel(idx, x.shape()))] : value;
  }
  return out;
}

Tensor arange9() { return arange(0, 9, 1, kFloat32).reshape({1, 1, 3, 3}); }

}  // namespace

TEST(Pad, TorchDocumentationExamples) {
  // torch.nn.ReflectionPad2d(2), ReplicationPad2d(2) and ZeroPad2d((1, 1, 2, 0)) on arange(9)
  EXPECT_TRUE(all_close(nn::ReflectionPad2d(2)(arange9()),
                        {8, 7, 6, 7, 8, 7, 6, 5, 4, 3, 4, 5, 4, 3, 2, 1, 0, 1, 2, 1, 0, 5, 4, 3, 4, 5, 4, 3,
                         8, 7, 6, 7, 8, 7, 6, 5, 4, 3, 4, 5, 4, 3, 2, 1, 0, 1, 2, 1, 0},
                        0, 0));
  EXPECT_TRUE(all_close(nn::ReplicationPad2d(2)(arange9()),
                        {0, 0, 0, 1, 2, 2, 2, 0, 0, 0, 1, 2, 2, 2, 0, 0, 0, 1, 2, 2, 2, 3, 3, 3, 4, 5, 5, 5,
                         6, 6, 6, 7, 8, 8, 8, 6, 6, 6, 7, 8, 8, 8, 6, 6, 6, 7, 8, 8, 8},
                        0, 0));
  Tensor z = nn::ZeroPad2d({1, 1, 2, 0})(arange9());
  EXPECT_EQ(z.shape(), (Shape{1, 1, 5, 5}));
  EXPECT_TRUE(all_close(z, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 3, 4, 5, 0, 0, 6, 7, 8, 0}, 0, 0));
  // circular: 2 on the left and 1 on the right of (0, 1, 2) wrap around
  EXPECT_TRUE(all_close(nn::CircularPad1d({2, 1})(arange(0, 3, 1, kFloat32).reshape({1, 1, 3})), {1, 2, 0, 1, 2, 0},
                        0, 0));
}

TEST(Pad, MatchesReferenceInEveryModeAndLayout) {
  Generator g(11);
  const std::vector<std::vector<int64_t>> pads = {{1, 2}, {2, 0, 1, 3}, {0, 1, 1, 0, 1, 1}, {-1, 2, 1, -2}};
  for (PadMode mode : {PadMode::Constant, PadMode::Reflect, PadMode::Replicate, PadMode::Circular})
    for (const auto& pad : pads)
      for (Image l : {Image::NCHW, Image::NHWC, Image::Sliced})
        for (DType dt : {kFloat64, kFloat32}) {
          SCOPED_TRACE(fmt::format("mode {} pad {} {} {}", static_cast<int>(mode), fmt::join(pad, ","),
                                   strata::testing::image_name(l), dtype_name(dt)));
          const Tensor x = as_image(randn({2, 3, 4, 5}, dt, &g), l);
          const double value = mode == PadMode::Constant ? 1.5 : 0.0;
          const Tensor y = F::pad(x, pad, mode, value);
          EXPECT_TRUE(all_close(y, pad_reference(x, pad, mode, value), 0, 0));
          EXPECT_TRUE(has_format(y, expected_format(x, l)));
        }
  // an integer tensor, constant mode, and a 5-d input padded in its last three dims
  Tensor ints = arange(0, 12, 1, kInt64).reshape({1, 2, 6});
  EXPECT_EQ(F::pad(ints, {2, 1}, PadMode::Constant, -7).dtype(), kInt64);
  EXPECT_TRUE(all_close(F::pad(ints, {2, 1}, PadMode::Constant, -7), pad_reference(ints, {2, 1}, PadMode::Constant, -7),
                        0, 0));
  Tensor vol = randn({1, 2, 3, 4, 3}, kFloat64, &g);
  const std::vector<int64_t> pad3 = {1, 1, 2, 1, 0, 2};
  EXPECT_TRUE(all_close(F::pad(vol, pad3, PadMode::Reflect), pad_reference(vol, pad3, PadMode::Reflect, 0), 0, 0));
  EXPECT_TRUE(all_close(F::pad(vol, pad3, PadMode::Circular), pad_reference(vol, pad3, PadMode::Circular, 0), 0, 0));
}

TEST(Pad, GradientsToSecondOrder) {
  std::vector<strata::testing::GradCase> cases;
  for (PadMode mode : {PadMode::Constant, PadMode::Reflect, PadMode::Replicate, PadMode::Circular}) {
    cases.push_back({"2-d", [mode](V in) { return F::pad(in[0], {2, 1, 1, 2}, mode); }, {{2, 2, 3, 4}}});
    cases.push_back({"1-d, cropping", [mode](V in) { return F::pad(in[0], {-1, 2}, mode); }, {{2, 3, 4}}});
  }
  check_cases_to_second_order(cases, 12);
}

TEST(Pad, BadInputRaises) {
  const Tensor x = randn({1, 2, 3, 4});
  EXPECT_TRUE(throws_with([&] { F::pad(x, {1, 2, 3}); }, {"[pad]", "3 entries"}));
  EXPECT_TRUE(throws_with([&] { F::pad(x, {1, 1, 1, 1, 1, 1, 1, 1, 1, 1}); }, {"[pad]", "4 dims"}));
  EXPECT_TRUE(throws_with([&] { F::pad(x, {0, 0, 3, 0}, PadMode::Reflect); }, {"reflect", "at most 2", "size 3"}));
  EXPECT_TRUE(throws_with([&] { F::pad(x, {5, 0}, PadMode::Circular); }, {"circular", "at most 4"}));
  EXPECT_TRUE(throws_with([&] { F::pad(x, {1, 1}, PadMode::Reflect, 2.0); }, {"fill value", "reflect"}));
  EXPECT_TRUE(throws_with([&] { F::pad(x.to(kInt32), {1, 1}, PadMode::Replicate); }, {"floating", "int32"}));
  EXPECT_TRUE(throws_with([&] { F::pad(x, {-3, -2}); }, {"leaves a size of -1"}));
  EXPECT_TRUE(throws_with([&] { F::pad(x, {-5, 3}); }, {"crops more than its size 4"}));
  EXPECT_TRUE(throws_with([&] { F::pad(x, {-2, -2}, PadMode::Replicate); }, {"leaves a size of 0"}));
  EXPECT_TRUE(throws_with([&] { F::pad(randn({1, 0}), {1, 1}, PadMode::Replicate); }, {"non-empty"}));
  EXPECT_TRUE(throws_with([&] { nn::ReflectionPad2d(1)(randn({4, 4})); }, {"[ReflectionPad2d]", "3-d or 4-d"}));
  EXPECT_TRUE(throws_with([&] { F::pad(Tensor(), {1, 1}); }, {"undefined"}));
}

// ---- interpolate ---------------------------------------------------------------------------

namespace {

// The Keys cubic convolution kernel (A = -0.75) by distance.
double keys(double d) {
  const double a = -0.75, x = std::abs(d);
  if (x <= 1) return (a + 2) * x * x * x - (a + 3) * x * x + 1;
  if (x < 2) return a * x * x * x - 5 * a * x * x + 8 * a * x - 4 * a;
  return 0;
}

struct Axis {
  std::vector<std::vector<std::pair<int64_t, double>>> taps;  // per output index: (input, weight)
};

// One axis by the mode's definition (PyTorch's nearest modes compute their positions in float).
Axis axis_reference(InterpolateMode mode, int64_t in, int64_t out, bool align, std::optional<double> factor) {
  Axis a;
  a.taps.resize(static_cast<size_t>(out));
  const double ratio = factor ? 1.0 / *factor : static_cast<double>(in) / static_cast<double>(out);
  for (int64_t j = 0; j < out; ++j) {
    auto& t = a.taps[static_cast<size_t>(j)];
    if (mode == InterpolateMode::Nearest || mode == InterpolateMode::NearestExact) {
      const float r = static_cast<float>(ratio);
      const float pos = mode == InterpolateMode::Nearest ? static_cast<float>(j) * r
                                                          : static_cast<float>((static_cast<double>(j) + 0.5) * r);
      t.push_back({std::min(static_cast<int64_t>(std::floor(pos)), in - 1), 1.0});
      continue;
    }
    const double corner_step = out > 1 ? static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0;
    double src = align ? static_cast<double>(j) * corner_step : (static_cast<double>(j) + 0.5) * ratio - 0.5;
    if (mode == InterpolateMode::Bicubic) {
      const double base = std::floor(src);
      for (int64_t k = -1; k <= 2; ++k) {
        const int64_t i = static_cast<int64_t>(base) + k;
        t.push_back({std::clamp<int64_t>(i, 0, in - 1), keys(src - static_cast<double>(i))});
      }
      continue;
    }
    src = std::max(src, 0.0);  // the half pixel before the first centre repeats it
    const int64_t i0 = std::min(static_cast<int64_t>(src), in - 1);
    const int64_t i1 = std::min(i0 + 1, in - 1);
    const double frac = std::min(src - static_cast<double>(i0), 1.0);
    t.push_back({i0, 1 - frac});
    t.push_back({i1, frac});
  }
  return a;
}

// Every output element as the sum over the product of its axes' taps.
std::vector<double> interpolate_reference(const Tensor& x, const Shape& out_shape, const std::vector<Axis>& axes) {
  const std::vector<double> xv = values(x);
  int64_t numel = 1;
  for (int64_t s : out_shape) numel *= s;
  std::vector<double> out(static_cast<size_t>(numel), 0.0);
  for (int64_t e = 0; e < numel; ++e) {
    const std::vector<int64_t> idx = unravel(e, out_shape);
    std::function<void(size_t, std::vector<int64_t>&, double)> walk = [&](size_t k, std::vector<int64_t>& src,
                                                                          double w) {
      if (k == axes.size()) {
        out[static_cast<size_t>(e)] += w * xv[static_cast<size_t>(ravel(src, x.shape()))];
        return;
      }
      for (auto [i, wi] : axes[k].taps[static_cast<size_t>(idx[2 + k])]) {
        src[2 + k] = i;
        walk(k + 1, src, w * wi);
      }
    };
    std::vector<int64_t> src = idx;
    walk(0, src, 1.0);
  }
  return out;
}

struct InterpCase {
  InterpolateMode mode;
  Shape in;
  std::vector<int64_t> size;
  std::vector<double> factor;
  std::optional<bool> align;
};

std::vector<double> reference_for(const Tensor& x, const InterpCase& c, Shape* out_shape) {
  *out_shape = {x.size(0), x.size(1)};
  std::vector<Axis> axes;
  for (int64_t k = 0; k + 2 < x.dim(); ++k) {
    const size_t sk = c.size.size() == 1 || c.factor.size() == 1 ? 0 : static_cast<size_t>(k);
    const int64_t in = x.size(2 + k);
    std::optional<double> f;
    int64_t out = 0;
    if (!c.factor.empty()) {
      f = c.factor[sk];
      out = static_cast<int64_t>(std::floor(static_cast<double>(in) * *f));
    } else {
      out = c.size[sk];
    }
    out_shape->push_back(out);
    axes.push_back(axis_reference(c.mode, in, out, c.align.value_or(false), f));
  }
  return interpolate_reference(x, *out_shape, axes);
}

const std::vector<InterpCase>& interp_cases() {
  using M = InterpolateMode;
  static const std::vector<InterpCase> all = {
      {M::Nearest, {2, 3, 4, 5}, {}, {2}, {}},             {M::Nearest, {1, 2, 7, 5}, {3, 8}, {}, {}},
      {M::Nearest, {1, 2, 5, 4}, {}, {1.5, 0.75}, {}},     {M::NearestExact, {1, 2, 7, 5}, {3, 8}, {}, {}},
      {M::NearestExact, {2, 3, 6}, {}, {2.5}, {}},         {M::Bilinear, {2, 3, 4, 5}, {}, {2}, false},
      {M::Bilinear, {2, 3, 4, 5}, {7, 3}, {}, true},       {M::Bilinear, {1, 2, 6, 6}, {4, 9}, {}, {}},
      {M::Bilinear, {1, 2, 5, 4}, {}, {1.7, 0.5}, false},  {M::Bicubic, {1, 2, 4, 5}, {}, {2}, false},
      {M::Bicubic, {2, 2, 5, 4}, {3, 7}, {}, true},        {M::Linear, {2, 3, 5}, {9}, {}, false},
      {M::Linear, {2, 3, 9}, {4}, {}, true},               {M::Trilinear, {1, 2, 3, 4, 3}, {}, {2, 1.5, 1}, false},
      {M::Nearest, {1, 2, 3, 2, 4}, {5, 3, 2}, {}, {}},
  };
  return all;
}

F::InterpolateArgs args_of(const InterpCase& c) {
  F::InterpolateArgs a;
  a.size = c.size;
  a.scale_factor = c.factor;
  a.mode = c.mode;
  a.align_corners = c.align;
  return a;
}

}  // namespace

TEST(Interpolate, TorchDocumentationExamples) {
  const Tensor x = arange(1, 5, 1, kFloat32).view({1, 1, 2, 2});
  auto up = [](InterpolateMode m, std::optional<bool> align) {
    return nn::Upsample({.scale_factor = {2}, .mode = m, .align_corners = align});
  };
  EXPECT_TRUE(all_close(up(InterpolateMode::Nearest, {})(x), {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4}, 0, 0));
  EXPECT_TRUE(all_close(up(InterpolateMode::Bilinear, false)(x),
                        {1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3, 3.25, 3.75, 4}, 1e-6, 0));
  const double t = 1.0 / 3;
  EXPECT_TRUE(all_close(up(InterpolateMode::Bilinear, true)(x),
                        {1, 1 + t, 2 - t, 2, 2 - t, 2, 2 + t, 3 - t, 2 + t, 3 - t, 3, 3 + t, 3, 3 + t, 4 - t, 4}, 1e-6,
                        0));
  // the 3x3 input with the 2x2 in its top-left corner
  const Tensor x3 = F::pad(x, {0, 1, 0, 1});
  EXPECT_TRUE(all_close(up(InterpolateMode::Bilinear, false)(x3),
                        {1.0,  1.25,   1.75,   1.5,   0.5,   0, 1.5,  1.75,   2.25,   1.875, 0.625, 0,
                         2.5,  2.75,   3.25,   2.625, 0.875, 0, 2.25, 2.4375, 2.8125, 2.25,  0.75,  0,
                         0.75, 0.8125, 0.9375, 0.75,  0.25,  0, 0,    0,      0,      0,     0,     0},
                        1e-6, 0));
  EXPECT_TRUE(all_close(up(InterpolateMode::Bilinear, true)(x3),
                        {1.0, 1.4,  1.8,  1.6,  0.8,  0, 1.8, 2.2,  2.6,  2.24, 1.12, 0,
                         2.6, 3.0,  3.4,  2.88, 1.44, 0, 2.4, 2.72, 3.04, 2.56, 1.28, 0,
                         1.2, 1.36, 1.52, 1.28, 0.64, 0, 0,   0,    0,    0,    0,    0},
                        1e-6, 0));
}

TEST(Interpolate, MatchesReferenceInEveryModeAndLayout) {
  Generator g(21);
  for (const InterpCase& c : interp_cases())
    for (Image l : {Image::NCHW, Image::NHWC, Image::Sliced}) {
      if (l != Image::NCHW && c.in.size() != 4) continue;
      SCOPED_TRACE(fmt::format("mode {} input {} {}", static_cast<int>(c.mode), c.in, strata::testing::image_name(l)));
      const Tensor x = c.in.size() == 4 ? as_image(randn(c.in, kFloat64, &g), l) : randn(c.in, kFloat64, &g);
      Shape out_shape;
      const std::vector<double> want = reference_for(x, c, &out_shape);
      const Tensor y = F::interpolate(x, args_of(c));
      EXPECT_EQ(y.shape(), out_shape);
      EXPECT_TRUE(all_close(y, want, 1e-12, 1e-12));
      if (c.in.size() == 4) EXPECT_TRUE(has_format(y, expected_format(x, l)));
      // float32 places its samples in float, as PyTorch's kernels: the same up to rounding
      EXPECT_TRUE(all_close(F::interpolate(x.to(kFloat32), args_of(c)), want, 1e-5, 1e-5));
    }
}

TEST(Interpolate, SixteenBitInputsRoundOnce) {
  Generator g(22);
  const Tensor x = randn({2, 3, 5, 4}, kFloat32, &g);
  for (DType dt : {kFloat16, kBFloat16})
    for (InterpolateMode m : {InterpolateMode::Nearest, InterpolateMode::Bilinear, InterpolateMode::Bicubic}) {
      const Tensor x16 = x.to(dt);
      const F::InterpolateArgs a{.size = {7, 9}, .mode = m};
      const Tensor y = F::interpolate(x16, a);
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_TRUE(all_close(y, values(F::interpolate(x16.to(kFloat32), a).to(dt)), 0, 0));
    }
  // the nearest modes take integer tensors too
  const Tensor ints = arange(0, 6, 1, kInt64).view({1, 1, 2, 3});
  EXPECT_TRUE(all_close(F::interpolate(ints, {.size = {2, 6}}), {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5}, 0, 0));
}

TEST(Interpolate, RecomputedScaleFactorPlacesByTheSizes) {
  // 5 -> 7 with factor 1.5: samples at 1 / 1.5 apart, or at 5 / 7 apart when recomputed
  const Tensor x = arange(0, 5, 1, kFloat64).view({1, 1, 5});
  F::InterpolateArgs a{.scale_factor = {1.5}, .mode = InterpolateMode::Linear};
  std::vector<double> by_factor, by_size;
  for (int64_t j = 0; j < 7; ++j) {
    by_factor.push_back(std::clamp((static_cast<double>(j) + 0.5) / 1.5 - 0.5, 0.0, 4.0));
    by_size.push_back(std::clamp((static_cast<double>(j) + 0.5) * 5.0 / 7.0 - 0.5, 0.0, 4.0));
  }
  EXPECT_TRUE(all_close(F::interpolate(x, a), by_factor, 1e-12, 1e-12));
  a.recompute_scale_factor = true;
  EXPECT_TRUE(all_close(F::interpolate(x, a), by_size, 1e-12, 1e-12));
}

TEST(Interpolate, GradientsToSecondOrder) {
  using M = InterpolateMode;
  std::vector<strata::testing::GradCase> cases;
  for (const InterpCase& c : std::vector<InterpCase>{{M::Nearest, {1, 2, 3, 4}, {5, 7}, {}, {}},
                                                     {M::Bilinear, {1, 2, 3, 4}, {5, 3}, {}, false},
                                                     {M::Bilinear, {1, 2, 3, 4}, {}, {2}, true},
                                                     {M::Bicubic, {1, 2, 3, 4}, {5, 6}, {}, false},
                                                     {M::Linear, {2, 2, 5}, {3}, {}, false},
                                                     {M::Trilinear, {1, 1, 2, 3, 2}, {}, {2}, false}}) {
    const F::InterpolateArgs a = args_of(c);
    cases.push_back({"interpolate", [a](V in) { return F::interpolate(in[0], a); }, {c.in}});
  }
  check_cases_to_second_order(cases, 23);
}

TEST(Interpolate, BadInputRaises) {
  const Tensor x = randn({1, 2, 3, 4});
  using M = InterpolateMode;
  EXPECT_TRUE(throws_with([&] { F::interpolate(x, {}); }, {"[interpolate]", "exactly one of size and scale_factor"}));
  EXPECT_TRUE(throws_with([&] { F::interpolate(x, {.size = {4}, .scale_factor = {2}}); }, {"exactly one"}));
  EXPECT_TRUE(throws_with([&] { F::interpolate(x, {.size = {4, 4, 4}}); }, {"1 or 2 entries"}));
  EXPECT_TRUE(throws_with([&] { F::interpolate(x, {.size = {4}, .mode = M::Linear}); }, {"linear", "3-d"}));
  EXPECT_TRUE(throws_with([&] { F::interpolate(x, {.size = {4}, .mode = M::Trilinear}); }, {"trilinear", "5-d"}));
  EXPECT_TRUE(throws_with([&] { F::interpolate(x, {.size = {4}, .align_corners = true}); }, {"align_corners"}));
  EXPECT_TRUE(throws_with([&] { F::interpolate(x, {.size = {0, 2}}); }, {"output size 0", "positive"}));
  EXPECT_TRUE(throws_with([&] { F::interpolate(x, {.scale_factor = {0.2}}); }, {"output size 0"}));
  EXPECT_TRUE(throws_with([&] { F::interpolate(x, {.scale_factor = {-1}}); }, {"positive and finite"}));
  EXPECT_TRUE(throws_with([&] { F::interpolate(x.to(kInt64), {.size = {4}, .mode = M::Bilinear}); },
                          {"bilinear", "floating", "int64"}));
  EXPECT_TRUE(throws_with([&] { F::interpolate(randn({2, 3}), {.size = {4}}); }, {"1 to 3 spatial dims"}));
  EXPECT_TRUE(throws_with([&] { F::interpolate(randn({1, 2, 0, 3}), {.size = {4}}); }, {"empty spatial dim"}));
  EXPECT_TRUE(throws_with([&] { nn::Upsample({}); }, {"[Upsample]", "exactly one"}));
}
