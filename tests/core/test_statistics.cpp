// median, nanmedian, quantile, nanquantile, unique and unique_consecutive (src/ops/statistics.cpp,
// unique.cpp) against float64 references written with std::sort and std::map after numpy's and
// PyTorch's documented definitions, PyTorch's documented examples, their gradients by finite
// differences, and bad input.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>

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

const double kNaN = std::numeric_limits<double>::quiet_NaN();
using Vec = std::vector<double>;

// Values with ties (multiples of 0.5 in [-2, 2]) and, with nan_rate > 0, NaNs.
Tensor tied_values(const Shape& shape, uint64_t seed, double nan_rate = 0) {
  Generator g(seed);
  Tensor v = mul(randint(-4, 5, shape, TensorOptions(kInt64), &g).to(kFloat64), 0.5);
  if (nan_rate > 0) v = where(lt(rand(shape, kFloat64, &g), nan_rate), kNaN, v);
  return v;
}

// The rows of x along dim (moved last), each as a vector.
std::vector<Vec> rows_along(const Tensor& x, int64_t dim) {
  std::vector<int64_t> perm;
  for (int64_t k = 0; k < x.dim(); ++k)
    if (k != dim) perm.push_back(k);
  perm.push_back(dim);
  const Vec v = values(x.permute(perm));
  const auto n = static_cast<size_t>(x.size(dim));
  std::vector<Vec> rows;
  for (size_t i = 0; i + n <= v.size() && n > 0; i += n) rows.emplace_back(v.begin() + i, v.begin() + i + n);
  return rows;
}

// PyTorch's median selection: position (n - 1) / 2 of the (value, position) order with NaNs
// last; for median a row holding NaN gives its first NaN, for nanmedian NaNs are left out.
std::pair<double, int64_t> median_ref(const Vec& row, bool ignore_nan) {
  std::vector<int64_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    const double x = row[a], y = row[b];
    return std::isnan(y) ? !std::isnan(x) : x < y;
  });
  int64_t nans = 0;
  for (double v : row) nans += std::isnan(v);
  const auto n = static_cast<int64_t>(row.size());
  int64_t k = (n - 1) / 2;
  if (nans > 0) k = ignore_nan ? std::max<int64_t>(n - nans - 1, 0) / 2 : n - nans;
  const int64_t at = order[static_cast<size_t>(k)];
  return {row[static_cast<size_t>(at)], at};
}

// numpy's quantile of one row: position q (n - 1) into the sorted row.
double quantile_ref(Vec row, double q, const std::string& mode, bool ignore_nan) {
  if (ignore_nan) row.erase(std::remove_if(row.begin(), row.end(), [](double v) { return std::isnan(v); }), row.end());
  if (row.empty() || std::any_of(row.begin(), row.end(), [](double v) { return std::isnan(v); })) return kNaN;
  std::sort(row.begin(), row.end());
  const double pos = q * static_cast<double>(row.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos)), hi = static_cast<size_t>(std::ceil(pos));
  if (mode == "lower") return row[lo];
  if (mode == "higher") return row[hi];
  if (mode == "nearest") return row[static_cast<size_t>(std::nearbyint(pos))];  // halves to even
  if (mode == "midpoint") return (row[lo] + row[hi]) / 2;
  return row[lo] + (pos - static_cast<double>(lo)) * (row[hi] - row[lo]);
}

}  // namespace

