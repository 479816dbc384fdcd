// Losses against float64 references written here from the definitions, over every reduction,
// ignore_index, label smoothing, class weights and probability targets, with finite-difference
// gradient checks (second order for cross_entropy) and bad input.
#include <cmath>
#include <limits>

#include "nn/nn_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::gradcheck;
using strata::testing::gradgradcheck;
using strata::testing::leaf;
using strata::testing::throws_with;
using strata::testing::values;
namespace F = strata::nn::functional;
using V = const std::vector<Tensor>&;

namespace {

const double kNaN = std::numeric_limits<double>::quiet_NaN();

// Reduces per-sample losses: "none" keeps them, "sum" adds, "mean" divides by `denom`.
std::vector<double> reduce(const std::vector<double>& per, const std::string& r, double denom) {
  if (r == "none") return per;
  double s = 0;
  for (double v : per) s += v;
  return {r == "sum" ? s : s / denom};
}

// Cross entropy of logits (N, C, D) (D = product of the trailing dims) in float64.
std::vector<double> ce_ref(const std::vector<double>& x, int64_t n, int64_t c, int64_t d,
                           const std::vector<int64_t>& target, const std::vector<double>& weight, int64_t ignore,
                           double eps, const std::string& red) {
  std::vector<double> per;
  double wsum = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t s = 0; s < d; ++s) {
      auto at = [&](int64_t j) { return x[static_cast<size_t>((i * c + j) * d + s)]; };
      double mx = -INFINITY, z = 0;
      for (int64_t j = 0; j < c; ++j) mx = std::max(mx, at(j));
      for (int64_t j = 0; j < c; ++j) z += std::exp(at(j) - mx);
      const double lse = mx + std::log(z);
      const int64_t t = target[static_cast<size_t>(i * d + s)];
      if (t == ignore) {
        per.push_back(0);
        continue;
      }
      auto w = [&](int64_t j) { return weight.empty() ? 1.0 : weight[j]; };
      double smooth = 0;
      for (int64_t j = 0; j < c; ++j) smooth += w(j) * (lse - at(j));
      per.push_back((1 - eps) * w(t) * (lse - at(t)) + eps / static_cast<double>(c) * smooth);
      wsum += w(t);
    }
  return reduce(per, red, wsum);
}

std::vector<double> ce_prob_ref(const std::vector<double>& x, const std::vector<double>& y, int64_t n, int64_t c,
                                int64_t d, const std::vector<double>& weight, double eps, const std::string& red) {
  std::vector<double> per;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t s = 0; s < d; ++s) {
      auto idx = [&](int64_t j) { return static_cast<size_t>((i * c + j) * d + s); };
      double mx = -INFINITY, z = 0, l = 0;
      for (int64_t j = 0; j < c; ++j) mx = std::max(mx, x[idx(j)]);
      for (int64_t j = 0; j < c; ++j) z += std::exp(x[idx(j)] - mx);
      for (int64_t j = 0; j < c; ++j) {
        double yj = y[idx(j)] * (1 - eps) + eps / static_cast<double>(c);
        l -= (weight.empty() ? 1.0 : weight[j]) * yj * (x[idx(j)] - mx - std::log(z));
      }
      per.push_back(l);
    }
  return reduce(per, red, static_cast<double>(n * d));
}

Tensor targets(const std::vector<int64_t>& v, const Shape& shape) { return from_vector<int64_t>(v, shape); }

}  // namespace

TEST(CrossEntropy, ClassIndicesMatchReference) {
  Generator g(1);
  const std::vector<double> weight = {0.5, 2.0, 1.0, 0.25};
  struct Shape3 {
    Shape logits, target;
    int64_t n, d;
  };
  for (const Shape3& sh : {Shape3{{5, 4}, {5}, 5, 1}, Shape3{{3, 4, 2, 3}, {3, 2, 3}, 3, 6}}) {
    Tensor x = randn(sh.logits, kFloat64, &g) * 3;
    std::vector<int64_t> t;
    for (int64_t i = 0; i < sh.n * sh.d; ++i) t.push_back(i % 3 == 1 ? -100 : (i * 7) % 4);
    Tensor tt = targets(t, sh.target);
    for (bool weighted : {false, true})
      for (double eps : {0.0, 0.2})
        for (std::string red : {"mean", "sum", "none"}) {
          SCOPED_TRACE(fmt::format("{} weighted={} eps={} {}", sh.logits, weighted, eps, red));
          F::CrossEntropyOptions o{weighted ? from_vector(weight).to(kFloat64) : Tensor(), -100, red, eps};
          Tensor loss = F::cross_entropy(x, tt, o);
          EXPECT_EQ(loss.shape(), red == "none" ? sh.target : Shape{});
          auto want = ce_ref(values(x), sh.n, 4, sh.d, t, weighted ? weight : std::vector<double>{}, -100, eps, red);
          EXPECT_TRUE(all_close(loss, want, 1e-12, 1e-12));
          Tensor xl = leaf(x);
          EXPECT_TRUE(gradcheck([&](V in) { return F::cross_entropy(in[0], tt, o); }, {xl}));
        }
  }
}

