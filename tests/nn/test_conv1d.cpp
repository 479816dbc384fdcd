// conv1d against a plain-loop float64 reference written here (also on transposed sequences
// and unbatched); conv_transpose1d as its adjoint; finite differences; the Conv1d and
// ConvTranspose1d layers; the padding modes of Conv1d and Conv2d (a convolution over the input
// padded by functional::pad, which test_resample checks element by element); bad input.
#include <algorithm>
#include <cmath>

#include "nn/image_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::gradcheck;
using strata::testing::throws_with;
using strata::testing::values;
namespace F = strata::nn::functional;
using V = const std::vector<Tensor>&;

namespace {

struct Conv1dCase {
  int64_t n, c, l, o, k, stride = 1, padding = 0, dilation = 1, groups = 1;
  int64_t out_len() const { return (l + 2 * padding - dilation * (k - 1) - 1) / stride + 1; }
};

// y[n, o, i] = b[o] + sum over the group's channels and the taps of x[n, c, i s - p + t d] w[o, c, t].
std::vector<double> conv1d_reference(const Conv1dCase& k, const std::vector<double>& x, const std::vector<double>& w,
                                     const std::vector<double>& b) {
  const int64_t L = k.out_len(), cg = k.c / k.groups, og = k.o / k.groups;
  std::vector<double> y(static_cast<size_t>(k.n * k.o * L));
  for (int64_t n = 0; n < k.n; ++n)
    for (int64_t o = 0; o < k.o; ++o)
      for (int64_t i = 0; i < L; ++i) {
        double s = b.empty() ? 0.0 : b[static_cast<size_t>(o)];
        for (int64_t ci = 0; ci < cg; ++ci)
          for (int64_t t = 0; t < k.k; ++t) {
            const int64_t pos = i * k.stride - k.padding + t * k.dilation;
            if (pos < 0 || pos >= k.l) continue;
            const int64_t c = (o / og) * cg + ci;
            s += x[static_cast<size_t>((n * k.c + c) * k.l + pos)] * w[static_cast<size_t>((o * cg + ci) * k.k + t)];
          }
        y[static_cast<size_t>((n * k.o + o) * L + i)] = s;
      }
  return y;
}

}  // namespace

TEST(Conv1d, MatchesReference) {
  const Conv1dCase cases[] = {{2, 3, 9, 4, 3}, {2, 4, 11, 6, 3, 2, 1, 1, 2}, {1, 6, 10, 6, 3, 1, 2, 2, 6},
                              {3, 2, 7, 5, 1}, {2, 4, 13, 4, 4, 3, 2, 2, 1}};
  Generator g(31);
  for (const Conv1dCase& k : cases)
    for (DType dt : {kFloat64, kFloat32}) {
      SCOPED_TRACE(fmt::format("c {} l {} k {} stride {} {}", k.c, k.l, k.k, k.stride, dtype_name(dt)));
      const Tensor x = randn({k.n, k.c, k.l}, kFloat64, &g), w = randn({k.o, k.c / k.groups, k.k}, kFloat64, &g);
      const Tensor b = randn({k.o}, kFloat64, &g);
      const std::vector<double> want = conv1d_reference(k, values(x), values(w), values(b));
      const F::Conv1dArgs a{k.stride, k.padding, k.dilation, k.groups};
      const double tol = dt == kFloat64 ? 1e-12 : 1e-5;
      const Tensor y = F::conv1d(x.to(dt), w.to(dt), b.to(dt), a);
      EXPECT_EQ(y.shape(), (Shape{k.n, k.o, k.out_len()}));
      EXPECT_TRUE(all_close(y, want, tol, tol));
      // a (N, L, C) sequence transposed to (N, C, L), as a transformer's activations are
      const Tensor xt = x.to(dt).transpose(1, 2).contiguous().transpose(1, 2);
      EXPECT_TRUE(all_close(F::conv1d(xt, w.to(dt), b.to(dt), a), want, tol, tol));
      // unbatched
      EXPECT_TRUE(all_close(F::conv1d(x[0].to(dt), w.to(dt), b.to(dt), a), values(y[0]), tol, tol));
    }
}

