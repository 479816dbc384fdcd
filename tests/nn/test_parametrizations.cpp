// weight_norm and spectral_norm: w = g v / ||v|| against float64 sums done here, its gradients
// (through the module) against finite differences, sigma against the largest singular value
// from a float64 power iteration run to convergence here, the buffers' update in training only,
// PyTorch's state dict keys, training, and bad input.
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <strata/nn/parametrizations.hpp>
#include <strata/optim/sgd.hpp>

#include "nn/nn_testing.h"

using namespace strata;
namespace P = strata::nn::parametrize;
namespace PZ = strata::nn::utils::parametrizations;
using strata::testing::all_close;
using strata::testing::gradcheck;
using strata::testing::Mat;
using strata::testing::throws_with;
using strata::testing::values;

namespace {

std::set<std::string> keys(const nn::StateDict& d) {
  std::set<std::string> out;
  for (auto& [k, v] : d) out.insert(k);
  return out;
}

// The largest singular value of m: power iteration on m^T m in float64, run until it settles.
double largest_singular_value(const Mat& m) {
  std::vector<double> v(static_cast<size_t>(m.cols), 1.0), u(static_cast<size_t>(m.rows));
  double sigma = 0;
  for (int it = 0; it < 5000; ++it) {
    for (int64_t r = 0; r < m.rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < m.cols; ++c) s += m(r, c) * v[static_cast<size_t>(c)];
      u[static_cast<size_t>(r)] = s;
    }
    double norm = 0;
    for (int64_t c = 0; c < m.cols; ++c) {
      double s = 0;
      for (int64_t r = 0; r < m.rows; ++r) s += m(r, c) * u[static_cast<size_t>(r)];
      v[static_cast<size_t>(c)] = s;
      norm += s * s;
    }
    norm = std::sqrt(norm);
    for (double& x : v) x /= norm;
    const double next = std::sqrt(norm);  // ||m^T m v|| -> sigma^2
    if (std::abs(next - sigma) < 1e-15 * next) return next;
    sigma = next;
  }
  return sigma;
}

nn::Linear linear64(int64_t in, int64_t out, uint64_t seed) {
  Generator g(seed);
  nn::LinearOptions o;
  o.generator = &g;
  nn::Linear lin(in, out, o);
  lin.to(kFloat64);
  return lin;
}

}  // namespace

TEST(WeightNorm, KeysShapesAndValueAgainstTheFormula) {
  for (std::optional<int64_t> dim : {std::optional<int64_t>(0), std::optional<int64_t>(1), std::optional<int64_t>()}) {
    nn::Linear lin = linear64(5, 3, 1);
    const std::vector<double> w0 = values(lin.weight);
    PZ::weight_norm(lin, "weight", dim);
    EXPECT_EQ(keys(lin.state_dict()), (std::set<std::string>{"bias", "parametrizations.weight.original0",
                                                             "parametrizations.weight.original1"}));
    const auto& originals = P::parametrizations(lin, "weight").originals();
    const Shape g_shape = !dim ? Shape{} : *dim == 0 ? Shape{3, 1} : Shape{1, 5};
    EXPECT_EQ(originals[0].shape(), g_shape);
    EXPECT_TRUE(all_close(lin.weight, w0, 1e-14, 1e-15));  // registration keeps the value

    Generator g(2);
    originals[0].detach().copy_(randn(g_shape, kFloat64, &g));
    originals[1].detach().copy_(randn({3, 5}, kFloat64, &g));
    const std::vector<double> gv = values(originals[0]), v = values(originals[1]);
    std::vector<double> want(15);
    for (int o = 0; o < 3; ++o)
      for (int i = 0; i < 5; ++i) {
        double sq = 0;
        for (int a = 0; a < 3; ++a)
          for (int b = 0; b < 5; ++b)
            if (!dim || (*dim == 0 && a == o) || (*dim == 1 && b == i)) sq += v[a * 5 + b] * v[a * 5 + b];
        const double gi = !dim ? gv[0] : *dim == 0 ? gv[static_cast<size_t>(o)] : gv[static_cast<size_t>(i)];
        want[static_cast<size_t>(o * 5 + i)] = gi * v[static_cast<size_t>(o * 5 + i)] / std::sqrt(sq);
      }
    EXPECT_TRUE(all_close(P::get(lin, "weight"), want, 1e-13, 1e-15));
  }
}

TEST(WeightNorm, GradientsThroughTheModuleMatchFiniteDifferences) {
  nn::Conv2d conv(2, 3, 3);
  conv.to(kFloat64);
  PZ::weight_norm(conv);
  const auto& originals = P::parametrizations(conv, "weight").originals();
  EXPECT_EQ(originals[0].shape(), (Shape{3, 1, 1, 1}));
  Generator g(3);
  Tensor x = randn({2, 2, 5, 5}, kFloat64, &g);
  // each evaluation goes through the pre-hook, recomputing the weight from the perturbed originals
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>&) { return conv(x); }, {originals[0], originals[1]}));
}

