// cat, stack, split, chunk, sort, argsort, topk, isclose, allclose and equal against plain-loop
// references: dtypes (with promotion for cat), negative dims, strided layouts, zero-size
// dims, ties and NaN for the orderings, views for split / chunk, and bad input.
#include <algorithm>
#include <cmath>
#include <limits>

#include "testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::Layout;
using strata::testing::unravel;
using strata::testing::values;
using strata::testing::with_layout;

namespace {

const Layout kLayouts[] = {Layout::Contiguous, Layout::Transposed, Layout::Sliced};

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t v : s) n *= v;
  return n;
}

int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t f = 0;
  for (size_t d = 0; d < s.size(); ++d) f = f * s[d] + idx[d];
  return f;
}

// Values with many ties: small integers (and halves for float types).
Tensor random_values(const Shape& s, DType t, Generator& g) {
  if (t == kBool) return randint(0, 2, s, TensorOptions(kInt64), &g).to(kBool);
  Tensor v = randint(t == kUInt8 ? 0 : -6, 6, s, TensorOptions(kInt64), &g);
  if (is_floating(t)) return (v.to(kFloat64) * 0.5).to(t);
  return v.to(t);
}

// Flat C-order positions of each slice of `s` along dim d, one vector per slice.
std::vector<std::vector<int64_t>> slices(const Shape& s, int64_t d) {
  Shape outer = s;
  outer[d] = 1;
  std::vector<std::vector<int64_t>> out;
  for (int64_t o = 0; o < numel_of(outer); ++o) {
    auto idx = unravel(o, outer);
    std::vector<int64_t> pos;
    for (int64_t j = 0; j < s[d]; ++j) {
      idx[d] = j;
      pos.push_back(ravel(idx, s));
    }
    out.push_back(pos);
  }
  return out;
}

bool less_nan_last(double a, double b) {
  if (std::isnan(a)) return false;
  if (std::isnan(b)) return true;
  return a < b;
}

// Reference ordering: stable sort of each slice, first k entries, as (values, indices).
void reference_order(const std::vector<double>& xv, const Shape& s, int64_t d, int64_t k, bool descending,
                     std::vector<double>& vals, std::vector<double>& idxs) {
  Shape os = s;
  os[d] = k;
  vals.assign(static_cast<size_t>(numel_of(os)), 0);
  idxs.assign(vals.size(), 0);
  auto in = slices(s, d);
  auto out = slices(os, d);
  for (size_t o = 0; o < in.size(); ++o) {
    std::vector<int64_t> perm(in[o].size());
    for (size_t j = 0; j < perm.size(); ++j) perm[j] = static_cast<int64_t>(j);
    std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
      double va = xv[in[o][a]], vb = xv[in[o][b]];
      return descending ? less_nan_last(vb, va) : less_nan_last(va, vb);
    });
    for (int64_t j = 0; j < k; ++j) {
      vals[out[o][j]] = xv[in[o][perm[j]]];
      idxs[out[o][j]] = static_cast<double>(perm[j]);
    }
  }
}

}  // namespace

