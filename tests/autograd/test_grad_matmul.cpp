// Finite-difference gradient checks of matmul in all its shapes, with broadcast batch dims
// and transposed inputs.
#include "gradcheck.h"

using namespace strata;
using strata::testing::gradcheck;
using strata::testing::gradgradcheck;
using strata::testing::Layout;
using strata::testing::leaf;

TEST(GradCheck, Matmul) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 4}, {4, 5}}, {{4}, {4}}, {{4}, {4, 3}}, {{3, 4}, {4}}, {{2, 3, 4}, {4, 5}},
      {{2, 1, 3, 4}, {3, 4, 2}}, {{4}, {2, 4, 3}}, {{2, 3, 4}, {4}}, {{1, 4}, {4, 1}}};
  for (const auto& [sa, sb] : shapes) {
    for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Sliced}) {
      SCOPED_TRACE(fmt::format("{} @ {} {}", sa, sb, strata::testing::layout_name(l)));
      std::vector<Tensor> in = {leaf(randn(sa), l), leaf(randn(sb), l)};
      auto f = [](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); };
      EXPECT_TRUE(gradcheck(f, in));
      if (l == Layout::Contiguous) EXPECT_TRUE(gradgradcheck(f, in));
    }
  }
  // mixed dtypes: gradients come back in each input's dtype
  Tensor a = ones({2, 3}, kFloat32).requires_grad_(), b = ones({3, 2}, kFloat64).requires_grad_();
  matmul(a, b).backward(ones({2, 2}, kFloat64));
  EXPECT_EQ(a.grad().dtype(), kFloat32);
  EXPECT_TRUE(strata::testing::all_close(a.grad(), std::vector<double>(6, 2), 0, 0));
}