TEST(WeightNorm, TrainingAConv2dReducesTheLoss) {
  nn::Conv2d conv(1, 2, 3);
  conv.to(kFloat64);
  PZ::weight_norm(conv);
  optim::SGD opt(conv.parameters(), {.lr = 0.1});
  Generator g(4);
  Tensor x = randn({4, 1, 6, 6}, kFloat64, &g), target = randn({4, 2, 4, 4}, kFloat64, &g);
  auto loss_now = [&] { return ((conv(x) - target) * (conv(x) - target)).mean(); };
  const double first = loss_now().item<double>();
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    loss_now().backward();
    for (const Tensor& o : P::parametrizations(conv, "weight").originals()) ASSERT_TRUE(o.grad().defined());
    opt.step();
  }
  EXPECT_LT(loss_now().item<double>(), 0.9 * first);
}

TEST(SpectralNorm, SigmaConvergesToTheLargestSingularValue) {
  nn::Linear lin = linear64(7, 5, 5);
  const Mat w(lin.weight.detach());
  const double sigma = largest_singular_value(w);
  PZ::spectral_norm(lin);
  EXPECT_EQ(keys(lin.state_dict()), (std::set<std::string>{"bias", "parametrizations.weight.original",
                                                           "parametrizations.weight.0._u",
                                                           "parametrizations.weight.0._v"}));
  Tensor x = ones({1, 7}, kFloat64);
  for (int i = 0; i < 200; ++i) lin(x);  // one power iteration each in training mode
  std::vector<double> want = w.v;
  for (double& e : want) e /= sigma;
  EXPECT_TRUE(all_close(lin.weight, want, 1e-9, 1e-12));
  EXPECT_NEAR(largest_singular_value(Mat(lin.weight.detach())), 1.0, 1e-9);

  // eval: the singular vectors stay as they are
  lin.eval();
  const Tensor u = lin.get_submodule("parametrizations.weight.0").named_buffers(false)[0].second;
  const std::vector<double> u_before = values(u);
  lin(x);
  lin(x);
  EXPECT_TRUE(all_close(u, u_before, 0, 0));
}

TEST(SpectralNorm, DimAndTransposedConvolutions) {
  nn::ConvTranspose2d up(4, 6, 3);  // weight (4, 6, 3, 3): dim 1 by default
  up.to(kFloat64);
  std::vector<double> wt = values(up.weight);
  PZ::spectral_norm(up);
  auto& p = P::parametrizations(up, "weight")[0];
  EXPECT_EQ(p.named_buffers(false)[0].second.shape(), (Shape{6}));
  for (int i = 0; i < 300; ++i) P::get(up, "weight");
  // the matrix of dim 1 against the rest: (6, 4 * 3 * 3)
  Mat m(6, 36);
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 6; ++b)
      for (int k = 0; k < 9; ++k) m(b, a * 9 + k) = wt[static_cast<size_t>((a * 6 + b) * 9 + k)];
  const double sigma = largest_singular_value(m);
  for (double& e : wt) e /= sigma;
  EXPECT_TRUE(all_close(up.weight, wt, 1e-9, 1e-12));
}

TEST(SpectralNorm, GradientsMatchFiniteDifferencesWithTheVectorsFixed) {
  nn::Linear lin = linear64(3, 4, 6);
  PZ::spectral_norm(lin);
  lin(ones({2, 3}, kFloat64)).sum().backward();
  const Tensor& original = P::parametrizations(lin, "weight").originals()[0];
  ASSERT_TRUE(original.grad().defined());
  // in eval mode u and v stay, so the weight is a fixed function of the original: W / (u . W v)
  lin.eval();
  Generator g(7);
  Tensor x = randn({2, 3}, kFloat64, &g);
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>&) { return lin(x); }, {original}));
}

TEST(SpectralNorm, FollowsTheModuleToAnotherDtype) {
  nn::Linear lin = linear64(3, 2, 8);
  PZ::spectral_norm(lin);
  lin.to(kFloat32);
  Tensor y = lin(ones({1, 3}));
  EXPECT_EQ(y.dtype(), kFloat32);
  EXPECT_EQ(lin.weight.dtype(), kFloat32);
  EXPECT_EQ(lin.get_submodule("parametrizations.weight.0").named_buffers(false)[0].second.dtype(), kFloat32);
}

