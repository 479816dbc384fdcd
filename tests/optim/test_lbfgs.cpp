// LBFGS on a separable ill-conditioned quadratic: the first iteration against its closed form
// (a gradient step of min(1, 1/|g|_1) * lr), the second against the two-loop recursion with one
// curvature pair written out here, convergence to the known minimum, bit-exact resume from a
// state dict mid-run, and bad input.
#include <cmath>
#include <cstring>
#include <vector>

#include "optim/optim_testing.h"

namespace strata {
namespace {

const std::vector<double> kCurv = {1, 3, 10, 0.5, 6}, kMin = {0.3, -1, 2, 0.7, -0.2};

// f(x) = sum c_i (x_i - m_i)^2
Tensor quadratic(const Tensor& x) {
  const Tensor c = from_vector(kCurv).to(x.dtype()), m = from_vector(kMin).to(x.dtype());
  return ((x - m) * (x - m) * c).sum();
}
std::vector<double> gradient(const std::vector<double>& x) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) g[i] = 2 * kCurv[i] * (x[i] - kMin[i]);
  return g;
}

Tensor start() {
  Tensor x = from_vector(std::vector<double>{1, 1, 1, 1, 1});
  x.requires_grad_();
  return x;
}

std::function<Tensor()> closure_for(optim::Optimizer& opt, const Tensor& x) {
  return [&opt, x] {
    opt.zero_grad();
    Tensor loss = quadratic(x);
    loss.backward();
    return loss;
  };
}

TEST(LBFGS, FirstTwoIterationsFollowTheRecursion) {
  Tensor x = start();
  // max_eval given: its default for max_iter 2 is 2 closure calls, which allow one iteration only
  optim::LBFGS opt(std::vector<Tensor>{x}, {.lr = 0.5, .max_iter = 2, .max_eval = 10});
  std::vector<double> x0 = testing::values(x), g0 = gradient(x0);
  double l1 = 0;
  for (double v : g0) l1 += std::abs(v);
  const double t1 = std::min(1.0, 1 / l1) * 0.5;
  std::vector<double> x1(5), s(5), y(5);
  for (size_t i = 0; i < 5; ++i) x1[i] = x0[i] - t1 * g0[i];
  const std::vector<double> g1 = gradient(x1);
  double ys = 0, yy = 0;
  for (size_t i = 0; i < 5; ++i) s[i] = -t1 * g0[i], y[i] = g1[i] - g0[i], ys += y[i] * s[i], yy += y[i] * y[i];
  // d = -H g1 with H = (I - rho s y^T) (ys/yy) (I - rho y s^T) + rho s s^T
  const double rho = 1 / ys;
  double sq = 0;
  for (size_t i = 0; i < 5; ++i) sq += s[i] * -g1[i];
  const double al = rho * sq;
  std::vector<double> r(5);
  for (size_t i = 0; i < 5; ++i) r[i] = (-g1[i] - al * y[i]) * ys / yy;
  double yr = 0;
  for (size_t i = 0; i < 5; ++i) yr += y[i] * r[i];
  std::vector<double> want(5);
  for (size_t i = 0; i < 5; ++i) want[i] = x1[i] + 0.5 * (r[i] + (al - rho * yr) * s[i]);
  const Tensor loss = opt.step(closure_for(opt, x));
  EXPECT_NEAR(loss.item<double>(), quadratic(from_vector(x0)).item<double>(), 1e-12);  // the first closure's
  EXPECT_TRUE(testing::all_close(x, want, 1e-12, 1e-12));
  EXPECT_EQ(opt.n_iter(), 2);
  EXPECT_EQ(opt.func_evals(), 2);  // the last iteration does not re-evaluate
}

TEST(LBFGS, ConvergesOnAQuadratic) {
  for (DType dtype : {kFloat64, kFloat32}) {
    Tensor x = start().detach().to(dtype);
    x.requires_grad_();
    optim::LBFGS opt({x}, {.history_size = 3});
    for (int i = 0; i < 10; ++i) opt.step(closure_for(opt, x));
    // it stops once the loss changes by less than tolerance_change (1e-9): x within ~1e-4
    EXPECT_TRUE(testing::all_close(x, kMin, 1e-4, 1e-4)) << dtype_name(dtype);
    EXPECT_LT(quadratic(x.detach()).item<double>(), 1e-8);
  }
}

