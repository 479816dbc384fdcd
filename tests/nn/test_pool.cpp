// Pooling (max with indices, average, adaptive average) against plain-loop float64 references
// written here, in NCHW, channels-last and non-dense layouts, float32 and float64;
// finite-difference gradient checks in float64; ties and NaNs; and bad input.
#include <cmath>
#include <limits>
#include <optional>
#include <random>

#include "nn/image_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::Arr4;
using strata::testing::as_image;
using strata::testing::expected_format;
using strata::testing::gradcheck;
using strata::testing::pool_out;
using strata::testing::has_format;
using strata::testing::Image;
using strata::testing::throws_with;
using strata::testing::values;
namespace F = strata::nn::functional;
using nn::Size2;
using V = const std::vector<Tensor>&;

namespace {

struct PoolCase {
  Shape in;  // (N, C, H, W)
  Size2 k;
  std::optional<Size2> stride;
  Size2 padding = 0, dilation = 1;
  bool ceil_mode = false;
};

const std::vector<PoolCase>& pool_cases() {
  static const std::vector<PoolCase> all = {
      {{2, 3, 7, 6}, 2},
      {{2, 4, 9, 8}, 3, Size2(2), 1},                       // ResNet's stem pool
      {{1, 5, 7, 7}, {3, 2}, Size2(2, 1), {1, 0}, 1, true},  // ceil mode, asymmetric
      {{3, 2, 10, 9}, 3, Size2(2), 1, 2},                   // dilation
      {{2, 3, 6, 5}, {2, 3}, Size2(3, 2), 0, 1, true},       // ceil mode with a partial last window
      {{1, 16, 5, 5}, 5},                                   // one window
  };
  return all;
}

struct MaxRef {
  Arr4 y, idx;
};

MaxRef max_reference(const PoolCase& k, const Arr4& x) {
  const Size2 s = k.stride.value_or(k.k);
  const int64_t oh = pool_out(x.h, k.k.h, s.h, k.padding.h, k.dilation.h, k.ceil_mode);
  const int64_t ow = pool_out(x.w, k.k.w, s.w, k.padding.w, k.dilation.w, k.ceil_mode);
  MaxRef r{Arr4(x.n, x.c, oh, ow), Arr4(x.n, x.c, oh, ow)};
  for (int64_t n = 0; n < x.n; ++n)
    for (int64_t c = 0; c < x.c; ++c)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          double best = -std::numeric_limits<double>::infinity();
          int64_t at = -1;
          for (int64_t ky = 0; ky < k.k.h; ++ky)
            for (int64_t kx = 0; kx < k.k.w; ++kx) {
              const int64_t iy = oy * s.h - k.padding.h + ky * k.dilation.h;
              const int64_t ix = ox * s.w - k.padding.w + kx * k.dilation.w;
              if (iy < 0 || iy >= x.h || ix < 0 || ix >= x.w) continue;
              const double v = x(n, c, iy, ix);
              if (at < 0 || v > best || std::isnan(v)) best = v, at = iy * x.w + ix;  // the last NaN wins
            }
          r.y(n, c, oy, ox) = best;
          r.idx(n, c, oy, ox) = static_cast<double>(at);
        }
  return r;
}

Arr4 avg_reference(const PoolCase& k, const Arr4& x, bool count_include_pad, std::optional<int64_t> divisor) {
  const Size2 s = k.stride.value_or(k.k);
  const int64_t oh = pool_out(x.h, k.k.h, s.h, k.padding.h, 1, k.ceil_mode);
  const int64_t ow = pool_out(x.w, k.k.w, s.w, k.padding.w, 1, k.ceil_mode);
  Arr4 y(x.n, x.c, oh, ow);
  for (int64_t n = 0; n < x.n; ++n)
    for (int64_t c = 0; c < x.c; ++c)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          double sum = 0;
          int64_t inside = 0, padded = 0;
          for (int64_t ky = 0; ky < k.k.h; ++ky)
            for (int64_t kx = 0; kx < k.k.w; ++kx) {
              const int64_t iy = oy * s.h - k.padding.h + ky, ix = ox * s.w - k.padding.w + kx;
              // positions in the padding count, those past it (ceil mode) do not
              if (iy >= x.h + k.padding.h || ix >= x.w + k.padding.w) continue;
              ++padded;
              if (iy < 0 || iy >= x.h || ix < 0 || ix >= x.w) continue;
              ++inside;
              sum += x(n, c, iy, ix);
            }
          const double d = divisor ? double(*divisor) : count_include_pad ? double(padded) : double(inside);
          y(n, c, oy, ox) = sum / d;
        }
  return y;
}

