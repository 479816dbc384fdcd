// conv2d, conv_transpose2d and the Conv2d / ConvTranspose2d layers against plain 7-loop
// float64 references written here: forward values and all three gradients, over
// stride/padding/dilation/groups combinations (depthwise included), odd sizes, NCHW,
// channels-last and non-dense inputs, float32 (oneDNN) and float64 (im2col reference);
// finite-difference gradient checks in float64; and bad input.
#include <cmath>
#include <thread>

#include "nn/image_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::Arr4;
using strata::testing::as_image;
using strata::testing::expected_format;
using strata::testing::gradcheck;
using strata::testing::has_format;
using strata::testing::Image;
using strata::testing::throws_with;
using strata::testing::values;
namespace F = strata::nn::functional;
using nn::Size2;
using V = const std::vector<Tensor>&;

namespace {

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw;
  Size2 stride = 1, padding = 0, dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  F::Conv2dArgs args() const { return {stride, padding, dilation, groups}; }
  int64_t oh() const { return (h + 2 * padding.h - dilation.h * (kh - 1) - 1) / stride.h + 1; }
  int64_t ow() const { return (w + 2 * padding.w - dilation.w * (kw - 1) - 1) / stride.w + 1; }
};

const std::vector<ConvCase>& conv_cases() {
  static const std::vector<ConvCase> all = {
      {2, 3, 7, 5, 4, 3, 3},                               // plain, odd sizes
      {2, 4, 9, 8, 6, 3, 3, 2, 1, 1, 2},                   // stride 2, padding, 2 groups
      {1, 6, 7, 7, 6, 3, 3, 1, 1, 1, 6, false},            // depthwise, no bias
      {2, 4, 6, 5, 8, 3, 3, 1, 1, 1, 4},                   // depthwise with multiplier 2
      {3, 4, 10, 9, 8, 3, 2, {2, 1}, {1, 0}, {2, 1}, 1},   // asymmetric kernel, stride, dilation
      {2, 8, 5, 6, 4, 1, 1},                               // 1x1
      {1, 3, 4, 4, 5, 5, 5, 1, 2},                         // kernel larger than the input
      {2, 6, 11, 7, 9, 3, 3, 3, 2, 2, 3},                  // stride 3, dilation 2, 3 groups
      {2, 5, 9, 7, 7, 2, 2, 2},                            // the last window stops short of the edge
      {1, 16, 6, 6, 16, 3, 3, 1, 1},                       // channels in oneDNN's blocking
  };
  return all;
}

struct ConvRef {
  Arr4 y, gx, gw;
  std::vector<double> gb;
};

// The 7-loop convolution, and its gradients for an output gradient g when given.
ConvRef conv_reference(const ConvCase& k, const Arr4& x, const Arr4& w, const std::vector<double>& b,
                       const Arr4* g = nullptr) {
  const int64_t oh = k.oh(), ow = k.ow(), og = k.o / k.groups, cg = k.c / k.groups;
  ConvRef r{Arr4(k.n, k.o, oh, ow), Arr4(k.n, k.c, k.h, k.w), Arr4(k.o, cg, k.kh, k.kw),
            std::vector<double>(static_cast<size_t>(k.o), 0.0)};
  for (int64_t n = 0; n < k.n; ++n)
    for (int64_t oc = 0; oc < k.o; ++oc)
      for (int64_t oy = 0; oy < oh; ++oy)
        for (int64_t ox = 0; ox < ow; ++ox) {
          double s = k.bias ? b[oc] : 0.0;
          const double gv = g ? (*g)(n, oc, oy, ox) : 0.0;
          r.gb[oc] += gv;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t ky = 0; ky < k.kh; ++ky)
              for (int64_t kx = 0; kx < k.kw; ++kx) {
                const int64_t iy = oy * k.stride.h - k.padding.h + ky * k.dilation.h;
                const int64_t ix = ox * k.stride.w - k.padding.w + kx * k.dilation.w;
                if (iy < 0 || iy >= k.h || ix < 0 || ix >= k.w) continue;
                const int64_t c = (oc / og) * cg + ci;
                s += x(n, c, iy, ix) * w(oc, ci, ky, kx);
                r.gx(n, c, iy, ix) += gv * w(oc, ci, ky, kx);
                r.gw(oc, ci, ky, kx) += gv * x(n, c, iy, ix);
              }
          r.y(n, oc, oy, ox) = s;
        }
  return r;
}

