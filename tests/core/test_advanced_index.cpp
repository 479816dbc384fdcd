// Advanced indexing (index, index_put, index_put_), searchsorted / bucketize and diagonal, diag,
// trace (src/ops/advanced_index.cpp, diagonal.cpp) against loops over the elements in float64,
// PyTorch's documented examples, gradients by finite differences, and bad input.
#include <algorithm>
#include <cmath>
#include <limits>

#include "gradcheck.h"
#include "testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::gradcheck;
using strata::testing::Layout;
using strata::testing::leaf;
using strata::testing::throws_with;
using strata::testing::values;
using strata::testing::with_layout;

namespace {

using Vec = std::vector<double>;

// Element (i, j, k) of a C-order (A, B, C) buffer.
double at3(const Vec& v, const Shape& s, int64_t i, int64_t j, int64_t k) {
  return v[static_cast<size_t>((i * s[1] + j) * s[2] + k)];
}

Tensor ints(std::vector<int64_t> v, Shape s) { return from_vector(v, s); }

}  // namespace

TEST(AdvancedIndex, IndexMatchesLoops) {
  const Shape s{4, 5, 6};
  const Tensor x = with_layout(randn(s, kFloat64), Layout::Transposed);
  const Vec xv = values(x);
  const Tensor i = ints({0, 3, -1, 2, 1, 0}, {2, 3});
  const Tensor j = ints({5, -6, 2}, {3});
  const std::vector<int64_t> iv = {0, 3, 3, 2, 1, 0}, jv = {5, 0, 2};  // wrapped
  const std::vector<int64_t> iv5 = {0, 3, 4, 2, 1, 0};                     // remainder(i, 5)
  // non-adjacent indices: the broadcast dims (2, 3) first, then the whole dim of size 5
  Vec want;
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 5; ++c) want.push_back(at3(xv, s, iv[a * 3 + b], c, jv[b]));
  Tensor got = index(x, {i, std::nullopt, j});
  EXPECT_EQ(got.shape(), (Shape{2, 3, 5}));
  EXPECT_EQ(values(got), want);
  // adjacent indices keep their place: (4, 2, 3)
  want.clear();
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 3; ++c) want.push_back(at3(xv, s, a, iv5[b * 3 + c], jv[c]));
  got = index(x, {std::nullopt, remainder(i, 5), j.view({1, 3})});
  EXPECT_EQ(got.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(values(got), want);
  // one index: rows; int32 indices; a 0-d index drops the dim
  EXPECT_EQ(values(index(x, {ints({2, 0}, {2}).to(kInt32)})), values(cat({x[2].unsqueeze(0), x[0].unsqueeze(0)})));
  EXPECT_EQ(values(index(x, {std::nullopt, scalar_tensor(4, kInt64)})), values(x.select(1, 4)));
  // bool masks: over the first two dims (count, 6), and over dim 1 (4, count, 6)
  const Tensor mask = randn({4, 5}) > 0;
  const Vec mv = values(mask);
  want.clear();
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 5; ++b)
      if (mv[static_cast<size_t>(a * 5 + b)] != 0)
        for (int c = 0; c < 6; ++c) want.push_back(at3(xv, s, a, b, c));
  EXPECT_EQ(values(index(x, {mask})), want);
  const Tensor row_mask = tensor({true, false, false, true, true});
  EXPECT_EQ(index(x, {std::nullopt, row_mask}).shape(), (Shape{4, 3, 6}));
  EXPECT_EQ(values(index(x, {std::nullopt, row_mask})), values(index(x, {std::nullopt, ints({0, 3, 4}, {3})})));
  // empty index; no index at all
  EXPECT_EQ(index(x, {empty({0}, kInt64)}).shape(), (Shape{0, 5, 6}));
  EXPECT_EQ(values(index(x, {})), xv);
  // integers, and the gradient: summed over repeated positions
  EXPECT_EQ(values(index(arange(10), {ints({9, 9, 1}, {3})})), (Vec{9, 9, 1}));
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return index(in[0], {i, std::nullopt, j}); },
                        {leaf(randn(s, kFloat64), Layout::Sliced)}));
}