Arr4 adaptive_reference(const Arr4& x, int64_t oh, int64_t ow) {
  Arr4 y(x.n, x.c, oh, ow);
  for (int64_t n = 0; n < x.n; ++n)
    for (int64_t c = 0; c < x.c; ++c)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          const int64_t h0 = static_cast<int64_t>(std::floor(double(oy * x.h) / oh));
          const int64_t h1 = static_cast<int64_t>(std::ceil(double((oy + 1) * x.h) / oh));
          const int64_t w0 = static_cast<int64_t>(std::floor(double(ox * x.w) / ow));
          const int64_t w1 = static_cast<int64_t>(std::ceil(double((ox + 1) * x.w) / ow));
          double s = 0;
          for (int64_t h = h0; h < h1; ++h)
            for (int64_t w = w0; w < w1; ++w) s += x(n, c, h, w);
          y(n, c, oy, ox) = s / double((h1 - h0) * (w1 - w0));
        }
  return y;
}

double tol(DType t) { return t == kFloat64 ? 1e-12 : 1e-5; }

}  // namespace

// ---- max pooling ----------------------------------------------------------------------------------

TEST(MaxPool2d, ValuesAndIndicesMatchReference) {
  uint64_t seed = 1;
  for (const PoolCase& k : pool_cases()) {
    Generator g(seed++);
    Tensor x64 = randn(k.in, kFloat64, &g);
    const MaxRef ref = max_reference(k, Arr4(x64));
    for (DType dt : {kFloat32, kFloat64})
      for (Image l : strata::testing::all_images()) {
        SCOPED_TRACE(fmt::format("case {} {} {}", seed - 1, dt, strata::testing::image_name(l)));
        Tensor x = as_image(x64.to(dt), l);
        auto r = F::max_pool2d_with_indices(x, k.k, {k.stride, k.padding, k.dilation, k.ceil_mode});
        ASSERT_EQ(r.output.shape(), ref.y.shape());
        EXPECT_EQ(r.indices.dtype(), kInt64);
        EXPECT_TRUE(has_format(r.output, expected_format(x, l)));
        EXPECT_TRUE(all_close(r.output, ref.y.v, tol(dt), 0));
        EXPECT_TRUE(all_close(r.indices, ref.idx.v, 0, 0));
      }
  }
}

TEST(MaxPool2d, NaNPropagatesAndUnbatchedInput) {
  Tensor x = from_vector<double>({1, 2, 3, 4, NAN, 0, 7, 8, 9}, Shape{1, 1, 3, 3});
  std::vector<double> y = values(F::max_pool2d(x, 2, {.stride = 1}));
  EXPECT_TRUE(std::isnan(y[0]) && std::isnan(y[1]) && std::isnan(y[2]) && std::isnan(y[3]));
  Generator g(5);
  Tensor b = randn({2, 3, 6, 6}, kFloat64, &g);
  EXPECT_TRUE(all_close(F::max_pool2d(b[1], 3, {.stride = 2}), values(F::max_pool2d(b, 3, {.stride = 2})[1]), 0, 0));
}

// Ties and NaNs decide the index: the first of equal maxima in window order, the last NaN.
// Values from {0, 1, 2} with NaNs sprinkled in, on planes wide enough for a window interior
// (which NCHW data runs across a whole row at once) and borders.
TEST(MaxPool2d, TiesAndNaNsPickTheReferenceIndex) {
  std::mt19937 rng(11);
  for (const PoolCase& k : {PoolCase{{2, 3, 17, 19}, 3, Size2(2), 1}, PoolCase{{1, 2, 16, 21}, 3, Size2(1), 2, 2},
                            PoolCase{{1, 2, 9, 40}, {2, 4}, Size2(2, 3), {1, 2}, 1, true}}) {
    std::vector<double> v(static_cast<size_t>(k.in[0] * k.in[1] * k.in[2] * k.in[3]));
    for (double& e : v) e = rng() % 50 == 0 ? NAN : double(rng() % 3);
    Tensor x64 = from_vector<double>(v, k.in);
    const MaxRef ref = max_reference(k, Arr4(x64));
    for (DType dt : {kFloat32, kFloat64})
      for (Image l : strata::testing::all_images()) {
        SCOPED_TRACE(fmt::format("{} {} {}", k.in, dt, strata::testing::image_name(l)));
        auto r = F::max_pool2d_with_indices(as_image(x64.to(dt), l), k.k,
                                            {k.stride, k.padding, k.dilation, k.ceil_mode});
        EXPECT_TRUE(all_close(r.indices, ref.idx.v, 0, 0));
        const std::vector<double> y = values(r.output);
        for (size_t i = 0; i < y.size(); ++i)
          ASSERT_TRUE(std::isnan(ref.y.v[i]) ? std::isnan(y[i]) : y[i] == ref.y.v[i]) << "output " << i;
      }
  }
}