TEST(LBFGS, ResumesBitForBit) {
  const optim::LBFGSOptions o{.lr = 0.8, .max_iter = 3, .history_size = 2};
  Tensor a = start();
  optim::LBFGS full(std::vector<Tensor>{a}, o);
  for (int i = 0; i < 6; ++i) full.step(closure_for(full, a));
  Tensor b = start();
  optim::StateDict saved;
  Tensor resumed;
  {
    optim::LBFGS first(std::vector<Tensor>{b}, o);
    for (int i = 0; i < 3; ++i) first.step(closure_for(first, b));
    saved = first.state_dict();
    resumed = b.detach().clone();
    resumed.requires_grad_();
  }
  optim::LBFGS second(std::vector<Tensor>{resumed}, o);
  second.load_state_dict(saved);
  for (int i = 0; i < 3; ++i) second.step(closure_for(second, resumed));
  EXPECT_EQ(std::memcmp(a.data(), resumed.data(), a.nbytes()), 0);
  EXPECT_EQ(second.n_iter(), full.n_iter());
  EXPECT_EQ(second.func_evals(), full.func_evals());
  // a dict for other parameter sizes is refused, leaving the optimizer as it was
  Tensor other = zeros({3});
  other.requires_grad_();
  optim::LBFGS wrong(std::vector<Tensor>{other}, o);
  EXPECT_TRUE(testing::throws_with([&] { wrong.load_state_dict(saved); }, {"lbfgs.d"}));
  EXPECT_EQ(wrong.n_iter(), 0);
}

// A dict whose search state does not fit its counters (curvature pairs or a direction missing
// after the first iteration) is refused at load, not read out of bounds at the next step.
TEST(LBFGS, InconsistentStateDictIsRefused) {
  const optim::LBFGSOptions o{.max_iter = 3, .history_size = 2};
  Tensor x = start();
  optim::LBFGS first(std::vector<Tensor>{x}, o);
  const optim::StateDict fresh = first.state_dict();  // before any step: no direction yet
  for (int i = 0; i < 2; ++i) first.step(closure_for(first, x));
  const optim::StateDict stepped = first.state_dict();
  ASSERT_GE(stepped.scalars.at("lbfgs.history"), 1);
  Tensor y = start();
  optim::LBFGS second(std::vector<Tensor>{y}, o);
  optim::StateDict no_direction = fresh;
  no_direction.scalars["lbfgs.n_iter"] = 4;
  EXPECT_TRUE(testing::throws_with([&] { second.load_state_dict(no_direction); }, {"lbfgs.d"}));
  optim::StateDict empty_pair = stepped;
  empty_pair.tensors["lbfgs.old_dirs.0"] = zeros({0}, TensorOptions(kFloat64));
  EXPECT_TRUE(testing::throws_with([&] { second.load_state_dict(empty_pair); }, {"lbfgs.old_dirs.0"}));
  EXPECT_EQ(second.n_iter(), 0);
  second.load_state_dict(fresh);  // a dict saved before the first step still loads
  second.load_state_dict(stepped);
  EXPECT_EQ(second.n_iter(), first.n_iter());
}

TEST(LBFGS, BadInput) {
  Tensor x = start();
  EXPECT_TRUE(testing::throws_with([&] { optim::LBFGS({x}, {.lr = -1}); }, {"lr"}));
  EXPECT_TRUE(testing::throws_with([&] { optim::LBFGS({x}, {.max_iter = 0}); }, {"max_iter"}));
  EXPECT_TRUE(testing::throws_with([&] { optim::LBFGS({x}, {.history_size = 0}); }, {"history_size"}));
  optim::LBFGS opt({x});
  EXPECT_TRUE(testing::throws_with([&] { opt.step(); }, {"closure"}));
  Tensor y = start();
  opt.add_param_group({y});
  EXPECT_TRUE(testing::throws_with([&] { opt.step(closure_for(opt, x)); }, {"one parameter group"}));
}

}  // namespace
}  // namespace strata