TEST(AdvancedIndex, IndexPutMatchesLoops) {
  const Shape s{3, 4};
  const Tensor x = randn(s, kFloat64);
  const Vec xv = values(x);
  const Tensor rows = ints({0, 2, 0, 1}, {4}), cols = ints({1, 3, 1, -1}, {4});  // (0, 1) twice
  const Tensor v = tensor({10.0, 20.0, 30.0, 40.0}).to(kFloat64);
  Vec put = xv, add = xv;
  const int r[] = {0, 2, 0, 1}, c[] = {1, 3, 1, 3};
  for (int k = 0; k < 4; ++k) {
    put[static_cast<size_t>(r[k] * 4 + c[k])] = 10.0 * (k + 1);  // the last write wins
    add[static_cast<size_t>(r[k] * 4 + c[k])] += 10.0 * (k + 1);
  }
  EXPECT_EQ(values(index_put(x, {rows, cols}, v)), put);
  EXPECT_TRUE(all_close(index_put(x, {rows, cols}, v, true), add, 1e-15, 0));
  EXPECT_EQ(values(x), xv);  // out of place
  // values broadcast over a whole dim; a bool mask; a transposed target; int64
  Vec rows_put = xv;
  for (int k = 0; k < 4; ++k) rows_put[static_cast<size_t>(4 + k)] = k;
  EXPECT_EQ(values(index_put(x, {ints({1}, {1})}, arange(4, kFloat64))), rows_put);
  const Tensor positive = x > 0;
  Vec clipped = xv;
  for (double& e : clipped) e = e > 0 ? 0 : e;
  EXPECT_EQ(values(index_put(x, {positive}, zeros({}, kFloat64))), clipped);
  const Tensor xt = x.t().contiguous().t();
  EXPECT_EQ(values(index_put(xt, {rows, cols}, v)), put);
  const Tensor n = arange(6).view({2, 3});
  EXPECT_EQ(values(index_put(n, {std::nullopt, ints({2, 2}, {2})}, ints({5, 7}, {2, 1}), true)),
            (Vec{0, 1, 12, 3, 4, 19}));
  // in place; a bad index raises before anything is written
  Tensor y = x.clone();
  index_put_(y, {rows, cols}, v);
  EXPECT_EQ(values(y), put);
  Tensor z = x.clone();
  EXPECT_TRUE(throws_with([&] { index_put_(z, {ints({0, 3}, {2})}, zeros({}, kFloat64)); },
                          {"[index_put]", "index 3 is out of range for dim 0 of size 3"}));
  EXPECT_EQ(values(z), xv);
}

TEST(AdvancedIndexGrad, IndexPutGradients) {
  const Tensor rows = ints({0, 2, 1}, {3}), cols = ints({1, 3, 0}, {3});
  for (bool accumulate : {false, true}) {
    EXPECT_TRUE(gradcheck(
        [&](const std::vector<Tensor>& in) { return index_put(in[0], {rows, cols}, in[1], accumulate); },
        {leaf(randn({3, 4}, kFloat64)), leaf(randn({3}, kFloat64))}));
    EXPECT_TRUE(gradcheck(
        [&](const std::vector<Tensor>& in) { return index_put(in[0], {std::nullopt, cols}, in[1], accumulate); },
        {leaf(randn({3, 4}, kFloat64), Layout::Transposed), leaf(randn({3, 1}, kFloat64))}));
  }
  // x's gradient is zero where written; with a repeated index every value gets the gradient
  // of the element it addresses, as PyTorch's
  const Tensor x = leaf(randn({4}, kFloat64)), v = leaf(randn({3}, kFloat64));
  (index_put(x, {ints({1, 1, 3}, {3})}, v) * arange(1, 5, 1, kFloat64)).sum().backward();
  EXPECT_EQ(values(x.grad()), (Vec{1, 0, 3, 0}));
  EXPECT_EQ(values(v.grad()), (Vec{2, 2, 4}));
  // under autograd, in place on a tensor that does not require grad
  Tensor target = zeros({4}, kFloat64);
  const Tensor w = leaf(tensor({1.0, 2.0}));
  index_put_(target, {ints({0, 2}, {2})}, w * 3);
  target.sum().backward();
  EXPECT_EQ(values(w.grad()), (Vec{3, 3}));
  EXPECT_TRUE(throws_with([&] { Tensor leaf_x = x; index_put_(leaf_x, {ints({0}, {1})}, v.narrow(0, 0, 1)); },
                          {"[index_put_]", "leaf"}));
}