TEST(CrossEntropy, SecondOrderAndFloat32) {
  Generator g(2);
  Tensor x = leaf(randn({4, 5}, kFloat64, &g));
  Tensor t = targets({0, 4, -100, 2}, {4});
  auto f = [&](V in) { return F::cross_entropy(in[0], t, {.label_smoothing = 0.1}); };
  EXPECT_TRUE(gradgradcheck(f, {x}));
  // float32 logits: the loss and gradient against the float64 reference
  Tensor xf = (randn({64, 1000}, kFloat32, &g) * 4).requires_grad_();
  std::vector<int64_t> tv;
  for (int64_t i = 0; i < 64; ++i) tv.push_back((i * 37) % 1000);
  Tensor tf = targets(tv, {64});
  Tensor loss = F::cross_entropy(xf, tf);
  EXPECT_TRUE(all_close(loss, ce_ref(values(xf), 64, 1000, 1, tv, {}, -100, 0, "mean"), 1e-5, 1e-5));
  loss.backward();
  Tensor x64 = xf.detach().to(kFloat64).requires_grad_();
  F::cross_entropy(x64, tf).backward();
  EXPECT_TRUE(all_close(xf.grad(), values(x64.grad()), 1e-4, 1e-7));
}

TEST(CrossEntropy, ProbabilityTargets) {
  Generator g(3);
  const std::vector<double> weight = {1.0, 0.5, 3.0};
  for (const Shape& shape : {Shape{4, 3}, Shape{2, 3, 5}}) {
    const int64_t n = shape[0], d = shape.size() > 2 ? shape[2] : 1;
    Tensor x = randn(shape, kFloat64, &g);
    Tensor y = softmax(randn(shape, kFloat64, &g), 1);
    for (bool weighted : {false, true})
      for (double eps : {0.0, 0.3})
        for (std::string red : {"mean", "sum", "none"}) {
          SCOPED_TRACE(fmt::format("{} weighted={} eps={} {}", shape, weighted, eps, red));
          F::CrossEntropyOptions o{weighted ? from_vector(weight) : Tensor(), -100, red, eps};
          auto want = ce_prob_ref(values(x), values(y), n, 3, d, weighted ? weight : std::vector<double>{}, eps, red);
          EXPECT_TRUE(all_close(F::cross_entropy(x, y, o), want, 1e-12, 1e-12));
          Tensor xl = leaf(x), yl = leaf(y);
          EXPECT_TRUE(gradcheck([&](V in) { return F::cross_entropy(in[0], in[1], o); }, {xl, yl}));
        }
  }
}