TEST(Cat, MatchesReferenceWithPromotion) {
  Generator g(1);
  const std::vector<std::vector<DType>> type_sets = {
      {kFloat32, kFloat32}, {kInt32, kFloat32}, {kInt64, kBool, kInt32}, {kFloat64}, {kBFloat16, kFloat16}};
  for (const Shape& base : {Shape{4}, Shape{3, 5}, Shape{2, 3, 4}, Shape{2, 0, 3}})
    for (int64_t dim = -static_cast<int64_t>(base.size()); dim < static_cast<int64_t>(base.size()); ++dim)
      for (const auto& types : type_sets)
        for (Layout l : kLayouts) {
          const int64_t d = dim < 0 ? dim + static_cast<int64_t>(base.size()) : dim;
          std::vector<Tensor> parts;
          DType want_t = types[0];
          for (size_t i = 0; i < types.size(); ++i) {
            Shape s = base;
            s[d] = static_cast<int64_t>(i) + (i == 1 ? 0 : 1);  // the second part is empty along d
            parts.push_back(with_layout(random_values(s, types[i], g), l));
            want_t = promote_types(want_t, types[i]);
          }
          SCOPED_TRACE(fmt::format("{} dim {} {}", base, dim, strata::testing::layout_name(l)));
          Tensor out = cat(parts, dim);
          ASSERT_EQ(out.dtype(), want_t);
          Shape want_shape = base;
          want_shape[d] = 0;
          for (const Tensor& p : parts) want_shape[d] += p.size(d);
          ASSERT_EQ(out.shape(), want_shape);
          std::vector<double> want(static_cast<size_t>(numel_of(want_shape)));
          int64_t off = 0;
          for (const Tensor& p : parts) {
            std::vector<double> pv = values(p);
            for (int64_t i = 0; i < p.numel(); ++i) {
              auto idx = unravel(i, p.shape());
              idx[d] += off;
              want[ravel(idx, want_shape)] = pv[i];
            }
            off += p.size(d);
          }
          ASSERT_TRUE(all_close(out, want, 0, 0));
        }
}

TEST(Cat, SkipsEmptyVectorsAndCopies) {
  Tensor a = arange(6, kFloat32).view({2, 3});
  Tensor e = empty({0}, kFloat64);
  Tensor out = cat({e, a, e, a * 2.0}, 0);
  EXPECT_EQ(out.shape(), (Shape{4, 3}));
  EXPECT_EQ(out.dtype(), kFloat64);  // promotion still counts the skipped tensors
  EXPECT_TRUE(all_close(out, {0, 1, 2, 3, 4, 5, 0, 2, 4, 6, 8, 10}, 0, 0));
  Tensor only = cat({e, empty({0}, kInt32)}, 0);
  EXPECT_EQ(only.shape(), (Shape{0}));
  EXPECT_EQ(only.dtype(), kFloat64);
  // the result never aliases an input
  Tensor single = cat({a}, 1);
  single.fill_(7);
  EXPECT_TRUE(all_close(a, {0, 1, 2, 3, 4, 5}, 0, 0));
}

// Contiguous inputs of the output's dtype are copied a whole output row at a time, across
// threads for many rows; views that start inside their storage are read from their start.
TEST(Cat, ContiguousRowsAcrossThreads) {
  Generator g(4);
  Tensor big = rand({3001, 40}, {}, &g);
  Tensor a = big.narrow(0, 1, 3000), b = rand({3000, 3}, {}, &g), c = rand({3000, 21}, {}, &g);
  ASSERT_TRUE(a.is_contiguous());
  const std::vector<double> av = values(a), bv = values(b), cv = values(c), got = values(cat({a, b, c}, 1));
  ASSERT_EQ(got.size(), static_cast<size_t>(3000 * 64));
  for (int64_t r = 0; r < 3000; ++r)
    for (int64_t j = 0; j < 64; ++j) {
      const double want = j < 40 ? av[r * 40 + j] : j < 43 ? bv[r * 3 + j - 40] : cv[r * 21 + j - 43];
      ASSERT_EQ(got[r * 64 + j], want) << r << ", " << j;
    }
  Tensor masks = cat({a > 0.5, b > 0.5}, 1);
  EXPECT_EQ(masks.dtype(), kBool);
  EXPECT_TRUE(equal(masks, cat({(a > 0.5).to(kFloat32), (b > 0.5).to(kFloat32)}, 1).to(kBool)));
}