TEST(AdvancedIndex, SearchsortedAndBucketize) {
  // PyTorch's documented examples
  const Tensor seq = tensor({1, 3, 5, 7, 9});
  const Tensor v = tensor({{3, 6, 9}, {3, 6, 9}});
  EXPECT_EQ(values(searchsorted(seq, v)), (Vec{1, 3, 4, 1, 3, 4}));
  EXPECT_EQ(values(searchsorted(seq, v, true)), (Vec{2, 3, 5, 2, 3, 5}));
  EXPECT_EQ(values(bucketize(v, seq)), (Vec{1, 3, 4, 1, 3, 4}));
  EXPECT_EQ(values(bucketize(v, seq, true)), (Vec{2, 3, 5, 2, 3, 5}));
  EXPECT_EQ(searchsorted(seq, v).dtype(), kInt64);
  // against std::lower_bound / upper_bound, with ties, a float sequence and float values
  Generator g(5);
  const Tensor sorted = std::get<0>(sort(mul(randint(-5, 6, {40}, TensorOptions(kInt64), &g).to(kFloat32), 0.5f)));
  const Tensor probes = with_layout(mul(randint(-7, 8, {6, 5}, TensorOptions(kInt64), &g).to(kFloat64), 0.5),
                                    Layout::Transposed);
  const Vec sv = values(sorted), pv = values(probes);
  for (bool right : {false, true}) {
    Vec want;
    for (double p : pv)
      want.push_back(static_cast<double>((right ? std::upper_bound(sv.begin(), sv.end(), p)
                                                : std::lower_bound(sv.begin(), sv.end(), p)) - sv.begin()));
    EXPECT_EQ(values(searchsorted(sorted, probes, right)), want);
    EXPECT_EQ(searchsorted(sorted, probes, right).shape(), probes.shape());
  }
  EXPECT_EQ(values(searchsorted(seq, tensor({std::nan(""), 0.0}))), (Vec{5, 0}));  // NaN at the end
  EXPECT_EQ(searchsorted(seq, scalar_tensor(4)).item<int64_t>(), 2);
  EXPECT_EQ(searchsorted(empty({0}), v).shape(), v.shape());
  EXPECT_TRUE(throws_with([&] { (void)searchsorted(v, v); }, {"[searchsorted]", "1-d"}));
  EXPECT_TRUE(throws_with([&] { (void)bucketize(v, v); }, {"[bucketize]", "1-d"}));
}

