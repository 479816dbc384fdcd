// Ops along one dim: softmax and log_softmax (against a float64 reference, rows summing to
// 1, agreement with exp(x - logsumexp), huge and infinite inputs), their fused gradients
// (against the float64 formula, and second-order gradients) and the scans cumsum and cumprod, over shapes, every dim, layouts and dtypes;
// thread-count independence; bad input.
#include <cmath>
#include <cstring>
#include <limits>

#include <strata/core/threads.hpp>

#include "gradcheck.h"
#include "testing.h"

using namespace strata;
using strata::testing::Layout;
using strata::testing::values;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Applies f to every 1-d line along `dim` of v (C order of `shape`), in place.
template <class F>
void along(std::vector<double>& v, const Shape& shape, int64_t dim, F f) {
  int64_t outer = 1, n = shape.empty() ? 1 : shape[dim], inner = 1;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (d < dim) outer *= shape[d];
    if (d > dim) inner *= shape[d];
  }
  std::vector<double> line(static_cast<size_t>(n));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      for (int64_t i = 0; i < n; ++i) line[i] = v[(o * n + i) * inner + j];
      f(line);
      for (int64_t i = 0; i < n; ++i) v[(o * n + i) * inner + j] = line[i];
    }
}

void ref_softmax(std::vector<double>& l, bool log) {
  double m = -kInf, s = 0;
  for (double x : l) m = std::max(m, x);
  for (double x : l) s += std::exp(x - m);
  for (double& x : l) x = log ? x - m - std::log(s) : std::exp(x - m) / s;
}

// {2, 5000}: float32 rows longer than a float lane block (Note [Float softmax rows])
const std::vector<Shape> kShapes = {{}, {1}, {9}, {100}, {3, 4, 5}, {2, 1, 3, 33}, {0, 4}, {3, 0}, {4, 300, 3}, {2, 5000}};
const std::vector<DType> kFloatTypes = {kFloat32, kFloat64, kFloat16, kBFloat16};
const std::vector<Layout> kLayouts = {Layout::Contiguous, Layout::Transposed, Layout::Sliced};

Tensor random_input(const Shape& shape, DType dtype, double scale, Generator& g) {
  if (!is_floating(dtype)) return randint(dtype == kUInt8 ? 0 : -3, 4, shape, TensorOptions(dtype), &g);
  Tensor t = empty(shape, kFloat64);
  normal_(t, 0, scale, &g);
  return t.to(dtype);
}

}  // namespace

TEST(Softmax, MatchesFloat64Reference) {
  Generator gen(11);
  for (const Shape& shape : kShapes)
    for (DType t : kFloatTypes) {
      Tensor base = random_input(shape, t, 3, gen);
      std::vector<double> xv = values(base);
      for (Layout l : kLayouts) {
        Tensor x = strata::testing::with_layout(base, l);
        int64_t nd = std::max<int64_t>(x.dim(), 1);
        for (int64_t dim = -nd; dim < nd; ++dim) {
          int64_t d = dim < 0 ? dim + nd : dim;
          for (bool log : {false, true}) {
            std::vector<double> want = xv;
            along(want, shape, d, [&](std::vector<double>& line) { ref_softmax(line, log); });
            Tensor got = log ? log_softmax(x, dim) : softmax(x, dim);
            EXPECT_EQ(got.shape(), shape);
            EXPECT_EQ(got.dtype(), t);
            double rtol = strata::testing::rtol_for(t);
            // log_softmax values are O(1..10): an absolute error of rtol * |x| scale
            EXPECT_TRUE(strata::testing::all_close(got, want, rtol, log ? 10 * rtol : rtol))
                << (log ? "log_softmax " : "softmax ") << dtype_name(t) << " " << strata::testing::layout_name(l)
                << " shape " << fmt::format("{}", shape) << " dim " << dim;
          }
        }
      }
    }
}