TEST(Statistics, MedianOfAllElements) {
  EXPECT_EQ(median(tensor({3.0, 1.0, 2.0})).item<double>(), 2.0);
  EXPECT_EQ(median(tensor({1, 2, 3, 4})).item<int64_t>(), 2);  // the lower middle value
  EXPECT_TRUE(std::isnan(median(tensor({1.0, kNaN, 3.0})).item<double>()));
  EXPECT_EQ(nanmedian(tensor({1.0, kNaN, 3.0, 2.0})).item<double>(), 2.0);
  EXPECT_TRUE(std::isnan(nanmedian(tensor({kNaN, kNaN})).item<double>()));
  EXPECT_TRUE(std::isnan(median(empty({0}, kFloat64)).item<double>()));
  for (uint64_t seed : {1, 2, 3}) {
    const Tensor x = tied_values({5, 7}, seed, seed == 3 ? 0.2 : 0.0);
    const Vec flat = values(x);
    for (Layout layout : {Layout::Contiguous, Layout::Transposed, Layout::Sliced}) {
      const Tensor xl = with_layout(x, layout);
      EXPECT_TRUE(all_close(median(xl), {median_ref(flat, false).first}, 0, 0));
      EXPECT_TRUE(all_close(nanmedian(xl), {median_ref(flat, true).first}, 0, 0));
      EXPECT_EQ(median(xl.to(kFloat32)).dtype(), kFloat32);
    }
  }
}

TEST(Statistics, MedianAlongADim) {
  for (const Shape& shape : {Shape{6}, Shape{4, 5}, Shape{3, 4, 6}}) {
    for (double nan_rate : {0.0, 0.25}) {
      const Tensor x = tied_values(shape, 7, nan_rate);
      for (int64_t dim = 0; dim < x.dim(); ++dim) {
        for (bool ignore_nan : {false, true}) {
          Vec want_values, want_indices;
          for (const Vec& row : rows_along(x, dim)) {
            const auto [v, i] = median_ref(row, ignore_nan);
            want_values.push_back(v);
            want_indices.push_back(static_cast<double>(i));
          }
          const MedianResult r = ignore_nan ? nanmedian(with_layout(x, Layout::Sliced), dim)
                                            : median(with_layout(x, Layout::Sliced), dim);
          SCOPED_TRACE(fmt::format("{} dim {} nan {}", shape, dim, ignore_nan));
          EXPECT_TRUE(all_close(r.values, want_values, 0, 0));
          EXPECT_EQ(values(r.indices), want_indices);
          EXPECT_EQ(r.indices.dtype(), kInt64);
          const MedianResult kept = median(x, dim, true);
          Shape kept_shape = shape;
          kept_shape[static_cast<size_t>(dim)] = 1;
          EXPECT_EQ(kept.values.shape(), kept_shape);
        }
      }
    }
  }
  // integers; a 0-d input along dim 0
  const MedianResult ints = median(tensor({{5, 1, 4}, {2, 2, 9}}), 1);
  EXPECT_EQ(values(ints.values), (Vec{4, 2}));
  EXPECT_EQ(values(ints.indices), (Vec{2, 1}));  // tie: the middle of (value, position) order
  EXPECT_EQ(median(scalar_tensor(3.0), 0).values.dim(), 0);
}

TEST(Statistics, QuantileDocumentedExamples) {
  const Tensor a = arange(4, kFloat32);
  EXPECT_NEAR(quantile(a, 0.6).item<double>(), 1.8, 1e-6);
  EXPECT_EQ(quantile(a, 0.6, std::nullopt, false, "lower").item<double>(), 1.0);
  EXPECT_EQ(quantile(a, 0.6, std::nullopt, false, "higher").item<double>(), 2.0);
  EXPECT_NEAR(quantile(a, 0.6, std::nullopt, false, "midpoint").item<double>(), 1.5, 1e-6);
  EXPECT_EQ(quantile(a, 0.6, std::nullopt, false, "nearest").item<double>(), 2.0);
  EXPECT_EQ(quantile(a, 0.4, std::nullopt, false, "nearest").item<double>(), 1.0);
  const Tensor t = tensor({kNaN, 1.0, 2.0});
  EXPECT_TRUE(std::isnan(quantile(t, 0.5).item<double>()));
  EXPECT_NEAR(nanquantile(t, 0.5).item<double>(), 1.5, 1e-6);
  const Tensor m = tensor({{kNaN, kNaN}, {1.0, 2.0}});
  EXPECT_TRUE(all_close(nanquantile(m, 0.5, 0), {1, 2}, 0, 0));
  EXPECT_TRUE(all_close(nanquantile(m, 0.5, 1), {kNaN, 1.5}, 0, 1e-6));
}

