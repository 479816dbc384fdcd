// binary_cross_entropy, huber, soft margin, margin ranking, hinge and cosine embedding, triplet
// margin, Poisson and Gaussian NLL and multi-label soft margin losses, and the distances
// cosine_similarity, pairwise_distance and normalize: against float64 references written here
// from PyTorch's formulas for every reduction and the edge cases its documentation names, with
// finite-difference gradient checks, their modules, and bad input.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "nn/nn_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::gradcheck;
using strata::testing::leaf;
using strata::testing::throws_with;
using strata::testing::values;
namespace F = strata::nn::functional;
using V = const std::vector<Tensor>&;

namespace {

const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const std::vector<std::string> kReductions = {"mean", "sum", "none"};

// Reduces per-sample losses: "none" keeps them, "sum" adds, "mean" divides by their count.
std::vector<double> reduce(const std::vector<double>& per, const std::string& r) {
  if (r == "none") return per;
  double s = 0;
  for (double v : per) s += v;
  return {r == "sum" ? s : s / static_cast<double>(per.size())};
}

Tensor vec(const std::vector<double>& v, const Shape& shape) { return from_vector<double>(v, shape); }

// (sum_i |a_i - b_i + eps|^p)^(1/p) over rows of length d; p = inf is the largest magnitude.
std::vector<double> distance_ref(const std::vector<double>& a, const std::vector<double>& b, size_t d, double p,
                                 double eps) {
  std::vector<double> out;
  for (size_t r = 0; r < a.size() / d; ++r) {
    double acc = 0;
    for (size_t i = 0; i < d; ++i) {
      const double v = std::fabs(a[r * d + i] - b[r * d + i] + eps);
      acc = std::isinf(p) ? std::max(acc, v) : acc + std::pow(v, p);
    }
    out.push_back(std::isinf(p) ? acc : std::pow(acc, 1 / p));
  }
  return out;
}

double log_sigmoid(double x) { return x >= 0 ? -std::log1p(std::exp(-x)) : x - std::log1p(std::exp(x)); }

}  // namespace

TEST(BinaryCrossEntropy, MatchesReferenceAndGradCheck) {
  Generator g(21);
  const Tensor x = rand({4, 3}, kFloat64, &g) * 0.9 + 0.05, y = rand({4, 3}, kFloat64, &g);
  const std::vector<double> xv = values(x), yv = values(y);
  const Tensor w_rows = vec({1.0, 0.0, 2.0, 0.5}, {4, 1}), w_cols = vec({0.5, 1.5, 3.0}, {3});
  for (const Tensor& w : {Tensor(), w_rows, w_cols})
    for (const std::string& red : kReductions) {
      SCOPED_TRACE(fmt::format("weight {} {}", w.defined() ? w.shape() : Shape{}, red));
      std::vector<double> per;
      for (size_t i = 0; i < 12; ++i) {
        const double wi = !w.defined() ? 1.0 : w.dim() == 2 ? values(w)[i / 3] : values(w)[i % 3];
        per.push_back(-wi * (yv[i] * std::log(xv[i]) + (1 - yv[i]) * std::log(1 - xv[i])));
      }
      EXPECT_TRUE(all_close(F::binary_cross_entropy(x, y, {w, red}), reduce(per, red), 1e-12, 1e-14));
      std::vector<Tensor> in = {leaf(x), leaf(y)};
      if (w.defined()) in.push_back(leaf(w));
      EXPECT_TRUE(gradcheck(
          [&](V t) { return F::binary_cross_entropy(t[0], t[1], {t.size() > 2 ? t[2] : Tensor(), red}); }, in));
    }
}

// Probabilities of exactly 0 and 1 (and below e^-100) give finite losses, each log clamped at
// -100 as in PyTorch, and finite gradients: the clamped formula's derivative.
TEST(BinaryCrossEntropy, ClampsLogsAtMinus100) {
  const std::vector<double> xv = {0, 1, 0, 1, 1e-50, 0.5}, yv = {1, 0, 0, 1, 1, 0.25};
  std::vector<double> per, dx, dy;
  for (size_t i = 0; i < xv.size(); ++i) {
    const double lx = std::max(std::log(xv[i]), -100.0), l1mx = std::max(std::log1p(-xv[i]), -100.0);
    per.push_back(-(yv[i] * lx + (1 - yv[i]) * l1mx));
    dx.push_back((lx > -100 ? -yv[i] / xv[i] : 0.0) + (l1mx > -100 ? (1 - yv[i]) / (1 - xv[i]) : 0.0));
    dy.push_back(l1mx - lx);
  }
  EXPECT_TRUE(all_close(per, {100, 100, 0, 0, 100, -0.25 * std::log(0.5) - 0.75 * std::log(0.5)}, 1e-15, 0));
  for (DType dt : {kFloat64, kFloat32}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = vec(xv, {6}).to(dt).requires_grad_(), y = vec(yv, {6}).to(dt).requires_grad_();
    Tensor loss = F::binary_cross_entropy(x, y, {.reduction = "none"});
    EXPECT_TRUE(all_close(loss, per, 1e-6, 0));
    sum(loss).backward();
    // 1e-50 is 0 in float32: both clamp the log
    EXPECT_TRUE(all_close(x.grad(), dx, 1e-6, 0));
    EXPECT_TRUE(all_close(y.grad(), dy, 1e-6, 0));
  }
}