TEST(CrossEntropy, EdgeCases) {
  Tensor x = randn({3, 4}, kFloat64);
  // every target ignored: mean is 0 / 0
  Tensor all_ignored = targets({-100, -100, -100}, {3});
  EXPECT_TRUE(std::isnan(F::cross_entropy(x, all_ignored).item<double>()));
  EXPECT_EQ(F::cross_entropy(x, all_ignored, {.reduction = "sum"}).item<double>(), 0.0);
  EXPECT_TRUE(std::isnan(F::cross_entropy(zeros({0, 4}), zeros({0}, kInt64)).item<double>()));
  // ignore_index inside the class range
  Tensor t = targets({0, 1, 2}, {3});
  auto want = ce_ref(values(x), 3, 4, 1, {0, 1, 2}, {}, 1, 0, "mean");
  EXPECT_TRUE(all_close(F::cross_entropy(x, t, {.ignore_index = 1}), want, 1e-12, 1e-12));
  // int32 targets, unbatched input
  EXPECT_TRUE(all_close(F::cross_entropy(x, t.to(kInt32)), ce_ref(values(x), 3, 4, 1, {0, 1, 2}, {}, -100, 0, "mean"),
                        1e-12, 1e-12));
  Tensor row = x.select(0, 1);
  EXPECT_TRUE(all_close(F::cross_entropy(row, from_vector<int64_t>({2}).view({})),
                        ce_ref(values(row), 1, 4, 1, {2}, {}, -100, 0, "mean"), 1e-12, 1e-12));
  // large logits stay finite
  Tensor big = from_vector<double>({1000, -1000, 0, 999}, Shape{1, 4});
  double l = F::cross_entropy(big, targets({3}, {1})).item<double>();
  EXPECT_NEAR(l, 1.0 + std::log(1 + std::exp(-1.0)), 1e-12);  // lse = 1000 + log(1 + e^-1)
  nn::CrossEntropyLoss module({.label_smoothing = 0.1});
  EXPECT_TRUE(equal(module(x, t), F::cross_entropy(x, t, {.label_smoothing = 0.1})));
  // every class weight of the targets 0 with label smoothing: no weight to divide by, NaN
  const F::CrossEntropyOptions zero_weight{.weight = from_vector<double>({1, 0, 1, 1}), .label_smoothing = 0.1};
  EXPECT_TRUE(std::isnan(F::cross_entropy(x, targets({1, 1, 1}, {3}), zero_weight).item<double>()));
}

// A batch whose every target is ignored has a NaN mean but a zero gradient, as in PyTorch: on
// every path (fused (N, C), spatial, unbatched, create_graph) and for nll_loss; a NaN there
// would poison every parameter.
TEST(CrossEntropy, AllIgnoredGivesZeroGradient) {
  Generator g(12);
  Tensor flat = randn({3, 4}, kFloat64, &g), spatial = randn({2, 4, 3}, kFloat64, &g);
  const Tensor ignored_flat = targets({-100, -100, -100}, {3}), ignored_spatial = full({2, 3}, -100, kInt64);
  struct Case {
    const char* name;
    Tensor x;
    std::function<Tensor(const Tensor&)> loss;
  };
  const std::vector<Case> cases = {
      {"fused", flat, [&](const Tensor& x) { return F::cross_entropy(x, ignored_flat); }},
      {"fused smoothed", flat,
       [&](const Tensor& x) { return F::cross_entropy(x, ignored_flat, {.label_smoothing = 0.2}); }},
      {"spatial", spatial, [&](const Tensor& x) { return F::cross_entropy(x, ignored_spatial); }},
      {"spatial weighted", spatial,
       [&](const Tensor& x) { return F::cross_entropy(x, ignored_spatial, {.weight = rand({4}, kFloat64, &g)}); }},
      {"unbatched", flat.select(0, 0),
       [&](const Tensor& x) { return F::cross_entropy(x, full({}, -100, kInt64)); }},
      {"nll", flat, [&](const Tensor& x) { return F::nll_loss(x, ignored_flat); }},
      {"nll spatial", spatial, [&](const Tensor& x) { return F::nll_loss(x, ignored_spatial); }},
  };
  for (const Case& c : cases)
    for (bool create_graph : {false, true}) {
      SCOPED_TRACE(fmt::format("{} create_graph={}", c.name, create_graph));
      Tensor x = leaf(c.x);
      Tensor loss = c.loss(x);
      EXPECT_TRUE(std::isnan(loss.item<double>()));
      Tensor gx = autograd::grad({loss}, {x}, {}, std::nullopt, create_graph)[0];
      EXPECT_TRUE(all_close(gx, std::vector<double>(static_cast<size_t>(x.numel()), 0.0), 0, 0));
    }
}

