// Reductions over dim sets (sum, mean, prod, amax, amin, var, std, logsumexp, norms): one table
// row per op, each checked against a float64 reference over shapes (0-d, 1-d, 3-d with
// every dim subset, 4-d, zero-size and size-1 dims, long rows that take the blocked paths),
// keepdim, layouts and dtypes; then max/min with indices, argmax/argmin, NaN, empty inputs,
// accumulation accuracy, thread-count independence and bad input. Softmax and the scans are
// in test_softmax.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>

#include <strata/core/threads.hpp>

#include "testing.h"

using namespace strata;
using strata::testing::Layout;
using strata::testing::values;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The elements each output folds, in C order of the reduced multi-index; outputs in C order.
std::vector<std::vector<double>> groups(const std::vector<double>& v, const Shape& shape,
                                        const std::vector<int64_t>& dims) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  std::vector<bool> red(nd, dims.empty());
  for (int64_t d : dims)
    if (nd > 0) red[(d + nd) % nd] = true;
  int64_t nout = 1;
  for (int64_t d = 0; d < nd; ++d)
    if (!red[d]) nout *= shape[d];
  std::vector<std::vector<double>> g(static_cast<size_t>(nout));
  std::vector<int64_t> idx(nd, 0);
  for (size_t i = 0; i < v.size(); ++i) {
    int64_t o = 0;
    for (int64_t d = 0; d < nd; ++d)
      if (!red[d]) o = o * shape[d] + idx[d];
    g[o].push_back(v[i]);
    for (int64_t d = nd; d-- > 0;) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return g;
}

Shape reduced(const Shape& shape, const std::vector<int64_t>& dims, bool keepdim) {
  Shape out;
  const int64_t nd = static_cast<int64_t>(shape.size());
  for (int64_t d = 0; d < nd; ++d) {
    bool r = dims.empty();
    for (int64_t k : dims) r = r || (k + nd) % std::max<int64_t>(nd, 1) == d;
    if (!r) out.push_back(shape[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

double ref_sum(const std::vector<double>& g) { return std::accumulate(g.begin(), g.end(), 0.0); }
double abs_sum(const std::vector<double>& g) {
  double s = 0;
  for (double x : g) s += std::fabs(x);
  return s;
}
double ref_mean(const std::vector<double>& g) { return ref_sum(g) / static_cast<double>(g.size()); }
double ref_prod(const std::vector<double>& g) {
  double p = 1;
  for (double x : g) p *= x;
  return p;
}
double ref_max(const std::vector<double>& g) { return *std::max_element(g.begin(), g.end()); }
double ref_min(const std::vector<double>& g) { return *std::min_element(g.begin(), g.end()); }
double ref_var(const std::vector<double>& g, double correction) {
  double m = ref_mean(g), s = 0;
  for (double x : g) s += (x - m) * (x - m);
  return s / std::max(0.0, static_cast<double>(g.size()) - correction);
}
double ref_lse(const std::vector<double>& g) {
  double m = g.empty() ? -kInf : ref_max(g), s = 0;
  if (std::isinf(m)) m = 0;
  for (double x : g) s += std::exp(x - m);
  return m + std::log(s);
}
double ref_pnorm(const std::vector<double>& g, double p) {
  if (p == kInf || p == -kInf) {
    double r = std::fabs(g[0]);
    for (double x : g) r = p > 0 ? std::max(r, std::fabs(x)) : std::min(r, std::fabs(x));
    return r;
  }
  double s = 0;
  for (double x : g) s += p == 0 ? (x != 0) : std::pow(std::fabs(x), p);
  return p == 0 ? s : std::pow(s, 1 / p);
}

using DimsOp = std::function<Tensor(const Tensor&, const std::vector<int64_t>&, bool)>;

struct ReduceCase {
  const char* name;
  DimsOp op;
  std::function<double(const std::vector<double>&)> ref;
  // magnitude the error is measured against: rounding errors scale with it
  std::function<double(const std::vector<double>&, double)> scale;
  bool ints;        // also runs on integer and bool inputs
  bool nonempty;    // needs at least one element per output
  double lo, hi;    // uniform input range; lo == hi means randn
};

double by_abs_sum(const std::vector<double>& g, double) { return abs_sum(g); }
double by_value(const std::vector<double>&, double want) { return std::fabs(want); }
double exact(const std::vector<double>&, double) { return 0; }

const std::vector<ReduceCase>& reduce_cases() {
  static const std::vector<ReduceCase> cases = {
      {"sum", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return sum(x, d, k); }, ref_sum,
       by_abs_sum, true, false, 0, 0},
      {"mean", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return mean(x, d, k); }, ref_mean,
       [](const std::vector<double>& g, double) { return abs_sum(g) / std::max<size_t>(g.size(), 1); }, false, false,
       0, 0},
      {"prod", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return prod(x, d, k); }, ref_prod,
       [](const std::vector<double>& g, double w) { return std::fabs(w) * (1 + g.size()); }, true, false, 0.9, 1.1},
      {"amax", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return amax(x, d, k); }, ref_max, exact,
       true, true, 0, 0},
      {"amin", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return amin(x, d, k); }, ref_min, exact,
       true, true, 0, 0},
      {"var", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return var(x, d, 1, k); },
       [](const std::vector<double>& g) { return ref_var(g, 1); }, by_value, false, false, 0, 0},
      {"var_population", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return var(x, d, 0, k); },
       [](const std::vector<double>& g) { return ref_var(g, 0); }, by_value, false, false, 0, 0},
      {"std", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return strata::std(x, d, 1, k); },
       [](const std::vector<double>& g) { return std::sqrt(ref_var(g, 1)); }, by_value, false, false, 0, 0},
      {"logsumexp", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return logsumexp(x, d, k); },
       ref_lse, [](const std::vector<double>&, double w) { return std::max(1.0, std::fabs(w)); }, false, false, -6,
       6},
      {"norm2", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return norm(x, 2, d, k); },
       [](const std::vector<double>& g) { return ref_pnorm(g, 2); }, by_value, false, false, 0, 0},
      {"norm_fro", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return norm(x, "fro", d, k); },
       [](const std::vector<double>& g) { return ref_pnorm(g, 2); }, by_value, false, false, 0, 0},
      {"norm1", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return norm(x, 1, d, k); },
       [](const std::vector<double>& g) { return ref_pnorm(g, 1); }, by_value, false, false, 0, 0},
      {"norm3", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return norm(x, 3, d, k); },
       [](const std::vector<double>& g) { return ref_pnorm(g, 3); }, by_value, false, false, 0, 0},
      {"norm0.5", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return norm(x, 0.5, d, k); },
       [](const std::vector<double>& g) { return ref_pnorm(g, 0.5); }, by_value, false, false, 0, 0},
      {"norm0", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return norm(x, 0, d, k); },
       [](const std::vector<double>& g) { return ref_pnorm(g, 0); }, by_value, false, false, -1, 1},
      {"norm_inf", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return norm(x, kInf, d, k); },
       [](const std::vector<double>& g) { return ref_pnorm(g, kInf); }, exact, false, true, 0, 0},
      {"norm_neg_inf", [](const Tensor& x, const std::vector<int64_t>& d, bool k) { return norm(x, -kInf, d, k); },
       [](const std::vector<double>& g) { return ref_pnorm(g, -kInf); }, exact, false, true, 0, 0},
  };
  return cases;
}

