// max_pool3d (with indices), avg_pool3d, adaptive_avg_pool3d and adaptive_max_pool3d against
// direct float64 loops of PyTorch's definitions written here (odd sizes; stride, padding, dilation, ceil_mode,
// count_include_pad and divisor_override; unbatched; float64, float32 and float16),
// finite-difference gradients in float64, max pooling's gradient landing on the argmax, the
// layers, and bad arguments.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "nn/nn_testing.h"

using namespace strata;
namespace F = strata::nn::functional;
using strata::testing::all_close;
using strata::testing::gradcheck;
using strata::testing::leaf;
using strata::testing::throws_with;
using strata::testing::values;
using V = const std::vector<Tensor>&;
using nn::Size3;

namespace {

int64_t at(Size3 s, int i) { return i == 0 ? s.d : i == 1 ? s.h : s.w; }

struct Volume {
  int64_t in[3], out[3];
  int64_t planes;  // N * C
};

Volume volume(const Tensor& x, Size3 k, Size3 s, Size3 p, Size3 d, bool ceil_mode) {
  Volume v{};
  v.planes = x.size(0) * x.size(1);
  for (int i = 0; i < 3; ++i) {
    v.in[i] = x.size(2 + i);
    v.out[i] = strata::testing::pool_out(v.in[i], at(k, i), at(s, i), at(p, i), at(d, i), ceil_mode);
  }
  return v;
}

// Each window's maximum, scanning (kd, kh, kw) and keeping the first of equal values (a NaN
// wins), and its flat index (d * H + h) * W + w.
void max_pool3d_loop(const Tensor& x, Size3 k, const F::MaxPool3dArgs& a, std::vector<double>& y,
                     std::vector<double>& idx) {
  const Size3 s = a.stride.value_or(k);
  const Volume v = volume(x, k, s, a.padding, a.dilation, a.ceil_mode);
  const std::vector<double> xv = values(x);
  const int64_t plane = v.in[0] * v.in[1] * v.in[2];
  for (int64_t pl = 0; pl < v.planes; ++pl)
    for (int64_t o0 = 0; o0 < v.out[0]; ++o0)
      for (int64_t o1 = 0; o1 < v.out[1]; ++o1)
        for (int64_t o2 = 0; o2 < v.out[2]; ++o2) {
          double best = -std::numeric_limits<double>::infinity();
          int64_t where = -1;
          for (int64_t k0 = 0; k0 < k.d; ++k0)
            for (int64_t k1 = 0; k1 < k.h; ++k1)
              for (int64_t k2 = 0; k2 < k.w; ++k2) {
                const int64_t p0 = o0 * s.d - a.padding.d + k0 * a.dilation.d;
                const int64_t p1 = o1 * s.h - a.padding.h + k1 * a.dilation.h;
                const int64_t p2 = o2 * s.w - a.padding.w + k2 * a.dilation.w;
                if (p0 < 0 || p0 >= v.in[0] || p1 < 0 || p1 >= v.in[1] || p2 < 0 || p2 >= v.in[2]) continue;
                const int64_t flat = (p0 * v.in[1] + p1) * v.in[2] + p2;
                const double val = xv[pl * plane + flat];
                if (where < 0 || val > best || (std::isnan(val) && !std::isnan(best))) best = val, where = flat;
              }
          y.push_back(best);
          idx.push_back(static_cast<double>(where));
        }
}

// The window's sum over the elements inside the input, divided by divisor_override, or by the
// window's size clipped to the padded input (count_include_pad), or by the elements inside.
std::vector<double> avg_pool3d_loop(const Tensor& x, Size3 k, const F::AvgPool3dArgs& a) {
  const Size3 s = a.stride.value_or(k);
  const Volume v = volume(x, k, s, a.padding, 1, a.ceil_mode);
  const std::vector<double> xv = values(x);
  const int64_t plane = v.in[0] * v.in[1] * v.in[2];
  std::vector<double> y;
  for (int64_t pl = 0; pl < v.planes; ++pl)
    for (int64_t o0 = 0; o0 < v.out[0]; ++o0)
      for (int64_t o1 = 0; o1 < v.out[1]; ++o1)
        for (int64_t o2 = 0; o2 < v.out[2]; ++o2) {
          const int64_t o[3] = {o0, o1, o2};
          int64_t lo[3], hi[3], padded = 1, inside = 1;
          for (int i = 0; i < 3; ++i) {
            lo[i] = o[i] * at(s, i) - at(a.padding, i);
            hi[i] = std::min(lo[i] + at(k, i), v.in[i] + at(a.padding, i));
            padded *= hi[i] - lo[i];
            lo[i] = std::max<int64_t>(lo[i], 0), hi[i] = std::min(hi[i], v.in[i]);
            inside *= hi[i] - lo[i];
          }
          double sum = 0;
          for (int64_t p0 = lo[0]; p0 < hi[0]; ++p0)
            for (int64_t p1 = lo[1]; p1 < hi[1]; ++p1)
              for (int64_t p2 = lo[2]; p2 < hi[2]; ++p2) sum += xv[pl * plane + (p0 * v.in[1] + p1) * v.in[2] + p2];
          const double divisor = a.divisor_override ? double(*a.divisor_override)
                                 : a.count_include_pad ? double(padded)
                                                       : double(inside);
          y.push_back(sum / divisor);
        }
  return y;
}

std::vector<double> adaptive_avg_pool3d_loop(const Tensor& x, Size3 out) {
  const std::vector<double> xv = values(x);
  const int64_t in[3] = {x.size(2), x.size(3), x.size(4)}, plane = in[0] * in[1] * in[2];
  std::vector<double> y;
  auto start = [](int64_t o, int64_t n, int64_t m) { return static_cast<int64_t>(std::floor(double(o * n) / m)); };
  auto end = [](int64_t o, int64_t n, int64_t m) { return static_cast<int64_t>(std::ceil(double((o + 1) * n) / m)); };
  for (int64_t pl = 0; pl < x.size(0) * x.size(1); ++pl)
    for (int64_t o0 = 0; o0 < out.d; ++o0)
      for (int64_t o1 = 0; o1 < out.h; ++o1)
        for (int64_t o2 = 0; o2 < out.w; ++o2) {
          double sum = 0;
          int64_t count = 0;
          for (int64_t p0 = start(o0, in[0], out.d); p0 < end(o0, in[0], out.d); ++p0)
            for (int64_t p1 = start(o1, in[1], out.h); p1 < end(o1, in[1], out.h); ++p1)
              for (int64_t p2 = start(o2, in[2], out.w); p2 < end(o2, in[2], out.w); ++p2, ++count)
                sum += xv[pl * plane + (p0 * in[1] + p1) * in[2] + p2];
          y.push_back(sum / double(count));
        }
  return y;
}

double tol_for(DType dt) { return dt == kFloat64 ? 1e-12 : dt == kFloat32 ? 1e-5 : 2e-3; }

}  // namespace