TEST(Softmax, RowsSumToOneAndMatchLogSumExp) {
  Tensor x = randn({6, 50, 7}) * 4;
  for (int64_t dim = 0; dim < 3; ++dim) {
    Tensor s = softmax(x, dim);
    std::vector<double> rows = values(sum(s, {dim}));
    for (double r : rows) EXPECT_NEAR(r, 1, 1e-6);
    Tensor ref = exp(x - logsumexp(x, {dim}, true));
    EXPECT_TRUE(strata::testing::all_close(s, values(ref), 1e-5, 1e-7)) << dim;
    EXPECT_TRUE(strata::testing::all_close(log_softmax(x, dim), values(x - logsumexp(x, {dim}, true)), 1e-5, 1e-5));
  }
}

TEST(Softmax, HugeAndInfiniteInputs) {
  for (DType t : {kFloat32, kFloat64, kBFloat16, kFloat16}) {
    double big = t == kFloat16 ? 6e4 : 1e4;
    Tensor x = from_vector<double>({big, big, 0, -big}).to(t);
    std::vector<double> s = values(softmax(x, 0));
    EXPECT_NEAR(s[0], 0.5, 1e-3);
    EXPECT_NEAR(s[1], 0.5, 1e-3);
    EXPECT_EQ(s[2], 0);
    std::vector<double> ls = values(log_softmax(x, 0));
    EXPECT_NEAR(ls[0], -std::log(2.0), 1e-2);
    EXPECT_TRUE(std::isfinite(ls[2]));
    // and along a dim that is not innermost (the column-block path)
    Tensor cols = x.unsqueeze(1).expand({4, 3}).contiguous();
    std::vector<double> sc = values(softmax(cols, 0));
    EXPECT_NEAR(sc[0], 0.5, 1e-3);
    EXPECT_NEAR(sc[3 + 2], 0.5, 1e-3);
    EXPECT_EQ(sc[6 + 1], 0);
    EXPECT_NEAR(values(log_softmax(cols, 0))[3], -std::log(2.0), 1e-2);
  }
  // -inf entries get probability 0; a row of only -inf is NaN (as in PyTorch)
  Tensor m = from_vector<double>({0, -kInf, 0, -kInf, -kInf, -kInf}, Shape{2, 3});
  std::vector<double> s = values(softmax(m, 1));
  EXPECT_EQ(s[0], 0.5);
  EXPECT_EQ(s[1], 0);
  EXPECT_TRUE(std::isnan(s[3]) && std::isnan(s[5]));
  EXPECT_EQ(values(log_softmax(m, 1))[1], -kInf);
  // the same along a non-innermost dim
  std::vector<double> c = values(softmax(m.t().contiguous(), 0));
  EXPECT_EQ(c[0], 0.5);
  EXPECT_TRUE(std::isnan(c[1]));
}

TEST(Softmax, Dtypes) {
  Tensor i = from_vector<int64_t>({1, 2, 3});
  EXPECT_THROW(softmax(i, 0), Error);
  EXPECT_THROW(log_softmax(i, 0), Error);
  Tensor f = softmax(i, 0, kFloat32);
  EXPECT_EQ(f.dtype(), kFloat32);
  EXPECT_NEAR(values(f)[2], std::exp(3) / (std::exp(1) + std::exp(2) + std::exp(3)), 1e-6);
  EXPECT_EQ(softmax(from_vector<float>({1, 2}), 0, kFloat64).dtype(), kFloat64);
  EXPECT_EQ(softmax(scalar_tensor(5.0), 0).item<double>(), 1);
  EXPECT_EQ(log_softmax(scalar_tensor(5.0), -1).item<double>(), 0);
}

