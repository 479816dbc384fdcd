// nn::parametrize: a parametrized Linear's forward and gradients against float64 math done here,
// chains, right_inverse and set, cached() scopes, removal, state dict keys (PyTorch's) and round
// trips, training, and bad input leaving the module as it was.
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <strata/nn/parametrize.hpp>
#include <strata/optim/sgd.hpp>

#include "nn/nn_testing.h"

using namespace strata;
namespace P = strata::nn::parametrize;
using strata::testing::all_close;
using strata::testing::throws_with;
using strata::testing::values;

namespace {

// X -> scale * X, the scale a buffer (so it shows in the state dict as the parametrization's).
struct Scale : nn::Module {
  explicit Scale(double s) { register_buffer("scale", full({}, s, kFloat64)); }
  Tensor forward(const Tensor& x) override { return x * named_buffers(false)[0].second; }
};

// X -> X + X^T: a symmetric matrix.
struct Symmetric : nn::Module {
  Tensor forward(const Tensor& x) override { return x + x.t(); }
};

// X -> exp(X), with log as right_inverse: positive weights.
struct Exp : P::Parametrization {
  int calls = 0;
  Tensor forward(const Tensor& x) override {
    ++calls;
    return exp(x);
  }
  bool has_right_inverse() const override { return true; }
  std::vector<Tensor> right_inverse(const Tensor& w) override { return {log(w)}; }
};

// Changes the shape: (r, c) -> (r * c).
struct Flatten : nn::Module {
  Tensor forward(const Tensor& x) override { return x.flatten(); }
};

// A parametrization whose forward raises.
struct Raises : nn::Module {
  Tensor forward(const Tensor&) override { detail::throw_error("[Raises] refused"); }
};

nn::Linear linear64(int64_t in, int64_t out, uint64_t seed) {
  Generator g(seed);
  nn::LinearOptions o;
  o.generator = &g;
  nn::Linear lin(in, out, o);
  lin.to(kFloat64);
  return lin;
}

std::set<std::string> keys(const nn::StateDict& d) {
  std::set<std::string> out;
  for (auto& [k, v] : d) out.insert(k);
  return out;
}

// y = x W^T + b in float64, x (n, in), W (out, in).
std::vector<double> affine(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                           int64_t n, int64_t in, int64_t out) {
  std::vector<double> y(static_cast<size_t>(n * out));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = b[static_cast<size_t>(o)];
      for (int64_t k = 0; k < in; ++k) s += x[static_cast<size_t>(i * in + k)] * w[static_cast<size_t>(o * in + k)];
      y[static_cast<size_t>(i * out + o)] = s;
    }
  return y;
}

}  // namespace

TEST(Parametrize, ForwardAndGradientUseTheParametrizedWeight) {
  nn::Linear lin = linear64(3, 3, 1);
  const std::vector<double> w0 = values(lin.weight), b = values(lin.bias);
  P::register_parametrization(lin, "weight", std::make_unique<Symmetric>());
  EXPECT_TRUE(P::is_parametrized(lin));
  EXPECT_TRUE(P::is_parametrized(lin, "weight"));
  EXPECT_FALSE(P::is_parametrized(lin, "bias"));
  EXPECT_EQ(keys(lin.state_dict()), (std::set<std::string>{"bias", "parametrizations.weight.original"}));
  ASSERT_EQ(lin.parameters().size(), 2u);
  const Tensor original = P::parametrizations(lin, "weight").originals()[0];
  EXPECT_TRUE(all_close(original, w0, 0, 0));  // the original keeps the old value

  std::vector<double> sym(9);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j) sym[static_cast<size_t>(i * 3 + j)] = w0[i * 3 + j] + w0[j * 3 + i];
  Generator g(2);
  Tensor x = randn({4, 3}, kFloat64, &g);
  Tensor y = lin(x);
  EXPECT_TRUE(all_close(y, affine(values(x), sym, b, 4, 3, 3), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(lin.weight, sym, 1e-15, 0));

  // loss = sum(y): dL/dW[o][k] = sum_i x[i][k], and dL/dX = dL/dW + dL/dW^T
  y.sum().backward();
  ASSERT_TRUE(original.grad().defined());
  const std::vector<double> xv = values(x);
  std::vector<double> want(9);
  for (int o = 0; o < 3; ++o)
    for (int k = 0; k < 3; ++k) {
      double colsum_k = 0, colsum_o = 0;
      for (int i = 0; i < 4; ++i) colsum_k += xv[i * 3 + k], colsum_o += xv[i * 3 + o];
      want[static_cast<size_t>(o * 3 + k)] = colsum_k + colsum_o;
    }
  EXPECT_TRUE(all_close(original.grad(), want, 1e-12, 1e-12));
}