TEST(CrossEntropy, BadInput) {
  Tensor x = randn({3, 4});
  EXPECT_TRUE(throws_with([&] { F::cross_entropy(x, targets({0, 4, 1}, {3})); }, {"[cross_entropy]", "4", "4 classes"}));
  EXPECT_TRUE(throws_with([&] { F::cross_entropy(x, targets({0, -2, 1}, {3})); }, {"-2"}));
  EXPECT_TRUE(throws_with([&] { F::cross_entropy(x, targets({0, 1}, {2})); }, {"target", "[2]", "[3, 4]"}));
  EXPECT_THROW(F::cross_entropy(x, randn({3, 5})), Error);
  EXPECT_THROW(F::cross_entropy(x, targets({0, 1, 2}, {3}), {.reduction = "avg"}), Error);
  EXPECT_THROW(F::cross_entropy(x, targets({0, 1, 2}, {3}), {.label_smoothing = 1.5}), Error);
  EXPECT_THROW(F::cross_entropy(x, targets({0, 1, 2}, {3}), {.weight = ones({3})}), Error);
  EXPECT_THROW(F::cross_entropy(x, zeros({3}, kBool)), Error);
  EXPECT_THROW(F::cross_entropy(zeros({3, 4}, kInt64), targets({0, 1, 2}, {3})), Error);
  EXPECT_THROW(nn::CrossEntropyLoss({.reduction = "mean "}), Error);
  // spatial targets (N, d1) are checked too; the ignore_index value itself is never out of range
  Tensor xs = randn({2, 4, 3});
  EXPECT_TRUE(throws_with([&] { F::cross_entropy(xs, targets({0, 1, 2, 3, 7, 0}, {2, 3})); }, {"7", "4 classes"}));
  EXPECT_NO_THROW(F::cross_entropy(xs, targets({0, -100, 2, 3, -100, 0}, {2, 3})));
  EXPECT_NO_THROW(F::cross_entropy(xs, targets({0, 9, 2, 3, 9, 0}, {2, 3}), {.ignore_index = 9}));
  EXPECT_TRUE(throws_with([&] { F::cross_entropy(xs, targets({0, 5, 2, 3, 1, 0}, {2, 3}).to(kInt32)); }, {"5"}));
  // an input without classes, even when every target is ignored
  const Tensor ignored = targets({-100, -100, -100}, {3});
  EXPECT_TRUE(throws_with([&] { F::cross_entropy(zeros({3, 0}), ignored); }, {"[cross_entropy]", "no classes"}));
  EXPECT_TRUE(throws_with([&] { F::nll_loss(zeros({3, 0}), ignored); }, {"[nll_loss]", "no classes"}));
  // probability targets have no index to ignore
  EXPECT_TRUE(throws_with([&] { F::cross_entropy(x, softmax(randn({3, 4}), 1), {.ignore_index = 1}); },
                          {"[cross_entropy]", "ignore_index 1", "class-index targets only"}));
  EXPECT_NO_THROW(F::cross_entropy(x, softmax(randn({3, 4}), 1), {.ignore_index = -1}));
}

TEST(NLLLoss, MatchesReferenceAndGradCheck) {
  Generator g(4);
  Tensor lp = log_softmax(randn({6, 3}, kFloat64, &g), 1);
  std::vector<int64_t> t = {0, 2, 1, 1, -100, 2};
  std::vector<double> w = {1.0, 0.2, 2.0};
  std::vector<double> x = values(lp);
  for (std::string red : {"mean", "sum", "none"}) {
    std::vector<double> per;
    double den = 0;
    for (int i = 0; i < 6; ++i) {
      per.push_back(t[i] < 0 ? 0.0 : -w[t[i]] * x[i * 3 + t[i]]);
      den += t[i] < 0 ? 0.0 : w[t[i]];
    }
    F::NLLLossOptions o{from_vector(w), -100, red};
    EXPECT_TRUE(all_close(F::nll_loss(lp, targets(t, {6}), o), reduce(per, red, den), 1e-12, 1e-12));
    Tensor l = leaf(lp);
    EXPECT_TRUE(gradcheck([&](V in) { return F::nll_loss(in[0], targets(t, {6}), o); }, {l}));
  }
  EXPECT_TRUE(throws_with([&] { F::nll_loss(lp, targets({0, 3, 0, 0, 0, 0}, {6})); }, {"[nll_loss]", "3", "3 classes"}));
  nn::NLLLoss m;
  EXPECT_TRUE(equal(m(lp, targets(t, {6})), F::nll_loss(lp, targets(t, {6}))));
}