TEST(Statistics, QuantileMatchesNumpysDefinition) {
  const std::vector<std::string> modes = {"linear", "lower", "higher", "midpoint", "nearest"};
  const Vec qs = {0.0, 0.1, 0.25, 0.5, 0.6, 0.9, 1.0};
  const Tensor q = from_vector(qs);
  for (double nan_rate : {0.0, 0.2}) {
    const Tensor x = tied_values({4, 5, 6}, 11, nan_rate);
    for (const std::string& mode : modes) {
      for (bool ignore_nan : {false, true}) {
        auto f = [ignore_nan](const Tensor& a, const Tensor& b, std::optional<int64_t> d, bool k,
                              std::string_view m) {
          return ignore_nan ? nanquantile(a, b, d, k, m) : quantile(a, b, d, k, m);
        };
        SCOPED_TRACE(fmt::format("{} nan {} rate {}", mode, ignore_nan, nan_rate));
        // over all elements: (nq,), and with keepdim (nq, 1, 1, 1)
        Vec want;
        for (double qv : qs) want.push_back(quantile_ref(values(x), qv, mode, ignore_nan));
        EXPECT_TRUE(all_close(f(x, q, std::nullopt, false, mode), want, 1e-12, 1e-12));
        EXPECT_EQ(f(x, q, std::nullopt, true, mode).shape(), (Shape{7, 1, 1, 1}));
        // along each dim, from a transposed layout: (nq, rest...)
        for (int64_t dim = 0; dim < 3; ++dim) {
          want.clear();
          const std::vector<Vec> rows = rows_along(x, dim);
          for (double qv : qs)
            for (const Vec& row : rows) want.push_back(quantile_ref(row, qv, mode, ignore_nan));
          const Tensor got = f(with_layout(x, Layout::Transposed), q, dim - 3, false, mode);
          Shape rest = x.shape();
          rest.erase(rest.begin() + dim);
          rest.insert(rest.begin(), 7);
          EXPECT_EQ(got.shape(), rest);
          EXPECT_TRUE(all_close(got, want, 1e-12, 1e-12)) << "dim " << dim;
        }
      }
    }
  }
  // a double q gives no q dim; float32 follows the float64 reference; keepdim along a dim
  const Tensor x = tied_values({3, 8}, 5);
  EXPECT_EQ(quantile(x, 0.3, 1).shape(), (Shape{3}));
  EXPECT_EQ(quantile(x, 0.3, 1, true).shape(), (Shape{3, 1}));
  EXPECT_EQ(quantile(x, from_vector(Vec{0.3, 0.7}), 0, true).shape(), (Shape{2, 1, 8}));
  Vec want;
  for (const Vec& row : rows_along(x, 1)) want.push_back(quantile_ref(row, 0.3, "linear", false));
  EXPECT_TRUE(all_close(quantile(x.to(kFloat32), 0.3f, 1), want, 1e-6, 1e-6));
}

TEST(Statistics, MedianAndQuantileGradients) {
  Generator g(21);
  const Tensor x = leaf(randn({4, 5}, kFloat64, &g));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return median(in[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return median(in[0], 1).values; }, {x}));
  EXPECT_TRUE(gradcheck([](const std::vector<Tensor>& in) { return nanmedian(in[0], 0, true).values; }, {x}));
  const Tensor q = from_vector(Vec{0.1, 0.5, 0.77});
  for (const char* mode : {"linear", "lower", "higher", "midpoint", "nearest"}) {
    SCOPED_TRACE(mode);
    EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return quantile(in[0], q, 1, false, mode); }, {x}));
    EXPECT_TRUE(gradcheck([&](const std::vector<Tensor>& in) { return nanquantile(in[0], 0.35, {}, true, mode); },
                          {leaf(randn({3, 4}, kFloat64, &g), Layout::Transposed)}));
  }
  // ties: the median's gradient is shared by the elements equal to it, as PyTorch's
  const Tensor tied = leaf(tensor({1.0, 2.0, 2.0, 5.0}));
  median(tied).backward();
  EXPECT_EQ(values(tied.grad()), (Vec{0, 0.5, 0.5, 0}));
}