TEST(BinaryCrossEntropy, BadInput) {
  const Tensor x = full({4, 3}, 0.5, kFloat64), y = full({4, 3}, 1.0, kFloat64);
  const char* op = "[binary_cross_entropy]";
  EXPECT_TRUE(throws_with([&] { F::binary_cross_entropy(x * 3, y); }, {op, "input", "[0, 1]"}));
  EXPECT_TRUE(throws_with([&] { F::binary_cross_entropy(x * kNaN, y); }, {op, "input", "[0, 1]"}));
  EXPECT_TRUE(throws_with([&] { F::binary_cross_entropy(x, -y); }, {op, "target", "[0, 1]"}));
  EXPECT_TRUE(throws_with([&] { F::binary_cross_entropy(x, full({3, 4}, 1.0)); }, {op, "[4, 3]", "[3, 4]"}));
  EXPECT_TRUE(throws_with([&] { F::binary_cross_entropy(x, y, {.weight = ones({4})}); }, {op}));
  EXPECT_TRUE(throws_with([&] { F::binary_cross_entropy(x, y, {.weight = ones({2, 1, 1})}); }, {op, "weight"}));
  EXPECT_TRUE(throws_with([&] { F::binary_cross_entropy(x, y, {.reduction = "avg"}); }, {op, "\"avg\""}));
  EXPECT_TRUE(throws_with([&] { F::binary_cross_entropy(zeros({4, 3}, kInt64), y); }, {op, "floating", "int64"}));
  EXPECT_TRUE(throws_with([&] { F::binary_cross_entropy(x, Tensor()); }, {op, "target is undefined"}));
  EXPECT_TRUE(throws_with([&] { F::binary_cross_entropy(x, ones({4, 3}, kBool)); }, {op, "target", "bool"}));
  EXPECT_TRUE(throws_with([&] { nn::BCELoss({.reduction = "avg"}); }, {"[BCELoss]"}));
}

TEST(HuberLoss, MatchesReferenceAndGradCheck) {
  Generator g(22);
  const Tensor x = randn({3, 4}, kFloat64, &g) * 2, y = randn({3, 4}, kFloat64, &g) * 2;
  const std::vector<double> xv = values(x), yv = values(y);
  for (double delta : {0.5, 1.0, 2.5})
    for (const std::string& red : kReductions) {
      SCOPED_TRACE(fmt::format("delta={} {}", delta, red));
      std::vector<double> per;
      for (size_t i = 0; i < 12; ++i) {
        const double d = std::fabs(xv[i] - yv[i]);
        per.push_back(d < delta ? 0.5 * d * d : delta * (d - 0.5 * delta));
      }
      EXPECT_TRUE(all_close(F::huber_loss(x, y, red, delta), reduce(per, red), 1e-12, 1e-14));
      EXPECT_TRUE(gradcheck([&](V t) { return F::huber_loss(t[0], t[1], red, delta); }, {leaf(x), leaf(y)}));
    }
  // huber(delta) = delta * smooth_l1(beta = delta)
  EXPECT_TRUE(all_close(F::huber_loss(x, y, "none", 2.0), values(F::smooth_l1_loss(x, y, "none", 2.0) * 2), 1e-12,
                        1e-14));
  EXPECT_TRUE(equal(nn::HuberLoss({.reduction = "sum", .delta = 0.5})(x, y), F::huber_loss(x, y, "sum", 0.5)));
  EXPECT_TRUE(throws_with([&] { F::huber_loss(x, y, "mean", 0); }, {"[huber_loss]", "delta", "positive"}));
  EXPECT_TRUE(throws_with([&] { F::huber_loss(x, y, "mean", kNaN); }, {"[huber_loss]", "delta"}));
  EXPECT_TRUE(throws_with([&] { nn::HuberLoss({.delta = -1}); }, {"[HuberLoss]", "delta"}));
  EXPECT_TRUE(throws_with([&] { F::huber_loss(x, y.t()); }, {"[huber_loss]", "[3, 4]", "[4, 3]"}));
}

TEST(SoftMarginLoss, MatchesReferenceStableAndGradCheck) {
  Generator g(23);
  const Tensor x = randn({4, 3}, kFloat64, &g) * 2;
  const Tensor y = vec({1, -1, -1, 1, 1, 1, -1, -1, 1, -1, 1, -1}, {4, 3});
  const std::vector<double> xv = values(x), yv = values(y);
  for (const std::string& red : kReductions) {
    SCOPED_TRACE(red);
    std::vector<double> per;
    for (size_t i = 0; i < 12; ++i) per.push_back(std::log1p(std::exp(-yv[i] * xv[i])));
    EXPECT_TRUE(all_close(F::soft_margin_loss(x, y, red), reduce(per, red), 1e-12, 1e-14));
    EXPECT_TRUE(gradcheck([&](V t) { return F::soft_margin_loss(t[0], t[1], red); }, {leaf(x), leaf(y)}));
  }
  // large margins neither overflow nor lose the tiny losses; the slope at 0 is -y / 2
  Tensor big = from_vector<float>({100, -100, 0, 40}).requires_grad_();
  const Tensor labels = from_vector<float>({-1, 1, 1, 1});
  Tensor loss = F::soft_margin_loss(big, labels, "none");
  EXPECT_TRUE(all_close(loss, {100, 100, std::log(2.0), std::exp(-40.0)}, 1e-6, 0));
  sum(loss).backward();
  EXPECT_TRUE(all_close(big.grad(), {1, -1, -0.5, -std::exp(-40.0)}, 1e-6, 0));
  EXPECT_TRUE(equal(nn::SoftMarginLoss("sum")(x, y), F::soft_margin_loss(x, y, "sum")));
  // integer labels are converted
  EXPECT_TRUE(equal(F::soft_margin_loss(x, y.to(kInt64)), F::soft_margin_loss(x, y)));
  EXPECT_TRUE(throws_with([&] { F::soft_margin_loss(x, y.view({12})); }, {"[soft_margin_loss]", "[12]"}));
  EXPECT_TRUE(throws_with([&] { nn::SoftMarginLoss("batchmean"); }, {"[SoftMarginLoss]", "batchmean"}));
}