TEST(ElementwiseLosses, MatchReferencesAndGradCheck) {
  Generator g(5);
  Tensor x = randn({3, 4}, kFloat64, &g) * 2, y = randn({3, 4}, kFloat64, &g) * 2;
  std::vector<double> xv = values(x), yv = values(y);
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&, const Tensor&, std::string_view)> f;
    std::function<double(double, double)> ref;
  };
  const std::vector<Case> cases = {
      {"mse", [](const Tensor& a, const Tensor& b, std::string_view r) { return F::mse_loss(a, b, r); },
       [](double a, double b) { return (a - b) * (a - b); }},
      {"l1", [](const Tensor& a, const Tensor& b, std::string_view r) { return F::l1_loss(a, b, r); },
       [](double a, double b) { return std::fabs(a - b); }},
      {"smooth_l1", [](const Tensor& a, const Tensor& b, std::string_view r) { return F::smooth_l1_loss(a, b, r, 1.5); },
       [](double a, double b) {
         double d = std::fabs(a - b);
         return d < 1.5 ? 0.5 * d * d / 1.5 : d - 0.75;
       }},
      {"smooth_l1_beta0",
       [](const Tensor& a, const Tensor& b, std::string_view r) { return F::smooth_l1_loss(a, b, r, 0.0); },
       [](double a, double b) { return std::fabs(a - b); }},
  };
  for (const Case& c : cases)
    for (std::string red : {"mean", "sum", "none"}) {
      SCOPED_TRACE(fmt::format("{} {}", c.name, red));
      std::vector<double> per;
      for (size_t i = 0; i < xv.size(); ++i) per.push_back(c.ref(xv[i], yv[i]));
      EXPECT_TRUE(all_close(c.f(x, y, red), reduce(per, red, 12), 1e-12, 1e-12));
      Tensor xl = leaf(x), yl = leaf(y);
      EXPECT_TRUE(gradcheck([&](V in) { return c.f(in[0], in[1], red); }, {xl, yl}));
    }
  EXPECT_TRUE(equal(nn::MSELoss("sum")(x, y), F::mse_loss(x, y, "sum")));
  EXPECT_TRUE(equal(nn::L1Loss()(x, y), F::l1_loss(x, y)));
  EXPECT_TRUE(equal(nn::SmoothL1Loss({.beta = 0.5})(x, y), F::smooth_l1_loss(x, y, "mean", 0.5)));
  EXPECT_TRUE(throws_with([&] { F::mse_loss(x, randn({4, 3})); }, {"[mse_loss]", "[3, 4]", "[4, 3]"}));
  EXPECT_THROW(F::l1_loss(x, y, "max"), Error);
  EXPECT_THROW(F::smooth_l1_loss(x, y, "mean", -1), Error);
  EXPECT_TRUE(std::isnan(F::mse_loss(zeros({0}), zeros({0})).item<double>()));
}

// smooth_l1's second derivative is 1 / beta inside the quadratic zone, at input == target too
// (squaring |d| had given 0 there), and a float32 beta too small for 0.5 / beta keeps finite
// gradients.
TEST(ElementwiseLosses, SmoothL1CurvatureAndTinyBeta) {
  Tensor x = leaf(from_vector<double>({1.0, 2.0, 0.25}));
  const Tensor y = from_vector<double>({1.0, 1.5, 4.0});  // d = 0, inside; 0.5, inside; -3.75, outside
  Tensor gx = autograd::grad({F::smooth_l1_loss(x, y, "sum", 2.0)}, {x}, {}, std::nullopt, true)[0];
  EXPECT_TRUE(all_close(gx, {0.0, 0.25, -1.0}, 1e-15, 0));
  EXPECT_TRUE(all_close(autograd::grad({sum(gx)}, {x})[0], {0.5, 0.5, 0.0}, 1e-15, 0));
  Tensor xs = leaf(from_vector<double>({1.0, -0.5, 3.0}));
  EXPECT_TRUE(gradgradcheck([&](V in) { return F::smooth_l1_loss(in[0], from_vector<double>({1.0, 1.0, 2.9}), "sum",
                                                                 0.5); }, {xs}));
  Tensor xf = leaf(from_vector<float>({1.0f, 2.0f}));
  const Tensor yf = from_vector<float>({1.0f, 1.0f});
  Tensor lf = F::smooth_l1_loss(xf, yf, "sum", 1e-40);
  lf.backward();
  EXPECT_TRUE(all_close(lf, {1.0}, 1e-6, 0));
  EXPECT_TRUE(all_close(xf.grad(), {0.0, 1.0}, 0, 0));
}

