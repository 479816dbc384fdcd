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

// matmul and linear save each operand only for the other's gradient: a parameter written in
// place between forward and backward breaks only the products whose other operand needs a
// gradient, as in PyTorch (every product below is linear in w, so its gradient is unchanged).
TEST(GradCheck, MatmulAndLinearSaveOnlyWhatTheGradientsRead) {
  Tensor w = from_vector<double>({1, 2, 3, 4, 5, 6}, Shape{2, 3}).requires_grad_();
  Tensor c = from_vector<double>({1, -1, 2}, Shape{3, 1});
  Tensor x = from_vector<double>({0.5, 1, -2}, Shape{1, 3});
  Tensor frozen = from_vector<double>({1, 0, 2, 1, -1, 3}, Shape{2, 3});
  Tensor y = sum(matmul(w, c)) + sum(linear(x, w)) + sum(matmul(from_vector<double>({1, 1}), w)) +
             sum(linear(w, frozen)) + sum(matmul(w.t(), from_vector<double>({1, 1})));
  {
    NoGradGuard no_grad;
    w.mul_(2);
  }
  y.backward();
  // rows: c^T + x + 1 + frozen's column sums + 1
  const std::vector<double> row = {1 + 0.5 + 1 + 2 + 1, -1 + 1 + 1 - 1 + 1, 2 - 2 + 1 + 5 + 1};
  std::vector<double> expected = row;
  expected.insert(expected.end(), row.begin(), row.end());
  EXPECT_TRUE(strata::testing::all_close(w.grad(), expected, 1e-15, 0));

  // a saved partner written in place is caught, as is w when both operands need gradients
  Tensor v = from_vector<double>({1, 2, 3, 4, 5, 6}, Shape{2, 3}).requires_grad_();
  Tensor by_c = sum(matmul(v, c)), by_x = sum(linear(x, v)), by_self = sum(matmul(v, v.t()));
  {
    NoGradGuard no_grad;
    c.mul_(2);
    x.mul_(2);
    v.mul_(2);
  }
  EXPECT_THROW(by_c.backward(), Error);
  EXPECT_THROW(by_x.backward(), Error);
  EXPECT_THROW(by_self.backward(), Error);
}