TEST(MarginRankingLoss, MatchesReferenceAndGradCheck) {
  Generator g(24);
  const Tensor x1 = randn({2, 3}, kFloat64, &g), x2 = randn({2, 3}, kFloat64, &g);
  const Tensor y = vec({1, -1, 1, 1, -1, -1}, {2, 3});
  const std::vector<double> av = values(x1), bv = values(x2), yv = values(y);
  for (double margin : {0.0, 0.5})
    for (const std::string& red : kReductions) {
      SCOPED_TRACE(fmt::format("margin={} {}", margin, red));
      std::vector<double> per;
      for (size_t i = 0; i < 6; ++i) per.push_back(std::max(0.0, -yv[i] * (av[i] - bv[i]) + margin));
      EXPECT_TRUE(all_close(F::margin_ranking_loss(x1, x2, y, margin, red), reduce(per, red), 1e-12, 1e-14));
      EXPECT_TRUE(gradcheck([&](V t) { return F::margin_ranking_loss(t[0], t[1], y, margin, red); },
                            {leaf(x1), leaf(x2)}));
    }
  EXPECT_TRUE(equal(nn::MarginRankingLoss({.margin = 0.5})(x1, x2, y), F::margin_ranking_loss(x1, x2, y, 0.5)));
  const char* op = "[margin_ranking_loss]";
  EXPECT_TRUE(throws_with([&] { F::margin_ranking_loss(x1, x2.view({6}), y); }, {op, "input2", "[6]"}));
  EXPECT_TRUE(throws_with([&] { F::margin_ranking_loss(x1, x2, y.view({6})); }, {op, "target", "[6]"}));
  EXPECT_TRUE(throws_with([&] { F::margin_ranking_loss(x1, x2.to(kInt32), y); }, {op, "input2", "floating"}));
}

TEST(HingeEmbeddingLoss, MatchesReferenceAndGradCheck) {
  Generator g(25);
  const Tensor x = randn({8}, kFloat64, &g) * 1.5;
  const Tensor y = vec({1, -1, 1, -1, 0, 2, -1, 1}, {8});  // 0 and 2 take both terms, as in PyTorch
  const std::vector<double> xv = values(x), yv = values(y);
  for (double margin : {1.0, 0.3})
    for (const std::string& red : kReductions) {
      SCOPED_TRACE(fmt::format("margin={} {}", margin, red));
      std::vector<double> per;
      for (size_t i = 0; i < 8; ++i)
        per.push_back((yv[i] != -1 ? xv[i] : 0.0) + (yv[i] != 1 ? std::max(0.0, margin - xv[i]) : 0.0));
      EXPECT_TRUE(all_close(F::hinge_embedding_loss(x, y, margin, red), reduce(per, red), 1e-12, 1e-14));
      EXPECT_TRUE(gradcheck([&](V t) { return F::hinge_embedding_loss(t[0], y, margin, red); }, {leaf(x)}));
    }
  EXPECT_TRUE(equal(nn::HingeEmbeddingLoss({.margin = 0.3})(x, y), F::hinge_embedding_loss(x, y, 0.3)));
  EXPECT_TRUE(throws_with([&] { F::hinge_embedding_loss(x, y.view({2, 4})); }, {"[hinge_embedding_loss]", "[2, 4]"}));
  EXPECT_TRUE(throws_with([&] { F::hinge_embedding_loss(x, y, 1, "max"); }, {"[hinge_embedding_loss]", "max"}));
}

TEST(CosineEmbeddingLoss, MatchesReferenceAndGradCheck) {
  Generator g(26);
  const int64_t n = 5, d = 4;
  const Tensor x1 = randn({n, d}, kFloat64, &g), x2 = randn({n, d}, kFloat64, &g);
  const Tensor y = vec({1, -1, 1, -1, 0}, {n});  // a label of 0 adds nothing
  const std::vector<double> av = values(x1), bv = values(x2), yv = values(y);
  auto cos_ref = [&](const std::vector<double>& a, const std::vector<double>& b, int64_t row) {
    double dot = 0, na = 0, nb = 0;
    for (int64_t i = row * d; i < (row + 1) * d; ++i) dot += a[i] * b[i], na += a[i] * a[i], nb += b[i] * b[i];
    return dot / std::sqrt((na + 1e-12) * (nb + 1e-12));
  };
  for (double margin : {0.0, -0.2})
    for (const std::string& red : kReductions) {
      SCOPED_TRACE(fmt::format("margin={} {}", margin, red));
      std::vector<double> per;
      for (int64_t i = 0; i < n; ++i) {
        const double c = cos_ref(av, bv, i);
        per.push_back(yv[i] == 1 ? 1 - c : yv[i] == -1 ? std::max(0.0, c - margin) : 0.0);
      }
      EXPECT_TRUE(all_close(F::cosine_embedding_loss(x1, x2, y, margin, red), reduce(per, red), 1e-12, 1e-14));
      EXPECT_TRUE(gradcheck([&](V t) { return F::cosine_embedding_loss(t[0], t[1], y, margin, red); },
                            {leaf(x1), leaf(x2)}));
    }
  // unbatched: (D) inputs and a 0-d label
  const Tensor a = x1.select(0, 1), b = x2.select(0, 1), minus_one = full({}, -1.0, kFloat64);
  Tensor single = F::cosine_embedding_loss(a, b, minus_one, 0, "none");
  EXPECT_EQ(single.shape(), Shape{});
  EXPECT_TRUE(all_close(single, {std::max(0.0, cos_ref(av, bv, 1))}, 1e-12, 1e-14));
  // a zero vector has cosine 0 (the 1e-12 keeps it finite), with finite gradients
  Tensor zero_row = leaf(zeros({1, d}, kFloat64));
  Tensor loss = F::cosine_embedding_loss(zero_row, x2.narrow(0, 0, 1), vec({1}, {1}));
  EXPECT_TRUE(all_close(loss, {1.0}, 1e-15, 0));
  loss.backward();
  EXPECT_TRUE(all(isfinite(zero_row.grad())).item<bool>());
  EXPECT_TRUE(equal(nn::CosineEmbeddingLoss({.margin = 0.1})(x1, x2, y), F::cosine_embedding_loss(x1, x2, y, 0.1)));
  const char* op = "[cosine_embedding_loss]";
  EXPECT_TRUE(throws_with([&] { F::cosine_embedding_loss(x1, x2, y.view({n, 1})); }, {op, "0-d or 1-d"}));
  EXPECT_TRUE(throws_with([&] { F::cosine_embedding_loss(a, b, y); }, {op, "[5]", "[4]"}));
  EXPECT_TRUE(throws_with([&] { F::cosine_embedding_loss(x1, x2, vec({1, -1}, {2})); }, {op, "[2]", "[5, 4]"}));
  EXPECT_TRUE(throws_with([&] { F::cosine_embedding_loss(x1, x2, minus_one); }, {op, "0-d target", "1-d inputs"}));
  EXPECT_TRUE(throws_with([&] { F::cosine_embedding_loss(x1, x2.narrow(1, 0, 3), y); }, {op, "input2", "[5, 3]"}));
}