Tensor random_input(const Shape& shape, DType dtype, double lo, double hi, Generator& g) {
  if (dtype == kBool) return randint(0, 2, shape, TensorOptions(kInt64), &g).to(kBool);
  if (is_integral(dtype)) {
    int64_t l = lo == hi ? -20 : -1, h = lo == hi ? 21 : 2;
    if (dtype == kUInt8) l = 0;
    return randint(l, h, shape, TensorOptions(dtype), &g);
  }
  Tensor t = empty(shape, kFloat64);
  if (lo == hi) normal_(t, 0, 1, &g);
  else uniform_(t, lo, hi, &g);
  return t.to(dtype);
}

struct ShapeDims {
  Shape shape;
  std::vector<std::vector<int64_t>> dims;
  bool big = false;  // fewer dtypes and layouts
};

const std::vector<ShapeDims>& shape_cases() {
  static const std::vector<ShapeDims> cases = {
      {{}, {{}, {0}, {-1}}},
      {{1}, {{}, {0}}},
      {{37}, {{}, {0}, {-1}}},
      {{3, 4, 5}, {{}, {0}, {1}, {2}, {0, 1}, {0, 2}, {1, 2}, {0, 1, 2}, {-1}, {-3, -1}, {2, 0}}},
      {{2, 1, 3, 20}, {{}, {1}, {3}, {0, 3}, {1, 2}, {0, 2}, {-1, -2, -3}}},
      {{5, 33}, {{0}, {1}}},
      {{0, 3}, {{}, {0}, {1}}},
      {{4, 0, 2}, {{1}, {0, 2}, {2}}},
      {{3, 40000}, {{}, {0}, {1}}, true},     // inner rows past kReduceBlock
      {{20000, 6}, {{0}, {1}}, true},         // outer, few columns: blocked rows
      {{2, 1000, 300}, {{1}, {0, 1}}, true},  // outer, more columns than one chunk
  };
  return cases;
}

// Checks one op on one input: values (against the reference), shape and dtype.
::testing::AssertionResult check_reduce(const ReduceCase& c, const Tensor& x,
                                        const std::vector<std::vector<double>>& g, const std::vector<int64_t>& dims,
                                        bool keepdim, DType expect_dtype) {
  Tensor got = c.op(x, dims, keepdim);
  Shape want_shape = reduced(x.shape(), dims, keepdim);
  if (got.shape() != want_shape)
    return ::testing::AssertionFailure() << "shape " << fmt::format("{}", got.shape()) << " want "
                                         << fmt::format("{}", want_shape);
  if (got.dtype() != expect_dtype)
    return ::testing::AssertionFailure() << "dtype " << dtype_name(got.dtype()) << " want "
                                         << dtype_name(expect_dtype);
  std::vector<double> gv = values(got);
  const double rtol = strata::testing::rtol_for(expect_dtype);
  for (size_t i = 0; i < g.size(); ++i) {
    double want = c.ref(g[i]);
    double tol = rtol * c.scale(g[i], want) + 1e-300;
    bool same_special = (std::isnan(want) && std::isnan(gv[i])) || (std::isinf(want) && want == gv[i]);
    if (!same_special && !(std::fabs(gv[i] - want) <= tol))
      return ::testing::AssertionFailure() << "output " << i << ": got " << gv[i] << ", want " << want << " (tol "
                                           << tol << ")";
  }
  return ::testing::AssertionSuccess();
}

