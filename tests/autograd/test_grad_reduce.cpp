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
