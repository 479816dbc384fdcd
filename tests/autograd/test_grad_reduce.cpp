// Finite-difference gradient checks (float64) for reductions, softmax and scans, over dim
// subsets, keepdim and layouts; second derivatives where the backward is differentiable.
#include "gradcheck.h"

using namespace strata;
using strata::testing::Fn;
using strata::testing::gradcheck;
using strata::testing::gradgradcheck;
using strata::testing::Layout;
using strata::testing::leaf;

namespace {
struct Case {
  const char* name;
  Fn f;
  bool second_order = true;
};
using V = const std::vector<Tensor>&;
}  // namespace

TEST(GradCheck, Reductions) {
  const std::vector<Case> cases = {
      {"sum_all", [](V x) { return sum(x[0]); }},
      {"sum_dims", [](V x) { return sum(x[0], {0, 2}); }},
      {"sum_keepdim", [](V x) { return sum(x[0], {1}, true) * x[0]; }},
      {"mean", [](V x) { return mean(x[0], {-1}); }},
      {"mean_all", [](V x) { return mean(x[0]); }},
      {"prod", [](V x) { return prod(x[0], {1}); }},
      {"amax", [](V x) { return amax(x[0], {1, 2}); }},
      {"amin_keep", [](V x) { return amin(x[0], {0}, true); }},
      {"max_all", [](V x) { return max(x[0]); }},
      {"max_dim", [](V x) { return max(x[0], 1).values; }},
      {"min_dim_keep", [](V x) { return min(x[0], 2, true).values; }},
      {"var", [](V x) { return var(x[0], {1}); }},
      {"var_all_c0", [](V x) { return var(x[0], {}, 0); }},
      {"std", [](V x) { return strata::std(x[0], {0, 1}, 1, true); }},
      {"logsumexp", [](V x) { return logsumexp(x[0], {2}); }},
      {"norm2", [](V x) { return norm(x[0], 2, {1}); }},
      {"norm1", [](V x) { return norm(x[0], 1, {0}); }, false},
      {"norm3", [](V x) { return norm(x[0], 3, {2}); }},
      {"norm_inf", [](V x) { return norm(x[0], INFINITY, {1}); }, false},
      {"norm_half", [](V x) { return norm(x[0], 0.5, {1}); }},
      {"softmax", [](V x) { return softmax(x[0], 1); }},
      {"log_softmax", [](V x) { return log_softmax(x[0], -1); }},
      {"cumsum", [](V x) { return cumsum(x[0], 1); }},
      {"cumprod", [](V x) { return cumprod(x[0], 2); }},
  };
  Generator g(5);
  for (const Case& c : cases) {
    for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Sliced}) {
      SCOPED_TRACE(fmt::format("{} {}", c.name, strata::testing::layout_name(l)));
      Tensor base = randn({2, 3, 4}, kFloat64, &g);
      std::vector<Tensor> in = {leaf(base, l)};
      EXPECT_TRUE(gradcheck(c.f, in));
      if (c.second_order && l == Layout::Contiguous) EXPECT_TRUE(gradgradcheck(c.f, in));
    }
  }
}

TEST(GradCheck, ExtremeTiesShareTheGradient) {
  Tensor x = from_vector<double>({1, 3, 3, 2}).requires_grad_();
  max(x).backward();
  EXPECT_TRUE(strata::testing::all_close(x.grad(), {0, 0.5, 0.5, 0}, 0, 0));
}