TEST(Stack, MatchesReference) {
  Generator g(2);
  for (const Shape& s : {Shape{}, Shape{4}, Shape{3, 2}, Shape{0, 2}})
    for (int64_t dim = -static_cast<int64_t>(s.size()) - 1; dim <= static_cast<int64_t>(s.size()); ++dim)
      for (Layout l : kLayouts) {
        std::vector<Tensor> parts;
        for (int i = 0; i < 3; ++i) parts.push_back(with_layout(random_values(s, kFloat32, g), l));
        Tensor out = stack(parts, dim);
        const int64_t d = dim < 0 ? dim + static_cast<int64_t>(s.size()) + 1 : dim;
        Shape want_shape = s;
        want_shape.insert(want_shape.begin() + d, 3);
        ASSERT_EQ(out.shape(), want_shape);
        std::vector<double> want(static_cast<size_t>(numel_of(want_shape)));
        for (int64_t i = 0; i < 3; ++i) {
          std::vector<double> pv = values(parts[i]);
          for (int64_t j = 0; j < parts[i].numel(); ++j) {
            auto idx = unravel(j, s);
            idx.insert(idx.begin() + d, i);
            want[ravel(idx, want_shape)] = pv[j];
          }
        }
        ASSERT_TRUE(all_close(out, want, 0, 0)) << fmt::format("{} dim {}", s, dim);
      }
}

TEST(Split, ViewsOfTheRightSizes) {
  Tensor x = arange(30, kFloat32).view({3, 10});
  auto check = [&](const std::vector<Tensor>& parts, const std::vector<int64_t>& sizes, int64_t d) {
    ASSERT_EQ(parts.size(), sizes.size());
    std::vector<double> xv = values(x);
    int64_t start = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      Shape want_shape = x.shape();
      want_shape[d] = sizes[i];
      ASSERT_EQ(parts[i].shape(), want_shape) << i;
      EXPECT_EQ(parts[i].storage(), x.storage());  // a view, not a copy
      std::vector<double> want;
      for (int64_t j = 0; j < numel_of(want_shape); ++j) {
        auto idx = unravel(j, want_shape);
        idx[d] += start;
        want.push_back(xv[ravel(idx, x.shape())]);
      }
      EXPECT_TRUE(all_close(parts[i], want, 0, 0)) << i;
      start += sizes[i];
    }
  };
  check(split(x, 4, 1), {4, 4, 2}, 1);
  check(split(x, 4, -1), {4, 4, 2}, 1);
  check(split(x, 10, 1), {10}, 1);
  check(split(x, 100, 1), {10}, 1);
  check(split(x, 1, 0), {1, 1, 1}, 0);
  check(split(x, std::vector<int64_t>{3, 0, 7}, 1), {3, 0, 7}, 1);
  check(split_with_sizes(x, {2, 1}, -2), {2, 1}, 0);
  check(chunk(x, 3, 1), {4, 4, 2}, 1);
  check(chunk(x, 4, 1), {3, 3, 3, 1}, 1);
  check(chunk(x, 6, 1), {2, 2, 2, 2, 2}, 1);  // fewer than asked, as in PyTorch
  check(chunk(x, 20, 1), std::vector<int64_t>(10, 1), 1);
  check(chunk(x, 1, 0), {3}, 0);
  // writes through a view reach the original
  split(x, 5, 1)[1].fill_(-1);
  EXPECT_EQ(values(x)[5], -1);
  EXPECT_EQ(values(x)[4], 4);
  // a zero-size dim
  Tensor e = zeros({0, 4});
  EXPECT_EQ(split(e, 2, 0).size(), 1u);
  EXPECT_EQ(split(e, 0, 0).size(), 1u);
  EXPECT_EQ(chunk(e, 3, 0).size(), 3u);
  EXPECT_EQ(chunk(e, 3, 0)[2].shape(), (Shape{0, 4}));
  EXPECT_EQ(chunk(e, 3, 1).size(), 2u);
}

