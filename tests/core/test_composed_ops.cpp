// The ops composed from other ops (src/ops/select.cpp, rearrange.cpp, combinations.cpp,
// tensor_methods.cpp), each against a loop over the elements in float64 or int64, their
// gradients by finite differences, and bad input.
#include <cmath>
#include <limits>
#include <set>

#include "gradcheck.h"
#include "testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::gradcheck;
using strata::testing::leaf;
using strata::testing::throws_with;
using strata::testing::unravel;
using strata::testing::values;

namespace {

// Row-major coordinates of the elements where pred(value) holds.
std::vector<double> coordinates_where(const Tensor& x, const std::function<bool(double)>& pred) {
  std::vector<double> out;
  const std::vector<double> v = values(x);
  for (size_t i = 0; i < v.size(); ++i)
    if (pred(v[i]))
      for (int64_t c : unravel(static_cast<int64_t>(i), x.shape())) out.push_back(static_cast<double>(c));
  return out;
}

Tensor sparse_ints(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  return randint(-1, 2, shape, TensorOptions(kInt64), &gen) * randint(0, 2, shape, TensorOptions(kInt64), &gen);
}

}  // namespace

TEST(ComposedOps, NonzeroMatchesALoop) {
  for (const Shape& shape : {Shape{7}, Shape{3, 4, 5}, Shape{2, 1, 6}, Shape{0, 3}, Shape{}}) {
    const Tensor x = sparse_ints(shape, 3);
    const Tensor nz = nonzero(x);
    EXPECT_EQ(nz.dtype(), kInt64);
    EXPECT_EQ(nz.dim(), 2);
    EXPECT_EQ(nz.size(1), x.dim());
    EXPECT_EQ(values(nz), coordinates_where(x, [](double v) { return v != 0; })) << fmt::format("{}", shape);
  }
  // a transposed view is read in its logical order; NaN is nonzero; bool as it is
  const Tensor t = sparse_ints({4, 6}, 5).to(kFloat32).t();
  EXPECT_EQ(values(t.nonzero()), coordinates_where(t, [](double v) { return v != 0; }));
  const Tensor f = from_vector<float>({0, NAN, -0.0f, 2});
  EXPECT_EQ(values(nonzero(f)), (std::vector<double>{1, 3}));
  EXPECT_EQ(values(nonzero(f > 1)), (std::vector<double>{3}));
  EXPECT_EQ(nonzero(zeros({3, 2})).shape(), (Shape{0, 2}));
  EXPECT_EQ(nonzero(scalar_tensor(4)).shape(), (Shape{1, 0}));
}

TEST(ComposedOps, MaskedSelect) {
  const Tensor x = randn({3, 4}, kFloat64);
  const Tensor mask = randn({4}) > 0;  // broadcast over the rows
  std::vector<double> want;
  const std::vector<double> xv = values(x), mv = values(mask);
  for (int64_t i = 0; i < 12; ++i)
    if (mv[static_cast<size_t>(i % 4)] != 0) want.push_back(xv[static_cast<size_t>(i)]);
  EXPECT_EQ(values(masked_select(x, mask)), want);
  std::vector<double> positive;
  for (double v : xv)
    if (v > 0) positive.push_back(v);
  EXPECT_EQ(values(x.masked_select(x > 0)), positive);
  EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return masked_select(in[0], mask); },
                        {leaf(randn({3, 4}, kFloat64))}));
  EXPECT_TRUE(throws_with([&] { (void)masked_select(x, ones({4})); }, {"[masked_select]", "bool"}));
  EXPECT_TRUE(throws_with([&] { (void)masked_select(x, ones({5}, kBool)); }, {"masked_select"}));
}

