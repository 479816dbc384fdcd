// Gradient clipping against float64 references: total norms of orders 1, 2, 3 and inf over
// grads of several layouts, scaling only above max_norm, PyTorch's handling of inf and NaN,
// and value clipping.
#include <cmath>
#include <limits>
#include <random>

#include "testing.h"

namespace strata {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct GradSet {
  std::vector<Tensor> params;
  std::vector<std::vector<double>> grads;  // C order; empty for the parameter without grad
};

GradSet make_setup(DType dtype, testing::Layout layout, double scale) {
  std::mt19937 rng(21);
  std::normal_distribution<double> normal(0, scale);
  GradSet s;
  const std::vector<Shape> shapes = {{6, 5}, {17}, {3, 4}, {0, 2}, {2, 2}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor p = zeros(shapes[i], dtype);
    p.requires_grad_();
    std::vector<double> g;
    if (i != 4) {  // the last parameter has no grad
      g.resize(static_cast<size_t>(p.numel()));
      for (double& x : g) x = static_cast<double>(static_cast<float>(normal(rng)));
      p.set_grad(testing::with_layout(from_vector(g, shapes[i]).to(dtype), layout));
    }
    s.params.push_back(p);
    s.grads.push_back(g);
  }
  return s;
}

double ref_norm(const std::vector<std::vector<double>>& grads, double p) {
  double acc = 0;
  for (const auto& g : grads)
    for (double x : g) acc = std::isinf(p) ? std::max(acc, std::fabs(x)) : acc + std::pow(std::fabs(x), p);
  return std::isinf(p) ? acc : std::pow(acc, 1 / p);
}

TEST(Clip, TotalNormAndClipping) {
  for (DType dtype : {kFloat32, kFloat64}) {
    const double tol = dtype == kFloat32 ? 1e-6 : 1e-12;
    for (testing::Layout layout : {testing::Layout::Contiguous, testing::Layout::Transposed, testing::Layout::Sliced}) {
      for (double p : {1.0, 2.0, 3.0, kInf}) {
        SCOPED_TRACE(fmt::format("{} {} p={}", dtype, testing::layout_name(layout), p));
        GradSet s = make_setup(dtype, layout, 1.0);
        double want = ref_norm(s.grads, p);
        EXPECT_NEAR(optim::total_grad_norm(s.params, p), want, tol * want);
        // above the limit: scaled by max_norm / (total + 1e-6)
        double max_norm = want / 4;
        double got = optim::clip_grad_norm_(s.params, max_norm, p);
        EXPECT_NEAR(got, want, tol * want);
        double coef = max_norm / (want + 1e-6);
        for (size_t i = 0; i < s.params.size(); ++i) {
          if (i == 4) {  // the parameter without grad
            EXPECT_FALSE(s.params[i].grad().defined());
            continue;
          }
          std::vector<double> scaled = s.grads[i];
          for (double& x : scaled) x *= coef;
          EXPECT_TRUE(testing::all_close(s.params[i].grad(), scaled, 2 * tol, 0)) << i;
        }
        EXPECT_NEAR(optim::total_grad_norm(s.params, p), coef * want, 4 * tol * want);  // max_norm less the 1e-6
        // below the limit: untouched
        GradSet t = make_setup(dtype, layout, 1.0);
        optim::clip_grad_norm_(t.params, want * 2, p);
        for (size_t i = 0; i < t.params.size(); ++i)
          if (i != 4) EXPECT_EQ(testing::values(t.params[i].grad()), t.grads[i]);
      }
    }
  }
}

TEST(Clip, NonFiniteNorms) {
  Tensor a = zeros({3}), b = zeros({2});
  a.requires_grad_();
  b.requires_grad_();
  auto set = [&](double x) {
    a.set_grad(from_vector(std::vector<double>{1.0, x, -2.0}).to(kFloat32));
    b.set_grad(from_vector(std::vector<double>{3.0, 4.0}).to(kFloat32));
  };
  for (double bad : {kInf, -kInf, std::nan("")}) {
    for (double p : {2.0, kInf}) {
      set(bad);
      EXPECT_THROW(optim::clip_grad_norm_({a, b}, 1.0, p, true), Error);
      EXPECT_EQ(testing::values(b.grad()), (std::vector<double>{3, 4}));  // left alone on error
      double total = optim::clip_grad_norm_({a, b}, 1.0, p);
      if (std::isnan(bad)) {
        EXPECT_TRUE(std::isnan(total));
        for (double x : testing::values(a.grad())) EXPECT_TRUE(std::isnan(x));  // scaled by NaN
        for (double x : testing::values(b.grad())) EXPECT_TRUE(std::isnan(x));
      } else {
        EXPECT_EQ(total, kInf);
        auto ga = testing::values(a.grad());  // scaled by 0: inf * 0 is NaN
        EXPECT_EQ(ga[0], 0);
        EXPECT_TRUE(std::isnan(ga[1]));
        EXPECT_EQ(testing::values(b.grad()), (std::vector<double>{0, 0}));
      }
    }
  }
}

TEST(Clip, Value) {
  Tensor a = zeros({5});
  a.requires_grad_();
  a.set_grad(from_vector(std::vector<double>{-3, -0.5, 0, 0.7, std::nan("")}).to(kFloat32));
  optim::clip_grad_value_({a}, 0.6);
  auto g = testing::values(a.grad());
  EXPECT_NEAR(g[0], -0.6, 1e-7);
  EXPECT_EQ(g[1], -0.5);
  EXPECT_EQ(g[2], 0);
  EXPECT_NEAR(g[3], 0.6, 1e-7);
  EXPECT_TRUE(std::isnan(g[4]));
}

TEST(Clip, BadInput) {
  Tensor a = zeros({2});
  a.requires_grad_();
  a.set_grad(ones({2}));
  EXPECT_THROW(optim::clip_grad_norm_({a}, 1.0, 0.0), Error);
  EXPECT_THROW(optim::clip_grad_norm_({a}, 1.0, -2.0), Error);
  EXPECT_THROW(optim::clip_grad_norm_({a}, std::nan("")), Error);
  EXPECT_THROW(optim::clip_grad_norm_({Tensor()}, 1.0), Error);
  EXPECT_THROW(optim::clip_grad_value_({a}, -1.0), Error);
  EXPECT_EQ(optim::clip_grad_norm_({}, 1.0), 0.0);
  Tensor no_grad = zeros({2});
  EXPECT_EQ(optim::clip_grad_norm_({no_grad}, 1.0), 0.0);
}

// A negative max_norm would flip the grads' sign; inf means no limit.
TEST(Clip, MaxNormRange) {
  Tensor b = zeros({2});
  b.requires_grad_();
  b.set_grad(from_vector(std::vector<double>{3, 4}).to(kFloat32));
  for (double bad : {-1.0, -kInf, std::nan("")}) {
    EXPECT_TRUE(testing::throws_with([&] { optim::clip_grad_norm_({b}, bad); }, {"[clip_grad_norm_] max_norm"}));
    EXPECT_EQ(testing::values(b.grad()), (std::vector<double>{3, 4}));
  }
  EXPECT_EQ(optim::clip_grad_norm_({b}, kInf), 5.0);
  EXPECT_EQ(testing::values(b.grad()), (std::vector<double>{3, 4}));
  b.set_grad(from_vector(std::vector<double>{kInf, 4}).to(kFloat32));
  EXPECT_EQ(optim::clip_grad_norm_({b}, kInf), kInf);  // no limit: not scaled by inf / inf = NaN
  EXPECT_EQ(testing::values(b.grad()), (std::vector<double>{kInf, 4}));
  b.set_grad(from_vector(std::vector<double>{3, 4}).to(kFloat32));
  EXPECT_EQ(optim::clip_grad_norm_({b}, 0.0), 5.0);  // 0 zeroes the grads, as PyTorch
  EXPECT_EQ(testing::values(b.grad()), (std::vector<double>{0, 0}));
  b.set_grad(from_vector(std::vector<double>{3, -4}).to(kFloat32));
  EXPECT_THROW(optim::clip_grad_value_({b}, std::nan("")), Error);
  optim::clip_grad_value_({b}, kInf);
  EXPECT_EQ(testing::values(b.grad()), (std::vector<double>{3, -4}));
}

// Every grad is checked before any is written: a grad that cannot be scaled in place (an
// expanded view, an integer grad) raises and leaves the grads before it untouched.
TEST(Clip, BadGradWritesNothing) {
  Tensor b = zeros({2}), a = zeros({3}), n = zeros({2}, kInt64);
  b.requires_grad_();
  a.requires_grad_();
  a.set_grad(from_vector(std::vector<double>{2}).to(kFloat32).expand({3}));  // strides (0)
  n.set_grad(ones({2}, kInt64));
  for (const Tensor& bad : {a, n}) {
    const char* what = bad.is_same(a) ? "expanded view" : "only floating grads";
    b.set_grad(from_vector(std::vector<double>{3, 4}).to(kFloat32));
    EXPECT_TRUE(testing::throws_with([&] { optim::clip_grad_norm_({b, bad}, 1.0); },
                                     {"[clip_grad_norm_] the grad of parameter 1", what}));
    EXPECT_EQ(testing::values(b.grad()), (std::vector<double>{3, 4}));
    EXPECT_TRUE(testing::throws_with([&] { optim::clip_grad_value_({b, bad}, 1.0); },
                                     {"[clip_grad_value_] the grad of parameter 1", what}));
    EXPECT_EQ(testing::values(b.grad()), (std::vector<double>{3, 4}));
  }
  EXPECT_EQ(testing::values(a.grad()), (std::vector<double>{2, 2, 2}));
}

}  // namespace
}  // namespace strata