TEST(MaxPool3d, MatchesLoopReference) {
  struct Case {
    Shape x;
    Size3 kernel;
    F::MaxPool3dArgs args;
  };
  const Case cases[] = {
      {{2, 3, 5, 6, 7}, 2, {}},
      {{1, 2, 7, 5, 6}, {3, 2, 3}, {Size3{2, 1, 2}, {1, 1, 1}, 1, false}},
      {{2, 2, 6, 7, 5}, 3, {Size3{2, 2, 1}, {1, 0, 1}, {2, 1, 2}, true}},
      {{1, 3, 5, 5, 8}, {2, 3, 3}, {Size3{2, 2, 3}, {1, 1, 0}, 1, true}},
  };
  Generator g(81);
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("x {} kernel {} padding {} dilation {} ceil {}", c.x, c.kernel, c.args.padding,
                             c.args.dilation, c.args.ceil_mode));
    Tensor x = randn(c.x, kFloat64, &g);
    x.view({x.numel()}).narrow(0, 3, 1).fill_(std::nan(""));  // a NaN wins its windows
    std::vector<double> want, want_idx;
    max_pool3d_loop(x, c.kernel, c.args, want, want_idx);
    for (DType dt : {kFloat64, kFloat32, kFloat16}) {
      SCOPED_TRACE(dtype_name(dt));
      const Tensor xt = x.to(dt);
      std::vector<double> want_dt, idx_dt;  // the reference on the rounded values (ties may move)
      max_pool3d_loop(xt.to(kFloat64), c.kernel, c.args, want_dt, idx_dt);
      const F::MaxPoolResult r = F::max_pool3d_with_indices(xt, c.kernel, c.args);
      EXPECT_TRUE(all_close(r.output, want_dt, 0, 0));
      EXPECT_TRUE(all_close(r.indices, idx_dt, 0, 0));
      EXPECT_EQ(r.indices.dtype(), kInt64);
    }
    EXPECT_TRUE(all_close(F::max_pool3d(x, c.kernel, c.args), want, 0, 0));
    // unbatched: the first sample
    const Tensor one = F::max_pool3d(x[0], c.kernel, c.args);
    EXPECT_TRUE(all_close(one, values(F::max_pool3d(x.narrow(0, 0, 1), c.kernel, c.args)), 0, 0));
  }
}