// The large shapes run for the ops whose loops differ, not for every norm variant.
bool big_ok(const std::string& name) {
  return name == "sum" || name == "mean" || name == "prod" || name == "amax" || name == "amin" || name == "var" ||
         name == "logsumexp" || name == "norm2";
}

const std::vector<DType> kFloatTypes = {kFloat32, kFloat64, kFloat16, kBFloat16};
const std::vector<DType> kIntTypes = {kInt64, kInt32, kInt8, kUInt8, kBool};
const std::vector<Layout> kLayouts = {Layout::Contiguous, Layout::Transposed, Layout::Sliced};

}  // namespace

TEST(Reduce, MatchesFloat64Reference) {
  Generator gen(7);
  for (const auto& c : reduce_cases()) {
    std::vector<DType> types = kFloatTypes;
    if (c.ints) types.insert(types.end(), kIntTypes.begin(), kIntTypes.end());
    for (const auto& sd : shape_cases()) {
      int64_t numel = checked_numel(sd.shape);
      for (DType t : types) {
        if (sd.big && (!big_ok(c.name) || (t != kFloat32 && t != kFloat16 && t != kInt32))) continue;
        Tensor base = random_input(sd.shape, t, c.lo, c.hi, gen);
        std::vector<double> xv = values(base);  // the reference sees the rounded inputs
        for (Layout l : kLayouts) {
          if (sd.big && l == Layout::Sliced) continue;
          Tensor x = strata::testing::with_layout(base, l);
          for (const auto& dims : sd.dims) {
            auto r = reduced(sd.shape, dims, false);
            bool empty_group = checked_numel(r) > 0 && numel == 0;
            bool empty_dim = false;
            for (int64_t d : dims)
              empty_dim = empty_dim || (!sd.shape.empty() && sd.shape[(d + sd.shape.size()) % sd.shape.size()] == 0);
            if (c.nonempty && (empty_group || empty_dim || (dims.empty() && numel == 0))) continue;
            bool to_int64 = std::string(c.name) == "sum" || std::string(c.name) == "prod";
            DType want = to_int64 && !is_floating(t) ? kInt64 : t;
            auto g = groups(xv, sd.shape, dims);
            for (bool keepdim : {false, true}) {
              EXPECT_TRUE(check_reduce(c, x, g, dims, keepdim, want))
                  << c.name << " " << dtype_name(t) << " " << strata::testing::layout_name(l) << " shape "
                  << fmt::format("{}", sd.shape) << " dims " << fmt::format("{}", dims) << " keepdim " << keepdim;
            }
          }
        }
      }
    }
  }
}

TEST(Reduce, ExpandedInput) {
  // stride-0 dims are reduced (and kept) without materialising them
  Tensor row = from_vector<double>({1, 2, 3});
  Tensor x = row.expand({4, 3});
  EXPECT_TRUE(strata::testing::all_close(sum(x, {0}), {4, 8, 12}, 0, 0));
  EXPECT_TRUE(strata::testing::all_close(sum(x, {1}), {6, 6, 6, 6}, 0, 0));
  EXPECT_TRUE(strata::testing::all_close(amax(x, {0}), {1, 2, 3}, 0, 0));
  EXPECT_EQ(sum(x).item<double>(), 24);
}

