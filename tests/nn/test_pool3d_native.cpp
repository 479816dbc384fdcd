// The native 3-d pooling ops beyond test_pool3d's loop references: the shared window math
// (kernels/common/pool_window.h) against brute force, ties in max pooling (the first maximum
// wins and alone gets the gradient, as in PyTorch), gradients against float64 loops, bfloat16
// and float16 (computed in float), non-contiguous inputs, the results of the 2-d pools the ops
// used to be composed of, an empty batch, and untrusted indices.
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "kernels/common/pool_window.h"
#include "nn/nn_testing.h"

using namespace strata;
namespace F = strata::nn::functional;
namespace pm = strata::pool_math;
using strata::testing::all_close;
using strata::testing::throws_with;
using strata::testing::values;
using nn::Size3;

namespace {

int64_t at(Size3 s, int i) { return i == 0 ? s.d : i == 1 ? s.h : s.w; }

// One output's window along one dim: the input positions it reads and its padded length.
struct Span {
  std::vector<int64_t> pos;
  int64_t padded = 0;
};

enum class Kind { Max, Avg, Adaptive };

// Every output's window along a dim of size `in`, written from PyTorch's definitions.
std::vector<Span> spans(Kind kind, int64_t in, int64_t out, int64_t k, int64_t s, int64_t p, int64_t dil) {
  std::vector<Span> r(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    Span& w = r[static_cast<size_t>(o)];
    if (kind == Kind::Adaptive) {
      const auto b = static_cast<int64_t>(std::floor(double(o * in) / double(out)));
      const auto e = static_cast<int64_t>(std::ceil(double((o + 1) * in) / double(out)));
      for (int64_t i = b; i < e; ++i) w.pos.push_back(i);
    } else {
      for (int64_t t = 0; t < k; ++t) {
        const int64_t i = o * s - p + t * dil;
        if (i >= 0 && i < in) w.pos.push_back(i);
      }
      w.padded = std::min(o * s - p + k, in + p) - (o * s - p);
    }
  }
  return r;
}

// A pooling of (planes, D, H, W) float64 values as explicit windows.
struct Ref {
  std::vector<Span> dims[3];
  int64_t in[3];
  int64_t planes;

  int64_t in_volume() const { return in[0] * in[1] * in[2]; }
  int64_t outputs() const { return planes * int64_t(dims[0].size() * dims[1].size() * dims[2].size()); }

  // calls f(plane, output number, flat input index within the plane) for every window element
  template <class Fn> void each(const Fn& f) const {
    int64_t o = 0;
    for (int64_t pl = 0; pl < planes; ++pl)
      for (const Span& a : dims[0])
        for (const Span& b : dims[1])
          for (const Span& c : dims[2]) {
            for (int64_t i : a.pos)
              for (int64_t j : b.pos)
                for (int64_t l : c.pos) f(pl, o, (i * in[1] + j) * in[2] + l);
            ++o;
          }
  }

  // the first maximum in (d, h, w) order (a NaN wins) and its flat index
  void max(const std::vector<double>& x, std::vector<double>& y, std::vector<double>& idx) const {
    y.assign(size_t(outputs()), -std::numeric_limits<double>::infinity());
    idx.assign(size_t(outputs()), -1);
    each([&](int64_t pl, int64_t o, int64_t i) {
      const double v = x[size_t(pl * in_volume() + i)];
      if (idx[size_t(o)] < 0 || v > y[size_t(o)] || std::isnan(v)) y[size_t(o)] = v, idx[size_t(o)] = double(i);
    });
  }

  std::vector<double> divisors(bool adaptive, bool include_pad, int64_t divisor) const {
    std::vector<double> d;
    for (int64_t pl = 0; pl < planes; ++pl)
      for (const Span& a : dims[0])
        for (const Span& b : dims[1])
          for (const Span& c : dims[2]) {
            const double inside = double(a.pos.size() * b.pos.size() * c.pos.size());
            d.push_back(divisor ? double(divisor)
                        : adaptive || !include_pad ? inside
                                                   : double(a.padded * b.padded * c.padded));
          }
    return d;
  }