TEST(Statistics, UniqueMatchesAMap) {
  // PyTorch's documented examples
  const UniqueResult a = unique(tensor({1, 3, 2, 3}), true, true);
  EXPECT_EQ(values(a.values), (Vec{1, 2, 3}));
  EXPECT_EQ(values(a.inverse), (Vec{0, 2, 1, 2}));
  EXPECT_FALSE(a.counts.defined());
  const UniqueResult b = unique(tensor({{1, 3}, {2, 3}}), true, true);
  EXPECT_EQ(b.inverse.shape(), (Shape{2, 2}));
  EXPECT_EQ(values(b.inverse), (Vec{0, 2, 1, 2}));
  const UniqueResult c = unique_consecutive(tensor({1, 1, 2, 2, 3, 1, 1, 2}), true, true);
  EXPECT_EQ(values(c.values), (Vec{1, 2, 3, 1, 2}));
  EXPECT_EQ(values(c.inverse), (Vec{0, 0, 1, 1, 2, 3, 3, 4}));
  EXPECT_EQ(values(c.counts), (Vec{2, 2, 1, 2, 1}));
  for (DType dt : {kFloat64, kFloat32, kInt64, kInt32}) {
    const Tensor x = with_layout(tied_values({6, 5}, 13).to(dt), Layout::Transposed);
    const Vec v = values(x);
    std::map<double, int64_t> count;
    for (double e : v) ++count[e];
    Vec want_values, want_counts, want_inverse;
    for (const auto& [value, n] : count) {
      want_values.push_back(value);
      want_counts.push_back(static_cast<double>(n));
    }
    for (double e : v)
      want_inverse.push_back(static_cast<double>(std::distance(count.begin(), count.find(e))));
    const UniqueResult r = unique(x, false, true, true);
    EXPECT_EQ(r.values.dtype(), dt);
    EXPECT_EQ(values(r.values), want_values);
    EXPECT_EQ(values(r.counts), want_counts);
    EXPECT_EQ(values(r.inverse), want_inverse);
    EXPECT_EQ(r.inverse.shape(), x.shape());
  }
  // NaNs are each distinct and sort last; bool; empty
  EXPECT_TRUE(all_close(unique(tensor({kNaN, 1.0, kNaN, 1.0})).values, {1, kNaN, kNaN}, 0, 0));
  EXPECT_EQ(values(unique(tensor({true, false, true})).values), (Vec{0, 1}));
  const UniqueResult e = unique(empty({0, 3}), true, true, true);
  EXPECT_EQ(e.values.shape(), (Shape{0}));
  EXPECT_EQ(e.inverse.shape(), (Shape{0, 3}));
  EXPECT_EQ(e.counts.shape(), (Shape{0}));
}