TEST(BCEWithLogits, MatchesReferenceStableAndGradCheck) {
  Generator g(6);
  Tensor x = randn({4, 3}, kFloat64, &g) * 3;
  Tensor y = rand({4, 3}, kFloat64, &g);
  Tensor pw = from_vector<double>({0.5, 2.0, 3.0});
  Tensor w = from_vector<double>({1.0, 0.0, 2.0, 0.5}, Shape{4, 1});
  std::vector<double> xv = values(x), yv = values(y);
  for (bool with_pw : {false, true})
    for (bool with_w : {false, true})
      for (std::string red : {"mean", "sum", "none"}) {
        SCOPED_TRACE(fmt::format("pos_weight={} weight={} {}", with_pw, with_w, red));
        std::vector<double> per;
        for (int i = 0; i < 12; ++i) {
          double s = 1 / (1 + std::exp(-xv[i]));
          double p = with_pw ? values(pw)[i % 3] : 1.0;
          double l = -(p * yv[i] * std::log(s) + (1 - yv[i]) * std::log(1 - s));
          per.push_back(l * (with_w ? values(w)[i / 3] : 1.0));
        }
        F::BCEWithLogitsOptions o{with_w ? w : Tensor(), with_pw ? pw : Tensor(), red};
        EXPECT_TRUE(all_close(F::binary_cross_entropy_with_logits(x, y, o), reduce(per, red, 12), 1e-10, 1e-12));
        Tensor xl = leaf(x), yl = leaf(y);
        EXPECT_TRUE(gradcheck([&](V in) { return F::binary_cross_entropy_with_logits(in[0], in[1], o); }, {xl, yl}));
      }
  // extreme logits: finite, and log(1 + e^-|x|) + max(-x, 0) exactly
  Tensor big = from_vector<float>({100, -100, 0});
  Tensor t = from_vector<float>({0, 1, 1});
  EXPECT_TRUE(all_close(F::binary_cross_entropy_with_logits(big, t, {.reduction = "none"}), {100, 100, std::log(2.0)},
                        1e-6, 1e-6));
  Tensor bl = big.detach().requires_grad_();
  F::binary_cross_entropy_with_logits(bl, t, {.reduction = "sum"}).backward();
  EXPECT_TRUE(all_close(bl.grad(), {1, -1, -0.5}, 1e-6, 1e-6));  // sigmoid(x) - y
  EXPECT_TRUE(equal(nn::BCEWithLogitsLoss({.pos_weight = pw})(x, y),
                    F::binary_cross_entropy_with_logits(x, y, {.pos_weight = pw})));
  EXPECT_THROW(F::binary_cross_entropy_with_logits(x, y, {.pos_weight = ones({4})}), Error);
  EXPECT_EQ(nn::BCEWithLogitsLoss({.pos_weight = pw}).state_dict().count("pos_weight"), 1u);
}

TEST(KLDiv, MatchesReferenceAndGradCheck) {
  Generator g(7);
  Tensor input = log_softmax(randn({3, 4}, kFloat64, &g), 1);
  Tensor p = softmax(randn({3, 4}, kFloat64, &g), 1);
  std::vector<double> iv = values(input), pv = values(p);
  pv[5] = 0;  // a zero target contributes 0 (xlogy)
  Tensor target = from_vector(pv, Shape{3, 4});
  for (bool log_target : {false, true})
    for (std::string red : {"mean", "sum", "none", "batchmean"}) {
      SCOPED_TRACE(fmt::format("log_target={} {}", log_target, red));
      Tensor t = log_target ? log_softmax(randn({3, 4}, kFloat64, &g), 1) : target;
      std::vector<double> tv = values(t), per;
      for (int i = 0; i < 12; ++i)
        per.push_back(log_target ? std::exp(tv[i]) * (tv[i] - iv[i])
                                 : (tv[i] > 0 ? tv[i] * std::log(tv[i]) : 0.0) - tv[i] * iv[i]);
      auto want = red == "batchmean" ? std::vector<double>{reduce(per, "sum", 1)[0] / 3} : reduce(per, red, 12);
      EXPECT_TRUE(all_close(F::kl_div(input, t, red, log_target), want, 1e-12, 1e-12));
      // the gradient check avoids the zero target, where y log y is not differentiable
      Tensor il = leaf(input), tl = leaf(log_target ? t : p);
      EXPECT_TRUE(gradcheck([&](V in) { return F::kl_div(in[0], in[1], red, log_target); }, {il, tl}));
    }
  EXPECT_TRUE(equal(nn::KLDivLoss({.reduction = "batchmean"})(input, target), F::kl_div(input, target, "batchmean")));
  // a negative target has no y log y: NaN, as PyTorch's xlogy
  const std::vector<double> kl =
      values(F::kl_div(from_vector<double>({-1, -2}), from_vector<double>({-0.5, 0}), "none"));
  EXPECT_TRUE(std::isnan(kl[0]));
  EXPECT_EQ(kl[1], 0.0);
  EXPECT_THROW(F::mse_loss(input, target, "batchmean"), Error);
}