  std::vector<double> mean(const std::vector<double>& x, const std::vector<double>& div) const {
    std::vector<double> y(size_t(outputs()), 0.0);
    each([&](int64_t pl, int64_t o, int64_t i) { y[size_t(o)] += x[size_t(pl * in_volume() + i)] / div[size_t(o)]; });
    return y;
  }

  // the gradient of mean: each output's gradient spread over its window
  std::vector<double> mean_grad(const std::vector<double>& gy, const std::vector<double>& div) const {
    std::vector<double> gx(size_t(planes * in_volume()), 0.0);
    each([&](int64_t pl, int64_t o, int64_t i) { gx[size_t(pl * in_volume() + i)] += gy[size_t(o)] / div[size_t(o)]; });
    return gx;
  }
};

Ref make_ref(Kind kind, const Shape& x, Size3 out, Size3 k = 1, Size3 s = 1, Size3 p = 0, Size3 dil = 1) {
  Ref r{};
  r.planes = x[0] * x[1];
  for (int i = 0; i < 3; ++i) {
    r.in[i] = x[2 + i];
    r.dims[i] = spans(kind, r.in[i], at(out, i), at(k, i), at(s, i), at(p, i), at(dil, i));
  }
  return r;
}

Size3 out_size(const Tensor& y) { return {y.size(2), y.size(3), y.size(4)}; }

// gx of a max pooling: gy scattered to the indices
std::vector<double> scatter(const Tensor& x, const std::vector<double>& gy, const std::vector<double>& idx) {
  const int64_t per_plane = int64_t(gy.size()) / (x.size(0) * x.size(1));
  const int64_t volume = x.size(2) * x.size(3) * x.size(4);
  std::vector<double> gx(size_t(x.numel()), 0.0);
  for (size_t o = 0; o < gy.size(); ++o) gx[size_t(int64_t(o) / per_plane * volume + int64_t(idx[o]))] += gy[o];
  return gx;
}

}  // namespace

TEST(PoolWindowMath, OutputsHoldingFindsEveryWindowThatHoldsAnInput) {
  for (bool adaptive : {false, true})
    for (int64_t in : {1, 5, 9})
      for (int64_t k : {1, 2, 3})
        for (int64_t s : {1, 2, 3})
          for (int64_t dil : {1, 2})
            for (int64_t p = 0; p <= ((k - 1) * dil + 1) / 2; ++p) {
              const int64_t out = adaptive ? s + k : strata::testing::pool_out(in, k, s, p, dil, s > 1);
              if (out <= 0) continue;
              const pm::PoolDim d{in, out, k, s, p, dil};
              for (int64_t i = 0; i < in; ++i) {
                std::set<int64_t> want, got;
                for (int64_t o = 0; o < out; ++o)
                  if (pm::window_holds(pm::window_taps(d, o, adaptive), i)) want.insert(o);
                const pm::OutRange r = pm::outputs_holding(d, i, adaptive);
                for (int64_t o = r.lo; o < r.hi; ++o)
                  if (pm::window_holds(pm::window_taps(d, o, adaptive), i)) got.insert(o);
                ASSERT_EQ(got, want) << fmt::format("adaptive {} in {} k {} s {} p {} dil {} i {}", adaptive, in, k,
                                                    s, p, dil, i);
              }
              // the taps are the windows of the definition
              const Kind kind = adaptive ? Kind::Adaptive : Kind::Max;
              const std::vector<Span> ref = spans(kind, in, out, k, s, p, dil);
              for (int64_t o = 0; o < out; ++o) {
                const pm::Taps t = pm::window_taps(d, o, adaptive);
                std::vector<int64_t> pos;
                for (int64_t j = 0; j < t.count; ++j) pos.push_back(t.start + j * t.step);
                ASSERT_EQ(pos, ref[size_t(o)].pos);
              }
            }
}