TEST(TripletMarginLoss, MatchesReferenceWithSwapAndGradCheck) {
  Generator g(27);
  const int64_t n = 5, d = 4;
  const Tensor anchor = randn({n, d}, kFloat64, &g), positive = anchor + randn({n, d}, kFloat64, &g) * 0.5;
  // the first two negatives lie next to their positive, far from the anchor: the swap uses d(p, n)
  Tensor negative = randn({n, d}, kFloat64, &g) * 2;
  negative.narrow(0, 0, 2).copy_(positive.narrow(0, 0, 2) + randn({2, d}, kFloat64, &g) * 0.1);
  const std::vector<double> av = values(anchor), pv = values(positive), nv = values(negative);
  for (double p : {1.0, 2.0, 3.0})
    for (bool swap : {false, true})
      for (const std::string& red : kReductions) {
        SCOPED_TRACE(fmt::format("p={} swap={} {}", p, swap, red));
        const F::TripletMarginLossOptions o{.margin = 2.0, .p = p, .swap = swap, .reduction = red};
        const auto dp = distance_ref(av, pv, d, p, 1e-6), dn = distance_ref(av, nv, d, p, 1e-6),
                   ds = distance_ref(pv, nv, d, p, 1e-6);
        std::vector<double> per;
        for (int64_t i = 0; i < n; ++i)
          per.push_back(std::max(0.0, 2.0 + dp[i] - (swap ? std::min(dn[i], ds[i]) : dn[i])));
        if (swap) EXPECT_LT(ds[0], dn[0]);  // the swap matters
        EXPECT_TRUE(all_close(F::triplet_margin_loss(anchor, positive, negative, o), reduce(per, red), 1e-12, 1e-14));
        EXPECT_TRUE(gradcheck([&](V t) { return F::triplet_margin_loss(t[0], t[1], t[2], o); },
                              {leaf(anchor), leaf(positive), leaf(negative)}));
      }
  // unbatched (D) inputs give a 0-d loss; the defaults are margin 1, p 2, eps 1e-6
  const Tensor a = anchor.select(0, 3), ps = positive.select(0, 3), ng = negative.select(0, 3);
  const double want = std::max(0.0, 1 + distance_ref(values(a), values(ps), d, 2, 1e-6)[0] -
                                        distance_ref(values(a), values(ng), d, 2, 1e-6)[0]);
  EXPECT_TRUE(all_close(F::triplet_margin_loss(a, ps, ng, {.reduction = "none"}), {want}, 1e-12, 1e-14));
  EXPECT_TRUE(equal(nn::TripletMarginLoss({.swap = true})(anchor, positive, negative),
                    F::triplet_margin_loss(anchor, positive, negative, {.swap = true})));
  const char* op = "[triplet_margin_loss]";
  EXPECT_TRUE(throws_with([&] { F::triplet_margin_loss(anchor, positive, ng); }, {op, "negative", "[4]"}));
  EXPECT_TRUE(throws_with([&] { F::triplet_margin_loss(sum(a), sum(ps), sum(ng)); }, {op, "0-d"}));
  EXPECT_TRUE(throws_with([&] { nn::TripletMarginLoss({.reduction = ""}); }, {"[TripletMarginLoss]"}));
}

