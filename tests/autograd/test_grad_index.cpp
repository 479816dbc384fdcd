// Finite-difference gradient checks (float64) for the indexing, joining and ordering ops, on
// contiguous, transposed and sliced inputs, with repeated indices where the op allows them;
// second derivatives through a square of each op; in-place forms refuse leaves that require
// grad (tests/autograd/test_grad_inplace.cpp checks them on non-leaves).
#include "gradcheck.h"

using namespace strata;
using strata::testing::Fn;
using strata::testing::gradcheck;
using strata::testing::gradgradcheck;
using strata::testing::Layout;
using strata::testing::leaf;

namespace {

using Case = strata::testing::GradCase;
using strata::testing::indices;

const std::vector<Case>& cases() {
  using V = const std::vector<Tensor>&;
  static const std::vector<Case> c = {
      {"index_select", [](V x) { return index_select(x[0], 1, indices({0, 3, 3, 1}, {4})); }, {{3, 5}}},
      {"index_select_dim0", [](V x) { return index_select(x[0], -2, indices({2, 0, 2}, {3})); }, {{3, 5}}},
      {"gather", [](V x) { return gather(x[0], 1, indices({0, 4, 4, 1, 2, 2}, {2, 3})); }, {{3, 5}}},
      {"gather_dim0", [](V x) { return gather(x[0], 0, indices({0, 2, 2, 1, 0, 0, 1, 1}, {2, 4})); }, {{3, 5}}},
      // one destination per (row, index): no position is written twice
      {"scatter", [](V x) { return scatter(x[0], 1, indices({4, 0, 2, 1, 3, 0}, {2, 3}), x[1]); }, {{3, 5}, {3, 4}}},
      {"scatter_value", [](V x) { return scatter(x[0], 0, indices({2, 0, 1}, {1, 3}), Scalar(0.5)); }, {{3, 5}}},
      {"scatter_add", [](V x) { return scatter_add(x[0], 1, indices({4, 4, 2, 1, 1, 1}, {2, 3}), x[1]); },
       {{3, 5}, {2, 4}}},
      {"index_add", [](V x) { return index_add(x[0], 0, indices({1, 1, 0, 2}, {4}), x[1], 2.5); }, {{3, 5}, {4, 5}}},
      {"index_add_dim1", [](V x) { return index_add(x[0], 1, indices({4, 0, 4}, {3}), x[1]); }, {{3, 5}, {3, 3}}},
      {"tril", [](V x) { return tril(x[0], 1); }, {{2, 4, 5}}},
      {"triu", [](V x) { return triu(x[0], -1); }, {{4, 3}}},
      {"cat", [](V x) { return cat({x[0], x[1], x[2]}, -1); }, {{3, 2}, {0}, {3, 4}}},
      {"cat_dim0", [](V x) { return cat({x[0], x[1]}, 0); }, {{2, 5}, {3, 5}}},
      {"stack", [](V x) { return stack({x[0], x[1]}, 1); }, {{3, 4}, {3, 4}}},
      {"split", [](V x) { return split(x[0], 2, 1)[1] * 3.0; }, {{3, 5}}},
      {"chunk", [](V x) { return chunk(x[0], 2, 0)[1]; }, {{3, 4}}},
      {"sort", [](V x) { return std::get<0>(sort(x[0], 1)); }, {{3, 5}}},
      {"sort_descending", [](V x) { return std::get<0>(sort(x[0], 0, true)); }, {{3, 5}}},
      {"topk", [](V x) { return std::get<0>(topk(x[0], 2, -1)); }, {{3, 5}}},
      {"topk_smallest", [](V x) { return std::get<0>(topk(x[0], 2, 0, false)); }, {{3, 5}}},
  };
  return c;
}

}  // namespace

TEST(GradIndex, MatchesFiniteDifferences) {
  Generator g(7);
  for (const Case& c : cases()) {
    for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Sliced}) {
      std::vector<Tensor> in;
      for (const Shape& s : c.shapes) in.push_back(leaf(randn(s, kFloat64, &g), l));
      SCOPED_TRACE(fmt::format("{} {}", c.name, strata::testing::layout_name(l)));
      EXPECT_TRUE(gradcheck(c.f, in));
      // the backward formulas are themselves differentiable
      Fn squared = [&c](const std::vector<Tensor>& x) { return square(c.f(x)); };
      EXPECT_TRUE(gradgradcheck(squared, in));
    }
  }
}

TEST(GradIndex, InPlaceFormsRefuseLeavesThatRequireGrad) {
  Tensor x = leaf(zeros({3, 4}));
  Tensor plain = zeros({3, 4}, kFloat64);
  Tensor src = leaf(ones({3, 4}));
  Tensor i = zeros({3, 4}, TensorOptions(kInt64));
  EXPECT_THROW(scatter_(x, 1, i, plain), Error);
  EXPECT_THROW(scatter_(x, 1, i, Scalar(1.0)), Error);
  EXPECT_THROW(scatter_add_(x, 1, i, src), Error);
  EXPECT_THROW(index_add_(x, 0, zeros({3}, TensorOptions(kInt64)), src), Error);
  EXPECT_TRUE(strata::testing::all_close(x, std::vector<double>(12, 0.0), 0, 0));
  {
    NoGradGuard no_grad;  // allowed without recording
    EXPECT_NO_THROW(scatter_add_(x, 1, i, src));
  }
  // a tensor that does not require grad joins the graph through src
  scatter_add_(plain, 1, i, src);
  EXPECT_TRUE(plain.requires_grad());
  plain.sum().backward();
  EXPECT_TRUE(strata::testing::all_close(src.grad(), std::vector<double>(12, 1.0), 0, 0));
}
