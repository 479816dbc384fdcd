// Tensor parallelism under mpirun: a column-parallel Linear feeding a row-parallel one gives the
// output, the input gradient and (for each rank's shard) the weight gradients of the same MLP
// built whole in one process from the same seeds, in float64.
#include "dist/dist_testing.h"

namespace strata {
namespace {

using testing::values;

void expect_close(const Tensor& got, const Tensor& want, const char* what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  EXPECT_TRUE(allclose(got, want, 1e-12, 1e-13)) << what;
}

Tensor input(int64_t features) {
  Generator gen(5);
  return randn({3, 2, features}, TensorOptions(kFloat64), &gen).requires_grad_();
}

TEST(TensorParallel, ColumnThenRowEqualsTheWholeMlp) {
  auto pg = dist_testing::group();
  const int r = pg->rank(), n = pg->size();
  const int64_t hidden = 4 * n, part = hidden / n;
  Generator g1(11), g2(12), h1(11), h2(12);
  nn::Linear fc1(6, hidden, {.generator = &g1}), fc2(hidden, 5, {.generator = &g2});
  dist::ColumnParallelLinear col(6, hidden, nullptr, {.gather_output = false, .generator = &h1});
  dist::RowParallelLinear row(hidden, 5, nullptr, {.input_is_parallel = true, .generator = &h2});
  for (nn::Module* m : std::initializer_list<nn::Module*>{&fc1, &fc2, &col, &row}) m->to(kFloat64);
  ASSERT_EQ(col.weight.shape(), (Shape{part, 6}));
  ASSERT_EQ(row.weight.shape(), (Shape{5, part}));

  Tensor x = input(6), x_ref = input(6);
  Tensor y = row(tanh(col(x)));
  Tensor y_ref = fc2(tanh(fc1(x_ref)));
  expect_close(y, y_ref, "output");
  // a loss that weighs every output differently
  Tensor w = sin(arange(30, TensorOptions(kFloat64)).view({3, 2, 5}));
  (y * w).sum().backward();
  (y_ref * w).sum().backward();
  expect_close(x.grad(), x_ref.grad(), "input gradient");  // copy_to's backward allreduce
  expect_close(col.weight.grad(), fc1.weight.grad().narrow(0, r * part, part), "column weight gradient");
  expect_close(col.bias.grad(), fc1.bias.grad().narrow(0, r * part, part), "column bias gradient");
  expect_close(row.weight.grad(), fc2.weight.grad().narrow(1, r * part, part), "row weight gradient");
  expect_close(row.bias.grad(), fc2.bias.grad(), "row bias gradient");
}

TEST(TensorParallel, GatheredColumnAndScatteredRowStandAlone) {
  auto pg = dist_testing::group();
  const int n = pg->size();
  Generator g1(21), g2(22), h1(21), h2(22);
  nn::Linear whole_col(6, 2 * n, {.generator = &g1}), whole_row(2 * n, 3, {.bias = false, .generator = &g2});
  dist::ColumnParallelLinear col(6, 2 * n, nullptr, {.generator = &h1});  // gathers its output
  dist::RowParallelLinear row(2 * n, 3, nullptr, {.bias = false, .generator = &h2});  // splits its input
  for (nn::Module* m : std::initializer_list<nn::Module*>{&whole_col, &whole_row, &col, &row}) m->to(kFloat64);
  Tensor x = input(6), x_ref = input(6);
  Tensor c = col(x), c_ref = whole_col(x_ref);
  expect_close(c, c_ref, "column output");
  Tensor y = row(c.square()), y_ref = whole_row(c_ref.square());
  expect_close(y, y_ref, "row output");
  y.sum().backward();
  y_ref.sum().backward();
  expect_close(x.grad(), x_ref.grad(), "input gradient");
}

TEST(TensorParallel, SizesThatDoNotSplitRaise) {
  auto pg = dist_testing::group();
  if (pg->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int64_t odd = 2 * pg->size() + 1;
  EXPECT_TRUE(testing::throws_with([&] { dist::ColumnParallelLinear(4, odd); }, {"out_features", "group size"}));
  EXPECT_TRUE(testing::throws_with([&] { dist::RowParallelLinear(odd, 4); }, {"in_features", "group size"}));
  EXPECT_TRUE(testing::throws_with([&] { dist::scatter_to_tensor_parallel_region(zeros({2, odd})); },
                                   {"scatter_to_tensor_parallel_region", "does not divide"}));
}

}  // namespace
}  // namespace strata