TEST(PoissonNLLLoss, MatchesReferenceWithStirlingAndGradCheck) {
  Generator g(28);
  const Tensor log_rate = randn({2, 4}, kFloat64, &g), rate = rand({2, 4}, kFloat64, &g) + 0.1;
  // targets on both sides of 1, where Stirling's term starts
  const Tensor y = vec({0, 0.5, 1, 2, 3.5, 7, 1.5, 4}, {2, 4});
  const Tensor y_smooth = vec({0, 0.5, 0.25, 2, 3.5, 7, 1.5, 4}, {2, 4});  // none at the jump at 1
  const std::vector<double> yv = values(y);
  for (bool log_input : {true, false})
    for (bool full : {false, true})
      for (const std::string& red : kReductions) {
        SCOPED_TRACE(fmt::format("log_input={} full={} {}", log_input, full, red));
        const Tensor& x = log_input ? log_rate : rate;
        const std::vector<double> xv = values(x);
        std::vector<double> per;
        for (size_t i = 0; i < 8; ++i) {
          double l = log_input ? std::exp(xv[i]) - yv[i] * xv[i] : xv[i] - yv[i] * std::log(xv[i] + 1e-8);
          if (full && yv[i] > 1) l += yv[i] * std::log(yv[i]) - yv[i] + 0.5 * std::log(2 * std::numbers::pi * yv[i]);
          per.push_back(l);
        }
        const F::PoissonNLLLossOptions o{.log_input = log_input, .full = full, .reduction = red};
        EXPECT_TRUE(all_close(F::poisson_nll_loss(x, y, o), reduce(per, red), 1e-12, 1e-14));
        EXPECT_TRUE(gradcheck([&](V t) { return F::poisson_nll_loss(t[0], t[1], o); }, {leaf(x), leaf(y_smooth)}));
      }
  // at the rate y itself, the full loss of y = 5 is 0.5 log(2 pi 5) (the exact -log P would use log 5!)
  const Tensor five = full({}, 5.0, kFloat64);
  EXPECT_TRUE(all_close(F::poisson_nll_loss(log(five), five, {.full = true}), {0.5 * std::log(10 * std::numbers::pi)},
                        1e-12, 0));
  // eps keeps a zero rate finite
  EXPECT_TRUE(all_close(F::poisson_nll_loss(zeros({1}, kFloat64), five.view({1}), {.log_input = false}),
                        {-5 * std::log(1e-8)}, 1e-12, 0));
  EXPECT_TRUE(equal(nn::PoissonNLLLoss({.full = true})(log_rate, y), F::poisson_nll_loss(log_rate, y, {.full = true})));
  EXPECT_TRUE(throws_with([&] { F::poisson_nll_loss(log_rate, y.t()); }, {"[poisson_nll_loss]", "[4, 2]"}));
  EXPECT_TRUE(throws_with([&] { F::poisson_nll_loss(log_rate, y, {.reduction = "Mean"}); }, {"[poisson_nll_loss]"}));
}

TEST(GaussianNLLLoss, MatchesReferenceForEachVarShape) {
  Generator g(29);
  const int64_t n = 4, d = 3;
  const Tensor x = randn({n, d}, kFloat64, &g), y = randn({n, d}, kFloat64, &g);
  const std::vector<double> xv = values(x), yv = values(y);
  const Tensor var_full = rand({n, d}, kFloat64, &g) + 0.1, var_row = rand({n}, kFloat64, &g) + 0.1;
  // var of the input's shape, of its shape without the last dim, and with a last dim of 1
  for (const Tensor& var : {var_full, var_row, var_row.view({n, 1})})
    for (bool full : {false, true})
      for (const std::string& red : kReductions) {
        SCOPED_TRACE(fmt::format("var {} full={} {}", var.shape(), full, red));
        const std::vector<double> vv = values(var);
        std::vector<double> per;
        for (size_t i = 0; i < 12; ++i) {
          const double v = var.numel() == 12 ? vv[i] : vv[i / 3];
          per.push_back(0.5 * (std::log(v) + (xv[i] - yv[i]) * (xv[i] - yv[i]) / v) +
                        (full ? 0.5 * std::log(2 * std::numbers::pi) : 0.0));
        }
        const F::GaussianNLLLossOptions o{.full = full, .reduction = red};
        Tensor loss = F::gaussian_nll_loss(x, y, var, o);
        EXPECT_EQ(loss.shape(), (red == "none" ? Shape{n, d} : Shape{}));
        EXPECT_TRUE(all_close(loss, reduce(per, red), 1e-12, 1e-14));
        EXPECT_TRUE(gradcheck([&](V t) { return F::gaussian_nll_loss(t[0], t[1], t[2], o); },
                              {leaf(x), leaf(y), leaf(var)}));
      }
  // a target broadcasting along the last dim; an unbatched input with a 0-d var
  const Tensor y_col = y.narrow(1, 0, 1);
  std::vector<double> per;
  for (size_t i = 0; i < 12; ++i) per.push_back(0.5 * std::pow(xv[i] - yv[i / 3 * 3], 2));
  EXPECT_TRUE(all_close(F::gaussian_nll_loss(x, y_col, ones({n, d}, kFloat64), {.reduction = "none"}), per, 1e-12, 0));
  const Tensor two = full({}, 2.0, kFloat64);
  Tensor unbatched = F::gaussian_nll_loss(x.select(0, 0), y.select(0, 0), two, {.reduction = "none"});
  std::vector<double> want;
  for (size_t i = 0; i < 3; ++i) want.push_back(0.5 * (std::log(2.0) + std::pow(xv[i] - yv[i], 2) / 2));
  EXPECT_TRUE(all_close(unbatched, want, 1e-12, 0));
  EXPECT_TRUE(equal(nn::GaussianNLLLoss({.full = true})(x, y, var_row),
                    F::gaussian_nll_loss(x, y, var_row, {.full = true})));
}