double tol(DType t) { return t == kFloat64 ? 1e-10 : 2e-4; }

struct Operands {
  Tensor x, w, b;  // float64, contiguous
};

Operands random_operands(const ConvCase& k, uint64_t seed) {
  Generator g(seed);
  return {randn({k.n, k.c, k.h, k.w}, kFloat64, &g), randn({k.o, k.c / k.groups, k.kh, k.kw}, kFloat64, &g),
          randn({k.o}, kFloat64, &g)};
}

}  // namespace

// ---- conv2d -------------------------------------------------------------------------------------

TEST(Conv2d, ForwardMatchesReferenceInEveryLayout) {
  uint64_t seed = 1;
  for (const ConvCase& k : conv_cases()) {
    const Operands op = random_operands(k, seed++);
    const ConvRef ref = conv_reference(k, Arr4(op.x), Arr4(op.w), values(op.b));
    for (DType dt : {kFloat32, kFloat64})
      for (Image l : strata::testing::all_images()) {
        SCOPED_TRACE(fmt::format("case {} {} {}", seed - 1, dt, strata::testing::image_name(l)));
        Tensor x = as_image(op.x.to(dt), l);
        // weights too are read in any layout: channels-last for every other case
        Tensor w = seed % 2 ? op.w.to(dt).to(MemoryFormat::ChannelsLast) : op.w.to(dt);
        Tensor y = F::conv2d(x, w, k.bias ? op.b.to(dt) : Tensor(), k.args());
        ASSERT_EQ(y.shape(), ref.y.shape());
        EXPECT_EQ(y.dtype(), dt);
        EXPECT_TRUE(has_format(y, expected_format(x, l)));
        EXPECT_TRUE(all_close(y, ref.y.v, tol(dt), tol(dt)));
      }
  }
}

TEST(Conv2d, GradientsMatchReference) {
  uint64_t seed = 100;
  for (const ConvCase& k : conv_cases()) {
    const Operands op = random_operands(k, seed++);
    Generator gen(seed);
    const Tensor gy = randn({k.n, k.o, k.oh(), k.ow()}, kFloat64, &gen);
    const Arr4 g(gy);
    const ConvRef ref = conv_reference(k, Arr4(op.x), Arr4(op.w), values(op.b), &g);
    for (DType dt : {kFloat32, kFloat64})
      for (Image l : {Image::NCHW, Image::NHWC, Image::Sliced}) {
        SCOPED_TRACE(fmt::format("case {} {} {}", seed - 1, dt, strata::testing::image_name(l)));
        Tensor x = as_image(op.x.to(dt), l).requires_grad_();
        Tensor w = op.w.to(dt).detach().requires_grad_();
        Tensor b = op.b.to(dt).detach().requires_grad_();
        Tensor y = F::conv2d(x, w, k.bias ? b : Tensor(), k.args());
        // the upstream gradient arrives in the output's layout
        std::vector<Tensor> grads = autograd::grad({y}, {x, w}, {as_image(gy.to(dt), l)});
        EXPECT_TRUE(has_format(grads[0], expected_format(x, l)));
        EXPECT_TRUE(all_close(grads[0], ref.gx.v, tol(dt), tol(dt))) << "input";
        EXPECT_TRUE(all_close(grads[1], ref.gw.v, tol(dt), 10 * tol(dt))) << "weight";
        if (k.bias) {
          Tensor gb = autograd::grad({F::conv2d(x, w, b, k.args())}, {b}, {gy.to(dt)})[0];
          EXPECT_TRUE(all_close(gb, ref.gb, tol(dt), 10 * tol(dt))) << "bias";
        }
      }
  }
}

TEST(Conv2d, FiniteDifferenceGradients) {
  const ConvCase cases[] = {{2, 4, 5, 4, 4, 3, 2, {2, 1}, 1, {1, 2}, 2}, {1, 3, 4, 5, 3, 3, 3, 1, 1, 1, 3},
                            {2, 2, 4, 4, 3, 2, 2, 2}};
  uint64_t seed = 200;
  for (const ConvCase& k : cases)
    for (Image l : {Image::NCHW, Image::NHWC}) {
      SCOPED_TRACE(strata::testing::image_name(l));
      const Operands op = random_operands(k, seed++);
      Tensor x = as_image(op.x, l).requires_grad_();
      Tensor w = op.w.clone().requires_grad_(), b = op.b.clone().requires_grad_();
      EXPECT_TRUE(gradcheck([&](V in) { return F::conv2d(in[0], in[1], in[2], k.args()); }, {x, w, b}));
    }
}