// Random geometries (kernel, stride, padding up to half the dilated kernel, dilation, ceil
// mode, planes narrower than the kernel) on values with ties and NaNs: the NCHW path, which
// runs each row's interior at once, agrees with the reference in values and indices.
TEST(MaxPool2d, RandomGeometriesMatchTheReference) {
  std::mt19937 rng(17);
  auto pick = [&](int lo, int hi) { return static_cast<int64_t>(lo + rng() % (hi - lo + 1)); };
  int checked = 0, refused = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t kh = pick(1, 4), kw = pick(1, 5), dh = pick(1, 3), dw = pick(1, 3);
    const int64_t ph = pick(0, (dh * (kh - 1) + 1) / 2), pw = pick(0, (dw * (kw - 1) + 1) / 2);
    const PoolCase k{{1, 2, pick(1, 9), pick(1, 23)}, {kh, kw}, Size2(pick(1, 3), pick(1, 3)), {ph, pw},
                     {dh, dw}, rng() % 2 == 0};
    if (k.in[2] + 2 * ph < dh * (kh - 1) + 1 || k.in[3] + 2 * pw < dw * (kw - 1) + 1)
      continue;  // the dilated kernel does not fit the padded input: the op refuses these
    std::vector<double> v(static_cast<size_t>(2 * k.in[2] * k.in[3]));
    for (double& e : v) e = rng() % 40 == 0 ? NAN : double(rng() % 4);
    Tensor x = from_vector<double>(v, k.in);
    const MaxRef ref = max_reference(k, Arr4(x));
    SCOPED_TRACE(fmt::format("trial {}: in {} k {}x{} s {}x{} p {}x{} d {}x{} ceil {}", trial, k.in, kh, kw,
                             k.stride->h, k.stride->w, ph, pw, dh, dw, k.ceil_mode));
    bool tapless = false;  // a window with no tap inside the input: its maximum has no element
    for (double i : ref.idx.v) tapless = tapless || i < 0;
    if (tapless) {
      EXPECT_TRUE(throws_with([&] { F::max_pool2d(x, k.k, {k.stride, k.padding, k.dilation, k.ceil_mode}); },
                              {"[max_pool2d]", "holds only padding"}));
      ++refused;
      continue;
    }
    auto r = F::max_pool2d_with_indices(x.to(kFloat32), k.k, {k.stride, k.padding, k.dilation, k.ceil_mode});
    ASSERT_TRUE(all_close(r.indices, ref.idx.v, 0, 0));
    const std::vector<double> y = values(r.output);
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_TRUE(std::isnan(ref.y.v[i]) ? std::isnan(y[i]) : y[i] == ref.y.v[i]) << "output " << i;
    ++checked;
  }
  EXPECT_GT(checked, 150);
  EXPECT_GT(refused, 0);
}

// A window of more than 2^31 taps (a kernel 1.4e9 rows tall, padded to match, over a 1 x 3
// plane): the NCHW path numbers the taps of the rows inside the plane only, so the index of
// the maximum is still right.
TEST(MaxPool2d, HugeKernelKeepsTheIndex) {
  Tensor x = from_vector<float>({0, 2, 1}, Shape{1, 1, 1, 3});
  auto r = F::max_pool2d_with_indices(x, {1431655767, 3}, {.stride = Size2(1), .padding = {715827883, 0}});
  ASSERT_EQ(r.output.shape(), (Shape{1, 1, 1, 1}));
  EXPECT_EQ(r.output.item<float>(), 2.0f);
  EXPECT_EQ(r.indices.item<int64_t>(), 1);
}