// A variance below eps is raised to eps in the loss, yet its gradient is the loss's slope at eps
// passed to var unchanged, as PyTorch's clamp under no_grad.
TEST(GaussianNLLLoss, ClampsVarToEpsAndKeepsItsGradient) {
  const double eps = 1e-3;
  const std::vector<double> xv = {0.5, -0.2, 0.1}, yv = {0.4, 0.3, 0.1}, vv = {0.0, 1e-6, 0.5};
  Tensor var = leaf(vec(vv, {3}));
  Tensor loss = F::gaussian_nll_loss(vec(xv, {3}), vec(yv, {3}), var, {.eps = eps, .reduction = "none"});
  std::vector<double> want, slope;
  for (size_t i = 0; i < 3; ++i) {
    const double v = std::max(vv[i], eps), r2 = (xv[i] - yv[i]) * (xv[i] - yv[i]);
    want.push_back(0.5 * (std::log(v) + r2 / v));
    slope.push_back(0.5 * (1 / v - r2 / (v * v)));
  }
  EXPECT_TRUE(all_close(loss, want, 1e-12, 0));
  sum(loss).backward();
  EXPECT_TRUE(all_close(var.grad(), slope, 1e-12, 0));
}

TEST(GaussianNLLLoss, BadInput) {
  const Tensor x = zeros({4, 3}, kFloat64), y = zeros({4, 3}, kFloat64);
  const char* op = "[gaussian_nll_loss]";
  EXPECT_TRUE(throws_with([&] { F::gaussian_nll_loss(x, y, vec({1, -1e-9, 1, 1}, {4})); }, {op, "var", "negative"}));
  EXPECT_TRUE(throws_with([&] { F::gaussian_nll_loss(x, y, ones({3}, kFloat64)); }, {op, "var", "[3]", "[4, 3]"}));
  EXPECT_TRUE(throws_with([&] { F::gaussian_nll_loss(x, y, ones({4, 2}, kFloat64)); }, {op, "var", "[4, 2]"}));
  EXPECT_TRUE(throws_with([&] { F::gaussian_nll_loss(x, zeros({2, 3}, kFloat64), ones({4, 3})); }, {op}));
  EXPECT_TRUE(throws_with([&] { F::gaussian_nll_loss(x, y, ones({4, 3}, kInt64)); }, {op, "var", "floating"}));
  EXPECT_TRUE(throws_with([&] { F::gaussian_nll_loss(x, y, Tensor()); }, {op, "var is undefined"}));
  EXPECT_TRUE(throws_with([&] { F::gaussian_nll_loss(x, y, ones({4, 3}), {.reduction = "batchmean"}); }, {op}));
}

TEST(MultiLabelSoftMarginLoss, MatchesReferenceAndGradCheck) {
  Generator g(30);
  const int64_t n = 4, c = 5;
  const Tensor x = randn({n, c}, kFloat64, &g) * 2;
  const Tensor y = vec({1, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0.25, 1, 0, 0}, {n, c});
  const Tensor w = rand({c}, kFloat64, &g) + 0.5;
  const std::vector<double> xv = values(x), yv = values(y), wv = values(w);
  for (bool weighted : {false, true})
    for (const std::string& red : kReductions) {
      SCOPED_TRACE(fmt::format("weighted={} {}", weighted, red));
      std::vector<double> per(n, 0.0);
      for (int64_t i = 0; i < n * c; ++i)
        per[i / c] -= (weighted ? wv[i % c] : 1.0) *
                      (yv[i] * log_sigmoid(xv[i]) + (1 - yv[i]) * log_sigmoid(-xv[i])) / static_cast<double>(c);
      const F::MultiLabelSoftMarginLossOptions o{weighted ? w : Tensor(), red};
      Tensor loss = F::multilabel_soft_margin_loss(x, y, o);
      EXPECT_EQ(loss.shape(), (red == "none" ? Shape{n} : Shape{}));
      EXPECT_TRUE(all_close(loss, reduce(per, red), 1e-12, 1e-14));
      std::vector<Tensor> in = {leaf(x), leaf(y)};
      if (weighted) in.push_back(leaf(w));
      EXPECT_TRUE(gradcheck(
          [&](V t) { return F::multilabel_soft_margin_loss(t[0], t[1], {t.size() > 2 ? t[2] : Tensor(), red}); },
          in));
    }
  // unbatched (C) gives a 0-d loss; integer targets are converted; large logits stay finite
  Tensor row = F::multilabel_soft_margin_loss(x.select(0, 0), y.select(0, 0), {.reduction = "none"});
  EXPECT_EQ(row.shape(), Shape{});
  EXPECT_TRUE(all_close(row, {values(F::multilabel_soft_margin_loss(x, y, {.reduction = "none"}))[0]}, 1e-15, 0));
  const Tensor y01 = y.narrow(0, 0, 2);
  EXPECT_TRUE(equal(F::multilabel_soft_margin_loss(x.narrow(0, 0, 2), y01.to(kInt64)),
                    F::multilabel_soft_margin_loss(x.narrow(0, 0, 2), y01)));
  const Tensor big = from_vector<float>({100, -100, 100}, Shape{1, 3});
  const Tensor labels = from_vector<float>({0, 1, 1}, Shape{1, 3});
  EXPECT_TRUE(all_close(F::multilabel_soft_margin_loss(big, labels), {200.0 / 3}, 1e-6, 0));
  nn::MultiLabelSoftMarginLoss module({.weight = w});
  EXPECT_TRUE(equal(module(x, y), F::multilabel_soft_margin_loss(x, y, {.weight = w})));
  EXPECT_EQ(module.state_dict().count("weight"), 1u);
  const char* op = "[multilabel_soft_margin_loss]";
  EXPECT_TRUE(throws_with([&] { F::multilabel_soft_margin_loss(x, y.t()); }, {op, "[5, 4]"}));
  EXPECT_TRUE(throws_with([&] { F::multilabel_soft_margin_loss(x, y, {.weight = ones({4})}); }, {op}));
  EXPECT_TRUE(throws_with([&] { F::multilabel_soft_margin_loss(sum(x), sum(y)); }, {op, "0-d"}));
}