TEST(Reduce, MaxMinWithIndices) {
  Generator gen(3);
  const Shape shape = {4, 5, 6};
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kInt8, kUInt8, kBool}) {
    // few distinct values, so ties are common and the first index must win
    Tensor base = randint(0, t == kBool ? 2 : 4, shape, TensorOptions(kInt64), &gen).to(t);
    std::vector<double> xv = values(base);
    for (Layout l : kLayouts) {
      Tensor x = strata::testing::with_layout(base, l);
      for (int64_t dim = -3; dim < 3; ++dim) {
        auto g = groups(xv, shape, {dim});
        for (bool keepdim : {false, true}) {
          auto [vmax, imax] = max(x, dim, keepdim);
          auto [vmin, imin] = min(x, dim, keepdim);
          Tensor amx = argmax(x, dim, keepdim), amn = argmin(x, dim, keepdim);
          Shape want_shape = reduced(shape, {dim}, keepdim);
          ASSERT_EQ(vmax.shape(), want_shape);
          ASSERT_EQ(imin.shape(), want_shape);
          ASSERT_EQ(amx.shape(), want_shape);
          EXPECT_EQ(vmax.dtype(), t);
          EXPECT_EQ(imax.dtype(), kInt64);
          std::vector<double> wmax, wmin, wimax, wimin;
          for (const auto& v : g) {
            auto mx = std::max_element(v.begin(), v.end()), mn = std::min_element(v.begin(), v.end());
            wmax.push_back(*mx);
            wmin.push_back(*mn);
            wimax.push_back(static_cast<double>(mx - v.begin()));  // first occurrence
            wimin.push_back(static_cast<double>(mn - v.begin()));
          }
          std::string where = fmt::format("{} {} dim {}", dtype_name(t), strata::testing::layout_name(l), dim);
          EXPECT_EQ(values(vmax), wmax) << where;
          EXPECT_EQ(values(vmin), wmin) << where;
          EXPECT_EQ(values(imax), wimax) << where;
          EXPECT_EQ(values(imin), wimin) << where;
          EXPECT_EQ(values(amx), wimax) << where;
          EXPECT_EQ(values(amn), wimin) << where;
        }
      }
      // flattened: the index counts in C order whatever the layout
      auto fm = std::max_element(xv.begin(), xv.end()), fn = std::min_element(xv.begin(), xv.end());
      EXPECT_EQ(argmax(x).item<int64_t>(), fm - xv.begin());
      EXPECT_EQ(argmin(x).item<int64_t>(), fn - xv.begin());
      EXPECT_EQ(argmax(x).dim(), 0);
      // with keepdim the flat index sits in x.dim() dims of size 1, as in PyTorch
      EXPECT_EQ(argmin(x, std::nullopt, true).shape(), Shape(static_cast<size_t>(x.dim()), 1));
      EXPECT_EQ(argmin(x, std::nullopt, true).item<int64_t>(), fn - xv.begin());
      EXPECT_EQ(max(x).item<double>(), *fm);
      EXPECT_EQ(min(x).item<double>(), *fn);
    }
  }
  // long rows take the lane and blocked paths: the first maximum still wins
  Tensor big = zeros({50000});
  big.narrow(0, 30001, 1).fill_(5);
  big.narrow(0, 40003, 1).fill_(5);
  big.narrow(0, 17, 1).fill_(4);
  EXPECT_EQ(argmax(big).item<int64_t>(), 30001);
  EXPECT_EQ(values(argmax(big.view({2, 25000}), 1)), (std::vector<double>{17, 5001}));
  EXPECT_EQ(values(argmax(big.view({25000, 2}), 0)), (std::vector<double>{0, 15000}));
  // 0-d: the only element
  Tensor s = scalar_tensor(3.5);
  EXPECT_EQ(argmax(s).item<int64_t>(), 0);
  EXPECT_EQ(max(s, 0).values.item<double>(), 3.5);
  EXPECT_EQ(max(s, 0).indices.item<int64_t>(), 0);
}

TEST(Reduce, NaNPropagates) {
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    // row 0 has NaNs at 2 and 5, row 1 none; column 1 has a NaN in row 0 only
    std::vector<double> v(2 * 40, 1.0);
    v[2] = kNaN;
    v[5] = kNaN;
    v[40 + 7] = 9;
    Tensor base = from_vector<double>(v, Shape{2, 40}).to(t);
    for (Layout l : kLayouts) {
      Tensor x = strata::testing::with_layout(base, l);
      auto mx = values(amax(x, {1}));
      EXPECT_TRUE(std::isnan(mx[0]));
      EXPECT_EQ(mx[1], 9);
      EXPECT_TRUE(std::isnan(values(amin(x, {1}))[0]));
      EXPECT_EQ(values(argmax(x, 1)), (std::vector<double>{2, 7}));
      EXPECT_EQ(values(argmin(x, 1))[0], 2);
      EXPECT_EQ(values(max(x, 1).indices), (std::vector<double>{2, 7}));
      EXPECT_TRUE(std::isnan(values(max(x, 1).values)[0]));
      EXPECT_EQ(argmax(x).item<int64_t>(), 2);
      EXPECT_TRUE(std::isnan(max(x).item<double>()));
      EXPECT_TRUE(std::isnan(min(x).item<double>()));
      // along dim 0 (the outer path): column 2 and 5 are NaN, index 0
      auto cmax = values(amax(x, {0}));
      EXPECT_TRUE(std::isnan(cmax[2]) && std::isnan(cmax[5]));
      EXPECT_EQ(cmax[7], 9);
      auto ci = values(argmax(x, 0));
      EXPECT_EQ(ci[2], 0);
      EXPECT_EQ(ci[7], 1);
      EXPECT_TRUE(std::isnan(values(sum(x, {1}))[0]));
      EXPECT_TRUE(std::isnan(values(norm(x, kInf, {1}))[0]));
    }
  }
}