TEST(JoinErrors, BadInput) {
  Tensor a = zeros({2, 3}), b = zeros({2, 4}), c = zeros({2, 3, 1});
  EXPECT_THROW(cat({}, 0), Error);
  EXPECT_THROW(cat({a, b}, 0), Error);     // mismatch outside dim
  EXPECT_THROW(cat({a, c}, 0), Error);     // different ranks
  EXPECT_THROW(cat({a, a}, 2), Error);     // bad dim
  EXPECT_THROW(cat({a, a}, -3), Error);
  EXPECT_THROW(cat({full({}, 1.0), full({}, 2.0)}, 0), Error);  // 0-d
  EXPECT_THROW(cat({a, Tensor()}, 0), Error);
  EXPECT_THROW(stack({}, 0), Error);
  EXPECT_THROW(stack({a, b}, 0), Error);
  EXPECT_THROW(stack({a, a}, 3), Error);
  EXPECT_THROW(stack({a, a}, -4), Error);
  EXPECT_THROW(split(b, std::vector<int64_t>{1, 2}, 1), Error);  // sums to 3, not 4
  EXPECT_THROW(split(b, std::vector<int64_t>{3, 2}, 1), Error);  // sums to 5
  EXPECT_THROW(split(b, std::vector<int64_t>{5, -1}, 1), Error);  // negative size
  EXPECT_THROW(split(b, -1, 1), Error);
  EXPECT_THROW(split(b, 0, 1), Error);                            // 0 only for an empty dim
  EXPECT_THROW(split(b, 2, 2), Error);
  EXPECT_THROW(split(full({}, 1.0), 1, 0), Error);
  EXPECT_THROW(chunk(b, 0, 1), Error);
  EXPECT_THROW(chunk(b, -2, 1), Error);
  EXPECT_THROW(chunk(b, 2, -3), Error);
  EXPECT_THROW(chunk(full({}, 1.0), 1, 0), Error);
}

TEST(Sort, MatchesStableReference) {
  Generator g(3);
  // slices of 700 take the radix sort (kernels/cpu/sort.h), shorter ones std::sort
  for (const Shape& s : {Shape{9}, Shape{4, 7}, Shape{3, 4, 5}, Shape{3, 0}, Shape{}, Shape{2, 300}, Shape{2, 700}})
    for (DType t : {kFloat32, kFloat64, kBFloat16, kInt64, kInt32, kUInt8, kBool}) {
      const int64_t nd = std::max<int64_t>(static_cast<int64_t>(s.size()), 1);
      for (int64_t dim = -nd; dim < nd; ++dim)
        for (Layout l : kLayouts)
          for (bool descending : {false, true}) {
            Tensor x = with_layout(random_values(s, t, g), l);
            SCOPED_TRACE(fmt::format("{} {} dim {} {} {}", s, t, dim, strata::testing::layout_name(l),
                                     descending ? "descending" : "ascending"));
            auto [v, i] = sort(x, dim, descending);
            ASSERT_EQ(v.shape(), s);
            ASSERT_EQ(i.shape(), s);
            ASSERT_EQ(v.dtype(), t);
            ASSERT_EQ(i.dtype(), kInt64);
            Shape s1 = s.empty() ? Shape{1} : s;
            const int64_t d = dim < 0 ? dim + nd : dim;
            std::vector<double> want_v, want_i;
            reference_order(values(x), s1, d, s1[d], descending, want_v, want_i);
            ASSERT_TRUE(all_close(v, want_v, 0, 0));
            ASSERT_TRUE(all_close(i, want_i, 0, 0));
            ASSERT_TRUE(all_close(argsort(x, dim, descending), want_i, 0, 0));
          }
    }
}