TEST(PoolWindowMath, PerOutputWindowsOfTheCudaKernelsMatchTheCpuRowLoops) {
  // pool_math::window_max / window_mean are what the CUDA kernels compute per output; the CPU
  // kernels run rows of windows instead
  Generator g(96);
  const Tensor x = round(randn({2, 3, 7, 6, 9}, kFloat64, &g) * 2);  // ties
  const std::vector<double> xv = values(x);
  auto check = [&](const pm::Pool3dShape& s, const F::MaxPoolResult& want, bool is_max) {
    const std::vector<double> y = values(want.output), idx = is_max ? values(want.indices) : std::vector<double>();
    const int64_t iv = pm::in_volume(s);
    int64_t o = 0;
    for (int64_t r = 0; r < s.planes; ++r)
      for (int64_t a = 0; a < s.dims[0].out; ++a)
        for (int64_t b = 0; b < s.dims[1].out; ++b)
          for (int64_t c = 0; c < s.dims[2].out; ++c, ++o) {
            if (is_max) {
              double best;
              int64_t at;
              pm::window_max(xv.data() + r * iv, s, a, b, c, best, at);
              ASSERT_EQ(best, y[size_t(o)]);
              ASSERT_EQ(double(at), idx[size_t(o)]);
            } else {
              ASSERT_NEAR(pm::window_mean<double>(xv.data() + r * iv, s, a, b, c), y[size_t(o)], 1e-12);
            }
          }
  };
  auto shape = [&](const Tensor& y, Size3 k, Size3 st, Size3 p, Size3 dil, bool adaptive) {
    pm::Pool3dShape s;
    s.planes = 6;
    for (int i = 0; i < 3; ++i) s.dims[i] = {x.size(2 + i), y.size(2 + i), at(k, i), at(st, i), at(p, i), at(dil, i)};
    s.adaptive = adaptive;
    return s;
  };
  const F::MaxPoolResult m = F::max_pool3d_with_indices(x, {3, 2, 3}, {Size3{2, 1, 2}, {1, 1, 1}, {1, 2, 1}, true});
  check(shape(m.output, {3, 2, 3}, {2, 1, 2}, 1, {1, 2, 1}, false), m, true);
  const F::MaxPoolResult am = F::adaptive_max_pool3d_with_indices(x, {4, 5, 4});
  check(shape(am.output, 1, 1, 0, 1, true), am, true);
  pm::Pool3dShape avg = shape(F::avg_pool3d(x, 3, {Size3(2), 1}), 3, 2, 1, 1, false);
  for (bool include_pad : {true, false})
    for (int64_t divisor : {0, 5}) {
      avg.count_include_pad = include_pad, avg.divisor = divisor;
      const F::AvgPool3dArgs args{Size3(2), 1, false, include_pad,
                                  divisor ? std::optional<int64_t>(divisor) : std::nullopt};
      check(avg, {F::avg_pool3d(x, 3, args), Tensor()}, false);
    }
  check(shape(F::adaptive_avg_pool3d(x, {4, 5, 4}), 1, 1, 0, 1, true), {F::adaptive_avg_pool3d(x, {4, 5, 4}), Tensor()},
        false);
}