TEST(Statistics, UniqueSlicesAlongADim) {
  const Tensor x = randint(0, 2, {7, 3, 2}, TensorOptions(kInt64));
  for (int64_t dim = 0; dim < 3; ++dim) {
    // slices as vectors, ordered lexicographically by std::map
    std::vector<int64_t> perm = {dim};
    for (int64_t k = 0; k < 3; ++k)
      if (k != dim) perm.push_back(k);
    const Tensor moved = x.permute(perm).contiguous();
    const int64_t n = x.size(dim), m = x.numel() / n;
    const Vec flat = values(moved);
    std::vector<Vec> slices;
    for (int64_t i = 0; i < n; ++i) slices.emplace_back(flat.begin() + i * m, flat.begin() + (i + 1) * m);
    std::map<Vec, int64_t> count;
    for (const Vec& s : slices) ++count[s];
    Vec want_values, want_counts, want_inverse;
    for (const auto& [s, k] : count) {
      want_values.insert(want_values.end(), s.begin(), s.end());
      want_counts.push_back(static_cast<double>(k));
    }
    for (const Vec& s : slices)
      want_inverse.push_back(static_cast<double>(std::distance(count.begin(), count.find(s))));
    const UniqueResult r = unique(x, true, true, true, dim);
    Shape shape = x.shape();
    shape[static_cast<size_t>(dim)] = static_cast<int64_t>(count.size());
    EXPECT_EQ(r.values.shape(), shape);
    EXPECT_EQ(values(r.values.permute(perm)), want_values) << "dim " << dim;
    EXPECT_EQ(values(r.counts), want_counts);
    EXPECT_EQ(values(r.inverse), want_inverse);
  }
  // consecutive rows
  const Tensor rows = tensor({{1, 2}, {1, 2}, {0, 5}, {1, 2}});
  const UniqueResult c = unique_consecutive(rows, true, true, 0);
  EXPECT_EQ(values(c.values), (Vec{1, 2, 0, 5, 1, 2}));
  EXPECT_EQ(values(c.inverse), (Vec{0, 0, 1, 2}));
  EXPECT_EQ(values(c.counts), (Vec{2, 1, 1}));
  EXPECT_EQ(values(unique(rows, true, false, false, 0).values), (Vec{0, 5, 1, 2}));
  EXPECT_EQ(unique(empty({2, 0}), true, false, false, 1).values.shape(), (Shape{2, 0}));
}

TEST(Statistics, BadInput) {
  const Tensor x = randn({3, 4}, kFloat64);
  EXPECT_TRUE(throws_with([&] { (void)median(x, 2); }, {"[median]", "dim"}));
  EXPECT_TRUE(throws_with([&] { (void)median(empty({3, 0}), 1); }, {"[median]", "size 0"}));
  EXPECT_TRUE(throws_with([&] { (void)median(empty({0}, kInt64)); }, {"[median]", "no elements"}));
  EXPECT_TRUE(throws_with([&] { (void)nanmedian(Tensor()); }, {"[nanmedian]", "undefined"}));
  EXPECT_TRUE(throws_with([&] { (void)quantile(x, 1.5); }, {"[quantile]", "[0, 1]"}));
  EXPECT_TRUE(throws_with([&] { (void)quantile(x, -0.1); }, {"[quantile]", "[0, 1]"}));
  EXPECT_TRUE(throws_with([&] { (void)nanquantile(x, from_vector(Vec{0.5, kNaN})); }, {"[nanquantile]", "[0, 1]"}));
  EXPECT_TRUE(throws_with([&] { (void)quantile(x, 0.5, 0, false, "cubic"); }, {"[quantile]", "interpolation"}));
  EXPECT_TRUE(throws_with([&] { (void)quantile(x.to(kInt64), 0.5); }, {"[quantile]", "float32 or float64"}));
  EXPECT_TRUE(throws_with([&] { (void)quantile(x, from_vector(Vec{0.5}).to(kFloat32)); }, {"[quantile]", "dtype"}));
  EXPECT_TRUE(throws_with([&] { (void)quantile(x, zeros({2, 2}, kFloat64)); }, {"[quantile]", "1-d"}));
  EXPECT_TRUE(throws_with([&] { (void)quantile(empty({0}, kFloat64), 0.5); }, {"[quantile]", "non-empty"}));
  EXPECT_TRUE(throws_with([&] { (void)quantile(x, 0.5, 3); }, {"quantile", "dim"}));
  EXPECT_TRUE(throws_with([&] { (void)unique(x, true, false, false, 2); }, {"unique", "dim"}));
  EXPECT_TRUE(throws_with([&] { (void)unique(scalar_tensor(1), true, false, false, 0); }, {"[unique]", "0-d"}));
  EXPECT_TRUE(throws_with([&] { (void)unique(empty({0, 0}), true, false, false, 0); }, {"[unique]", "size 0"}));
  EXPECT_TRUE(throws_with([&] { (void)unique_consecutive(Tensor()); }, {"[unique_consecutive]", "undefined"}));
}