TEST(Conv2d, UnbatchedEmptyBatchAndHalfPrecision) {
  const ConvCase k{3, 4, 6, 5, 6, 3, 3, 1, 1, 1, 2};
  const Operands op = random_operands(k, 300);
  Tensor y = F::conv2d(op.x, op.w, op.b, k.args());
  // (C, H, W) is one image
  EXPECT_TRUE(all_close(F::conv2d(op.x[1], op.w, op.b, k.args()), values(y[1]), 1e-12, 1e-12));
  // an empty batch gives an empty result and zero weight gradients
  Tensor e = zeros({0, 4, 6, 5}, kFloat64).requires_grad_();
  Tensor w = op.w.clone().requires_grad_();
  Tensor ye = F::conv2d(e, w, Tensor(), k.args());
  EXPECT_EQ(ye.shape(), (Shape{0, 6, 6, 5}));
  ye.sum().backward();
  EXPECT_TRUE(all_close(w.grad(), std::vector<double>(static_cast<size_t>(w.numel()), 0.0), 0, 0));
  // bfloat16 and float16 compute in float32 and round
  for (DType dt : {kBFloat16, kFloat16}) {
    Tensor yh = F::conv2d(op.x.to(dt), op.w.to(dt), op.b.to(dt), k.args());
    EXPECT_EQ(yh.dtype(), dt);
    Tensor ref = F::conv2d(op.x.to(dt).to(kFloat64), op.w.to(dt).to(kFloat64), op.b.to(dt).to(kFloat64), k.args());
    EXPECT_TRUE(all_close(yh, values(ref), 2e-2, 5e-2));
  }
}

TEST(Conv2d, ConcurrentCallsAgree) {
  // primitives are cached and shared between threads; each thread runs its own shapes
  std::vector<ConvCase> ks = {conv_cases()[0], conv_cases()[1], conv_cases()[4], conv_cases()[9]};
  std::vector<Operands> ops;
  std::vector<Tensor> want;
  for (size_t i = 0; i < ks.size(); ++i) {
    ops.push_back(random_operands(ks[i], 400 + i));
    want.push_back(F::conv2d(ops[i].x.to(kFloat32), ops[i].w.to(kFloat32), ops[i].b.to(kFloat32), ks[i].args()));
  }
  std::vector<int> ok(ks.size(), 0);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ks.size(); ++i)
    threads.emplace_back([&, i] {
      bool good = true;
      for (int rep = 0; rep < 5; ++rep) {
        Tensor x = ops[i].x.to(kFloat32);
        if (rep % 2) x = x.to(MemoryFormat::ChannelsLast);
        Tensor y = F::conv2d(x, ops[i].w.to(kFloat32), ops[i].b.to(kFloat32), ks[i].args());
        good = good && static_cast<bool>(all_close(y, values(want[i]), 1e-4, 1e-4));
      }
      ok[i] = good;
    });
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < ks.size(); ++i) EXPECT_TRUE(ok[i]) << "thread " << i;
}

// ---- conv_transpose2d -----------------------------------------------------------------------------

