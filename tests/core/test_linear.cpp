// The linear op (x W^T + b, and linear_gelu) on the CPU: forward against a float64 reference
// for every dtype, 1-d to 4-d inputs, transposed and sliced operands, zero-size dims, with and
// without bias; finite-difference gradient checks in float64 (first and second order); the
// two-op path of linear_gelu under autograd; nn::functional::linear going through the op; bad
// input.
#include <cmath>

#include "gradcheck.h"

using namespace strata;
using strata::testing::gradcheck;
using strata::testing::gradgradcheck;
using strata::testing::Layout;
using strata::testing::leaf;
using strata::testing::values;
using strata::testing::with_layout;

namespace {

double gelu_tanh_ref(double v) { return 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v))); }

// y[r, o] = gelu?(sum_i x[r, i] w[o, i] + b[o]) over x's rows (all leading dims), in float64,
// with the sum of |terms| per element to scale rounding tolerances.
struct Ref {
  std::vector<double> value, bound;
};
Ref reference(const Tensor& x, const Tensor& w, const Tensor& b, bool gelu) {
  const std::vector<double> vx = values(x), vw = values(w), vb = b.defined() ? values(b) : std::vector<double>();
  const int64_t in = w.size(1), out = w.size(0);
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  Ref r;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = vb.empty() ? 0 : vb[o], t = std::fabs(s);
      for (int64_t p = 0; p < in; ++p) {
        s += vx[i * in + p] * vw[o * in + p];
        t += std::fabs(vx[i * in + p] * vw[o * in + p]);
      }
      r.value.push_back(gelu ? gelu_tanh_ref(s) : s);
      r.bound.push_back(t + 1);  // + 1: GELU's own rounding, and the output's
    }
  return r;
}

double tolerance(DType t, int64_t k) {
  const double kk = static_cast<double>(std::max<int64_t>(k, 1));
  switch (t) {
    case kFloat64: return 4 * kk * 1.1e-16;
    case kFloat32: return 4 * kk * 6e-8 + 1e-6;
    case kFloat16: return 2 * (kk * 6e-8 + 4.9e-4) + 1e-3;
    case kBFloat16: return 2 * (kk * 6e-8 + 3.9e-3) + 8e-3;
    default: return 0;
  }
}

::testing::AssertionResult matches(const Tensor& got, const Ref& want, DType t, int64_t k) {
  if (got.dtype() != t) return ::testing::AssertionFailure() << "dtype " << dtype_name(got.dtype());
  std::vector<double> g = values(got);
  if (g.size() != want.value.size()) return ::testing::AssertionFailure() << "size " << g.size();
  const double tol = tolerance(t, k);
  for (size_t i = 0; i < g.size(); ++i)
    if (!(std::fabs(g[i] - want.value[i]) <= tol * want.bound[i]))
      return ::testing::AssertionFailure() << "element " << i << ": got " << g[i] << ", want " << want.value[i];
  return ::testing::AssertionSuccess();
}

Tensor random(const Shape& shape, DType t, Generator& g) {
  if (is_integral(t)) return randint(-3, 4, shape, TensorOptions(t), &g);
  Tensor x = empty(shape, kFloat64);
  uniform_(x, -1, 1, &g);
  return x.to(t);
}

struct Case {
  Shape x;
  int64_t out;
};
const std::vector<Case> kCases = {{{1}, 1},       {{7}, 5},          {{3, 7}, 1},    {{33, 7}, 33},
                                  {{5, 33}, 129}, {{2, 3, 40}, 17},  {{2, 1, 3, 9}, 4}, {{0, 5}, 3},
                                  {{4, 0}, 3},    {{2, 0, 6}, 5},    {{3, 6}, 0}};

}  // namespace

TEST(Linear, MatchesFloat64ReferenceForEveryDtypeAndLayout) {
  Generator g(17);
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64}) {
    for (const Case& c : kCases) {
      const int64_t in = c.x.back();
      Tensor x0 = random(c.x, t, g), w0 = random({c.out, in}, t, g), b0 = random({c.out}, t, g);
      for (bool bias : {true, false})
        for (Layout lx : {Layout::Contiguous, Layout::Transposed, Layout::Sliced})
          for (Layout lw : {Layout::Contiguous, Layout::Transposed, Layout::Sliced}) {
            SCOPED_TRACE(fmt::format("{} x {} out {} bias {} ({}, {})", t, c.x, c.out, bias,
                                     strata::testing::layout_name(lx), strata::testing::layout_name(lw)));
            Tensor x = with_layout(x0, lx), w = with_layout(w0, lw), b = bias ? b0 : Tensor();
            Shape want_shape = c.x;
            want_shape.back() = c.out;
            Tensor y = linear(x, w, b);
            ASSERT_EQ(y.shape(), want_shape);
            ASSERT_TRUE(matches(y, reference(x0, w0, b, false), t, in));
            if (is_floating(t)) ASSERT_TRUE(matches(linear_gelu(x, w, b), reference(x0, w0, b, true), t, in));
          }
    }
  }
}