TEST(AvgPool3d, MatchesLoopReference) {
  struct Case {
    Shape x;
    Size3 kernel;
    F::AvgPool3dArgs args;
  };
  const Case cases[] = {
      {{2, 3, 5, 6, 7}, 2, {}},
      {{1, 2, 7, 5, 6}, {3, 2, 3}, {{{2, 1, 2}}, {1, 1, 1}, false, true, std::nullopt}},
      {{1, 2, 7, 5, 6}, {3, 2, 3}, {{{2, 1, 2}}, {1, 1, 1}, true, false, std::nullopt}},
      {{2, 1, 6, 7, 5}, 3, {{{2, 2, 1}}, {1, 0, 1}, true, true, std::nullopt}},
      {{1, 3, 5, 5, 8}, {2, 3, 3}, {{{2, 2, 3}}, {1, 1, 0}, true, false, 5}},
  };
  Generator g(82);
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("x {} kernel {} padding {} ceil {} include_pad {} divisor {}", c.x, c.kernel,
                             c.args.padding, c.args.ceil_mode, c.args.count_include_pad,
                             c.args.divisor_override.value_or(0)));
    const Tensor x = randn(c.x, kFloat64, &g);
    const std::vector<double> want = avg_pool3d_loop(x, c.kernel, c.args);
    for (DType dt : {kFloat64, kFloat32, kFloat16}) {
      const Tensor y = F::avg_pool3d(x.to(dt), c.kernel, c.args);
      EXPECT_EQ(y.dtype(), dt);
      EXPECT_TRUE(all_close(y, want, tol_for(dt), tol_for(dt))) << dtype_name(dt);
    }
    EXPECT_EQ(F::avg_pool3d(x[0], c.kernel, c.args).dim(), 4);
  }
}

TEST(AdaptiveAvgPool3d, MatchesLoopReference) {
  Generator g(83);
  const Tensor x = randn({2, 3, 7, 5, 6}, kFloat64, &g);
  for (Size3 out : {Size3(1), Size3(3, 2, 4), Size3(7, 5, 6), Size3(4, 5, 1)}) {
    const std::vector<double> want = adaptive_avg_pool3d_loop(x, out);
    for (DType dt : {kFloat64, kFloat32}) {
      const Tensor y = F::adaptive_avg_pool3d(x.to(dt), out);
      EXPECT_EQ(y.shape(), (Shape{2, 3, out.d, out.h, out.w}));
      EXPECT_TRUE(all_close(y, want, tol_for(dt), tol_for(dt))) << fmt::format("{} {}", out, dtype_name(dt));
    }
  }
  EXPECT_EQ(F::adaptive_avg_pool3d(x[1], {2, 2, 2}).shape(), (Shape{3, 2, 2, 2}));
}