namespace {

struct TransposeCase {
  int64_t n, c, h, w, o, kh, kw;  // c: input channels, o: output channels
  Size2 stride = 1, padding = 0, output_padding = 0, dilation = 1;
  int64_t groups = 1;
  bool bias = true;
  F::ConvTranspose2dArgs args() const { return {stride, padding, output_padding, groups, dilation}; }
  int64_t oh() const { return (h - 1) * stride.h - 2 * padding.h + dilation.h * (kh - 1) + output_padding.h + 1; }
  int64_t ow() const { return (w - 1) * stride.w - 2 * padding.w + dilation.w * (kw - 1) + output_padding.w + 1; }
};

const std::vector<TransposeCase>& transpose_cases() {
  static const std::vector<TransposeCase> all = {
      {2, 4, 5, 4, 6, 3, 3, 2, 1, 1, 1, 2},
      {1, 3, 4, 5, 2, 2, 3, {2, 3}, {0, 1}, {1, 2}, 1},
      {2, 6, 3, 3, 6, 3, 3, 1, 1, 0, 2, 6, false},  // depthwise, dilated
      {1, 2, 4, 4, 3, 3, 3, 1, 0, 1, 2},            // output_padding >= stride (below dilation)
      {2, 16, 5, 5, 8, 4, 4, 2, 1},                 // a decoder's upsampling step
  };
  return all;
}

// y[n, oc, iy*s - p + ky*d, ix*s - p + kx*d] += x[n, ic, iy, ix] * w[ic, oc', ky, kx]
Arr4 transpose_reference(const TransposeCase& k, const Arr4& x, const Arr4& w, const std::vector<double>& b) {
  const int64_t oh = k.oh(), ow = k.ow(), cg = k.c / k.groups, og = k.o / k.groups;
  Arr4 y(k.n, k.o, oh, ow);
  for (int64_t n = 0; n < k.n; ++n) {
    for (int64_t oc = 0; oc < k.o; ++oc)
      for (int64_t i = 0; i < oh * ow; ++i) y(n, oc, i / ow, i % ow) = k.bias ? b[oc] : 0.0;
    for (int64_t ic = 0; ic < k.c; ++ic)
      for (int64_t iy = 0; iy < k.h; ++iy)
        for (int64_t ix = 0; ix < k.w; ++ix)
          for (int64_t ol = 0; ol < og; ++ol)
            for (int64_t ky = 0; ky < k.kh; ++ky)
              for (int64_t kx = 0; kx < k.kw; ++kx) {
                const int64_t oy = iy * k.stride.h - k.padding.h + ky * k.dilation.h;
                const int64_t ox = ix * k.stride.w - k.padding.w + kx * k.dilation.w;
                if (oy < 0 || oy >= oh || ox < 0 || ox >= ow) continue;
                y(n, (ic / cg) * og + ol, oy, ox) += x(n, ic, iy, ix) * w(ic, ol, ky, kx);
              }
  }
  return y;
}

Operands random_operands(const TransposeCase& k, uint64_t seed) {
  Generator g(seed);
  return {randn({k.n, k.c, k.h, k.w}, kFloat64, &g), randn({k.c, k.o / k.groups, k.kh, k.kw}, kFloat64, &g),
          randn({k.o}, kFloat64, &g)};
}

}  // namespace

TEST(ConvTranspose2d, ForwardMatchesReference) {
  uint64_t seed = 500;
  for (const TransposeCase& k : transpose_cases()) {
    const Operands op = random_operands(k, seed++);
    const Arr4 ref = transpose_reference(k, Arr4(op.x), Arr4(op.w), values(op.b));
    for (DType dt : {kFloat32, kFloat64})
      for (Image l : {Image::NCHW, Image::NHWC, Image::Sliced, Image::SlicedNHWC}) {
        SCOPED_TRACE(fmt::format("case {} {} {}", seed - 1, dt, strata::testing::image_name(l)));
        Tensor x = as_image(op.x.to(dt), l);
        Tensor y = F::conv_transpose2d(x, op.w.to(dt), k.bias ? op.b.to(dt) : Tensor(), k.args());
        ASSERT_EQ(y.shape(), ref.shape());
        EXPECT_TRUE(has_format(y, expected_format(x, l)));
        EXPECT_TRUE(all_close(y, ref.v, tol(dt), tol(dt)));
      }
  }
}

TEST(ConvTranspose2d, FiniteDifferenceGradients) {
  uint64_t seed = 600;
  for (size_t i : {0u, 1u, 3u})
    for (Image l : {Image::NCHW, Image::NHWC}) {
      const TransposeCase& k = transpose_cases()[i];
      SCOPED_TRACE(fmt::format("case {} {}", i, strata::testing::image_name(l)));
      const Operands op = random_operands(k, seed++);
      Tensor x = as_image(op.x, l).requires_grad_();
      Tensor w = op.w.clone().requires_grad_(), b = op.b.clone().requires_grad_();
      EXPECT_TRUE(gradcheck([&](V in) { return F::conv_transpose2d(in[0], in[1], in[2], k.args()); }, {x, w, b}));
    }
}