TEST(AdvancedIndex, DiagonalDiagTrace) {
  const Shape s{3, 4, 5};
  const Tensor x = randn(s, kFloat64);
  const Vec xv = values(x);
  for (int64_t offset : {-3, -1, 0, 2, 6}) {
    // dims (2, 0) of (3, 4, 5): shape (4, length), element [b][k] = x[k - min(offset, 0)][b][k + max(offset, 0)]
    Vec want;
    int64_t length = 0;
    for (int64_t b = 0; b < 4; ++b)
      for (int64_t k = 0;; ++k) {
        const int64_t row = k + std::max<int64_t>(-offset, 0), col = k + std::max<int64_t>(offset, 0);
        if (row >= 5 || col >= 3) break;  // dim1 = 2 (rows), dim2 = 0 (columns)
        want.push_back(at3(xv, s, col, b, row));
        length = k + 1;
      }
    const Tensor d = diagonal(x, offset, 2, 0);
    EXPECT_EQ(d.shape(), (Shape{4, length})) << offset;
    EXPECT_EQ(values(d), want) << offset;
  }
  // a view: writes show in x
  Tensor m = zeros({3, 3}, kFloat64);
  diagonal(m, 1).fill_(7);
  EXPECT_EQ(values(m), (Vec{0, 7, 0, 0, 0, 7, 0, 0, 0}));
  EXPECT_TRUE(diagonal(m).storage() == m.storage());
  // diag both ways, trace
  EXPECT_EQ(values(diag(tensor({1, 2}), -1)), (Vec{0, 0, 0, 1, 0, 0, 0, 2, 0}));
  EXPECT_EQ(diag(tensor({1.0, 2.0}), 2).shape(), (Shape{4, 4}));
  const Tensor sq = arange(12).view({3, 4});
  EXPECT_EQ(values(diag(sq)), (Vec{0, 5, 10}));
  EXPECT_EQ(values(diag(sq, 1)), (Vec{1, 6, 11}));
  EXPECT_EQ(values(diag(sq.t(), -2)), (Vec{2, 7}));
  EXPECT_EQ(trace(sq).item<int64_t>(), 15);
  EXPECT_EQ(trace(sq).dtype(), kInt64);
  // gradients, through non-contiguous inputs too
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return diagonal(in[0], -1, 2, 1); },
                        {leaf(randn(s, kFloat64), Layout::Transposed)}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return diag(in[0], 1); }, {leaf(randn({3}, kFloat64))}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return diag(in[0], -1); },
                        {leaf(randn({4, 3}, kFloat64), Layout::Sliced)}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return trace(in[0]); }, {leaf(randn({4, 4}, kFloat64))}));
  EXPECT_TRUE(strata::testing::gradgradcheck([](const std::vector<Tensor>& in) { return square(diagonal(in[0])); },
                                             {leaf(randn({3, 4}, kFloat64))}));
}

TEST(AdvancedIndex, BadInput) {
  const Tensor x = randn({3, 4});
  EXPECT_TRUE(throws_with([&] { (void)index(x, {ints({0}, {1}), ints({0}, {1}), ints({0}, {1})}); },
                          {"[index]", "too many indices"}));
  EXPECT_TRUE(throws_with([&] { (void)index(x, {ints({-4}, {1})}); }, {"[index]", "out of range"}));
  EXPECT_TRUE(throws_with([&] { (void)index(x, {std::nullopt, ints({4}, {1})}); }, {"[index]", "dim 1 of size 4"}));
  EXPECT_TRUE(throws_with([&] { (void)index(x, {x}); }, {"[index]", "int64, int32 or bool"}));
  EXPECT_TRUE(throws_with([&] { (void)index(x, {ones({3, 5}, kBool)}); }, {"[index]", "mask"}));
  EXPECT_TRUE(throws_with([&] { (void)index(x, {ints({0, 1}, {2}), ints({0, 1, 2}, {3})}); }, {"index"}));
  EXPECT_TRUE(throws_with([&] { (void)index(Tensor(), {}); }, {"[index]", "undefined"}));
  EXPECT_TRUE(throws_with([&] { (void)index_put(x, {ints({0}, {1})}, ones({4}, kFloat64)); },
                          {"[index_put]", "dtype"}));
  EXPECT_TRUE(throws_with([&] { (void)index_put(x, {ints({0, 1}, {2})}, ones({3, 4})); }, {"index_put"}));
  EXPECT_TRUE(throws_with([&] { (void)index_put(x, {ints({0}, {1})}, Tensor()); }, {"[index_put]", "undefined"}));
  EXPECT_TRUE(throws_with([&] { (void)diagonal(ones({3})); }, {"[diagonal]", "at least 2 dims"}));
  EXPECT_TRUE(throws_with([&] { (void)diagonal(x, 0, 1, -1); }, {"[diagonal]", "differ"}));
  EXPECT_TRUE(throws_with([&] { (void)diagonal(x, 0, 0, 2); }, {"diagonal", "dim 2"}));
  EXPECT_TRUE(throws_with([&] { (void)diag(ones({2, 2, 2})); }, {"[diag]", "1-d or 2-d"}));
  EXPECT_TRUE(throws_with([&] { (void)trace(ones({3})); }, {"[trace]", "2-d"}));
}