TEST(ComposedOps, AnyAllAndFloatingTests) {
  const Tensor x = from_vector<float>({0, 1, 0, 0, 0, 0}, Shape{2, 3});
  EXPECT_TRUE(x.any().item<bool>());
  EXPECT_FALSE(x.all().item<bool>());
  EXPECT_EQ(values(any(x, 1)), (std::vector<double>{1, 0}));
  EXPECT_EQ(values(all(x == 0, 0, true)), (std::vector<double>{1, 0, 1}));
  EXPECT_EQ(all(x, 0, true).shape(), (Shape{1, 3}));
  EXPECT_TRUE(all(zeros({0})).item<bool>());  // as PyTorch: all of nothing is true
  EXPECT_FALSE(any(zeros({0})).item<bool>());

  const float inf = std::numeric_limits<float>::infinity();
  const Tensor v = from_vector<float>({1, NAN, inf, -inf, -0.0f});
  EXPECT_EQ(values(isnan(v)), (std::vector<double>{0, 1, 0, 0, 0}));
  EXPECT_EQ(values(isinf(v)), (std::vector<double>{0, 0, 1, 1, 0}));
  EXPECT_EQ(values(isfinite(v)), (std::vector<double>{1, 0, 0, 0, 1}));
  EXPECT_EQ(values(isnan(arange(3))), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(values(isfinite(arange(3))), (std::vector<double>{1, 1, 1}));
  const double big = std::numeric_limits<float>::max();
  EXPECT_EQ(values(nan_to_num(v)), (std::vector<double>{1, 0, big, -big, 0}));
  EXPECT_EQ(values(nan_to_num(v, 7, 8, -9)), (std::vector<double>{1, 7, 8, -9, 0}));
  EXPECT_EQ(values(nan_to_num(v.to(kFloat16)))[2], 65504.0);
  // the replaced elements get no gradient
  Tensor w = v.to(kFloat64);
  w.requires_grad_();
  (nan_to_num(w) * 3).sum().backward();
  EXPECT_EQ(values(w.grad()), (std::vector<double>{3, 0, 0, 0, 3}));
}

TEST(ComposedOps, Arithmetic) {
  const Tensor a = from_vector<double>({1, -2, 3}), b = from_vector<double>({5, 6, -7});
  EXPECT_EQ(values(lerp(a, b, 0.25)), (std::vector<double>{2, 0, 0.5}));
  EXPECT_EQ(values(lerp(a, b, 1.0)), values(b));  // exact at the ends
  EXPECT_EQ(values(lerp(a, b, 0.0)), values(a));
  EXPECT_EQ(values(lerp(a, b, from_vector<double>({0, 0.5, 1}))), (std::vector<double>{1, 2, -7}));
  Tensor ema = a.clone();
  ema.lerp_(b, 0.75);
  EXPECT_EQ(values(ema), (std::vector<double>{4, 4, -4.5}));
  EXPECT_EQ(values(addcmul(a, a, b, 2)), (std::vector<double>{11, -26, -39}));
  EXPECT_EQ(values(addcdiv(a, b, from_vector<double>({2, 4, 7}), -1)), (std::vector<double>{-1.5, -3.5, 4}));
  EXPECT_TRUE(throws_with([] { (void)addcdiv(arange(2), arange(2), arange(2)); }, {"[addcdiv]", "integer"}));
  EXPECT_EQ(values(outer(a, from_vector<double>({1, 10}))), (std::vector<double>{1, 10, -2, -20, 3, 30}));
  EXPECT_TRUE(throws_with([&] { (void)outer(a.view({3, 1}), a); }, {"[outer]", "1-d"}));
  const Tensor cond = a > 0;
  EXPECT_EQ(where(cond, 1.0, 0.0).dtype(), kFloat32);
  EXPECT_EQ(where(cond, 1, 0).dtype(), kInt64);
  EXPECT_EQ(values(where(cond, 1.5, -1)), (std::vector<double>{1.5, -1, 1.5}));
  // masked_fill with a 0-d tensor: differentiable with respect to it
  Tensor fill = scalar_tensor(2.0, kFloat64);
  fill.requires_grad_();
  masked_fill(a, cond, fill).sum().backward();
  EXPECT_EQ(fill.grad().item<double>(), 2.0);
  EXPECT_TRUE(throws_with([&] { (void)masked_fill(a, cond, a); }, {"[masked_fill]", "0-d"}));
  for (const auto& c : std::vector<std::pair<const char*, strata::testing::Fn>>{
           {"lerp", [](const std::vector<Tensor>& in) { return lerp(in[0], in[1], in[2]); }},
           {"addcdiv", [](const std::vector<Tensor>& in) { return addcdiv(in[0], in[1], in[2] + 3, 0.5); }}})
    EXPECT_TRUE(gradcheck(c.second, {leaf(randn({4}, kFloat64)), leaf(randn({4}, kFloat64)), leaf(rand({4}, kFloat64))})) << c.first;
}

// Against numpy's rules, written out as loops over the output.
TEST(ComposedOps, Rearrangements) {
  const Tensor x = arange(6).view({2, 3});
  EXPECT_EQ(values(repeat(x, {2, 2})),
            (std::vector<double>{0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5, 0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5}));
  EXPECT_EQ(x.repeat({2, 1, 1}).shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(values(tile(x, {2})), (std::vector<double>{0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5}));
  EXPECT_EQ(repeat(x, {0, 1}).shape(), (Shape{0, 3}));
  EXPECT_TRUE(throws_with([&] { (void)repeat(x, {2}); }, {"[repeat]", "at least one per dim"}));
  EXPECT_TRUE(throws_with([&] { (void)repeat(x, {-1, 1}); }, {"[repeat]", ">= 0"}));
  EXPECT_EQ(values(repeat_interleave(x, 2, 1)), (std::vector<double>{0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5}));
  EXPECT_EQ(values(repeat_interleave(x, 2, 0)), (std::vector<double>{0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5}));
  EXPECT_EQ(values(repeat_interleave(x, 2)), (std::vector<double>{0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5}));
  EXPECT_EQ(values(flip(x, {1})), (std::vector<double>{2, 1, 0, 5, 4, 3}));
  EXPECT_EQ(values(x.flip({0, 1})), (std::vector<double>{5, 4, 3, 2, 1, 0}));
  EXPECT_TRUE(throws_with([&] { (void)flip(x, {1, -1}); }, {"[flip]", "more than once"}));
  EXPECT_EQ(values(roll(x, {1}, {1})), (std::vector<double>{2, 0, 1, 5, 3, 4}));
  EXPECT_EQ(values(roll(x, {-4}, {1})), (std::vector<double>{1, 2, 0, 4, 5, 3}));
  EXPECT_EQ(values(roll(x, {1, 1}, {0, 1})), (std::vector<double>{5, 3, 4, 2, 0, 1}));
  EXPECT_EQ(values(roll(x, {2})), (std::vector<double>{4, 5, 0, 1, 2, 3}));
  EXPECT_EQ(roll(x, {2}).shape(), x.shape());
  EXPECT_TRUE(throws_with([&] { (void)roll(x, {1, 2}, {0}); }, {"[roll]"}));
  const std::vector<Tensor> rows = x.unbind(0);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(values(rows[1]), (std::vector<double>{3, 4, 5}));
  EXPECT_EQ(unbind(x, 1).size(), 3u);
  EXPECT_TRUE(throws_with([] { (void)unbind(scalar_tensor(1)); }, {"[unbind]"}));
  for (const auto& c : std::vector<std::pair<const char*, strata::testing::Fn>>{
           {"repeat", [](const std::vector<Tensor>& in) { return repeat(in[0], {2, 1, 3}); }},
           {"repeat_interleave", [](const std::vector<Tensor>& in) { return repeat_interleave(in[0], 3, 0); }},
           {"flip", [](const std::vector<Tensor>& in) { return flip(in[0].t(), {0, 1}); }},
           {"roll", [](const std::vector<Tensor>& in) { return roll(in[0], {1, -1}, {0, 1}); }}})
    EXPECT_TRUE(gradcheck(c.second, {leaf(randn({2, 3}, kFloat64))})) << c.first;
}

TEST(ComposedOps, RandomDraws) {
  Generator gen(11), same(11);
  const Tensor p = randperm(50, kInt64, &gen);
  std::vector<double> sorted = values(p);
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
  EXPECT_EQ(values(randperm(50, kInt64, &same)), values(p));  // the generator decides
  EXPECT_NE(values(randperm(50, kInt64, &gen)), values(p));
  EXPECT_EQ(randperm(0).numel(), 0);
  EXPECT_EQ(randperm(5).dtype(), kInt64);
  EXPECT_TRUE(throws_with([] { (void)randperm(-1); }, {"[randperm]"}));
  EXPECT_TRUE(throws_with([] { (void)randperm(20000000, kFloat32); }, {"[randperm]", "exactly"}));

  Generator g(5);
  const Tensor draws = bernoulli(full({100000}, 0.3, kFloat64), &g);
  EXPECT_EQ(draws.dtype(), kFloat64);
  const double rate = draws.mean().item<double>();
  EXPECT_NEAR(rate, 0.3, 0.006);  // 4 standard deviations
  EXPECT_EQ(values(bernoulli(from_vector<float>({0, 1, 0, 1}), &g)), (std::vector<double>{0, 1, 0, 1}));
  EXPECT_TRUE(throws_with([&] { (void)bernoulli(from_vector<float>({0.5, 1.5})); }, {"[bernoulli]", "[0, 1]"}));
  EXPECT_TRUE(throws_with([&] { (void)bernoulli(arange(2)); }, {"[bernoulli]", "floating"}));
}

TEST(ComposedOps, Literals) {
  const Tensor f = tensor({1.5, -2.0});
  EXPECT_EQ(f.dtype(), kFloat32);
  EXPECT_EQ(values(f), (std::vector<double>{1.5, -2}));
  EXPECT_EQ(tensor({1, 2, 3}).dtype(), kInt64);
  EXPECT_EQ(tensor({true, false}).dtype(), kBool);
  EXPECT_EQ(tensor({1, 2}, kFloat64).dtype(), kFloat64);
  const Tensor m = tensor({{1, 2, 3}, {4, 5, 6}});
  EXPECT_EQ(m.shape(), (Shape{2, 3}));
  EXPECT_EQ(values(m), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(tensor({{0.5f}, {1.5f}}).shape(), (Shape{2, 1}));
  EXPECT_TRUE(throws_with([] { (void)tensor({{1, 2}, {3}}); }, {"[tensor]", "as long as the first"}));
}

TEST(ComposedOps, MethodForms) {
  const Tensor a = randn({3, 4}, kFloat64), b = randn({3, 4}, kFloat64);
  EXPECT_TRUE(equal(a.add(b, 2), add(a, mul(b, 2))));
  EXPECT_TRUE(equal(a.sub(b), a - b));
  EXPECT_TRUE(equal(a.mul(3), a * 3));
  EXPECT_TRUE(equal(a.div(b), a / b));
  EXPECT_TRUE(equal(a.square(), a * a));
  EXPECT_TRUE(equal(a.sum(1), sum(a, {1})));
  EXPECT_TRUE(equal(a.mean(0, true), mean(a, {0}, true)));
  EXPECT_TRUE(equal(a.softmax(1), softmax(a, 1)));
  EXPECT_TRUE(equal(a.log_softmax(0), log_softmax(a, 0)));
  EXPECT_TRUE(equal(a.masked_fill(a > 0, 0), masked_fill(a, a > 0, 0)));
  EXPECT_TRUE(equal(a.cumsum(1), cumsum(a, 1)));
  EXPECT_EQ(a.chunk(2, 1).size(), 2u);
  EXPECT_EQ(a.split(2).size(), 2u);
  EXPECT_EQ(a.view_as(b.t()).shape(), (Shape{4, 3}));
  EXPECT_EQ(a.options().dtype_, kFloat64);
  const Tensor idx = from_vector<int64_t>({2, 0});
  EXPECT_TRUE(equal(a.index_select(1, idx), index_select(a, 1, idx)));
  EXPECT_TRUE(equal(a.gather(1, idx.view({1, 2}).expand({3, 2})), gather(a, 1, idx.view({1, 2}).expand({3, 2}))));
  EXPECT_TRUE(equal(a.isnan(), isnan(a)));
}

// LibTorch's checked conversion: a value the requested type cannot hold raises.
TEST(ComposedOps, ItemRefusesValuesTheTypeCannotHold) {
  EXPECT_EQ(scalar_tensor(3.9).item<int64_t>(), 3);
  EXPECT_EQ(scalar_tensor(-0.5).item<uint8_t>(), 0);
  EXPECT_EQ(scalar_tensor(255, kInt64).item<uint8_t>(), 255);
  EXPECT_EQ(scalar_tensor(-2147483648.0, kFloat64).item<int32_t>(), INT32_MIN);
  EXPECT_TRUE(std::isnan(scalar_tensor(NAN).item<float>()));
  EXPECT_TRUE(std::isinf(scalar_tensor(INFINITY).item<float>()));
  EXPECT_TRUE(throws_with([] { (void)scalar_tensor(NAN).item<int64_t>(); }, {"[item]", "64-bit signed integer"}));
  EXPECT_TRUE(throws_with([] { (void)scalar_tensor(INFINITY).item<int64_t>(); }, {"[item]"}));
  EXPECT_TRUE(throws_with([] { (void)scalar_tensor(3e10).item<int32_t>(); }, {"[item]", "32-bit"}));
  EXPECT_TRUE(throws_with([] { (void)scalar_tensor(int64_t{1} << 40, kInt64).item<int32_t>(); }, {"[item]"}));
  EXPECT_TRUE(throws_with([] { (void)scalar_tensor(-1.0).item<uint8_t>(); }, {"[item]", "unsigned"}));
  EXPECT_TRUE(throws_with([] { (void)scalar_tensor(70000, kInt64).item<int16_t>(); }, {"[item]", "16-bit"}));
  EXPECT_TRUE(throws_with([] { (void)scalar_tensor(1e300, kFloat64).item<float>(); }, {"[item]", "float"}));
  EXPECT_TRUE(throws_with([] { (void)scalar_tensor(9223372036854775808.0, kFloat64).item<int64_t>(); }, {"[item]"}));
}
