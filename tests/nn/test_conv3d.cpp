// conv3d and conv_transpose3d against direct float64 loops of PyTorch's definitions
// (volume_testing.h; odd sizes; stride, padding, dilation and groups mixed per dim; with and
// without bias; unbatched; float64, float32 and bfloat16: with oneDNN the last two run the native
// ops, float64 the composed path), finite-difference gradients in float64, the
// Conv3d / ConvTranspose3d layers (PyTorch's parameter shapes, the padding modes), and bad
// shapes and arguments.
#include <algorithm>
#include <vector>

#include "nn/volume_testing.h"

using namespace strata;
namespace F = strata::nn::functional;
using strata::testing::all_close;
using strata::testing::gradcheck;
using strata::testing::leaf;
using strata::testing::throws_with;
using strata::testing::values;
using V = const std::vector<Tensor>&;
using nn::Size3;
using namespace strata::testing;  // the loops and cases of volume_testing.h

TEST(Conv3d, MatchesLoopReference) {
  Generator g(71);
  for (const ConvCase& c : kCases) {
    SCOPED_TRACE(fmt::format("x ({}, {}, {}, {}, {}) out {} kernel {} stride {} padding {} dilation {} groups {}",
                             c.x.n, c.x.c, c.x.d, c.x.h, c.x.w, c.out_channels, c.kernel, c.stride, c.padding,
                             c.dilation, c.groups));
    const Tensor x = randn({c.x.n, c.x.c, c.x.d, c.x.h, c.x.w}, kFloat64, &g);
    const Tensor w = randn({c.out_channels, c.x.c / c.groups, c.kernel.d, c.kernel.h, c.kernel.w}, kFloat64, &g);
    const Tensor b = c.bias ? randn({c.out_channels}, kFloat64, &g) : Tensor();
    const F::Conv3dArgs a{c.stride, c.padding, c.dilation, c.groups};
    Shape want_shape;
    const std::vector<double> want = conv3d_loop(x, w, b, a, want_shape);
    for (DType dt : {kFloat64, kFloat32, kBFloat16}) {
      SCOPED_TRACE(dtype_name(dt));
      const double tol = dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 1e-5 : 0.1;
      auto cast = [&](const Tensor& t) { return t.defined() ? t.to(dt) : t; };
      const Tensor y = F::conv3d(cast(x), cast(w), cast(b), a);
      EXPECT_EQ(y.shape(), want_shape);
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_TRUE(y.is_contiguous());
      if (dt != kBFloat16) EXPECT_TRUE(all_close(y, want, tol, tol));
      else EXPECT_TRUE(all_close(y, want, 0.05, tol));  // bf16 inputs: 8 bits of mantissa
    }
    // unbatched: the first sample
    const Tensor one = F::conv3d(x[0], w, b, a);
    const Tensor first = F::conv3d(x.narrow(0, 0, 1), w, b, a);
    EXPECT_TRUE(all_close(one, values(first), 0, 0));
  }
}

TEST(ConvTranspose3d, MatchesLoopReference) {
  Generator g(72);
  for (const ConvCase& c : kCases) {
    SCOPED_TRACE(fmt::format("x ({}, {}, {}, {}, {}) kernel {} stride {} padding {} dilation {} groups {} op {}", c.x.n,
                             c.x.c, c.x.d, c.x.h, c.x.w, c.kernel, c.stride, c.padding, c.dilation, c.groups,
                             c.output_padding));
    const Tensor x = randn({c.x.n, c.x.c, c.x.d, c.x.h, c.x.w}, kFloat64, &g);
    const Tensor w = randn({c.x.c, c.out_channels / c.groups, c.kernel.d, c.kernel.h, c.kernel.w}, kFloat64, &g);
    const Tensor b = c.bias ? randn({c.out_channels}, kFloat64, &g) : Tensor();
    const F::ConvTranspose3dArgs a{c.stride, c.padding, c.output_padding, c.groups, c.dilation};
    Shape want_shape;
    const std::vector<double> want = conv_transpose3d_loop(x, w, b, a, want_shape);
    for (DType dt : {kFloat64, kFloat32}) {
      const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
      auto cast = [&](const Tensor& t) { return t.defined() ? t.to(dt) : t; };
      const Tensor y = F::conv_transpose3d(cast(x), cast(w), cast(b), a);
      EXPECT_EQ(y.shape(), want_shape);
      EXPECT_TRUE(all_close(y, want, tol, tol)) << dtype_name(dt);
    }
    EXPECT_EQ(F::conv_transpose3d(x[0], w, b, a).shape(), Shape(want_shape.begin() + 1, want_shape.end()));
  }
}