TEST(ConvTranspose2d, Float32GradientsMatchFloat64) {
  // float32 runs oneDNN (backward-data as the forward, forward and backward-weights as the
  // backward); float64 runs the reference path checked above by finite differences
  uint64_t seed = 700;
  for (const TransposeCase& k : transpose_cases()) {
    const Operands op = random_operands(k, seed++);
    Generator gen(seed);
    Tensor gy = randn({k.n, k.o, k.oh(), k.ow()}, kFloat64, &gen);
    std::vector<std::vector<double>> want;
    for (DType dt : {kFloat64, kFloat32})
      for (Image l : {Image::NCHW, Image::NHWC}) {
        Tensor x = as_image(op.x.to(dt), l).requires_grad_();
        Tensor w = op.w.to(dt).detach().requires_grad_(), b = op.b.to(dt).detach().requires_grad_();
        Tensor y = F::conv_transpose2d(x, w, b, k.args());
        std::vector<Tensor> g = autograd::grad({y}, {x, w, b}, {gy.to(dt)});
        if (dt == kFloat64 && l == Image::NCHW) {
          for (const Tensor& t : g) want.push_back(values(t));
          continue;
        }
        SCOPED_TRACE(fmt::format("case {} {} {}", seed - 1, dt, strata::testing::image_name(l)));
        for (size_t j = 0; j < 3; ++j) EXPECT_TRUE(all_close(g[j], want[j], 1e-4, 1e-3)) << "gradient " << j;
      }
  }
}

// ---- the layers -------------------------------------------------------------------------------------

TEST(Conv2dLayer, ParametersInitAndForward) {
  Generator g(7);
  nn::Conv2d conv(6, 8, {3, 2}, {.stride = 2, .padding = 1, .groups = 2, .generator = &g});
  EXPECT_EQ(conv.weight.shape(), (Shape{8, 3, 3, 2}));
  EXPECT_EQ(conv.bias.shape(), (Shape{8}));
  auto sd = conv.state_dict();
  ASSERT_EQ(sd.size(), 2u);
  EXPECT_TRUE(sd.count("weight") && sd.count("bias"));
  // kaiming_uniform(a = sqrt(5)) and the bias both give U(+-1/sqrt(fan_in)), fan_in = 3*3*2
  const double bound = 1.0 / std::sqrt(18.0);
  for (const Tensor& p : {conv.weight, conv.bias}) {
    double mx = 0;
    for (double v : values(p)) mx = std::max(mx, std::fabs(v));
    EXPECT_LE(mx, bound);
    EXPECT_GT(mx, 0.6 * bound);
  }
  Generator g2(7);
  nn::Conv2d same(6, 8, {3, 2}, {.stride = 2, .padding = 1, .groups = 2, .generator = &g2});
  EXPECT_TRUE(all_close(same.weight, values(conv.weight), 0, 0));

  Tensor x = randn({2, 6, 7, 6}, kFloat32, &g);
  Tensor y = conv(x);
  EXPECT_EQ(y.shape(), (Shape{2, 8, 4, 4}));
  EXPECT_TRUE(all_close(y, values(F::conv2d(x, conv.weight, conv.bias, {2, 1, 1, 2})), 1e-6, 1e-6));
  Tensor ycl = conv(x.to(MemoryFormat::ChannelsLast));
  EXPECT_TRUE(has_format(ycl, MemoryFormat::ChannelsLast));
  EXPECT_TRUE(all_close(ycl, values(y), 1e-5, 1e-5));
  EXPECT_EQ(conv(x[0]).shape(), (Shape{8, 4, 4}));

  nn::Conv2d plain(3, 4, 1, {.bias = false});
  EXPECT_FALSE(plain.bias.defined());
  EXPECT_EQ(plain.state_dict().size(), 1u);
}

TEST(ConvTranspose2dLayer, ParametersAndForward) {
  Generator g(8);
  nn::ConvTranspose2d up(4, 6, 3, {.stride = 2, .padding = 1, .output_padding = 1, .groups = 2, .generator = &g});
  EXPECT_EQ(up.weight.shape(), (Shape{4, 3, 3, 3}));
  EXPECT_EQ(up.bias.shape(), (Shape{6}));
  const double bound = 1.0 / std::sqrt(27.0);  // fan_in = weight.size(1) * kH * kW
  double mx = 0;
  for (double v : values(up.weight)) mx = std::max(mx, std::fabs(v));
  EXPECT_LE(mx, bound);
  Tensor x = randn({2, 4, 5, 5}, kFloat32, &g);
  Tensor y = up(x);
  EXPECT_EQ(y.shape(), (Shape{2, 6, 10, 10}));
  EXPECT_TRUE(all_close(y, values(F::conv_transpose2d(x, up.weight, up.bias, {2, 1, 1, 2})), 1e-6, 1e-6));
}