TEST(Distances, CosineSimilarity) {
  Generator g(31);
  const Tensor x1 = randn({3, 5}, kFloat64, &g), x2 = randn({3, 5}, kFloat64, &g);
  // sum_i a_i / max(|a|, eps) * b_i / max(|b|, eps) over the rows or columns of (3, 5) matrices
  auto ref = [](const std::vector<double>& a, const std::vector<double>& b, bool rows, double eps) {
    std::vector<double> out;
    const int64_t outer = rows ? 3 : 5, inner = rows ? 5 : 3;
    for (int64_t o = 0; o < outer; ++o) {
      auto at = [&](const std::vector<double>& v, int64_t i) { return v[rows ? o * 5 + i : i * 5 + o]; };
      double na = 0, nb = 0, dot = 0;
      for (int64_t i = 0; i < inner; ++i) na += at(a, i) * at(a, i), nb += at(b, i) * at(b, i);
      na = std::max(std::sqrt(na), eps), nb = std::max(std::sqrt(nb), eps);
      for (int64_t i = 0; i < inner; ++i) dot += at(a, i) / na * at(b, i) / nb;
      out.push_back(dot);
    }
    return out;
  };
  const std::vector<double> av = values(x1), bv = values(x2);
  EXPECT_TRUE(all_close(F::cosine_similarity(x1, x2), ref(av, bv, true, 1e-8), 1e-12, 1e-14));
  EXPECT_TRUE(all_close(F::cosine_similarity(x1, x2, -1), ref(av, bv, true, 1e-8), 1e-12, 1e-14));
  EXPECT_TRUE(all_close(F::cosine_similarity(x1, x2, 0), ref(av, bv, false, 1e-8), 1e-12, 1e-14));
  for (int64_t dim : {0, 1})
    EXPECT_TRUE(gradcheck([&](V t) { return F::cosine_similarity(t[0], t[1], dim); }, {leaf(x1), leaf(x2)}));
  // one row broadcast against every row
  const Tensor one = x2.narrow(0, 1, 1);
  std::vector<double> bcast;
  for (int64_t r = 0; r < 3; ++r) bcast.insert(bcast.end(), bv.begin() + 5, bv.begin() + 10);
  EXPECT_TRUE(all_close(F::cosine_similarity(x1, one), ref(av, bcast, true, 1e-8), 1e-12, 1e-14));
  EXPECT_TRUE(gradcheck([&](V t) { return F::cosine_similarity(t[0], t[1]); }, {leaf(x1), leaf(one)}));
  // a zero vector: cosine 0 through eps, and the gradient PyTorch gives, x2 / (|x2| eps)
  Tensor zero = leaf(zeros({1, 5}, kFloat64));
  Tensor cos = F::cosine_similarity(zero, one);
  EXPECT_TRUE(all_close(cos, {0.0}, 0, 0));
  cos.backward();
  const double norm_b = std::sqrt(values(sum(square(one)))[0]);
  std::vector<double> grad_want;
  for (int64_t i = 5; i < 10; ++i) grad_want.push_back(bv[i] / norm_b / 1e-8);
  EXPECT_TRUE(all_close(zero.grad(), grad_want, 1e-12, 0));
  // integers mix with floats, as in PyTorch
  EXPECT_TRUE(all_close(F::cosine_similarity(vec({3, 4}, {1, 2}), from_vector<int64_t>({4, 3}, Shape{1, 2})),
                        {24.0 / 25}, 1e-15, 0));
  const char* op = "[cosine_similarity]";
  EXPECT_TRUE(throws_with([&] { F::cosine_similarity(ones({2, 2}, kInt64), ones({2, 2}, kInt64)); }, {op, "floating"}));
  EXPECT_TRUE(throws_with([&] { F::cosine_similarity(x1, x2, 2); }, {"cosine_similarity"}));
  EXPECT_TRUE(throws_with([&] { F::cosine_similarity(x1, x2.narrow(1, 0, 4)); }, {"cosine_similarity"}));
  EXPECT_TRUE(throws_with([&] { F::cosine_similarity(x1, Tensor()); }, {op, "undefined"}));
}

TEST(Distances, PairwiseDistance) {
  Generator g(32);
  const Tensor x1 = randn({4, 3}, kFloat64, &g), x2 = randn({4, 3}, kFloat64, &g);
  const std::vector<double> av = values(x1), bv = values(x2);
  for (double p : {1.0, 2.0, 3.0, kInf})
    for (double eps : {1e-6, 0.0})
      for (bool keepdim : {false, true}) {
        SCOPED_TRACE(fmt::format("p={} eps={} keepdim={}", p, eps, keepdim));
        Tensor dist = F::pairwise_distance(x1, x2, p, eps, keepdim);
        EXPECT_EQ(dist.shape(), (keepdim ? Shape{4, 1} : Shape{4}));
        EXPECT_TRUE(all_close(dist, distance_ref(av, bv, 3, p, eps), 1e-12, 1e-14));
        EXPECT_TRUE(gradcheck([&](V t) { return F::pairwise_distance(t[0], t[1], p, eps, keepdim); },
                              {leaf(x1), leaf(x2)}));
      }
  // broadcasting a row; 1-d inputs give a 0-d distance; eps is added before the magnitude
  const Tensor row = x2.narrow(0, 2, 1);
  std::vector<double> rows;
  for (int r = 0; r < 4; ++r) rows.insert(rows.end(), bv.begin() + 6, bv.begin() + 9);
  EXPECT_TRUE(all_close(F::pairwise_distance(x1, row), distance_ref(av, rows, 3, 2, 1e-6), 1e-12, 1e-14));
  Tensor single = F::pairwise_distance(x1.select(0, 0), x2.select(0, 0));
  EXPECT_EQ(single.shape(), Shape{});
  EXPECT_TRUE(all_close(F::pairwise_distance(vec({1, 1}, {2}), vec({1, 1}, {2}), 2, 0.5), {std::sqrt(0.5)}, 1e-15, 0));
  EXPECT_TRUE(throws_with([&] { F::pairwise_distance(x1, x2.narrow(0, 0, 3)); }, {"pairwise_distance"}));
  EXPECT_TRUE(throws_with([&] { F::pairwise_distance(ones({2}, kInt64), ones({2}, kInt64)); },
                          {"[pairwise_distance]", "floating"}));
}