TEST(MaxPool2d, GradientsByFiniteDifferences) {
  uint64_t seed = 20;
  for (const PoolCase& k : pool_cases())
    for (Image l : {Image::NCHW, Image::NHWC, Image::Sliced}) {
      SCOPED_TRACE(fmt::format("case {} {}", seed, strata::testing::image_name(l)));
      Generator g(seed++);
      // distinct values, far apart compared to the finite-difference step: no ties
      Tensor x = as_image(randn(k.in, kFloat64, &g), l).requires_grad_();
      const F::MaxPool2dArgs a{k.stride, k.padding, k.dilation, k.ceil_mode};
      EXPECT_TRUE(gradcheck([&](V in) { return F::max_pool2d(in[0], k.k, a); }, {x}));
    }
}

// ---- average pooling ----------------------------------------------------------------------------------

TEST(AvgPool2d, MatchesReferenceForEveryDivisorRule) {
  uint64_t seed = 40;
  for (const PoolCase& k : pool_cases()) {
    if (k.dilation.h != 1 || k.dilation.w != 1) continue;  // avg_pool2d has no dilation
    Generator g(seed++);
    Tensor x64 = randn(k.in, kFloat64, &g);
    for (bool include_pad : {true, false})
      for (std::optional<int64_t> divisor : {std::optional<int64_t>(), std::optional<int64_t>(5)}) {
        const Arr4 ref = avg_reference(k, Arr4(x64), include_pad, divisor);
        const F::AvgPool2dArgs a{k.stride, k.padding, k.ceil_mode, include_pad, divisor};
        for (DType dt : {kFloat32, kFloat64})
          for (Image l : strata::testing::all_images()) {
            SCOPED_TRACE(fmt::format("case {} pad {} divisor {} {} {}", seed - 1, include_pad, divisor.value_or(0), dt,
                                     strata::testing::image_name(l)));
            Tensor x = as_image(x64.to(dt), l);
            Tensor y = F::avg_pool2d(x, k.k, a);
            ASSERT_EQ(y.shape(), ref.shape());
            EXPECT_TRUE(has_format(y, expected_format(x, l)));
            EXPECT_TRUE(all_close(y, ref.v, tol(dt), tol(dt)));
          }
        Tensor xg = as_image(x64, Image::NHWC).requires_grad_();
        EXPECT_TRUE(gradcheck([&](V in) { return F::avg_pool2d(in[0], k.k, a); }, {xg}));
        Tensor xn = x64.clone().requires_grad_();
        EXPECT_TRUE(gradcheck([&](V in) { return F::avg_pool2d(in[0], k.k, a); }, {xn}));
      }
  }
}

TEST(AdaptiveAvgPool2d, MatchesReference) {
  const std::pair<Shape, Size2> cases[] = {{{2, 3, 7, 7}, 1},      {{2, 4, 7, 5}, {3, 2}}, {{1, 3, 5, 9}, {2, 4}},
                                           {{2, 2, 4, 3}, {8, 5}}, {{1, 16, 6, 6}, 3}};
  uint64_t seed = 60;
  for (const auto& [shape, out] : cases) {
    Generator g(seed++);
    Tensor x64 = randn(shape, kFloat64, &g);
    const Arr4 ref = adaptive_reference(Arr4(x64), out.h, out.w);
    for (DType dt : {kFloat32, kFloat64})
      for (Image l : strata::testing::all_images()) {
        SCOPED_TRACE(fmt::format("case {} {} {}", seed - 1, dt, strata::testing::image_name(l)));
        Tensor x = as_image(x64.to(dt), l);
        Tensor y = F::adaptive_avg_pool2d(x, out);
        ASSERT_EQ(y.shape(), ref.shape());
        EXPECT_TRUE(has_format(y, expected_format(x, l)));
        EXPECT_TRUE(all_close(y, ref.v, tol(dt), tol(dt)));
      }
    for (Image l : {Image::NCHW, Image::NHWC}) {
      Tensor xg = as_image(x64, l).requires_grad_();
      EXPECT_TRUE(gradcheck([&](V in) { return F::adaptive_avg_pool2d(in[0], out); }, {xg}));
    }
  }
}