TEST(Scan, MatchesFloat64Reference) {
  Generator gen(5);
  std::vector<DType> types = kFloatTypes;
  types.insert(types.end(), {kInt64, kInt32, kInt8, kUInt8, kBool});
  for (const Shape& shape : kShapes)
    for (DType t : types) {
      Tensor base = t == kBool ? randint(0, 2, shape, {}, &gen).to(kBool) : random_input(shape, t, 1, gen);
      if (t == kUInt8) base = randint(0, 4, shape, TensorOptions(kUInt8), &gen);
      std::vector<double> xv = values(base);
      for (Layout l : kLayouts) {
        Tensor x = strata::testing::with_layout(base, l);
        int64_t nd = std::max<int64_t>(x.dim(), 1);
        for (int64_t dim = -nd; dim < nd; ++dim) {
          int64_t d = dim < 0 ? dim + nd : dim;
          for (bool is_prod : {false, true}) {
            std::vector<double> want = xv;
            along(want, shape, d, [&](std::vector<double>& line) {
              double acc = is_prod ? 1 : 0;
              for (double& v : line) v = acc = is_prod ? acc * v : acc + v;
            });
            // keep products of many factors in range: compare the first few only
            Tensor got = is_prod ? cumprod(x, dim) : cumsum(x, dim);
            EXPECT_EQ(got.shape(), shape);
            EXPECT_EQ(got.dtype(), is_floating(t) ? t : kInt64);
            double rtol = is_floating(t) ? strata::testing::rtol_for(t) * (is_prod ? 40 : 4) : 0;
            std::vector<double> gv = values(got);
            for (size_t i = 0; i < want.size(); ++i) {
              double tol = rtol * (1 + std::fabs(want[i])) * (is_prod ? 1 : std::sqrt(double(xv.size())));
              if (std::fabs(want[i]) > 1e15) continue;  // past exact int64 / float range
              ASSERT_LE(std::fabs(gv[i] - want[i]), tol)
                  << (is_prod ? "cumprod " : "cumsum ") << dtype_name(t) << " " << strata::testing::layout_name(l)
                  << " shape " << fmt::format("{}", shape) << " dim " << dim << " element " << i;
            }
          }
        }
      }
    }
}

TEST(Scan, Dtypes) {
  Tensor i8 = from_vector<int8_t>({100, 100, 100});
  EXPECT_EQ(values(cumsum(i8, 0)), (std::vector<double>{100, 200, 300}));
  EXPECT_EQ(cumsum(i8, 0).dtype(), kInt64);
  EXPECT_EQ(cumsum(i8, 0, kInt32).dtype(), kInt32);
  EXPECT_EQ(cumsum(i8, 0, kFloat64).dtype(), kFloat64);
  EXPECT_EQ(values(cumprod(from_vector<int32_t>({2, 3, 4}), 0)), (std::vector<double>{2, 6, 24}));
  EXPECT_EQ(values(cumsum(from_vector<bool>({true, false, true}), 0)), (std::vector<double>{1, 1, 2}));
  // float32 runs accumulate in double: 2^24 + 1 is not lost
  Tensor big = full({3}, 1.0, kFloat32);
  big.narrow(0, 0, 1).fill_(16777216.0);
  EXPECT_EQ(values(cumsum(big, 0))[2], 16777218.0);
}

// The gradient of a prefix sum is a suffix sum of g, summed from the end: a huge first entry
// must not swallow the small ones after it, nor cancel against its negative.
TEST(Scan, GradientIsAnExactSuffixSum) {
  for (bool is_prod : {false, true}) {
    Tensor x = ones({2, 4}).requires_grad_();
    Tensor y = is_prod ? cumprod(x, 1) : cumsum(x, 1);
    Tensor g = from_vector<float>({3e7f, 1, 1, 1, 1e8f, -1e8f, 1, 0}).reshape({2, 4});
    Tensor dx = autograd::grad({y}, {x}, {g})[0];
    EXPECT_EQ(values(dx), (std::vector<double>{30000004, 3, 2, 1, 1, -1e8, 1, 0})) << (is_prod ? "cumprod" : "cumsum");
    Tensor col = ones({4}).requires_grad_();  // along dim 0 of a vector, and a 0-d input
    EXPECT_EQ(values(autograd::grad({cumsum(col, 0)}, {col}, {from_vector<float>({3e7f, 1, 1, 1})})[0]),
              (std::vector<double>{30000004, 3, 2, 1}));
    Tensor scalar = full({}, 2.0).requires_grad_();
    EXPECT_EQ(values(autograd::grad({is_prod ? cumprod(scalar, 0) : cumsum(scalar, 0)}, {scalar}, {full({}, 5.0)})[0]),
              (std::vector<double>{5}));
  }
}