// ---- bad input ---------------------------------------------------------------------------------------

TEST(Conv2d, BadInputRaises) {
  Generator g(9);
  Tensor x = randn({2, 4, 8, 8}, kFloat32, &g), w = randn({6, 4, 3, 3}, kFloat32, &g);
  // rank
  EXPECT_TRUE(throws_with([&] { F::conv2d(randn({4, 8}), w); }, {"[conv2d]", "4-d"}));
  EXPECT_TRUE(throws_with([&] { F::conv2d(randn({1, 2, 4, 8, 8}), w); }, {"[conv2d]", "4-d"}));
  EXPECT_TRUE(throws_with([&] { F::conv2d(x, randn({6, 4, 3})); }, {"[conv2d]", "weight"}));
  // channels and groups
  EXPECT_TRUE(throws_with([&] { F::conv2d(randn({2, 5, 8, 8}), w); }, {"[conv2d]", "5 channels", "[6, 4, 3, 3]"}));
  EXPECT_TRUE(throws_with([&] { F::conv2d(x, randn({6, 2, 3, 3}), Tensor(), {.groups = 4}); }, {"divisible"}));
  EXPECT_TRUE(throws_with([&] { F::conv2d(x, randn({6, 2, 3, 3}), Tensor(), {.groups = 3}); }, {"channels"}));
  // arguments
  EXPECT_TRUE(throws_with([&] { F::conv2d(x, w, Tensor(), {.stride = 0}); }, {"stride"}));
  EXPECT_TRUE(throws_with([&] { F::conv2d(x, w, Tensor(), {.stride = {1, -2}}); }, {"stride"}));
  EXPECT_TRUE(throws_with([&] { F::conv2d(x, w, Tensor(), {.stride = {int64_t(1) << 31, 1}}); }, {"stride", "2^31"}));
  EXPECT_TRUE(throws_with([&] { F::conv2d(x, w, Tensor(), {.padding = -1}); }, {"padding"}));
  EXPECT_TRUE(throws_with([&] { F::conv2d(x, w, Tensor(), {.dilation = 0}); }, {"dilation"}));
  EXPECT_TRUE(throws_with([&] { F::conv2d(x, w, Tensor(), {.groups = 0}); }, {"groups"}));
  EXPECT_TRUE(throws_with([&] { F::conv2d(x, w, Tensor(), {.groups = -1}); }, {"groups"}));
  EXPECT_TRUE(throws_with([&] { F::conv2d(x, zeros({6, 4, 0, 3})); }, {"kernel size"}));
  // output size
  EXPECT_TRUE(throws_with([&] { F::conv2d(randn({1, 4, 2, 2}), w); }, {"too small"}));
  EXPECT_TRUE(throws_with([&] { F::conv2d(x, w, Tensor(), {.dilation = 4}); }, {"too small"}));
  // dtypes, bias
  EXPECT_TRUE(throws_with([&] { F::conv2d(x, w.to(kFloat64)); }, {"same dtype"}));
  EXPECT_TRUE(throws_with([&] { F::conv2d(x.to(kInt32), w.to(kInt32)); }, {"floating"}));
  EXPECT_TRUE(throws_with([&] { F::conv2d(x, w, randn({5})); }, {"bias"}));
  EXPECT_TRUE(throws_with([&] { F::conv2d(Tensor(), w); }, {"undefined"}));
}