TEST(Conv3d, FiniteDifferenceGradients) {
  Generator g(73);
  // through the input, the weight and the bias; strided layouts too
  const Tensor x = randn({2, 4, 4, 5, 3}, kFloat64, &g);
  std::vector<Tensor> in = {leaf(x), leaf(randn({4, 2, 2, 3, 2}, kFloat64, &g)), leaf(randn({4}, kFloat64, &g))};
  const F::Conv3dArgs a{{2, 1, 1}, {1, 1, 0}, {1, 1, 2}, 2};
  EXPECT_TRUE(gradcheck([&](V t) { return F::conv3d(t[0], t[1], t[2], a); }, in));
  std::vector<Tensor> view = {leaf(randn({1, 3, 2, 4, 3}, kFloat64, &g), strata::testing::Layout::Sliced),
                              leaf(randn({2, 3, 2, 2, 2}, kFloat64, &g), strata::testing::Layout::Transposed)};
  EXPECT_TRUE(gradcheck([&](V t) { return F::conv3d(t[0], t[1], Tensor(), {1, 1, 1, 1}); }, view));

  const F::ConvTranspose3dArgs ta{{2, 1, 2}, {1, 0, 1}, {1, 0, 0}, 2, {1, 2, 1}};
  std::vector<Tensor> tin = {leaf(randn({2, 4, 3, 3, 2}, kFloat64, &g)), leaf(randn({4, 1, 3, 2, 2}, kFloat64, &g)),
                             leaf(randn({2}, kFloat64, &g))};
  EXPECT_TRUE(gradcheck([&](V t) { return F::conv_transpose3d(t[0], t[1], t[2], ta); }, tin));
}

TEST(Conv3d, LayersHaveTorchShapesAndPaddingModes) {
  Generator g(74);
  nn::Conv3d conv(4, 6, {3, 1, 2}, {.stride = 2, .padding = {1, 0, 1}, .groups = 2, .generator = &g});
  EXPECT_EQ(conv.weight.shape(), (Shape{6, 2, 3, 1, 2}));
  EXPECT_EQ(conv.bias.shape(), (Shape{6}));
  const Tensor x = randn({2, 4, 5, 4, 6}, kFloat32, &g);
  EXPECT_TRUE(all_close(conv(x), values(F::conv3d(x, conv.weight, conv.bias, {2, {1, 0, 1}, 1, 2})), 0, 0));
  // kaiming_uniform(a = sqrt(5)) bounds the weight by 1 / sqrt(fan_in), fan_in = 2 * 3 * 1 * 2
  for (double v : values(conv.weight)) EXPECT_LE(std::fabs(v), 1 / std::sqrt(12.0));

  nn::ConvTranspose3d up(4, 6, 2, {.stride = 2, .groups = 2, .generator = &g});
  EXPECT_EQ(up.weight.shape(), (Shape{4, 3, 2, 2, 2}));
  EXPECT_EQ(up(x).shape(), (Shape{2, 6, 10, 8, 12}));

  // padding_mode reflect, replicate and circular: the loop over an input padded by hand, with a
  // different padding per dim so that the (W, H, D) order of the pads shows
  const Tensor v = randn({1, 1, 3, 4, 5}, kFloat64, &g);
  const std::vector<double> vv = values(v);
  const int64_t pd = 1, ph = 2, pw = 1;
  for (nn::PaddingMode mode : {nn::PaddingMode::Reflect, nn::PaddingMode::Replicate, nn::PaddingMode::Circular}) {
    SCOPED_TRACE(static_cast<int>(mode));
    nn::Conv3d layer(1, 1, 3, {.padding = {pd, ph, pw}, .bias = false, .padding_mode = mode, .generator = &g});
    layer.to(kFloat64);
    auto source = [mode](int64_t i, int64_t n) {
      if (mode == nn::PaddingMode::Reflect) return i < 0 ? -i : i >= n ? 2 * (n - 1) - i : i;
      if (mode == nn::PaddingMode::Replicate) return std::clamp<int64_t>(i, 0, n - 1);
      return (i + n) % n;
    };
    std::vector<double> padded;
    for (int64_t d = -pd; d < 3 + pd; ++d)
      for (int64_t h = -ph; h < 4 + ph; ++h)
        for (int64_t w = -pw; w < 5 + pw; ++w)
          padded.push_back(vv[(source(d, 3) * 4 + source(h, 4)) * 5 + source(w, 5)]);
    Shape shape;
    const std::vector<double> want = conv3d_loop(
        from_vector(padded, Shape{1, 1, 3 + 2 * pd, 4 + 2 * ph, 5 + 2 * pw}), layer.weight, Tensor(), {}, shape);
    EXPECT_TRUE(all_close(layer(v), want, 1e-12, 1e-12));
  }
}