TEST(Softmax, ThreadCountDoesNotChangeResults) {
  const std::vector<Tensor> inputs = {randn({64, 1000}), randn({5, 3000, 40}), randn({1 << 18}).to(kBFloat16)};
  for (const Tensor& x : inputs)
    for (int64_t dim = 0; dim < x.dim(); ++dim) {
      auto run = [&] {
        return std::vector<std::vector<double>>{values(softmax(x, dim)), values(log_softmax(x, dim)),
                                                values(cumsum(x, dim)), values(cumprod(x, dim))};
      };
      set_num_threads(1);
      auto one = run();
      set_num_threads(2);
      auto two = run();
      for (size_t i = 0; i < one.size(); ++i)
        EXPECT_EQ(std::memcmp(one[i].data(), two[i].data(), one[i].size() * sizeof(double)), 0)
            << "result " << i << " dim " << dim << " shape " << fmt::format("{}", x.shape());
    }
}

// The fused gradient kernels against dx = y (g - sum g y) and dx = g - exp(y) sum g, computed
// in float64 from the rounded y and g, along every dim (rows and columns) of each dtype.
TEST(Softmax, GradientMatchesFloat64Formula) {
  Generator gen(7);
  for (DType t : kFloatTypes)
    for (const Shape& shape : {Shape{3, 5, 7}, Shape{2, 300}, Shape{1}, Shape{4, 0}, Shape{2, 5000}})
      for (int64_t dim = 0; dim < static_cast<int64_t>(shape.size()); ++dim)
        for (bool log : {false, true}) {
          Tensor x = random_input(shape, t, 2.0, gen).requires_grad_();
          Tensor y = log ? log_softmax(x, dim) : softmax(x, dim);
          Tensor g = random_input(shape, t, 1.0, gen);
          Tensor dx = autograd::grad({y}, {x}, {g})[0];
          std::vector<double> yv = values(y.detach()), gv = values(g), want(yv.size());
          // the row totals, then the formula
          std::vector<double> total(yv.size());
          std::vector<double> idx(yv.size());
          for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<double>(i);
          along(idx, shape, dim, [&](std::vector<double>& line) {
            double sum = 0;
            for (double i : line) sum += log ? gv[size_t(i)] : gv[size_t(i)] * yv[size_t(i)];
            for (double i : line) total[size_t(i)] = sum;
          });
          for (size_t i = 0; i < want.size(); ++i)
            want[i] = log ? gv[i] - std::exp(yv[i]) * total[i] : yv[i] * (gv[i] - total[i]);
          const double tol = t == kFloat64 ? 1e-12 : t == kFloat32 ? 2e-6 : t == kFloat16 ? 4e-3 : 3e-2;
          EXPECT_TRUE(strata::testing::all_close(values(dx), want, tol, tol))
              << (log ? "log_softmax " : "softmax ") << dtype_name(t) << " shape " << fmt::format("{}", shape)
              << " dim " << dim;
        }
}

// Gradients through a graph of the backward (create_graph) still come out: the backward is
// then recorded from differentiable ops.
TEST(Softmax, SecondOrderGradients) {
  Generator gen(8);
  for (bool log : {false, true}) {
    Tensor x = random_input({3, 6}, kFloat64, 1.0, gen).requires_grad_();
    EXPECT_TRUE(strata::testing::gradgradcheck(
        [log](const std::vector<Tensor>& in) { return log ? log_softmax(in[0], 1) : softmax(in[0], 1); }, {x}));
  }
}

TEST(Softmax, BadInput) {
  Tensor x = ones({2, 3});
  EXPECT_THROW(softmax(x, 2), Error);
  EXPECT_THROW(log_softmax(x, -3), Error);
  EXPECT_THROW(cumsum(x, 2), Error);
  EXPECT_THROW(cumprod(x, -3), Error);
  EXPECT_THROW(softmax(Tensor(), 0), Error);
  EXPECT_THROW(cumsum(Tensor(), 0), Error);
  EXPECT_THROW(softmax(x, 0, kInt32), Error);
  EXPECT_THROW(softmax(scalar_tensor(1.0), 1), Error);
}