TEST(Conv2dLayer, BadConfigurationAndInputRaise) {
  EXPECT_TRUE(throws_with([] { nn::Conv2d(3, 4, 3, {.groups = 2}); }, {"Conv2d", "divisible by groups"}));
  EXPECT_TRUE(throws_with([] { nn::Conv2d(4, 6, 3, {.groups = 4}); }, {"out_channels", "divisible"}));
  EXPECT_TRUE(throws_with([] { nn::Conv2d(3, 4, 0); }, {"kernel_size"}));
  EXPECT_TRUE(throws_with([] { nn::Conv2d(3, 4, {3, -1}); }, {"kernel_size"}));
  EXPECT_TRUE(throws_with([] { nn::Conv2d(3, 4, 3, {.stride = 0}); }, {"stride"}));
  EXPECT_TRUE(throws_with([] { nn::Conv2d(3, 4, 3, {.groups = 0}); }, {"groups"}));
  EXPECT_TRUE(throws_with([] { nn::Conv2d(0, 4, 3); }, {"in_channels"}));
  EXPECT_TRUE(throws_with([] { nn::ConvTranspose2d(4, 4, 3, {.stride = 2, .output_padding = 2}); },
                          {"output_padding"}));
  nn::Conv2d conv(3, 4, 3);
  EXPECT_TRUE(throws_with([&] { conv(randn({2, 5, 8, 8})); }, {"Conv2d(3, 4", "3 input channels", "[2, 5, 8, 8]"}));
  EXPECT_TRUE(throws_with([&] { conv(randn({3, 8})); }, {"Conv2d(3, 4", "2-d", "[3, 8]"}));
  EXPECT_TRUE(throws_with([&] { conv(randn({1, 1, 3, 8, 8})); }, {"Conv2d(3, 4", "5-d"}));
  EXPECT_TRUE(throws_with([&] { conv(randn({1, 3, 2, 8})); }, {"too small"}));
  nn::ConvTranspose2d up(3, 4, 3);
  EXPECT_TRUE(throws_with([&] { up(randn({2, 4, 5, 5})); }, {"ConvTranspose2d", "3 input channels"}));
  EXPECT_TRUE(throws_with([&] { F::conv_transpose2d(randn({1, 3, 4, 4}), randn({3, 2, 3, 3}), Tensor(),
                                                    {.stride = 2, .output_padding = 2}); },
                          {"output_padding"}));
  EXPECT_TRUE(throws_with([&] { F::conv_transpose2d(randn({1, 3, 4, 4}), randn({3, 2, 3, 3}), Tensor(),
                                                    {.padding = 4}); },
                          {"empty output"}));
}

// The backwards of conv, batch norm and pooling run kernels that are not recorded: asking for
// a gradient of them (create_graph) is refused by name, not answered with the part that goes
// through them missing. First-order gradients with create_graph still work where nothing
// needs their graph.
TEST(Conv2d, DoubleBackwardIsRefusedByName) {
  auto second_order = [](const std::function<Tensor(const Tensor&)>& f) {
    Tensor x = randn({1, 2, 4, 4}, kFloat64);
    x.requires_grad_();
    Tensor y = f(x);
    Tensor loss = (y * y).sum() + (x * x).sum() * 0.5;  // another path to x, as a penalty would add
    Tensor gx = autograd::grad({loss}, {x}, {}, std::nullopt, /*create_graph=*/true)[0];
    return autograd::grad({gx.sum()}, {x})[0];
  };
  nn::Conv2d conv(2, 2, 3, {.padding = 1});
  conv.to(kFloat64);
  nn::BatchNorm2d bn(2);
  bn.to(kFloat64);
  auto refused = [&](const std::function<Tensor(const Tensor&)>& f, const char* op) {
    return throws_with([&] { second_order(f); }, {op, "double backward"});
  };
  EXPECT_TRUE(refused([&](const Tensor& x) { return conv(x); }, "[conv2d]"));
  EXPECT_TRUE(refused([&](const Tensor& x) { return bn(x); }, "[batch_norm]"));
  EXPECT_TRUE(refused([](const Tensor& x) { return nn::functional::max_pool2d(x, 2); }, "[max_pool2d]"));
  EXPECT_TRUE(refused([](const Tensor& x) { return nn::functional::avg_pool2d(x, 2); }, "[avg_pool2d]"));
  EXPECT_TRUE(
      refused([](const Tensor& x) { return nn::functional::adaptive_avg_pool2d(x, 1); }, "[adaptive_avg_pool2d]"));
  // without create_graph the same gradients come as before
  Tensor x = randn({1, 2, 4, 4}, kFloat64);
  x.requires_grad_();
  Tensor g = autograd::grad({conv(x).sum()}, {x})[0];
  EXPECT_EQ(g.shape(), x.shape());
}
