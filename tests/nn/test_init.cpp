// nn::init against PyTorch's formulas: fans and gains exactly, each initializer's range and
// moments statistically (fixed seeds, tolerances of several standard errors), orthogonality,
// and the default initialization of every layer with parameters.
#include <cmath>

#include "nn/nn_testing.h"

using namespace strata;
using strata::testing::throws_with;
using strata::testing::values;
namespace init = strata::nn::init;

namespace {

struct Stats {
  double min = INFINITY, max = -INFINITY, mean = 0, std = 0;
  int64_t n = 0;
};

Stats stats(const Tensor& t) {
  Stats s;
  std::vector<double> v = values(t);
  s.n = static_cast<int64_t>(v.size());
  for (double x : v) s.min = std::min(s.min, x), s.max = std::max(s.max, x), s.mean += x;
  s.mean /= static_cast<double>(s.n);
  for (double x : v) s.std += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(s.std / static_cast<double>(s.n - 1));
  return s;
}

// The sample mean and std of n draws with true std sigma lie within 5 standard errors.
void expect_moments(const Stats& s, double mean, double sigma) {
  const double n = static_cast<double>(s.n);
  EXPECT_NEAR(s.mean, mean, 5 * sigma / std::sqrt(n));
  EXPECT_NEAR(s.std, sigma, 5 * sigma / std::sqrt(2 * n));
}

// U(-bound, bound): inside the bound, reaching close to it, with std bound / sqrt(3).
void expect_uniform(const Tensor& t, double bound) {
  Stats s = stats(t);
  EXPECT_GE(s.min, -bound * (1 + 1e-6));
  EXPECT_LE(s.max, bound * (1 + 1e-6));
  EXPECT_GT(s.max, 0.99 * bound);
  EXPECT_LT(s.min, -0.99 * bound);
  expect_moments(s, 0, bound / std::sqrt(3.0));
}

double phi(double x) { return std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI); }
double cdf(double x) { return 0.5 * (1 + std::erf(x / std::sqrt(2.0))); }

}  // namespace