TEST(MaxPool3dNative, TiesPickTheFirstMaximumWhichAloneGetsTheGradient) {
  Generator g(91);
  // values in {0, 1, 2}: most windows hold several equal maxima
  const Tensor x = randint(0, 3, {2, 2, 5, 6, 7}, TensorOptions(kInt64), &g).to(kFloat64);
  const std::vector<double> xv = values(x);
  struct Case {
    Size3 k, s, p, dil;
    bool ceil;
  };
  for (const Case& c : {Case{3, 1, 1, 1, false}, Case{{2, 3, 2}, {1, 2, 1}, {1, 1, 0}, {2, 1, 1}, true}}) {
    Tensor leaf = x.detach().requires_grad_();
    const F::MaxPoolResult r = F::max_pool3d_with_indices(leaf, c.k, {c.s, c.p, c.dil, c.ceil});
    std::vector<double> want, idx;
    make_ref(Kind::Max, x.shape(), out_size(r.output), c.k, c.s, c.p, c.dil).max(xv, want, idx);
    EXPECT_TRUE(all_close(r.output, want, 0, 0));
    EXPECT_TRUE(all_close(r.indices, idx, 0, 0));
    const Tensor gy = randn(r.output.shape(), kFloat64, &g);
    (r.output * gy).sum().backward();
    EXPECT_TRUE(all_close(leaf.grad(), scatter(x, values(gy), idx), 1e-12, 1e-12));
  }
  for (Size3 out : {Size3(2, 4, 3), Size3(5, 6, 7), Size3(3, 1, 5)}) {
    Tensor leaf = x.detach().requires_grad_();
    const F::MaxPoolResult r = F::adaptive_max_pool3d_with_indices(leaf, out);
    std::vector<double> want, idx;
    make_ref(Kind::Adaptive, x.shape(), out).max(xv, want, idx);
    EXPECT_TRUE(all_close(r.output, want, 0, 0)) << fmt::format("{}", out);
    EXPECT_TRUE(all_close(r.indices, idx, 0, 0)) << fmt::format("{}", out);
    const Tensor gy = randn(r.output.shape(), kFloat64, &g);
    (r.output * gy).sum().backward();
    EXPECT_TRUE(all_close(leaf.grad(), scatter(x, values(gy), idx), 1e-12, 1e-12));
  }
}

TEST(AvgPool3dNative, GradientsMatchLoopsForEveryAveragingRule) {
  Generator g(92);
  const Tensor x = randn({2, 3, 5, 7, 6}, kFloat64, &g);
  struct Case {
    Size3 k, s, p;
    bool ceil, include_pad;
    int64_t divisor;
  };
  for (const Case& c : {Case{3, 2, 1, true, true, 0}, Case{3, 2, 1, true, false, 0}, Case{{2, 3, 3}, 1, {1, 1, 0},
                                                                                          false, false, 7}}) {
    SCOPED_TRACE(fmt::format("k {} s {} p {} ceil {} include_pad {} divisor {}", c.k, c.s, c.p, c.ceil, c.include_pad,
                             c.divisor));
    Tensor leaf = x.detach().requires_grad_();
    const F::AvgPool3dArgs args{c.s, c.p, c.ceil, c.include_pad,
                                c.divisor ? std::optional<int64_t>(c.divisor) : std::nullopt};
    const Tensor y = F::avg_pool3d(leaf, c.k, args);
    const Ref ref = make_ref(Kind::Avg, x.shape(), out_size(y), c.k, c.s, c.p);
    const std::vector<double> div = ref.divisors(false, c.include_pad, c.divisor);
    EXPECT_TRUE(all_close(y, ref.mean(values(x), div), 1e-12, 1e-12));
    const Tensor gy = randn(y.shape(), kFloat64, &g);
    (y * gy).sum().backward();
    EXPECT_TRUE(all_close(leaf.grad(), ref.mean_grad(values(gy), div), 1e-12, 1e-12));
  }
  Tensor leaf = x.detach().requires_grad_();
  const Tensor y = F::adaptive_avg_pool3d(leaf, {3, 4, 4});
  const Ref ref = make_ref(Kind::Adaptive, x.shape(), {3, 4, 4});
  const Tensor gy = randn(y.shape(), kFloat64, &g);
  (y * gy).sum().backward();
  EXPECT_TRUE(all_close(leaf.grad(), ref.mean_grad(values(gy), ref.divisors(true, false, 0)), 1e-12, 1e-12));
}