// Zeros in prod and cumprod: the gradient at a zero is the product of the others (prod/x_i
// would divide by 0), checked by finite differences, which are exact for these multilinear
// functions; to second order with one, two or three zeros in a group (recorded, the gradient
// is the product of the others written without division).
TEST(GradCheck, ProductsThroughZeros) {
  Tensor one_zero = from_vector<double>({2, 0, -1, 0.5, 1.5, 3, -2, 0.25, 0, 0, 1, 4}, Shape{3, 4});
  for (Layout l : {Layout::Contiguous, Layout::Transposed}) {
    SCOPED_TRACE(strata::testing::layout_name(l));
    std::vector<Tensor> in = {leaf(one_zero, l)};
    EXPECT_TRUE(gradcheck([](V x) { return prod(x[0], {1}); }, in));
    EXPECT_TRUE(gradcheck([](V x) { return prod(x[0]); }, in));
    EXPECT_TRUE(gradcheck([](V x) { return cumprod(x[0], 1); }, in));
    EXPECT_TRUE(gradcheck([](V x) { return cumprod(x[0], 0); }, in));
  }
  Tensor single = from_vector<double>({2, 0, -1, 0.5, 1.5, 3, -2, 0.25, 0.5, 0, 1, 4}, Shape{3, 4});
  std::vector<Tensor> in = {leaf(single)};
  EXPECT_TRUE(gradgradcheck([](V x) { return prod(x[0], {1}); }, in));
  EXPECT_TRUE(gradgradcheck([](V x) { return cumprod(x[0], 1); }, in));
  // rows with two and three zeros, where the first-order gradient is 0 but its derivative is not
  Tensor several = from_vector<double>({0, 1.5, 0, -2, 0, 0, 0, 3, 2, -1, 0.5, 0.25}, Shape{3, 4});
  for (Layout l : {Layout::Contiguous, Layout::Transposed}) {
    SCOPED_TRACE(strata::testing::layout_name(l));
    std::vector<Tensor> in2 = {leaf(several, l)};
    EXPECT_TRUE(gradgradcheck([](V x) { return prod(x[0], {1}); }, in2));
    EXPECT_TRUE(gradgradcheck([](V x) { return prod(x[0], {0}); }, in2));
    EXPECT_TRUE(gradgradcheck([](V x) { return prod(x[0]); }, in2));
    EXPECT_TRUE(gradgradcheck([](V x) { return prod(x[0].reshape({3, 2, 2}), {0, 2}); }, in2));
    EXPECT_TRUE(gradgradcheck([](V x) { return cumprod(x[0], 1); }, in2));
    EXPECT_TRUE(gradgradcheck([](V x) { return cumprod(x[0], 0); }, in2));
  }
  // the published values: d prod / dx at the zero of {2, 0, -1, 0.5} is 2 * -1 * 0.5
  Tensor x = from_vector<double>({2, 0, -1, 0.5}).requires_grad_();
  prod(x).backward();
  EXPECT_TRUE(strata::testing::all_close(x.grad(), {0, -1, 0, 0}, 0, 0));
}

// Where a reduction is not differentiable its gradient is 0, as in PyTorch, never NaN: std of a
// constant group, the p = 0 "norm" (a count), and a p < 1 norm at a zero element.
TEST(GradCheck, DegenerateReductionsGiveZeroNotNaN) {
  Tensor c = from_vector<double>({2, 2, 2, 1, 3, 5}, Shape{2, 3}).requires_grad_();
  sum(strata::std(c, {1})).backward();
  EXPECT_TRUE(strata::testing::all_close(c.grad(), {0, 0, 0, -0.5, 0, 0.5}, 1e-15, 0));
  Tensor x = from_vector<double>({0, -1, 2}).requires_grad_();
  norm(x, 0).backward();
  EXPECT_TRUE(strata::testing::all_close(x.grad(), {0, 0, 0}, 0, 0));
  Tensor y = from_vector<double>({0, -1, 2}).requires_grad_();
  norm(y, 0.5).backward();
  const double n = std::pow(1 + std::sqrt(2.0), 2);  // (|0|^.5 + |-1|^.5 + |2|^.5)^2
  EXPECT_TRUE(strata::testing::all_close(y.grad(), {0, -std::sqrt(n), std::sqrt(n / 2)}, 1e-14, 0));
}