TEST(Init, FansAndGains) {
  init::Fans f = init::calculate_fan_in_and_fan_out(empty({5, 3}));
  EXPECT_EQ(f.fan_in, 3);
  EXPECT_EQ(f.fan_out, 5);
  f = init::calculate_fan_in_and_fan_out(empty({4, 6, 3, 2}));  // conv (out, in, kh, kw)
  EXPECT_EQ(f.fan_in, 36);
  EXPECT_EQ(f.fan_out, 24);
  EXPECT_TRUE(throws_with([] { init::calculate_fan_in_and_fan_out(empty({7})); }, {"at least 2 dims", "[7]"}));
  EXPECT_EQ(init::calculate_gain("linear"), 1.0);
  EXPECT_EQ(init::calculate_gain("conv2d"), 1.0);
  EXPECT_EQ(init::calculate_gain("sigmoid"), 1.0);
  EXPECT_DOUBLE_EQ(init::calculate_gain("tanh"), 5.0 / 3.0);
  EXPECT_DOUBLE_EQ(init::calculate_gain("relu"), std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(init::calculate_gain("leaky_relu"), std::sqrt(2.0 / (1 + 0.01 * 0.01)));
  EXPECT_DOUBLE_EQ(init::calculate_gain("leaky_relu", 0.2), std::sqrt(2.0 / 1.04));
  EXPECT_DOUBLE_EQ(init::calculate_gain("selu"), 0.75);
  EXPECT_TRUE(throws_with([] { init::calculate_gain("softplus"); }, {"calculate_gain", "softplus"}));
}

TEST(Init, UniformNormalAndConstants) {
  Generator g(1);
  Tensor t = empty({200, 150});
  init::uniform_(t, -0.5, 1.5, &g);
  Stats s = stats(t);
  EXPECT_GE(s.min, -0.5);
  EXPECT_LE(s.max, 1.5);
  expect_moments(s, 0.5, 2 / std::sqrt(12.0));
  init::normal_(t, 3, 0.25, &g);
  expect_moments(stats(t), 3, 0.25);
  init::constant_(t, 0.75);
  for (double v : values(t)) ASSERT_EQ(v, 0.75);
  init::zeros_(t);
  EXPECT_EQ(stats(t).max, 0.0);
  init::ones_(t);
  EXPECT_EQ(stats(t).min, 1.0);
  // the same generator state gives the same values, on float64 too
  Tensor a = empty({50}, kFloat64), b = empty({50}, kFloat64);
  Generator g1(5), g2(5);
  init::normal_(a, 0, 1, &g1);
  init::normal_(b, 0, 1, &g2);
  EXPECT_TRUE(equal(a, b));
  // parameters are initialized in place without recording a graph
  Tensor p = empty({10, 10}).requires_grad_();
  init::xavier_uniform_(p, 1, &g);
  EXPECT_TRUE(p.is_leaf());
  EXPECT_EQ(p.grad_fn(), nullptr);
}

TEST(Init, XavierBoundsAndStd) {
  Generator g(2);
  Tensor w = empty({300, 200});
  init::xavier_uniform_(w, 1, &g);
  expect_uniform(w, std::sqrt(6.0 / 500.0));
  init::xavier_uniform_(w, 5.0 / 3.0, &g);
  expect_uniform(w, 5.0 / 3.0 * std::sqrt(6.0 / 500.0));
  Tensor c = empty({32, 16, 5, 5});  // fans 400 and 800
  init::xavier_normal_(c, 2, &g);
  expect_moments(stats(c), 0, 2 * std::sqrt(2.0 / 1200.0));
}

TEST(Init, KaimingFanModesAndGains) {
  Generator g(3);
  Tensor c = empty({64, 32, 3, 3});  // fan_in 288, fan_out 576
  init::kaiming_uniform_(c, 0, "fan_in", "relu", &g);
  expect_uniform(c, std::sqrt(2.0) * std::sqrt(3.0 / 288));
  init::kaiming_uniform_(c, 0, "fan_out", "relu", &g);
  expect_uniform(c, std::sqrt(2.0) * std::sqrt(3.0 / 576));
  // a = sqrt(5) with leaky_relu, the Linear/Conv default, is exactly U(+-1/sqrt(fan_in))
  init::kaiming_uniform_(c, std::sqrt(5.0), "fan_in", "leaky_relu", &g);
  expect_uniform(c, 1 / std::sqrt(288.0));
  init::kaiming_normal_(c, 0, "fan_out", "relu", &g);
  expect_moments(stats(c), 0, std::sqrt(2.0 / 576));
  init::kaiming_normal_(c, 0.2, "fan_in", "leaky_relu", &g);
  expect_moments(stats(c), 0, std::sqrt(2.0 / 1.04) / std::sqrt(288.0));
  init::kaiming_normal_(c, 0, "fan_in", "tanh", &g);
  expect_moments(stats(c), 0, 5.0 / 3.0 / std::sqrt(288.0));
}

TEST(Init, TruncNormalRangeAndMoments) {
  Generator g(4);
  Tensor t = empty({100000});
  // an asymmetric window: mean 1, std 2 truncated to [0, 3]
  init::trunc_normal_(t, 1, 2, 0, 3, &g);
  Stats s = stats(t);
  EXPECT_GE(s.min, 0.0);
  EXPECT_LE(s.max, 3.0);
  EXPECT_LT(s.min, 0.01);
  EXPECT_GT(s.max, 2.99);
  const double al = (0 - 1) / 2.0, be = (3 - 1) / 2.0, z = cdf(be) - cdf(al);
  const double m = 1 + 2 * (phi(al) - phi(be)) / z;
  const double var = 4 * (1 + (al * phi(al) - be * phi(be)) / z - std::pow((phi(al) - phi(be)) / z, 2));
  expect_moments(s, m, std::sqrt(var));
  // the default window [-2, 2] around N(0, 0.02^2) is no truncation at all (100 sigma)
  init::trunc_normal_(t, 0, 0.02, -2, 2, &g);
  expect_moments(stats(t), 0, 0.02);
  // a window deep in the tail still stays inside it
  init::trunc_normal_(t, 0, 1, 4, 5, &g);
  s = stats(t);
  EXPECT_GE(s.min, 4.0);
  EXPECT_LE(s.max, 5.0);
  // std = 0 is the mean, clamped to the window
  Tensor c = empty({8});
  init::trunc_normal_(c, 0.5, 0, -1, 1, &g);
  for (double v : values(c)) EXPECT_EQ(v, 0.5);
  init::trunc_normal_(c, 3, 0, -1, 1, &g);
  for (double v : values(c)) EXPECT_EQ(v, 1.0);
  EXPECT_TRUE(throws_with([&] { init::trunc_normal_(c, 0, 1, 2, 1); }, {"trunc_normal_", "a <= b"}));
  EXPECT_TRUE(throws_with([&] { init::trunc_normal_(c, 0, -1); }, {"trunc_normal_", "std"}));
}

TEST(Init, OrthogonalGivesOrthonormalRowsOrColumns) {
  Generator g(5);
  // (rows, cols) -> Q^T Q = gain^2 I for tall, Q Q^T = gain^2 I for wide; dims past 1 flatten
  struct Case {
    Shape shape;
    double gain;
  };
  for (const Case& c : {Case{{40, 12}, 1.0}, Case{{6, 30}, 1.0}, Case{{9, 9}, 2.0}, Case{{4, 2, 3, 3}, 0.5}}) {
    SCOPED_TRACE(fmt::format("{}", c.shape));
    Tensor t = empty(c.shape);
    init::orthogonal_(t, c.gain, &g);
    const int64_t rows = c.shape[0], cols = t.numel() / rows;
    std::vector<double> q = values(t);  // (rows, cols)
    const bool tall = rows >= cols;
    const int64_t n = tall ? cols : rows, m = tall ? rows : cols;
    auto at = [&](int64_t vec, int64_t i) {  // component i of the vec-th column (tall) or row (wide)
      return tall ? q[i * cols + vec] : q[vec * cols + i];
    };
    for (int64_t a = 0; a < n; ++a)
      for (int64_t b = 0; b < n; ++b) {
        double dot = 0;
        for (int64_t i = 0; i < m; ++i) dot += at(a, i) * at(b, i);
        ASSERT_NEAR(dot, a == b ? c.gain * c.gain : 0.0, 1e-5) << a << "," << b;
      }
  }
  // not a fixed matrix: two draws differ, and the same seed repeats
  Tensor a = empty({5, 5}), b = empty({5, 5}), c = empty({5, 5});
  Generator g1(7), g2(7);
  init::orthogonal_(a, 1, &g1);
  init::orthogonal_(b, 1, &g1);
  init::orthogonal_(c, 1, &g2);
  EXPECT_FALSE(equal(a, b));
  EXPECT_TRUE(equal(a, c));
  EXPECT_TRUE(throws_with([] {
    Tensor v = empty({5});
    init::orthogonal_(v);
  }, {"orthogonal_", "2 dims"}));
}

TEST(Init, BadArgumentsRaise) {
  Tensor w = empty({4, 3});
  EXPECT_TRUE(throws_with([&] { init::kaiming_uniform_(w, 0, "fan_avg"); }, {"kaiming_uniform_", "fan_avg"}));
  EXPECT_TRUE(throws_with([&] { init::kaiming_normal_(w, 0, "fan_in", "swish"); }, {"swish"}));
  EXPECT_TRUE(throws_with([] {
    Tensor v = empty({3});
    init::xavier_uniform_(v);
  }, {"at least 2 dims"}));
  EXPECT_TRUE(throws_with([] {
    Tensor i = zeros({3, 3}, kInt64);
    init::normal_(i);
  }, {"normal_", "floating"}));
  EXPECT_TRUE(throws_with([] {
    Tensor z = empty({0, 3});
    init::kaiming_uniform_(z, 0, "fan_out");
  }, {"zero fan"}));
}

// ---- each layer's default initialization, as in torch.nn ---------------------------------------

TEST(DefaultInit, LinearConvAndEmbedding) {
  nn::Linear fc(256, 300);
  expect_uniform(fc.weight, 1 / 16.0);  // kaiming_uniform(a = sqrt(5)): 1 / sqrt(in_features)
  Stats b = stats(fc.bias);
  EXPECT_LE(std::max(-b.min, b.max), 1 / 16.0);
  nn::Conv2d conv(16, 64, 3);
  expect_uniform(conv.weight, 1 / 12.0);  // fan_in 16 * 3 * 3 = 144
  nn::ConvTranspose2d up(64, 16, 3);    // weight (in, out, kh, kw): fan_in = 16 * 9
  expect_uniform(up.weight, 1 / 12.0);
  nn::Embedding emb(300, 64);
  expect_moments(stats(emb.weight), 0, 1);
}

TEST(DefaultInit, NormalizationLayers) {
  nn::LayerNorm ln(Shape{3, 4});
  nn::RMSNorm rms(5);
  nn::GroupNorm gn(2, 6);
  nn::BatchNorm2d bn(7);
  for (const Tensor& t : {ln.weight, rms.weight, gn.weight, bn.weight, bn.running_var})
    for (double v : values(t)) EXPECT_EQ(v, 1.0);
  for (const Tensor& t : {ln.bias, gn.bias, bn.bias, bn.running_mean})
    for (double v : values(t)) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(ln.weight.shape(), (Shape{3, 4}));
  EXPECT_EQ(bn.num_batches_tracked.dtype(), kInt64);
  EXPECT_EQ(bn.num_batches_tracked.item<int64_t>(), 0);
  for (const Tensor& t : {ln.weight, rms.weight, gn.weight, bn.weight}) EXPECT_TRUE(t.requires_grad());
  EXPECT_FALSE(bn.running_mean.requires_grad());
}