// Where the extreme is NaN its gradient is shared among the NaNs, not 0 / 0 everywhere.
TEST(Reduce, ExtremeGradientAtNaN) {
  for (bool is_max : {true, false}) {
    Tensor x = from_vector<double>({1, kNaN, 2, kNaN}).requires_grad_();
    Tensor y = is_max ? max(x) : min(x);
    EXPECT_EQ(values(autograd::grad({y}, {x}, {full({}, 4.0, kFloat64)})[0]), (std::vector<double>{0, 2, 0, 2}));
    Tensor rows = from_vector<double>({1, kNaN, 2, 3, 5, 5}, Shape{2, 3}).requires_grad_();
    Tensor r = is_max ? amax(rows, {1}) : amin(rows, {1});
    EXPECT_EQ(values(autograd::grad({r}, {rows}, {ones({2}, kFloat64)})[0]),
              (is_max ? std::vector<double>{0, 1, 0, 0, 0.5, 0.5} : std::vector<double>{0, 1, 0, 1, 0, 0}));
  }
}

// A norm takes |x|: -0.0 is +0, so odd negative powers of zeros give +inf, never inf - inf.
TEST(Reduce, NormsOfSignedZeros) {
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    const Tensor zeros2 = from_vector<double>({-0.0, 0.0}).to(t);
    EXPECT_EQ(norm(zeros2, -3.0).item<double>(), 0.0) << dtype_name(t);
    EXPECT_EQ(norm(from_vector<double>({-0.0, 2.0}).to(t), -1.0).item<double>(), 0.0);
    const double inf_norm = norm(from_vector<double>({-0.0, -0.0}).to(t), kInf).item<double>();
    EXPECT_EQ(inf_norm, 0.0);
    EXPECT_FALSE(std::signbit(inf_norm));
  }
}

// Long contiguous rows take a two-pass scan (Note [Extreme runs] in kernels/cpu/reduce.h):
// the extreme, then its first position. Rows with ties, NaNs (first at the start, in the
// middle, in the tail past the last full lane step, or everywhere), infinities and signed
// zeros, checked against a float64 scan, and against the transposed layout's lane path.
TEST(Reduce, LongRowsExtremesAndFirstIndices) {
  Generator gen(11);
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t cols : {64, 100, 1000, 1037}) {
    const int64_t rows = 9;
    std::vector<double> v = values(randint(-3, 4, {rows, cols}, TensorOptions(kInt64), &gen));
    auto at = [&](int64_t r, int64_t c) -> double& { return v[r * cols + c]; };
    at(1, 0) = kNaN;
    at(2, cols / 2) = kNaN;
    at(2, cols / 2 + 3) = kNaN;
    at(3, cols - 1) = kNaN;
    for (int64_t c = 0; c < cols; ++c) at(4, c) = kNaN;
    at(5, cols - 1) = 100;  // the maximum in the last, partial lane step
    at(5, 3) = -inf;
    for (int64_t c = 0; c < cols; ++c) at(6, c) = c % 2 ? 0.0 : -0.0;  // all equal: index 0
    at(7, 7) = inf;
    at(7, cols - 2) = inf;
    at(8, cols - 1) = -100;
    for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt8, kBool}) {
      const bool floating = is_floating(t);
      std::vector<double> w = v;
      for (double& x : w) {
        if (!floating && !std::isfinite(x)) x = 1;
        if (t == kBool) x = x > 0;
        if (t == kInt8) x = std::clamp(x, -100.0, 100.0);
      }
      Tensor base = from_vector<double>(w, Shape{rows, cols}).to(t);
      for (const bool transposed : {false, true}) {
        // the same values in a (cols, rows) tensor's transpose: strided rows, the lane path
        Tensor x = transposed ? base.t().contiguous().t() : base;
        auto [vmax, imax] = max(x, 1);
        auto [vmin, imin] = min(x, 1);
        const std::vector<double> gvmax = values(vmax), gimax = values(imax), gvmin = values(vmin),
                                  gimin = values(imin), gamax = values(amax(x, {1})), gamin = values(amin(x, {1})),
                                  gargmax = values(argmax(x, 1)), gargmin = values(argmin(x, 1));
        for (int64_t r = 0; r < rows; ++r) {
          // float64 reference: the first NaN wins; else the first extreme
          const std::vector<double> row = values(base[r].to(kFloat64));
          int64_t best_max = 0, best_min = 0;
          for (int64_t c = 1; c < cols; ++c) {
            const bool nan_max = std::isnan(row[best_max]), nan_min = std::isnan(row[best_min]);
            if (!nan_max && (std::isnan(row[c]) || row[c] > row[best_max])) best_max = c;
            if (!nan_min && (std::isnan(row[c]) || row[c] < row[best_min])) best_min = c;
          }
          const std::string where = fmt::format("{} cols {} row {}{}", dtype_name(t), cols, r,
                                                transposed ? " (strided)" : "");
          EXPECT_EQ(gimax[r], best_max) << where;
          EXPECT_EQ(gimin[r], best_min) << where;
          EXPECT_EQ(gargmax[r], best_max) << where;
          EXPECT_EQ(gargmin[r], best_min) << where;
          for (auto [got, want] : {std::pair{gvmax[r], row[best_max]}, {gamax[r], row[best_max]},
                                   {gvmin[r], row[best_min]}, {gamin[r], row[best_min]}}) {
            if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << where;
            else EXPECT_EQ(got, want) << where;
          }
        }
      }
    }
  }
}