TEST(Parametrizations, BadInputRaises) {
  nn::Linear lin = linear64(3, 2, 7);
  EXPECT_TRUE(throws_with([&] { PZ::weight_norm(lin, "weight", 2); }, {"weight_norm", "dim 2", "out of range"}));
  EXPECT_TRUE(throws_with([&] { PZ::weight_norm(lin, "weight", -3); }, {"dim -3"}));
  EXPECT_TRUE(throws_with([&] { PZ::spectral_norm(lin, "weight", 1, 1e-12, 2); },
                          {"spectral_norm", "dim 2", "out of range"}));
  EXPECT_TRUE(throws_with([&] { PZ::spectral_norm(lin, "weight", 0); }, {"n_power_iterations", "positive"}));
  EXPECT_TRUE(throws_with([&] { PZ::spectral_norm(lin, "kernel"); }, {"Linear", "no parameter or buffer", "kernel"}));
  EXPECT_TRUE(throws_with([&] { PZ::weight_norm(lin, "kernel"); }, {"kernel"}));
  EXPECT_FALSE(P::is_parametrized(lin));
  // a tensor parametrized by {g, v} cannot go back to one original
  PZ::weight_norm(lin);
  EXPECT_TRUE(throws_with([&] { P::remove_parametrizations(lin, "weight", false); }, {"2 tensors"}));
  const std::vector<double> w = values(lin.weight);
  P::remove_parametrizations(lin, "weight");
  EXPECT_TRUE(all_close(lin.weight, w, 0, 0));
  EXPECT_EQ(keys(lin.state_dict()), (std::set<std::string>{"bias", "weight"}));
}

TEST(WeightNorm, NegativeDimsBelowMinusOneCountFromTheEnd) {
  // PyTorch's norm_except_dim: -1 is the whole tensor, -2, -3, ... wrap as dims do
  nn::Conv2d conv(2, 3, 3);  // weight (3, 2, 3, 3)
  conv.to(kFloat64);
  const std::vector<double> w = values(conv.weight);
  PZ::weight_norm(conv, "weight", -3);  // dim 1
  const auto& originals = P::parametrizations(conv, "weight").originals();
  ASSERT_EQ(originals[0].shape(), (Shape{1, 2, 1, 1}));
  std::vector<double> want(2, 0.0);  // the norm of each input channel's weights
  for (size_t i = 0; i < w.size(); ++i) want[(i / 9) % 2] += w[i] * w[i];
  for (double& n : want) n = std::sqrt(n);
  EXPECT_TRUE(all_close(originals[0], want, 1e-14, 0));
  EXPECT_TRUE(all_close(P::get(conv, "weight"), w, 1e-14, 1e-15));

  nn::Linear lin = linear64(5, 3, 9);
  PZ::weight_norm(lin, "weight", -2);  // dim 0
  EXPECT_EQ(P::parametrizations(lin, "weight").originals()[0].shape(), (Shape{3, 1}));
  nn::Linear wide = linear64(5, 3, 9);
  EXPECT_TRUE(throws_with([&] { PZ::weight_norm(wide, "weight", -3); }, {"weight_norm", "dim -3", "out of range"}));
  EXPECT_FALSE(P::is_parametrized(wide));
}

TEST(WeightNorm, RemovalKeepsTheWeightTrainableWhileEitherOriginalIs) {
  nn::Linear lin = linear64(3, 2, 10);
  PZ::weight_norm(lin);
  P::parametrizations(lin, "weight").originals()[0].requires_grad_(false);  // g frozen, v trained
  P::remove_parametrizations(lin, "weight");
  EXPECT_TRUE(lin.weight.requires_grad());
  PZ::weight_norm(lin);
  for (const Tensor& o : P::parametrizations(lin, "weight").originals()) o.requires_grad_(false);
  P::remove_parametrizations(lin, "weight");
  EXPECT_FALSE(lin.weight.requires_grad());
}

TEST(SpectralNorm, ANegativeDimCountsFromTheEnd) {
  nn::Linear lin = linear64(7, 5, 11);  // weight (5, 7)
  PZ::spectral_norm(lin, "weight", 1, 1e-12, -1);
  const auto buffers = P::parametrizations(lin, "weight")[0].named_buffers(false);
  EXPECT_EQ(buffers[0].second.shape(), (Shape{7}));  // _u: the rows of the (7, 5) matrix
  EXPECT_EQ(buffers[1].second.shape(), (Shape{5}));
}

TEST(SpectralNorm, TwoCallsInACachedScopeBackpropagateThroughTheWeightTheyUsed) {
  // in training each computation takes a power iteration; the scope computes the weight once. 8 x 8:
  // close singular values, so that the estimate still moves after the first 16 iterations
  nn::Linear lin = linear64(8, 8, 12);
  PZ::spectral_norm(lin);
  Generator g(13);
  Tensor real = randn({2, 8}, kFloat64, &g).requires_grad_(), fake = randn({2, 8}, kFloat64, &g).requires_grad_();
  std::vector<double> w_first;
  {
    auto scope = P::cached();
    Tensor loss = lin(real).sum();
    w_first = values(lin.weight);
    loss = loss + lin(fake).sum();
    loss.backward();
  }
  // d(sum y)/dx[i][k] = sum_o W[o][k], W the weight the first call used
  std::vector<double> want(16, 0.0);
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 8; ++k)
      for (int o = 0; o < 8; ++o) want[static_cast<size_t>(i * 8 + k)] += w_first[static_cast<size_t>(o * 8 + k)];
  EXPECT_TRUE(all_close(real.grad(), want, 1e-14, 1e-15));
  EXPECT_TRUE(all_close(fake.grad(), want, 1e-14, 1e-15));
}