TEST(Conv3d, AutocastRunsInLowerPrecision) {
  // as torch.autocast: conv3d and conv_transpose3d compute in bfloat16 inside the region
  Generator g(75);
  const Tensor x = randn({1, 2, 4, 5, 3}, kFloat32, &g), w = randn({2, 2, 2, 2, 2}, kFloat32, &g);
  const Tensor b = randn({2}, kFloat32, &g);
  const Tensor want = F::conv3d(x, w, b), want_t = F::conv_transpose3d(x, w, b, {.stride = 2});
  amp::Autocast region(kBFloat16);
  const Tensor y = F::conv3d(x, w, b), yt = F::conv_transpose3d(x, w, b, {.stride = 2});
  EXPECT_EQ(y.dtype(), kBFloat16);
  EXPECT_EQ(yt.dtype(), kBFloat16);
  EXPECT_TRUE(all_close(y, values(want), 0.05, 0.1));
  EXPECT_TRUE(all_close(yt, values(want_t), 0.05, 0.1));
}

TEST(Conv3d, BadShapesRaise) {
  const Tensor x = randn({2, 4, 5, 5, 5}), w = randn({6, 2, 3, 3, 3});
  EXPECT_TRUE(throws_with([&] { F::conv3d(randn({4, 5, 5}), w); }, {"[conv3d]", "5-d (N, C, D, H, W)", "[4, 5, 5]"}));
  EXPECT_TRUE(throws_with([&] { F::conv3d(x, randn({6, 4, 3, 3})); }, {"[conv3d]", "5-d weight"}));
  EXPECT_TRUE(throws_with([&] { F::conv3d(x, w); }, {"[conv3d]", "4 channels", "groups=1 expects 2"}));
  EXPECT_TRUE(throws_with([&] { F::conv3d(x, randn({5, 2, 3, 3, 3}), Tensor(), {.groups = 2}); },
                          {"[conv3d]", "out channels (5", "divisible by groups=2"}));
  EXPECT_TRUE(throws_with([&] { F::conv3d(x, w, randn({5}), {.groups = 2}); }, {"[conv3d]", "bias", "(6)"}));
  EXPECT_TRUE(throws_with([&] { F::conv3d(randn({1, 4, 2, 5, 5}), w, Tensor(), {.groups = 2}); },
                          {"[conv3d]", "too small", "[1, 4, 2, 5, 5]"}));
  EXPECT_TRUE(throws_with([&] { F::conv3d(x, w, Tensor(), {.stride = {1, 0, 1}, .groups = 2}); },
                          {"[conv3d]", "stride", "(1, 0, 1)"}));
  EXPECT_TRUE(throws_with([&] { F::conv3d(x, w.to(kFloat64), Tensor(), {.groups = 2}); }, {"[conv3d]", "same dtype"}));
  EXPECT_TRUE(throws_with([&] { F::conv_transpose3d(x, randn({3, 2, 2, 2, 2})); },
                          {"[conv_transpose3d]", "4 channels", "expects 3"}));
  EXPECT_TRUE(throws_with(
      [&] { F::conv_transpose3d(x, randn({4, 2, 2, 2, 2}), Tensor(), {.stride = 2, .output_padding = {0, 2, 0}}); },
      {"[conv_transpose3d]", "output_padding (0, 2, 0)"}));
  EXPECT_TRUE(throws_with([] { nn::Conv3d(4, 6, {3, 0, 3}); }, {"[Conv3d(4, 6", "kernel_size must be positive"}));
  EXPECT_TRUE(throws_with([] { nn::Conv3d(4, 6, 3, {.groups = 4}); }, {"out_channels (6)", "groups (4)"}));
  EXPECT_TRUE(throws_with([] { nn::ConvTranspose3d(4, 6, 3, {.padding_mode = nn::PaddingMode::Reflect}); },
                          {"[ConvTranspose3d", "zeros only"}));
  nn::Conv3d conv(4, 6, 3);
  EXPECT_TRUE(throws_with([&] { conv(randn({2, 3, 5, 5, 5})); }, {"[Conv3d(4, 6", "expects 4 input channels"}));
  EXPECT_TRUE(throws_with([&] { conv(randn({4, 5, 5})); }, {"(N, 4, D, H, W)", "3-d input"}));
}