TEST(Conv1d, FiniteDifferenceGradients) {
  Generator g(32);
  const F::Conv1dArgs a{2, 1, 2, 2};
  Tensor x = randn({2, 4, 9}, kFloat64, &g).requires_grad_();
  Tensor w = randn({6, 2, 3}, kFloat64, &g).requires_grad_(), b = randn({6}, kFloat64, &g).requires_grad_();
  EXPECT_TRUE(gradcheck([&](V in) { return F::conv1d(in[0], in[1], in[2], a); }, {x, w, b}));
  Tensor wt = randn({4, 3, 3}, kFloat64, &g).requires_grad_(), bt = randn({6}, kFloat64, &g).requires_grad_();
  const F::ConvTranspose1dArgs at{2, 1, 1, 2, 1};
  EXPECT_TRUE(gradcheck([&](V in) { return F::conv_transpose1d(in[0], in[1], in[2], at); }, {x, wt, bt}));
}

TEST(ConvTranspose1d, IsTheGradientOfConv1d) {
  // <conv_transpose1d(g, w), x> = <g, conv1d(x, w)> for every x and g: the adjoint
  Generator g(33);
  const F::Conv1dArgs a{3, 2, 2, 2};
  const Tensor x = randn({2, 4, 14}, kFloat64, &g), w = randn({6, 2, 3}, kFloat64, &g);
  const Tensor y = F::conv1d(x, w, Tensor(), a);
  const Tensor gy = randn(y.shape(), kFloat64, &g);
  const int64_t output_padding = x.size(2) - ((y.size(2) - 1) * 3 - 4 + 2 * 2 + 1);
  const Tensor gx = F::conv_transpose1d(gy, w, Tensor(), {3, 2, output_padding, 2, 2});
  ASSERT_EQ(gx.shape(), x.shape());
  EXPECT_NEAR(sum(gx * x).item<double>(), sum(gy * y).item<double>(), 1e-9);
}

TEST(Conv1dLayer, ParametersInitAndForward) {
  Generator g(34);
  nn::Conv1d conv(4, 6, 3, {.stride = 2, .padding = 1, .groups = 2, .generator = &g});
  EXPECT_EQ(conv.weight.shape(), (Shape{6, 2, 3}));
  EXPECT_EQ(conv.bias.shape(), (Shape{6}));
  EXPECT_EQ(conv.state_dict().size(), 2u);
  const double bound = 1.0 / std::sqrt(6.0);  // fan_in = 2 channels * 3 taps
  for (const Tensor& p : {conv.weight, conv.bias}) {
    double mx = 0;
    for (double v : values(p)) mx = std::max(mx, std::fabs(v));
    EXPECT_LE(mx, bound);
    EXPECT_GT(mx, 0.5 * bound);
  }
  const Tensor x = randn({2, 4, 9}, kFloat32, &g);
  EXPECT_TRUE(all_close(conv(x), values(F::conv1d(x, conv.weight, conv.bias, {2, 1, 1, 2})), 1e-6, 1e-6));
  nn::ConvTranspose1d up(6, 4, 4, {.stride = 2, .padding = 1, .generator = &g});
  EXPECT_EQ(up.weight.shape(), (Shape{6, 4, 4}));
  EXPECT_EQ(up(conv(x)).shape(), (Shape{2, 4, 10}));
}