TEST(Parametrize, ChainsApplyInOrderWithTheirStateUnderPyTorchKeys) {
  nn::Linear lin = linear64(2, 2, 3);
  const std::vector<double> w0 = values(lin.weight);
  P::register_parametrization(lin, "weight", std::make_unique<Symmetric>());
  P::register_parametrization(lin, "weight", std::make_unique<Scale>(3.0));
  EXPECT_EQ(P::parametrizations(lin, "weight").size(), 2u);
  EXPECT_EQ(keys(lin.state_dict()), (std::set<std::string>{"bias", "parametrizations.weight.original",
                                                           "parametrizations.weight.1.scale"}));
  const std::vector<double> want{6 * w0[0], 3 * (w0[1] + w0[2]), 3 * (w0[1] + w0[2]), 6 * w0[3]};
  EXPECT_TRUE(all_close(P::get(lin, "weight"), want, 1e-15, 0));
  EXPECT_TRUE(all_close(lin.weight, want, 1e-15, 0));
}

TEST(Parametrize, RightInverseSetsTheOriginalAndSetAssigns) {
  nn::Linear lin = linear64(2, 3, 4);
  lin.weight.detach().copy_(from_vector<double>({0.5, 1, 2, 3, 0.25, 4}, Shape{3, 2}));
  P::register_parametrization(lin, "weight", std::make_unique<Exp>());
  const Tensor original = P::parametrizations(lin, "weight").originals()[0];
  EXPECT_TRUE(all_close(original, {std::log(0.5), 0, std::log(2), std::log(3), std::log(0.25), std::log(4)}, 1e-15,
                        0));
  EXPECT_TRUE(all_close(P::get(lin, "weight"), {0.5, 1, 2, 3, 0.25, 4}, 1e-14, 0));

  P::set(lin, "weight", from_vector<double>({1, 2, 3, 4, 5, 6}, Shape{3, 2}));
  EXPECT_TRUE(all_close(original, {0, std::log(2), std::log(3), std::log(4), std::log(5), std::log(6)}, 1e-15, 0));
  EXPECT_TRUE(all_close(lin.weight, {1, 2, 3, 4, 5, 6}, 1e-14, 0));  // refreshed at once
  // a parametrization without right_inverse cannot be assigned through
  P::register_parametrization(lin, "weight", std::make_unique<Scale>(2.0));
  EXPECT_TRUE(throws_with([&] { P::set(lin, "weight", zeros({3, 2}, kFloat64)); }, {"has no right_inverse"}));
}

TEST(Parametrize, CachedScopeComputesOncePerScope) {
  nn::Linear lin = linear64(2, 2, 5);
  lin.weight.detach().copy_(lin.weight.detach().abs());
  auto exp_p = std::make_unique<Exp>();
  Exp& counter = *exp_p;
  P::register_parametrization(lin, "weight", std::move(exp_p));
  Tensor x = ones({1, 2}, kFloat64);
  counter.calls = 0;
  for (int i = 0; i < 3; ++i) lin(x);
  EXPECT_EQ(counter.calls, 3);
  counter.calls = 0;
  {
    auto scope = P::cached();
    Tensor loss = lin(x).sum() + lin(x).sum() + lin(lin(x)).sum();
    EXPECT_EQ(counter.calls, 1);
    loss.backward();  // the one computed value's graph serves every call
    EXPECT_TRUE(P::parametrizations(lin, "weight").originals()[0].grad().defined());
  }
  lin(x);
  EXPECT_EQ(counter.calls, 2);  // a new computation once the scope ended
}

TEST(Parametrize, RemoveLeavesTheParametrizedValueOrTheOriginal) {
  for (bool leave : {true, false}) {
    nn::Linear lin = linear64(2, 2, 6);
    const std::vector<double> w0 = values(lin.weight);
    P::register_parametrization(lin, "weight", std::make_unique<Scale>(2.0));
    P::remove_parametrizations(lin, "weight", leave);
    EXPECT_FALSE(P::is_parametrized(lin));
    EXPECT_FALSE(lin.has_hooks());
    EXPECT_EQ(keys(lin.state_dict()), (std::set<std::string>{"bias", "weight"}));
    std::vector<double> want = w0;
    if (leave)
      for (double& v : want) v *= 2;
    EXPECT_TRUE(all_close(lin.weight, want, 1e-15, 0));
    EXPECT_TRUE(lin.weight.is_leaf());
    EXPECT_TRUE(lin.weight.requires_grad());
    lin(ones({1, 2}, kFloat64)).sum().backward();  // the member is the trained parameter again
    EXPECT_TRUE(all_close(lin.weight.grad(), {1, 1, 1, 1}, 0, 0));
  }
}