TEST(Sort, NaNOrdersAboveEverything) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (DType t : {kFloat32, kFloat64, kFloat16}) {
    Tensor x = from_vector<double>({3, nan, -inf, 1, nan, inf, 1}).to(t);
    auto [v, i] = sort(x);
    EXPECT_TRUE(all_close(v, {-inf, 1, 1, 3, inf, nan, nan}, 0, 0)) << fmt::format("{}", t);
    EXPECT_TRUE(all_close(i, {2, 3, 6, 0, 5, 1, 4}, 0, 0)) << fmt::format("{}", t);
    auto [vd, id] = sort(x, 0, true);
    EXPECT_TRUE(all_close(vd, {nan, nan, inf, 3, 1, 1, -inf}, 0, 0)) << fmt::format("{}", t);
    EXPECT_TRUE(all_close(id, {1, 4, 5, 0, 3, 6, 2}, 0, 0)) << fmt::format("{}", t);
    auto [tv, ti] = topk(x, 3);
    EXPECT_TRUE(all_close(tv, {nan, nan, inf}, 0, 0)) << fmt::format("{}", t);
    EXPECT_TRUE(all_close(ti, {1, 4, 5}, 0, 0)) << fmt::format("{}", t);
    auto [sv, si] = topk(x, 2, 0, false);
    EXPECT_TRUE(all_close(sv, {-inf, 1}, 0, 0)) << fmt::format("{}", t);
    EXPECT_TRUE(all_close(si, {2, 3}, 0, 0)) << fmt::format("{}", t);
  }
}

// NaN, infinities and both zeros in slices long enough for the radix sort, and in a topk: the
// reference order, and every value written back bit for bit (the sign of each zero too).
TEST(Sort, LongSlicesWithNaNAndSignedZeros) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  std::vector<double> pattern = {3, nan, -inf, 1, nan, inf, 1, -0.0, 0.0, -2, 0.0, -0.0}, xs;
  for (int r = 0; r < 60; ++r) xs.insert(xs.end(), pattern.begin(), pattern.end());
  const Shape s{static_cast<int64_t>(xs.size())};
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16})
    for (bool descending : {false, true})
      for (int64_t k : {int64_t(5), int64_t(100), s[0]}) {
        SCOPED_TRACE(fmt::format("{} k {} {}", t, k, descending ? "descending" : "ascending"));
        Tensor x = from_vector<double>(xs).to(t);
        auto [v, i] = k == s[0] ? sort(x, 0, descending) : topk(x, k, 0, descending);
        std::vector<double> want_v, want_i;
        reference_order(xs, s, 0, k, descending, want_v, want_i);
        std::vector<double> got_v = values(v), got_i = values(i);
        for (int64_t j = 0; j < k; ++j) {
          ASSERT_EQ(got_i[j], want_i[j]) << j;
          ASSERT_EQ(std::isnan(got_v[j]), std::isnan(want_v[j])) << j;
          if (!std::isnan(want_v[j])) {
            ASSERT_EQ(got_v[j], want_v[j]) << j;
            ASSERT_EQ(std::signbit(got_v[j]), std::signbit(want_v[j])) << j;
          }
        }
      }
}

TEST(Topk, MatchesReferenceAndBreaksTiesByPosition) {
  Generator g(4);
  for (const Shape& s : {Shape{9}, Shape{4, 7}, Shape{3, 4, 5}, Shape{0, 3}, Shape{3, 200}})
    for (DType t : {kFloat32, kFloat64, kInt64, kInt32, kBFloat16}) {
      const int64_t nd = static_cast<int64_t>(s.size());
      for (int64_t dim = -nd; dim < nd; ++dim) {
        const int64_t d = dim < 0 ? dim + nd : dim;
        for (int64_t k : {int64_t(0), int64_t(1), s[d] / 2, s[d]})
          for (bool largest : {true, false})
            for (Layout l : kLayouts) {
              if (k > s[d]) continue;
              Tensor x = with_layout(random_values(s, t, g), l);
              SCOPED_TRACE(fmt::format("{} {} dim {} k {} {} {}", s, t, dim, k, largest ? "largest" : "smallest",
                                       strata::testing::layout_name(l)));
              auto [v, i] = topk(x, k, dim, largest);
              Shape want_shape = s;
              want_shape[d] = k;
              ASSERT_EQ(v.shape(), want_shape);
              ASSERT_EQ(i.dtype(), kInt64);
              std::vector<double> want_v, want_i;
              reference_order(values(x), s, d, k, largest, want_v, want_i);
              ASSERT_TRUE(all_close(v, want_v, 0, 0));
              ASSERT_TRUE(all_close(i, want_i, 0, 0));
            }
      }
    }
  auto [v, i] = topk(from_vector<float>({1, 3, 3, 2, 3}), 2);
  EXPECT_TRUE(all_close(v, {3, 3}, 0, 0));
  EXPECT_TRUE(all_close(i, {1, 2}, 0, 0));
}