TEST(ConvLayers, PaddingModesPadBeforeTheConvolution) {
  Generator g(35);
  using F::PadMode;
  using nn::PaddingMode;
  const std::pair<PaddingMode, PadMode> modes[] = {
      {PaddingMode::Reflect, PadMode::Reflect},
      {PaddingMode::Replicate, PadMode::Replicate},
      {PaddingMode::Circular, PadMode::Circular}};
  for (auto [layer_mode, pad_mode] : modes) {
    SCOPED_TRACE(static_cast<int>(pad_mode));
    // 1-d: a convolution without padding over the input padded by the reference rule
    nn::Conv1d c1(3, 4, 3, {.padding = 2, .padding_mode = layer_mode, .generator = &g});
    const Tensor x1 = randn({2, 3, 6}, kFloat64, &g);
    c1.to(kFloat64);
    const Tensor want1 = F::conv1d(F::pad(x1, {2, 2}, pad_mode), c1.weight, c1.bias);
    const Tensor y1 = c1(x1);
    EXPECT_EQ(y1.shape(), (Shape{2, 4, 8}));
    EXPECT_TRUE(all_close(y1, values(want1), 1e-12, 1e-12));
    // 2-d with different padding per dim
    nn::Conv2d c2(2, 3, 3, {.stride = 2, .padding = {1, 2}, .padding_mode = layer_mode, .generator = &g});
    c2.to(kFloat64);
    const Tensor x2 = randn({1, 2, 5, 6}, kFloat64, &g);
    const Tensor want2 = F::conv2d(F::pad(x2, {2, 2, 1, 1}, pad_mode), c2.weight, c2.bias, {.stride = 2});
    EXPECT_TRUE(all_close(c2(x2), values(want2), 1e-12, 1e-12));
  }
  // reflect on [a, b, c, d] by 2 gives [c, b, a, b, c, d, c, b]: checked through a 1-tap identity
  nn::Conv1d identity(1, 1, 1, {.padding = 2, .bias = false, .padding_mode = PaddingMode::Reflect});
  {
    NoGradGuard no_grad;
    identity.weight.fill_(1);
  }
  EXPECT_TRUE(all_close(identity(tensor({1.0f, 2.0f, 3.0f, 4.0f}).view({1, 1, 4})), {3, 2, 1, 2, 3, 4, 3, 2}, 0, 0));
}

TEST(Conv1d, BadInputRaises) {
  const Tensor x = randn({2, 4, 9}), w = randn({6, 2, 3});
  EXPECT_TRUE(throws_with([&] { F::conv1d(randn({2, 4, 9, 1}), w); }, {"[conv1d]", "(N, C, L)"}));
  EXPECT_TRUE(throws_with([&] { F::conv1d(x, randn({6, 2, 3, 1})); }, {"[conv1d]", "3-d weight"}));
  EXPECT_TRUE(throws_with([&] { F::conv1d(x, w); }, {"[conv1d]", "4 channels", "takes 2"}));
  EXPECT_TRUE(throws_with([&] { F::conv1d(x, w, Tensor(), {.groups = 0}); }, {"groups must be positive"}));
  nn::Conv1d conv(4, 6, 3);
  EXPECT_TRUE(throws_with([&] { conv(randn({2, 5, 9})); }, {"[Conv1d(4, 6, kernel_size=3, stride=1)]", "5 channels"}));
  EXPECT_TRUE(throws_with([&] { conv(randn({9})); }, {"(N, 4, L) or (4, L)"}));
  EXPECT_TRUE(throws_with([&] { nn::Conv1d(4, 6, 0); }, {"[Conv1d", "kernel_size must be positive"}));
  EXPECT_TRUE(throws_with([&] { nn::ConvTranspose1d(4, 6, 3, {.padding_mode = nn::PaddingMode::Reflect}); },
                          {"[ConvTranspose1d", "zeros only"}));
  EXPECT_TRUE(throws_with([&] { nn::ConvTranspose2d(4, 6, 3, {.padding_mode = nn::PaddingMode::Circular}); },
                          {"[ConvTranspose2d", "zeros only"}));
  nn::Conv2d reflect(2, 2, 3, {.padding = 3, .padding_mode = nn::PaddingMode::Reflect});
  EXPECT_TRUE(throws_with([&] { reflect(randn({1, 2, 3, 3})); }, {"[pad]", "reflect"}));
}