TEST(Parametrize, AMovedModuleInAContainerStaysParametrized) {
  nn::Linear lin = linear64(2, 2, 13);
  const std::vector<double> w0 = values(lin.weight), b = values(lin.bias);
  P::register_parametrization(lin, "weight", std::make_unique<Scale>(-1.0));
  nn::Sequential seq(std::move(lin));
  Tensor x = from_vector<double>({1, 2}, Shape{1, 2});
  std::vector<double> neg = w0;
  for (double& v : neg) v = -v;
  EXPECT_TRUE(all_close(seq(x), affine(values(x), neg, b, 1, 2, 2), 1e-15, 0));
  EXPECT_EQ(keys(seq.state_dict()), (std::set<std::string>{"0.bias", "0.parametrizations.weight.original",
                                                           "0.parametrizations.weight.0.scale"}));
  seq(x).sum().backward();  // dL/dW = -x per row
  const Tensor original = P::parametrizations(seq[0], "weight").originals()[0];
  EXPECT_TRUE(all_close(original.grad(), {-1, -2, -1, -2}, 0, 0));
}

TEST(Parametrize, StateDictRoundTrip) {
  nn::Linear a = linear64(3, 2, 7), b = linear64(3, 2, 8);
  P::register_parametrization(a, "weight", std::make_unique<Scale>(0.5));
  P::register_parametrization(b, "weight", std::make_unique<Scale>(4.0));
  b.load_state_dict(a.state_dict());
  Tensor x = ones({2, 3}, kFloat64);
  EXPECT_TRUE(all_close(b(x), values(a(x)), 0, 0));
}

TEST(Parametrize, TrainingASymmetricLinearReducesTheLossAndKeepsItSymmetric) {
  nn::Linear lin = linear64(4, 4, 9);
  P::register_parametrization(lin, "weight", std::make_unique<Symmetric>());
  optim::SGD opt(lin.parameters(), {.lr = 0.05});
  Generator g(10);
  Tensor x = randn({16, 4}, kFloat64, &g), target = randn({16, 4}, kFloat64, &g);
  auto loss_now = [&] { return ((lin(x) - target) * (lin(x) - target)).mean(); };
  const double first = loss_now().item<double>();
  for (int step = 0; step < 50; ++step) {
    opt.zero_grad();
    Tensor loss = loss_now();
    loss.backward();
    opt.step();
  }
  EXPECT_LT(loss_now().item<double>(), 0.7 * first);
  EXPECT_TRUE(all_close(lin.weight, values(lin.weight.t().contiguous()), 0, 0));
}

TEST(Parametrize, BadInputRaisesAndChangesNothing) {
  nn::Linear lin = linear64(3, 2, 11);
  EXPECT_TRUE(throws_with([&] { P::register_parametrization(lin, "wieght", std::make_unique<Symmetric>()); },
                          {"Linear", "no parameter, buffer or parametrized tensor", "wieght"}));
  EXPECT_TRUE(throws_with([&] { P::register_parametrization(lin, "weight", std::make_unique<Flatten>()); },
                          {"register_parametrization", "[6]", "[2, 3]", "unsafe"}));
  EXPECT_TRUE(throws_with([&] { P::register_parametrization(lin, "weight", nullptr); }, {"null"}));
  EXPECT_FALSE(P::is_parametrized(lin));
  EXPECT_FALSE(lin.has_hooks());
  EXPECT_EQ(keys(lin.state_dict()), (std::set<std::string>{"bias", "weight"}));
  EXPECT_TRUE(throws_with([&] { P::remove_parametrizations(lin, "weight"); }, {"no parametrization on", "weight"}));
  EXPECT_TRUE(throws_with([&] { P::get(lin, "weight"); }, {"no parametrization on"}));

  // a second parametrization that changes the shape is refused too, keeping the first
  P::register_parametrization(lin, "weight", std::make_unique<Scale>(2.0));
  EXPECT_TRUE(throws_with([&] { P::register_parametrization(lin, "weight", std::make_unique<Flatten>()); },
                          {"[6]", "unsafe"}));
  EXPECT_EQ(P::parametrizations(lin, "weight").size(), 1u);

  // unsafe allows it
  nn::Linear free = linear64(3, 2, 12);
  P::register_parametrization(free, "weight", std::make_unique<Flatten>(), /*unsafe=*/true);
  EXPECT_EQ(free.weight.shape(), (Shape{6}));
  EXPECT_TRUE(P::parametrizations(free, "weight").unsafe());
}