TEST(Pooling, LayersForwardToFunctional) {
  Generator g(70);
  Tensor x = randn({2, 3, 9, 9}, kFloat32, &g);
  nn::MaxPool2d mp(3);  // stride defaults to the kernel size
  EXPECT_EQ(mp(x).shape(), (Shape{2, 3, 3, 3}));
  auto r = mp.forward_with_indices(x);
  EXPECT_TRUE(all_close(r.output, values(mp(x)), 0, 0));
  nn::MaxPool2d mp2(3, {.stride = 2, .padding = 1});
  EXPECT_EQ(mp2(x).shape(), (Shape{2, 3, 5, 5}));
  nn::AvgPool2d ap(2, {.ceil_mode = true, .count_include_pad = false});
  EXPECT_TRUE(all_close(ap(x), values(F::avg_pool2d(x, 2, {.ceil_mode = true, .count_include_pad = false})), 0, 0));
  nn::AdaptiveAvgPool2d gap(1);
  EXPECT_EQ(gap(x).shape(), (Shape{2, 3, 1, 1}));
  EXPECT_TRUE(mp.named_parameters().empty());
}

TEST(Pooling, BadInputRaises) {
  Tensor x = randn({2, 3, 8, 8});
  EXPECT_TRUE(throws_with([&] { F::max_pool2d(randn({3, 8}), 2); }, {"[max_pool2d]", "4-d"}));
  EXPECT_TRUE(throws_with([&] { F::avg_pool2d(randn({1, 2, 3, 8, 8}), 2); }, {"[avg_pool2d]", "4-d"}));
  EXPECT_TRUE(throws_with([&] { F::max_pool2d(x, 0); }, {"kernel_size"}));
  EXPECT_TRUE(throws_with([&] { F::max_pool2d(x, {2, -1}); }, {"kernel_size"}));
  EXPECT_TRUE(throws_with([&] { F::max_pool2d(x, {int64_t(1) << 31, 1}); }, {"kernel_size", "[1, 2^31)"}));
  EXPECT_TRUE(throws_with([&] { F::max_pool2d(x, 2, {.stride = Size2(0)}); }, {"stride"}));
  EXPECT_TRUE(throws_with([&] { F::avg_pool2d(x, 2, {.stride = Size2(-1)}); }, {"stride"}));
  EXPECT_TRUE(throws_with([&] { F::max_pool2d(x, 2, {.dilation = 0}); }, {"dilation"}));
  EXPECT_TRUE(throws_with([&] { F::max_pool2d(x, 3, {.padding = 2}); }, {"padding", "half"}));
  EXPECT_TRUE(throws_with([&] { F::avg_pool2d(x, 2, {.padding = 2}); }, {"padding", "half"}));
  EXPECT_TRUE(throws_with([&] { F::max_pool2d(x, 9); }, {"too small"}));
  // dilation 3 over a row of 2 padded by 1: the first window's taps (-1 and 2) both miss it
  EXPECT_TRUE(throws_with([&] { F::max_pool2d(randn({1, 1, 3, 2}), {1, 2}, {Size2(1), {0, 1}, {1, 3}}); },
                          {"[max_pool2d]", "holds only padding", "[1, 1, 3, 2]"}));
  EXPECT_TRUE(throws_with([&] { F::avg_pool2d(x, 2, {.divisor_override = 0}); }, {"divisor_override"}));
  EXPECT_TRUE(throws_with([&] { F::adaptive_avg_pool2d(x, {0, 2}); }, {"output_size"}));
  EXPECT_TRUE(throws_with([&] { F::max_pool2d(x.to(kInt64), 2); }, {"floating"}));
  EXPECT_TRUE(throws_with([&] { F::max_pool2d(zeros({2, 0, 8, 8}), 2); }, {"non-empty"}));
  EXPECT_TRUE(throws_with([] { nn::MaxPool2d(0); }, {"MaxPool2d", "kernel_size"}));
  EXPECT_TRUE(throws_with([] { nn::AdaptiveAvgPool2d({1, 0}); }, {"AdaptiveAvgPool2d"}));
  // changed indices are caught before the backward scatters with them
  Tensor xg = randn({1, 2, 4, 4}).requires_grad_();
  auto r = F::max_pool2d_with_indices(xg, 2);
  {
    NoGradGuard no_grad;
    r.indices.fill_(100);
  }
  EXPECT_THROW(r.output.sum().backward(), Error);
}