TEST(SortErrors, BadInput) {
  Tensor x = zeros({3, 4});
  EXPECT_THROW(topk(x, 5), Error);
  EXPECT_THROW(topk(x, -1), Error);
  EXPECT_THROW(topk(x, 4, 0), Error);
  EXPECT_THROW(topk(x, 1, 2), Error);
  EXPECT_THROW(sort(x, 2), Error);
  EXPECT_THROW(sort(x, -3), Error);
  EXPECT_THROW(argsort(Tensor()), Error);
  EXPECT_NO_THROW(topk(x, 3, 0));
}

TEST(Compare, IsCloseAllCloseEqual) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  Tensor a = from_vector<double>({1, 2, nan, inf, -inf, 1e10, 0});
  Tensor b = from_vector<double>({1 + 1e-6, 2.1, nan, inf, inf, 1e10 + 1, 1e-9});
  EXPECT_TRUE(all_close(isclose(a, b), {1, 0, 0, 1, 0, 1, 1}, 0, 0));
  EXPECT_TRUE(all_close(isclose(a, b, 1e-5, 1e-8, true), {1, 0, 1, 1, 0, 1, 1}, 0, 0));
  EXPECT_TRUE(all_close(isclose(a, b, 0, 0), {0, 0, 0, 1, 0, 0, 0}, 0, 0));
  EXPECT_TRUE(all_close(isclose(a, b, 0.1, 0), {1, 1, 0, 1, 0, 1, 0}, 0, 0));
  EXPECT_FALSE(allclose(a, b));
  Tensor x = arange(12, kFloat32).view({3, 4});
  Tensor y = with_layout(x.to(kFloat64) * (1 + 2e-6), Layout::Transposed);
  EXPECT_TRUE(allclose(x, y));
  EXPECT_FALSE(allclose(x, y, 0, 0));
  EXPECT_TRUE(allclose(x.slice(0, 0, 1), x.slice(0, 0, 1).expand({3, 4}).contiguous()));  // broadcasting
  EXPECT_FALSE(allclose(x.slice(0, 0, 1), x));
  EXPECT_TRUE(allclose(x.slice(1, 1, 2), from_vector<float>({1, 5, 9}, Shape{3, 1})));
  EXPECT_TRUE(allclose(zeros({0, 3}), zeros({3})));
  EXPECT_TRUE(allclose(from_vector<int64_t>({5, 7}), from_vector<double>({5, 7})));
  EXPECT_THROW(allclose(x, zeros({4, 3})), Error);  // shapes that do not broadcast
  EXPECT_THROW(isclose(x, x, -1.0), Error);
  EXPECT_THROW(isclose(x, Tensor()), Error);

  EXPECT_TRUE(equal(x, with_layout(x, Layout::Sliced)));
  EXPECT_TRUE(equal(x, x.to(kInt64)));
  EXPECT_FALSE(equal(x, x.view({4, 3})));  // same values, other shape
  EXPECT_FALSE(equal(x, x + 1e-3));
  EXPECT_FALSE(equal(from_vector<double>({nan}), from_vector<double>({nan})));
  EXPECT_TRUE(equal(zeros({0, 2}), zeros({0, 2})));
  EXPECT_FALSE(equal(zeros({0, 2}), zeros({2, 0})));
  EXPECT_THROW(equal(x, Tensor()), Error);
}