// Sums over the leading dims with contiguous columns take 64, then 16, then single columns at
// a time down blocks of rows (Note [Float column sums]): every split of the columns, row counts
// on either side of a block, rows strided and rows from two dims.
TEST(Reduce, Float32ColumnSums) {
  Generator gen(5);
  auto check = [](const Tensor& x, const std::vector<int64_t>& dims, const std::string& what) {
    const std::vector<double> got = values(sum(x, dims));
    const auto g = groups(values(x), x.shape(), dims);
    ASSERT_EQ(got.size(), g.size()) << what;
    for (size_t c = 0; c < g.size(); ++c) {
      double want = 0, scale = 0;
      for (double v : g[c]) want += v, scale += std::fabs(v);
      ASSERT_NEAR(got[c], want, 1e-6 * scale + 1e-30) << what << " column " << c;
    }
  };
  for (int64_t cols : {1, 15, 16, 17, 64, 85, 300})
    for (int64_t rows : {1, 63, 64, 65, 200}) {
      Tensor x = randn({rows, cols}, {}, &gen);
      check(x, {0}, fmt::format("({}, {})", rows, cols));
      check(randn({rows, cols + 9}, {}, &gen).narrow(1, 4, cols), {0}, fmt::format("({}, {}) strided", rows, cols));
    }
  Tensor three = randn({7, 5, 85}, {}, &gen);
  check(three, {0, 1}, "(7, 5, 85) over two dims");
  check(three.permute({1, 0, 2}), {0, 1}, "permuted (5, 7, 85) over two dims");
  check(three.permute({1, 0, 2}).contiguous().permute({1, 0, 2}), {0, 1}, "(7, 5, 85) with swapped strides");
}

// A contiguous float32 row sums in registers, its tail as a zero-padded block and its lanes by
// halves (sum_float_run in kernels/cpu/reduce_runs.h): tail lengths around the lane count, rows
// across the float lane blocks, against float64, and bit for bit against the same row read with
// a stride, which folds lane by lane in memory in the same order.
TEST(Reduce, Float32RowSums) {
  Generator gen(9);
  for (int64_t m : {32, 33, 47, 63, 64, 65, 95, 96, 97, 127, 128, 129, 1000, 2048, 4095, 4096, 4097, 9000}) {
    Tensor x = randn({3, m}, {}, &gen);
    Tensor strided = randn({3, m, 2}, {}, &gen);
    strided.select(2, 0).copy_(x);
    const std::vector<double> got = values(sum(x, {1})), got_strided = values(sum(strided.select(2, 0), {1}));
    const auto g = groups(values(x), x.shape(), {1});
    for (size_t r = 0; r < g.size(); ++r) {
      double want = 0, scale = 0;
      for (double v : g[r]) want += v, scale += std::fabs(v);
      EXPECT_NEAR(got[r], want, 1e-6 * scale) << "row " << r << " of " << m;
      EXPECT_EQ(got[r], got_strided[r]) << "row " << r << " of " << m;
    }
    EXPECT_NEAR(values(mean(x, {1}))[0], got[0] / m, 1e-7 * std::fabs(got[0] / m) + 1e-12) << m;
  }
}