TEST(AdaptiveMaxPool3d, MatchesLoopReference) {
  Generator g(87);
  const Tensor x = randn({2, 3, 7, 5, 6}, kFloat64, &g);
  const std::vector<double> xv = values(x);
  auto start = [](int64_t o, int64_t n, int64_t m) { return o * n / m; };
  auto end = [](int64_t o, int64_t n, int64_t m) { return ((o + 1) * n + m - 1) / m; };
  for (Size3 out : {Size3(1), Size3(3, 2, 4), Size3(7, 5, 3), Size3(4, 5, 1)}) {
    std::vector<double> want;
    for (int64_t pl = 0; pl < 6; ++pl)
      for (int64_t o0 = 0; o0 < out.d; ++o0)
        for (int64_t o1 = 0; o1 < out.h; ++o1)
          for (int64_t o2 = 0; o2 < out.w; ++o2) {
            double best = -std::numeric_limits<double>::infinity();
            for (int64_t p0 = start(o0, 7, out.d); p0 < end(o0, 7, out.d); ++p0)
              for (int64_t p1 = start(o1, 5, out.h); p1 < end(o1, 5, out.h); ++p1)
                for (int64_t p2 = start(o2, 6, out.w); p2 < end(o2, 6, out.w); ++p2)
                  best = std::max(best, xv[pl * 210 + (p0 * 5 + p1) * 6 + p2]);
            want.push_back(best);
          }
    EXPECT_TRUE(all_close(F::adaptive_max_pool3d(x, out), want, 0, 0)) << fmt::format("{}", out);
    EXPECT_TRUE(all_close(nn::AdaptiveMaxPool3d(out)(x[1]), std::vector<double>(want.begin() + want.size() / 2,
                                                                                 want.end()),
                          0, 0));
  }
}

TEST(Pool3d, FiniteDifferenceGradients) {
  Generator g(84);
  // distinct values keep max pooling differentiable at the test points
  const Tensor distinct = randperm(400, TensorOptions(kInt64), &g).to(kFloat64).view({2, 2, 5, 4, 5}) * 0.1;
  std::vector<Tensor> x = {leaf(distinct)};
  const F::MaxPool3dArgs ma{Size3{2, 1, 2}, 1, {1, 2, 1}, true};
  EXPECT_TRUE(gradcheck([&](V t) { return F::max_pool3d(t[0], {3, 2, 2}, ma); }, x));
  EXPECT_TRUE(gradcheck([&](V t) { return F::adaptive_max_pool3d(t[0], {2, 3, 2}); }, x));
  std::vector<Tensor> y = {leaf(randn({2, 2, 5, 4, 5}, kFloat64, &g), strata::testing::Layout::Transposed)};
  const F::AvgPool3dArgs aa{{{2, 1, 2}}, {1, 1, 0}, true, false, std::nullopt};
  EXPECT_TRUE(gradcheck([&](V t) { return F::avg_pool3d(t[0], {3, 2, 2}, aa); }, y));
  EXPECT_TRUE(gradcheck([&](V t) { return F::adaptive_avg_pool3d(t[0], {3, 3, 2}); }, y));
}

TEST(MaxPool3d, GradientLandsOnTheArgmax) {
  Generator g(85);
  Tensor x = randn({2, 3, 5, 6, 4}, kFloat64, &g);
  x.requires_grad_();
  nn::MaxPool3d pool({2, 3, 2}, {.stride = Size3{1, 2, 2}, .padding = {1, 1, 0}});
  const F::MaxPoolResult r = pool.forward_with_indices(x);
  EXPECT_TRUE(all_close(pool(x), values(r.output), 0, 0));
  const Tensor gy = randn(r.output.shape(), kFloat64, &g);
  (r.output * gy).sum().backward();
  std::vector<double> want(static_cast<size_t>(x.numel()), 0.0);
  const std::vector<double> idx = values(r.indices), gyv = values(gy);
  const int64_t per_plane = r.output.numel() / 6, volume = 5 * 6 * 4;
  for (size_t i = 0; i < idx.size(); ++i)
    want[static_cast<size_t>(static_cast<int64_t>(i) / per_plane * volume + static_cast<int64_t>(idx[i]))] += gyv[i];
  EXPECT_TRUE(all_close(x.grad(), want, 1e-12, 1e-12));
}