TEST(Linear, PromotesDtypesAndMatchesFunctional) {
  Generator g(19);
  Tensor x = random({4, 6}, kFloat16, g), w = random({3, 6}, kFloat32, g), b = random({3}, kFloat64, g);
  Tensor y = linear(x, w, b);
  EXPECT_EQ(y.dtype(), kFloat64);
  EXPECT_TRUE(matches(y, reference(x, w, b, false), kFloat64, 6));
  // nn::functional::linear and nn::Linear run the same op
  Tensor xf = random({2, 5, 6}, kFloat32, g), wf = random({3, 6}, kFloat32, g), bf = random({3}, kFloat32, g);
  EXPECT_EQ(values(nn::functional::linear(xf, wf, bf)), values(linear(xf, wf, bf)));
  // a zero inner dim leaves only the bias
  EXPECT_EQ(values(linear(ones({2, 0}), ones({3, 0}), full({3}, 2.0))), std::vector<double>(6, 2));
}

TEST(GradCheck, Linear) {
  Generator g(23);
  const std::vector<Case> cases = {{{4}, 3}, {{3, 4}, 5}, {{2, 3, 4}, 2}, {{2, 1, 3, 4}, 3}, {{1, 1}, 1}};
  for (const Case& c : cases) {
    const int64_t in = c.x.back();
    for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Sliced}) {
      SCOPED_TRACE(fmt::format("x {} out {} {}", c.x, c.out, strata::testing::layout_name(l)));
      std::vector<Tensor> in3 = {leaf(randn(c.x, kFloat64, &g), l), leaf(randn({c.out, in}, kFloat64, &g), l),
                                 leaf(randn({c.out}, kFloat64, &g))};
      auto f3 = [](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); };
      EXPECT_TRUE(gradcheck(f3, in3));
      std::vector<Tensor> in2 = {in3[0], in3[1]};
      auto f2 = [](const std::vector<Tensor>& v) { return linear(v[0], v[1]); };
      EXPECT_TRUE(gradcheck(f2, in2));
      auto fg = [](const std::vector<Tensor>& v) { return linear_gelu(v[0], v[1], v[2]); };
      EXPECT_TRUE(gradcheck(fg, in3));
      if (l == Layout::Contiguous) EXPECT_TRUE(gradgradcheck(f3, in3));
    }
  }
  // only the inputs that require grad get one
  Tensor x = randn({3, 4}, kFloat64, &g), w = randn({2, 4}, kFloat64, &g).requires_grad_(), b = randn({2}, kFloat64, &g);
  linear(x, w, b).sum().backward();
  EXPECT_TRUE(w.grad().defined());
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

// Empty sizes: no outputs (W has no rows) gives zero gradients of x's shape; no inputs gives an
// empty weight gradient and a bias gradient counting the rows; no rows gives zero gradients.
TEST(Linear, GradientsWithEmptySizes) {
  for (const auto& [x_shape, out] : std::vector<std::pair<Shape, int64_t>>{{{5, 3}, 0}, {{2, 4, 3}, 0}, {{3}, 0},
                                                                          {{5, 0}, 2}, {{0, 3}, 2}}) {
    SCOPED_TRACE(fmt::format("x {} out {}", x_shape, out));
    Tensor x = ones(x_shape).requires_grad_(), w = ones({out, x_shape.back()}).requires_grad_();
    Tensor b = ones({out}).requires_grad_();
    linear(x, w, b).sum().backward();
    EXPECT_EQ(x.grad().shape(), x_shape);
    EXPECT_EQ(w.grad().shape(), w.shape());
    EXPECT_EQ(b.grad().shape(), b.shape());
    for (const Tensor& grad : {x.grad(), w.grad()})  // g W and g^T x with ones: 0 when either has no elements
      for (double v : values(grad)) EXPECT_EQ(v, 0.0);
    int64_t rows = 1;
    for (size_t d = 0; d + 1 < x_shape.size(); ++d) rows *= x_shape[d];
    for (double v : values(b.grad())) EXPECT_EQ(v, static_cast<double>(rows));
  }
}

TEST(Linear, BadInput) {
  EXPECT_THROW(linear(ones({2, 3}), ones({4, 5})), Error);
  EXPECT_THROW(linear(ones({2, 3}), ones({4, 3}), ones({3})), Error);
  EXPECT_THROW(linear(ones({2, 3}), ones({12})), Error);
  EXPECT_THROW(linear(scalar_tensor(1.0), ones({1, 1})), Error);
  EXPECT_THROW(linear(ones({2, 3}, kBool), ones({4, 3}, kBool)), Error);
  EXPECT_THROW(linear_gelu(ones({2, 3}, kInt32), ones({4, 3}, kInt32)), Error);
  EXPECT_THROW(linear(Tensor(), ones({4, 3})), Error);
  try {
    linear(ones({2, 5}), ones({4, 3}));
    FAIL();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("[linear]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2, 5]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4, 3]"), std::string::npos) << msg;
  }
}