TEST(Reduce, EmptyInputs) {
  Tensor e = zeros({0, 3});
  EXPECT_EQ(sum(e).item<double>(), 0);
  EXPECT_EQ(prod(e).item<double>(), 1);
  EXPECT_TRUE(std::isnan(mean(e).item<double>()));
  EXPECT_TRUE(std::isnan(var(e).item<double>()));
  EXPECT_EQ(logsumexp(e, {}).item<double>(), -kInf);
  EXPECT_EQ(norm(e).item<double>(), 0);
  EXPECT_EQ(values(sum(e, {0})), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(values(prod(e, {0})), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(sum(e, {1}).shape(), (Shape{0}));
  EXPECT_EQ(sum(zeros({0}, kInt32)).dtype(), kInt64);
  // the reduced dim is non-empty: fine even though the result is empty
  EXPECT_EQ(amax(e, {1}).shape(), (Shape{0}));
  EXPECT_EQ(max(e, 1).indices.shape(), (Shape{0}));
  EXPECT_EQ(argmax(e, 1, true).shape(), (Shape{0, 1}));
  // no identity: an empty reduction is an error
  EXPECT_THROW(amax(e), Error);
  EXPECT_THROW(amin(e, {0}), Error);
  EXPECT_THROW(max(e), Error);
  EXPECT_THROW(min(e, 0), Error);
  EXPECT_THROW(argmax(e), Error);
  EXPECT_THROW(argmin(e, 0), Error);
  EXPECT_THROW(norm(e, kInf), Error);
}

TEST(Reduce, VarCorrection) {
  Tensor one = from_vector<double>({3});
  EXPECT_TRUE(std::isnan(var(one).item<double>()));  // 0 / 0
  EXPECT_EQ(var(one, {}, 0).item<double>(), 0);
  Tensor two = from_vector<double>({1, 3});
  EXPECT_EQ(var(two).item<double>(), 2);
  EXPECT_EQ(var(two, {}, 0).item<double>(), 1);
  EXPECT_EQ(var(two, {}, 2).item<double>(), kInf);   // 2 / 0
  EXPECT_EQ(var(two, {}, 5).item<double>(), kInf);   // divisor clamps at 0
  EXPECT_EQ(strata::std(two, {}, 0.5).item<double>(), std::sqrt(2 / 1.5));
  // a large offset does not swamp the variance (two passes)
  Tensor shifted = from_vector<float>({1e4f + 1, 1e4f + 2, 1e4f + 3, 1e4f + 4});
  EXPECT_NEAR(var(shifted).item<double>(), 5.0 / 3.0, 1e-6);
}

TEST(Reduce, LogSumExpStaysFinite) {
  for (DType t : {kFloat32, kFloat64, kBFloat16}) {
    Tensor x = from_vector<double>({1e4, 1e4, 1e4 - 1, -1e4}).to(t);
    double want = ref_lse(values(x));  // of the rounded inputs
    EXPECT_GT(want, 1e4 * 0.99);
    EXPECT_NEAR(logsumexp(x, {0}).item<double>(), want, want * strata::testing::rtol_for(t)) << dtype_name(t);
  }
  Tensor rows = from_vector<double>({-kInf, -kInf, 1, -kInf, kInf, 2}, Shape{3, 2});
  EXPECT_EQ(values(logsumexp(rows, {1})), (std::vector<double>{-kInf, 1, kInf}));
  // integer inputs compute in float32
  Tensor li = logsumexp(from_vector<int64_t>({1, 2, 3}), {0});
  EXPECT_EQ(li.dtype(), kFloat32);
  EXPECT_NEAR(li.item<double>(), std::log(std::exp(1) + std::exp(2) + std::exp(3)), 1e-5);
}

TEST(Reduce, DtypeRules) {
  Tensor i8 = from_vector<int8_t>({100, 100, 100});
  EXPECT_EQ(sum(i8).dtype(), kInt64);
  EXPECT_EQ(sum(i8).item<int64_t>(), 300);  // no int8 overflow
  EXPECT_EQ(prod(i8).item<int64_t>(), 1000000);
  EXPECT_EQ(sum(from_vector<bool>({true, true, false})).item<int64_t>(), 2);
  EXPECT_EQ(amax(from_vector<bool>({false, true})).dtype(), kBool);
  EXPECT_EQ(amax(i8).dtype(), kInt8);
  Tensor f = from_vector<float>({1.5f, 2.5f});
  EXPECT_EQ(sum(f, kFloat64).dtype(), kFloat64);
  EXPECT_EQ(sum(i8, kFloat32).dtype(), kFloat32);
  EXPECT_EQ(sum(f, {0}, false, kInt32).dtype(), kInt32);
  EXPECT_EQ(sum(f, kInt32).item<int64_t>(), 3);  // converted first: 1 + 2
  EXPECT_EQ(mean(i8, kFloat32).item<double>(), 100);
  EXPECT_EQ(mean(from_vector<double>({1, 2}), {0}, false, kFloat16).dtype(), kFloat16);
  EXPECT_EQ(mean(f).dtype(), kFloat32);
  EXPECT_THROW(mean(i8), Error);
  EXPECT_THROW(mean(i8, kInt64), Error);
  EXPECT_THROW(mean(from_vector<bool>({true})), Error);
  EXPECT_THROW(var(i8), Error);
  EXPECT_THROW(strata::std(i8), Error);
  EXPECT_THROW(norm(i8), Error);
}

TEST(Reduce, Float32SumsMatchFloat64) {
  // positive values: naive float32 accumulation of 4M of them is off by ~1e-3 relative
  Tensor x = rand({1 << 22});
  std::vector<double> xv = values(x);
  double want = ref_sum(xv);
  EXPECT_NEAR(sum(x).item<double>(), want, 1e-6 * want);
  EXPECT_NEAR(mean(x).item<double>(), want / xv.size(), 1e-6 * want / xv.size());
  // the bias-gradient shape: sum over the batch dim of (N, C)
  Tensor b = rand({1 << 16, 64});
  std::vector<double> got = values(sum(b, {0}));
  auto g = groups(values(b), b.shape(), {0});
  for (size_t c = 0; c < g.size(); ++c) EXPECT_NEAR(got[c], ref_sum(g[c]), 1e-6 * ref_sum(g[c]));
  // values that never cancel: runs of float additions stay short enough (Note [Float lanes])
  const double tenth = static_cast<double>(0.1f), n = 1e7;
  EXPECT_NEAR(sum(full({10000000}, 0.1)).item<double>(), n * tenth, 1e-6 * n * tenth);
  EXPECT_NEAR(mean(full({10000000}, 0.1)).item<double>(), tenth, 1e-6 * tenth);
  Tensor cols = full({300, 3}, 0.1);  // a strided reduction: sum over the rows
  for (double got : values(sum(cols, {0}))) EXPECT_NEAR(got, 300 * tenth, 1e-6 * 300 * tenth);
  // and half inputs accumulate in float, not in half
  Tensor h = full({1 << 14}, 1.0, kFloat16);
  EXPECT_EQ(sum(h).item<double>(), 1 << 14);  // float16 alone stops counting at 2048
}

TEST(Reduce, ThreadCountDoesNotChangeResults) {
  const std::vector<Tensor> inputs = {randn({1 << 20}), randn({3, 100000}), randn({100000, 7}),
                                      randn({64, 300, 40}).transpose(0, 2), randn({1 << 15, 64}).to(kFloat16)};
  auto run = [&](const Tensor& x) {
    std::vector<std::vector<double>> r;
    for (int64_t d = -1; d < x.dim(); ++d) {
      std::vector<int64_t> dims = d < 0 ? std::vector<int64_t>{} : std::vector<int64_t>{d};
      r.push_back(values(sum(x, dims)));
      r.push_back(values(mean(x, dims)));
      r.push_back(values(var(x, dims)));
      r.push_back(values(logsumexp(x, dims)));
      r.push_back(values(norm(x, 2, dims)));
      r.push_back(values(amax(x, dims)));
      if (d >= 0) r.push_back(values(argmax(x, d)));
    }
    return r;
  };
  for (const Tensor& x : inputs) {
    set_num_threads(1);
    auto one = run(x);
    set_num_threads(2);
    auto two = run(x);
    ASSERT_EQ(one.size(), two.size());
    for (size_t i = 0; i < one.size(); ++i) {
      ASSERT_EQ(one[i].size(), two[i].size());
      EXPECT_EQ(std::memcmp(one[i].data(), two[i].data(), one[i].size() * sizeof(double)), 0)
          << "result " << i << " for shape " << fmt::format("{}", x.shape());
    }
  }
}

TEST(Reduce, TensorMethods) {
  Tensor x = from_vector<double>({1, 5, 3, 4, 2, 6}, Shape{2, 3});
  EXPECT_EQ(x.sum().item<double>(), 21);
  EXPECT_EQ(values(x.sum({1})), (std::vector<double>{9, 12}));
  EXPECT_EQ(x.sum({0}, true).shape(), (Shape{1, 3}));
  EXPECT_EQ(x.mean().item<double>(), 3.5);
  EXPECT_EQ(values(x.mean({0})), (std::vector<double>{2.5, 3.5, 4.5}));
  EXPECT_EQ(x.mean({-1}, true).shape(), (Shape{2, 1}));
  EXPECT_EQ(x.max().item<double>(), 6);
  EXPECT_EQ(x.min().item<double>(), 1);
  EXPECT_EQ(x.argmax().item<int64_t>(), 5);
  EXPECT_EQ(x.argmin().item<int64_t>(), 0);
  EXPECT_EQ(values(x.argmax(1)), (std::vector<double>{1, 2}));
  EXPECT_EQ(values(x.argmin(0, true)), (std::vector<double>{0, 1, 0}));
  EXPECT_EQ(x.argmin(0, true).shape(), (Shape{1, 3}));
}

TEST(Reduce, BadInput) {
  Tensor x = ones({2, 3, 4});
  EXPECT_THROW(sum(x, {3}), Error);
  EXPECT_THROW(sum(x, {-4}), Error);
  EXPECT_THROW(sum(x, {1, 1}), Error);
  EXPECT_THROW(sum(x, {1, -2}), Error);  // the same dim twice
  EXPECT_THROW(mean(x, {0, 2, 0}), Error);
  EXPECT_THROW(amax(x, {5}), Error);
  EXPECT_THROW(var(x, {2, -1}), Error);
  EXPECT_THROW(var(x, {}, kNaN), Error);
  EXPECT_THROW(logsumexp(x, {7}), Error);
  EXPECT_THROW(norm(x, 2, {0, 0}), Error);
  EXPECT_THROW(norm(x, "nuc"), Error);
  EXPECT_THROW(norm(x, kNaN), Error);
  EXPECT_THROW(max(x, 3), Error);
  EXPECT_THROW(argmax(x, -4), Error);
  EXPECT_THROW(sum(Tensor()), Error);
  EXPECT_THROW(argmax(Tensor()), Error);
  EXPECT_THROW(sum(scalar_tensor(1.0), {1}), Error);
  // the kernels check what they are handed, too
  ReduceParams p;
  p.dims = {0};
  Tensor in = ones({3});
  for (Tensor out : {empty({}, kInt32), empty({2}), empty({1, 1})}) {
    EXPECT_THROW(run_kernel(OpId::sum, kFloat32, KernelCall{{&in, 1}, {&out, 1}, &p}), Error);
    EXPECT_THROW(run_kernel(OpId::var, kFloat32, KernelCall{{&in, 1}, {&out, 1}, &p}), Error);
  }
  Tensor i32 = empty({}, kInt32);
  EXPECT_THROW(run_kernel(OpId::amax, kFloat32, KernelCall{{&in, 1}, {&i32, 1}, &p}), Error);
  try {
    sum(x, {0, -3});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[sum]"), std::string::npos) << e.what();
  }
}