TEST(Parametrize, ABufferStaysABuffer) {
  struct WithBuffer : nn::Module {
    Tensor stats;
    WithBuffer() { stats = register_buffer("stats", from_vector<double>({1, 2})); }
  } m;
  P::register_parametrization(m, "stats", std::make_unique<Scale>(3.0));
  EXPECT_EQ(keys(m.state_dict()), (std::set<std::string>{"parametrizations.stats.original",
                                                         "parametrizations.stats.0.scale"}));
  EXPECT_TRUE(m.parameters().empty());
  EXPECT_TRUE(all_close(m.stats, {3, 6}, 0, 0));
  P::remove_parametrizations(m, "stats");
  EXPECT_EQ(keys(m.state_dict()), (std::set<std::string>{"stats"}));
  EXPECT_TRUE(all_close(m.named_buffers()[0].second, {3, 6}, 0, 0));
}

TEST(Parametrize, AnUnsafeRegistrationWhoseForwardRaisesChangesNothing) {
  nn::Linear lin = linear64(3, 2, 14);
  EXPECT_TRUE(throws_with([&] { P::register_parametrization(lin, "weight", std::make_unique<Raises>(), true); },
                          {"refused"}));
  EXPECT_FALSE(P::is_parametrized(lin));
  EXPECT_FALSE(lin.has_hooks());
  EXPECT_EQ(keys(lin.state_dict()), (std::set<std::string>{"bias", "weight"}));
  EXPECT_EQ(lin.parameters().size(), 2u);
  EXPECT_TRUE(lin.weight.is_leaf());

  // appended to a parametrized tensor: the chain keeps its one parametrization and still computes
  P::register_parametrization(lin, "weight", std::make_unique<Scale>(2.0));
  EXPECT_TRUE(throws_with([&] { P::register_parametrization(lin, "weight", std::make_unique<Raises>(), true); },
                          {"refused"}));
  EXPECT_EQ(P::parametrizations(lin, "weight").size(), 1u);
  EXPECT_FALSE(P::parametrizations(lin, "weight").unsafe());
  std::vector<double> twice = values(P::parametrizations(lin, "weight").originals()[0]);
  for (double& v : twice) v *= 2;
  EXPECT_TRUE(all_close(P::get(lin, "weight"), twice, 0, 0));
}

TEST(Parametrize, ABufferKeepsItsPersistenceWhateverTheStateDictHooksDo) {
  struct WithBuffers : nn::Module {
    Tensor stats, scratch;
    WithBuffers() {
      stats = register_buffer("stats", from_vector<double>({1, 2}));
      scratch = register_buffer("scratch", from_vector<double>({3}), /*persistent=*/false);
    }
  } m;
  int hook_runs = 0;
  // a post-hook renaming the buffer's key, as a module keeping an old checkpoint format would
  m.register_state_dict_post_hook([&](const nn::Module&, nn::StateDict& d, const std::string& prefix) {
    ++hook_runs;
    if (auto it = d.find(prefix + "stats"); it != d.end()) {
      d[prefix + "legacy_stats"] = it->second;
      d.erase(it);
    }
  });
  P::register_parametrization(m, "stats", std::make_unique<Scale>(3.0));
  P::register_parametrization(m, "scratch", std::make_unique<Scale>(2.0));
  EXPECT_EQ(hook_runs, 0);  // registering reads no state dict
  EXPECT_EQ(keys(m.state_dict()), (std::set<std::string>{"parametrizations.stats.original",
                                                         "parametrizations.stats.0.scale",
                                                         "parametrizations.scratch.0.scale"}));
  P::remove_parametrizations(m, "stats");
  P::remove_parametrizations(m, "scratch");
  EXPECT_EQ(keys(m.state_dict()), (std::set<std::string>{"legacy_stats"}));
  EXPECT_EQ(m.buffers().size(), 2u);
}

TEST(Parametrize, AnOptimizerBuiltBeforeRegistrationRaisesUntilRemoval) {
  // its handle is the member's, which holds the computed value (Note [Parametrized members])
  nn::Linear lin = linear64(2, 2, 15);
  optim::SGD opt(lin.parameters(), {.lr = 0.5});
  P::register_parametrization(lin, "weight", std::make_unique<Scale>(2.0));
  Tensor x = ones({1, 2}, kFloat64);
  lin(x).sum().backward();
  EXPECT_TRUE(throws_with([&] { opt.step(); }, {"not a leaf"}));
  P::remove_parametrizations(lin, "weight");
  const std::vector<double> w = values(lin.weight);
  opt.zero_grad();
  lin(x).sum().backward();  // dL/dW = 1 everywhere
  opt.step();
  std::vector<double> want = w;
  for (double& v : want) v -= 0.5;
  EXPECT_TRUE(all_close(lin.weight, want, 1e-15, 0));
}
