// The everyday C++ idioms of LibTorch code, with LibTorch's meaning: assignment to a
// temporary writes elements, in-place methods work through const handles, compound assignment
// is in place, and &, |, ^ and ~ combine masks.
#include <type_traits>

#include "testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::throws_with;
using strata::testing::values;

TEST(TensorIdioms, AssignmentToATemporaryWritesElements) {
  Tensor x = zeros({3, 3});
  x[1] = ones({3});                          // a row, from a tensor
  x.select(1, 0) = full({3}, 7.0);           // a column
  x.slice(0, 2, 3) = full({1, 3}, 2.0);      // a slice
  x[0][2] = 5;                               // one element, from a scalar
  EXPECT_EQ(values(x), (std::vector<double>{7, 0, 5, 7, 1, 1, 2, 2, 2}));
  x[1] = arange(3.0, 6.0);                   // broadcast and converted as copy_
  x.select(1, 2) = 9.5;
  EXPECT_EQ(values(x), (std::vector<double>{7, 0, 9.5, 3, 4, 9.5, 2, 2, 9.5}));
  const Tensor row = ones({3}, kFloat64);
  x[2] = row;                                // from an lvalue, converting float64 to float32
  EXPECT_EQ(values(x[2]), (std::vector<double>{1, 1, 1}));

  // Assigning to a named tensor rebinds the handle and writes nothing.
  Tensor y = x;
  y = zeros({2});
  EXPECT_EQ(x.shape(), (Shape{3, 3}));
  EXPECT_EQ(values(x[2]), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(y.shape(), (Shape{2}));

  // Shapes that do not broadcast, and values the dtype cannot hold, raise as copy_ and fill_ do.
  EXPECT_TRUE(throws_with([&] { x[0] = ones({4}); }, {"copy_", "broadcast"}));
  Tensor ints = zeros({2}, kInt32);
  EXPECT_TRUE(throws_with([&] { ints[0] = 1e20; }, {"fill_"}));
  const Tensor expanded = zeros({1, 3}).expand({2, 3});
  EXPECT_TRUE(throws_with([&] { expanded.select(1, 0) = 1; }, {"fill_"}));  // its elements share memory
}

// h[0] = 2w writes w's history into h, as LibTorch's copy_ does: d sum(h * c) / dw = 2 c[0].
TEST(TensorIdioms, AssignmentToATemporaryIsDifferentiable) {
  Tensor w = from_vector(std::vector<double>{0.5, -1.0, 2.0});
  w.requires_grad_();
  const Tensor c = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, Shape{2, 3});
  Tensor h = zeros({2, 3}, kFloat64);
  h[0] = w * 2.0;
  h[1] = 1.0;
  (h * c).sum().backward();
  EXPECT_EQ(values(w.grad()), (std::vector<double>{2, 4, 6}));
  EXPECT_EQ(values(h.detach()), (std::vector<double>{1, -2, 4, 1, 1, 1}));
}

TEST(TensorIdioms, InPlaceThroughConstHandles) {
  Tensor p = ones({3});
  p.requires_grad_();
  (p * from_vector(std::vector<float>{1, 2, 3})).sum().backward();
  p.grad().mul_(0.5);  // the gradient's elements change; the handle grad() returns is const
  EXPECT_EQ(values(p.grad()), (std::vector<double>{0.5, 1, 1.5}));
  p.grad().zero_();
  EXPECT_EQ(values(p.grad()), (std::vector<double>{0, 0, 0}));

  const std::vector<Tensor> params{ones({2}), ones({2})};
  {
    NoGradGuard no_grad;
    for (const Tensor& q : params) q.sub_(full({2}, 0.25)).mul_(2);  // chained, as LibTorch's
  }
  EXPECT_EQ(values(params[1]), (std::vector<double>{1.5, 1.5}));
  static_assert(std::is_same_v<decltype(params[0].add_(1)), const Tensor&>);
}

TEST(TensorIdioms, CompoundAssignmentIsInPlace) {
  Tensor a = from_vector(std::vector<double>{1, 2, 3});
  const Tensor alias = a;  // another handle on the same tensor sees every write
  const Tensor b = from_vector(std::vector<double>{4, 5, 6});
  a += b;
  EXPECT_EQ(values(alias), (std::vector<double>{5, 7, 9}));
  a -= 1;
  a *= b;
  a /= 2;
  EXPECT_EQ(values(alias), (std::vector<double>{8, 15, 24}));
  a *= 0.5;
  a -= b;
  a += 1.5;
  EXPECT_EQ(values(alias), (std::vector<double>{1.5, 4, 7.5}));
  EXPECT_TRUE(a.is_same(alias));
  Tensor ints = arange(3);
  EXPECT_TRUE(throws_with([&] { ints /= 2; }, {"div_"}));  // a float result cannot go into int64
}

TEST(TensorIdioms, MaskOperators) {
  const Tensor x = from_vector(std::vector<float>{-2, -0.5, 0, 0.5, 2});
  const Tensor inside = (x > -1) & (x < 1);
  const Tensor outside = (x <= -1) | (x >= 1);
  EXPECT_EQ(inside.dtype(), kBool);
  EXPECT_EQ(values(inside), (std::vector<double>{0, 1, 1, 1, 0}));
  EXPECT_EQ(values(outside), (std::vector<double>{1, 0, 0, 0, 1}));
  EXPECT_EQ(values(~inside), values(outside));
  EXPECT_EQ(values(inside ^ (x >= 0)), (std::vector<double>{0, 1, 0, 0, 1}));
  EXPECT_TRUE(all_close(masked_fill(x, ~inside, 0), {0, -0.5, 0, 0.5, 0}, 0, 0));
  EXPECT_TRUE(throws_with([&] { (void)(x & inside); }, {"operator&", "bool"}));
  EXPECT_TRUE(throws_with([&] { (void)(arange(3) | arange(3)); }, {"operator|", "int64"}));
  EXPECT_TRUE(throws_with([&] { (void)~arange(3); }, {"operator~", "int64"}));
}