TEST(MaxPool3d, WindowOfEqualValuesPicksItsFirstElementNotThePadding) {
  // PyTorch's kernel starts each window's argmax at its first element inside the input, so a
  // window of -inf (a masked region) names that element and its gradient lands there, never on
  // the padding; with dilation the first tap inside is not the clamped window start.
  const double inf = std::numeric_limits<double>::infinity();
  Tensor x = full({1, 1, 3, 3, 3}, -inf, TensorOptions(kFloat64));
  x.requires_grad_();
  const F::MaxPoolResult r = F::max_pool3d_with_indices(x, 2, {.padding = 1});
  EXPECT_EQ(values(r.indices), (std::vector<double>{0, 1, 3, 4, 9, 10, 12, 13}));
  r.output.sum().backward();
  std::vector<double> want(27, 0.0);
  for (int64_t i : {0, 1, 3, 4, 9, 10, 12, 13}) want[static_cast<size_t>(i)] = 1;
  EXPECT_TRUE(all_close(x.grad(), want, 0, 0));

  const Tensor column = full({1, 1, 3, 1, 1}, -inf, TensorOptions(kFloat64));  // taps -1 and 1 first
  const F::MaxPool3dArgs dilated{.stride = Size3(1), .padding = {1, 0, 0}, .dilation = {2, 1, 1}};
  EXPECT_EQ(values(F::max_pool3d_with_indices(column, {2, 1, 1}, dilated).indices), (std::vector<double>{1, 0, 1}));
}

TEST(Pool3d, LayersAndBadArgumentsRaise) {
  Generator g(86);
  const Tensor x = randn({2, 3, 4, 5, 6}, kFloat32, &g);
  EXPECT_TRUE(all_close(nn::AvgPool3d(2, {.count_include_pad = false})(x), values(F::avg_pool3d(x, 2)), 0, 0));
  EXPECT_EQ(nn::AdaptiveAvgPool3d({1, 2, 3})(x).shape(), (Shape{2, 3, 1, 2, 3}));
  EXPECT_TRUE(throws_with([&] { F::max_pool3d(randn({3, 4, 5}), 2); }, {"[max_pool3d]", "5-d (N, C, D, H, W)"}));
  EXPECT_TRUE(throws_with([&] { F::max_pool3d(x, {2, 0, 2}); }, {"[max_pool3d]", "kernel_size", "(2, 0, 2)"}));
  EXPECT_TRUE(throws_with([&] { F::max_pool3d(x, 2, {.padding = {2, 0, 0}}); },
                          {"[max_pool3d]", "padding (2, 0, 0)", "at most half"}));
  EXPECT_TRUE(throws_with([&] { F::max_pool3d(x, {5, 2, 2}); }, {"[max_pool3d]", "too small", "[2, 3, 4, 5, 6]"}));
  const F::MaxPool3dArgs only_padding{.stride = Size3(1), .padding = {1, 0, 0}, .dilation = {2, 1, 1}};
  EXPECT_TRUE(throws_with([&] { F::max_pool3d(randn({1, 1, 1, 3, 3}), {2, 1, 1}, only_padding); },
                          {"[max_pool3d]", "holds only padding"}));
  EXPECT_TRUE(throws_with([&] { F::avg_pool3d(x, 2, {.divisor_override = 0}); }, {"[avg_pool3d]", "nonzero"}));
  EXPECT_TRUE(throws_with([&] { F::avg_pool3d(x.to(kInt64), 2); }, {"[avg_pool3d]", "floating"}));
  EXPECT_TRUE(throws_with([&] { F::adaptive_avg_pool3d(x, {1, 0, 1}); }, {"[adaptive_avg_pool3d]", "output_size"}));
  EXPECT_TRUE(throws_with([&] { F::adaptive_avg_pool3d(randn({2, 0, 4, 5, 6}), 1); }, {"non-empty"}));
  EXPECT_TRUE(throws_with([] { nn::MaxPool3d({0, 1, 1}); }, {"[MaxPool3d]", "kernel_size must be positive"}));
  EXPECT_TRUE(throws_with([] { nn::AdaptiveAvgPool3d(0); }, {"[AdaptiveAvgPool3d]"}));
  EXPECT_TRUE(throws_with([&] { F::adaptive_max_pool3d(randn({5, 6, 7}), 1); }, {"[adaptive_max_pool3d]", "(N, C, D"}));
  EXPECT_TRUE(throws_with([&] { F::adaptive_max_pool3d(x, {2, 2, 0}); }, {"[adaptive_max_pool3d]", "(2, 2, 0)"}));
}