TEST(Distances, Normalize) {
  Generator g(33);
  Tensor x = randn({3, 4}, kFloat64, &g);
  const std::vector<double> xv = values(x);
  for (double p : {1.0, 2.0})
    for (int64_t dim : {0, 1, -1}) {
      SCOPED_TRACE(fmt::format("p={} dim={}", p, dim));
      const bool rows = dim != 0;
      std::vector<double> want(12);
      for (int64_t o = 0; o < (rows ? 3 : 4); ++o) {
        auto idx = [&](int64_t i) { return static_cast<size_t>(rows ? o * 4 + i : i * 4 + o); };
        double n = 0;
        for (int64_t i = 0; i < (rows ? 4 : 3); ++i) n += std::pow(std::fabs(xv[idx(i)]), p);
        n = std::max(std::pow(n, 1 / p), 1e-12);
        for (int64_t i = 0; i < (rows ? 4 : 3); ++i) want[idx(i)] = xv[idx(i)] / n;
      }
      EXPECT_TRUE(all_close(F::normalize(x, p, dim), want, 1e-12, 1e-14));
      EXPECT_TRUE(gradcheck([&](V t) { return F::normalize(t[0], p, dim); }, {leaf(x)}));
    }
  // rows of norm 0 and below eps are divided by eps
  Tensor small = vec({0, 0, 0, 3e-13, 4e-13, 0}, {2, 3});
  EXPECT_TRUE(all_close(F::normalize(small), {0, 0, 0, 0.3, 0.4, 0}, 1e-12, 0));
  Tensor zl = leaf(zeros({2, 3}, kFloat64));
  sum(F::normalize(zl)).backward();
  EXPECT_TRUE(all_close(zl.grad(), std::vector<double>(6, 1e12), 1e-12, 0));
  EXPECT_TRUE(throws_with([&] { F::normalize(ones({3}, kInt64)); }, {"[normalize]", "floating"}));
  EXPECT_TRUE(throws_with([&] { F::normalize(ones({3})); }, {"normalize"}));  // dim 1 of a 1-d tensor
}

// Every module forwards its options (and weight buffer) to its function; bad options raise at
// construction, naming the module.
TEST(ExtraLossModules, EqualTheFunctionsAndCheckOptions) {
  Generator g(34);
  const Tensor p = rand({3, 4}, kFloat64, &g) * 0.8 + 0.1, t = rand({3, 4}, kFloat64, &g);
  const Tensor w = rand({4}, kFloat64, &g);
  nn::BCELoss bce({.weight = w, .reduction = "sum"});
  EXPECT_TRUE(equal(bce(p, t), F::binary_cross_entropy(p, t, {w, "sum"})));
  EXPECT_EQ(bce.state_dict().count("weight"), 1u);
  EXPECT_TRUE(equal(nn::BCELoss()(p, t), F::binary_cross_entropy(p, t)));
  const Tensor var = rand({3}, kFloat64, &g) + 0.5;
  EXPECT_TRUE(equal(nn::GaussianNLLLoss({.eps = 0.6, .reduction = "none"})(p, t, var),
                    F::gaussian_nll_loss(p, t, var, {.eps = 0.6, .reduction = "none"})));
  EXPECT_TRUE(equal(nn::PoissonNLLLoss({.log_input = false, .eps = 1e-3})(p, t),
                    F::poisson_nll_loss(p, t, {.log_input = false, .eps = 1e-3})));
  EXPECT_TRUE(equal(nn::CosineEmbeddingLoss()(p, t, vec({1, -1, 1}, {3})),
                    F::cosine_embedding_loss(p, t, vec({1, -1, 1}, {3}))));
  EXPECT_TRUE(throws_with([&] { nn::MarginRankingLoss({.reduction = "avg"}); }, {"[MarginRankingLoss]", "avg"}));
  EXPECT_TRUE(throws_with([&] { nn::HingeEmbeddingLoss({.reduction = "avg"}); }, {"[HingeEmbeddingLoss]"}));
  EXPECT_TRUE(throws_with([&] { nn::CosineEmbeddingLoss({.reduction = "avg"}); }, {"[CosineEmbeddingLoss]"}));
  EXPECT_TRUE(throws_with([&] { nn::PoissonNLLLoss({.reduction = "avg"}); }, {"[PoissonNLLLoss]"}));
  EXPECT_TRUE(throws_with([&] { nn::GaussianNLLLoss({.reduction = "avg"}); }, {"[GaussianNLLLoss]"}));
  EXPECT_TRUE(throws_with([&] { nn::MultiLabelSoftMarginLoss({.reduction = "avg"}); }, {"[MultiLabelSoftMarginLoss]"}));
}