TEST(Pool3dNative, HalfTypesComputeInFloat) {
  Generator g(93);
  const Tensor x64 = randn({2, 3, 6, 5, 7}, kFloat64, &g);
  for (DType dt : {kBFloat16, kFloat16}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = x64.to(dt), xr = x.to(kFloat64);  // the reference on the rounded values
    const double tol = dt == kBFloat16 ? 1e-2 : 2e-3;
    const F::MaxPoolResult m = F::max_pool3d_with_indices(x, {3, 2, 3}, {Size3{2, 1, 2}, {1, 1, 1}, 1, true});
    std::vector<double> want, idx;
    make_ref(Kind::Max, x.shape(), out_size(m.output), {3, 2, 3}, {2, 1, 2}, 1).max(values(xr), want, idx);
    EXPECT_TRUE(all_close(m.output, want, 0, 0));
    EXPECT_TRUE(all_close(m.indices, idx, 0, 0));
    // a window of 27 values: a sum rounded to dt at each step would be off by far more than tol
    Tensor leaf = x.detach().requires_grad_();
    const Tensor y = F::avg_pool3d(leaf, 3, {.stride = Size3(1), .padding = 1, .count_include_pad = false});
    const Ref ref = make_ref(Kind::Avg, x.shape(), out_size(y), 3, 1, 1);
    const std::vector<double> div = ref.divisors(false, false, 0);
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_TRUE(all_close(y, ref.mean(values(xr), div), tol, tol));
    const Tensor gy = randn(y.shape(), kFloat64, &g).to(dt);
    (y * gy).sum().backward();
    EXPECT_TRUE(all_close(leaf.grad(), ref.mean_grad(values(gy.to(kFloat64)), div), tol, tol));
    const Ref ad = make_ref(Kind::Adaptive, x.shape(), {4, 2, 3});
    EXPECT_TRUE(all_close(F::adaptive_avg_pool3d(x, {4, 2, 3}), ad.mean(values(xr), ad.divisors(true, false, 0)), tol,
                          tol));
    ad.max(values(xr), want, idx);
    EXPECT_TRUE(all_close(F::adaptive_max_pool3d_with_indices(x, {4, 2, 3}).indices, idx, 0, 0));
  }
}

TEST(Pool3dNative, NonContiguousInputsPoolAsTheirCopies) {
  Generator g(94);
  const Tensor base = randn({3, 2, 7, 6, 8}, kFloat64, &g);
  // channels and batch swapped, and a strided slice of depth and width
  for (const Tensor& x : {base.transpose(0, 1), base.narrow(2, 1, 5).narrow(4, 1, 6)}) {
    ASSERT_FALSE(x.is_contiguous());
    const Tensor copy = x.contiguous();
    const F::MaxPool3dArgs ma{Size3{2, 1, 2}, 1, 1, false};
    const auto a = F::max_pool3d_with_indices(x, 3, ma), b = F::max_pool3d_with_indices(copy, 3, ma);
    EXPECT_TRUE(all_close(a.output, values(b.output), 0, 0));
    EXPECT_TRUE(all_close(a.indices, values(b.indices), 0, 0));
    EXPECT_TRUE(all_close(F::avg_pool3d(x, 2, {.padding = 1}), values(F::avg_pool3d(copy, 2, {.padding = 1})), 0, 0));
    EXPECT_TRUE(all_close(F::adaptive_avg_pool3d(x, {2, 3, 4}), values(F::adaptive_avg_pool3d(copy, {2, 3, 4})), 0, 0));
    EXPECT_TRUE(all_close(F::adaptive_max_pool3d(x, {2, 3, 4}), values(F::adaptive_max_pool3d(copy, {2, 3, 4})), 0, 0));
    Tensor leaf = x.detach().requires_grad_();
    F::avg_pool3d(leaf, 3, {.stride = Size3(2), .padding = 1}).sum().backward();
    Tensor leaf_copy = copy.detach().requires_grad_();
    F::avg_pool3d(leaf_copy, 3, {.stride = Size3(2), .padding = 1}).sum().backward();
    EXPECT_EQ(leaf.grad().shape(), x.shape());
    EXPECT_TRUE(all_close(leaf.grad(), values(leaf_copy.grad()), 0, 0));
  }
}

TEST(Pool3dNative, MatchesTheTwoDPoolsItWasComposedOf) {
  // a depth-1 window is the 2-d pool of every depth slice; the adaptive max pool is its former
  // composition: adaptive_max_pool2d of every slice, then the maximum over each depth window
  Generator g(95);
  const Tensor x = randn({2, 3, 4, 7, 6}, kFloat64, &g);
  const Tensor planes = x.reshape({2, 12, 7, 6});
  auto as_volume = [](const Tensor& t) { return t.reshape({2, 3, 4, t.size(2), t.size(3)}); };
  const F::MaxPoolResult m3 = F::max_pool3d_with_indices(x, {1, 3, 2}, {Size3{1, 2, 1}, {0, 1, 1}, {1, 1, 2}, true});
  const F::MaxPoolResult m2 = F::max_pool2d_with_indices(planes, {3, 2}, {{{2, 1}}, {1, 1}, {1, 2}, true});
  EXPECT_TRUE(all_close(m3.output, values(as_volume(m2.output)), 0, 0));
  const Tensor depth = arange(4, TensorOptions(kInt64)).view({1, 1, 4, 1, 1}) * 42;  // d * H * W
  EXPECT_TRUE(all_close(m3.indices, values(as_volume(m2.indices) + depth), 0, 0));
  const F::AvgPool3dArgs a3{Size3{1, 2, 2}, {0, 1, 1}, true, false, std::nullopt};
  const F::AvgPool2dArgs a2{{{2, 2}}, {1, 1}, true, false, std::nullopt};
  EXPECT_TRUE(all_close(F::avg_pool3d(x, {1, 3, 3}, a3), values(as_volume(F::avg_pool2d(planes, 3, a2))), 1e-12, 0));
  EXPECT_TRUE(all_close(F::adaptive_avg_pool3d(x, {4, 3, 5}),
                        values(as_volume(F::adaptive_avg_pool2d(planes, {3, 5}))), 1e-12, 0));
  const Tensor slices = as_volume(F::adaptive_max_pool2d(planes, {3, 5}));  // (2, 3, 4, 3, 5)
  std::vector<Tensor> depth_windows;
  for (int64_t o = 0; o < 3; ++o) {
    const int64_t b = o * 4 / 3, e = ((o + 1) * 4 + 2) / 3;
    depth_windows.push_back(amax(slices.narrow(2, b, e - b), {2}));
  }
  EXPECT_TRUE(all_close(F::adaptive_max_pool3d(x, {3, 3, 5}), values(stack(depth_windows, 2)), 0, 0));
}

TEST(Pool3dNative, EmptyBatchAndUntrustedIndices) {
  Tensor empty_batch = zeros({0, 2, 4, 4, 4}, TensorOptions(kFloat32)).requires_grad_();
  const Tensor y = F::max_pool3d(empty_batch, 2) + F::avg_pool3d(empty_batch, 2) +
                   F::adaptive_max_pool3d(empty_batch, 2) + F::adaptive_avg_pool3d(empty_batch, 2);
  EXPECT_EQ(y.shape(), (Shape{0, 2, 2, 2, 2}));
  y.sum().backward();
  EXPECT_EQ(empty_batch.grad().shape(), empty_batch.shape());

  // the backward kernel checks each index against its plane before writing
  const Tensor gy = ones({1, 1, 2, 2, 2}, TensorOptions(kFloat32));
  const Tensor idx = full({1, 1, 2, 2, 2}, 64.0, TensorOptions(kInt64));  // one past a 4x4x4 plane
  Tensor gx = empty({1, 1, 4, 4, 4}, TensorOptions(kFloat32));
  const Tensor ins[2] = {gy, idx};
  nn::Pool3dParams p{2, 2, 0, 1};
  const KernelCall call{{ins, 2}, {&gx, 1}, &p};
  const KernelFn kernel = ext::get_kernel(OpId::max_pool3d_backward, DeviceType::CPU, kFloat32);
  EXPECT_TRUE(throws_with([&] { kernel(call); }, {"[max_pool3d_backward]", "outside"}));
}
