// Finite-difference gradient checks (float64) for the elementwise, view and copy ops, on
// contiguous, transposed and sliced inputs and with broadcasting; second derivatives too.
#include "gradcheck.h"

using namespace strata;
using strata::testing::Fn;
using strata::testing::gradcheck;
using strata::testing::gradgradcheck;
using strata::testing::Layout;
using strata::testing::leaf;

namespace {

struct Case {
  const char* name;
  Fn f;
  std::vector<Shape> shapes;
  double lo = -2, hi = 2;  // input range
  bool second_order = true;
};

Tensor uniform_in(const Shape& s, double lo, double hi, Generator& g) {
  Tensor t = empty(s, kFloat64);
  uniform_(t, lo, hi, &g);
  return t;
}

const std::vector<Case>& cases() {
  using V = const std::vector<Tensor>&;
  static const std::vector<Case> c = {
      {"neg", [](V x) { return -x[0]; }, {{3, 4}}},
      {"abs", [](V x) { return abs(x[0]); }, {{3, 4}}, 0.1, 2},
      {"exp", [](V x) { return exp(x[0]); }, {{3, 4}}},
      {"log", [](V x) { return log(x[0]); }, {{3, 4}}, 0.5, 3},
      {"sqrt", [](V x) { return sqrt(x[0]); }, {{3, 4}}, 0.5, 3},
      {"rsqrt", [](V x) { return rsqrt(x[0]); }, {{3, 4}}, 0.5, 3},
      {"sin", [](V x) { return sin(x[0]); }, {{3, 4}}},
      {"cos", [](V x) { return cos(x[0]); }, {{3, 4}}},
      {"tanh", [](V x) { return tanh(x[0]); }, {{3, 4}}},
      {"sigmoid", [](V x) { return sigmoid(x[0]); }, {{3, 4}}},
      {"relu", [](V x) { return relu(x[0]); }, {{3, 4}}, 0.1, 2},
      {"relu_neg", [](V x) { return relu(x[0]); }, {{3, 4}}, -2, -0.1},
      {"gelu", [](V x) { return gelu(x[0]); }, {{3, 4}}},
      {"gelu_tanh", [](V x) { return gelu(x[0], "tanh"); }, {{3, 4}}},
      {"silu", [](V x) { return silu(x[0]); }, {{3, 4}}},
      {"erf", [](V x) { return erf(x[0]); }, {{3, 4}}},
      {"square", [](V x) { return square(x[0]); }, {{3, 4}}},
      {"reciprocal", [](V x) { return reciprocal(x[0]); }, {{3, 4}}, 0.5, 2},
      {"pow_scalar", [](V x) { return pow(x[0], 2.5); }, {{3, 4}}, 0.5, 2},
      {"pow_int", [](V x) { return pow(x[0], 3); }, {{3, 4}}},
      {"clamp", [](V x) { return clamp(x[0], -0.5, 0.7); }, {{3, 4}}},
      {"leaky_relu", [](V x) { return leaky_relu(x[0], 0.2); }, {{3, 4}}},
      {"log1p", [](V x) { return log1p(x[0]); }, {{3, 4}}, -0.5, 2},
      {"expm1", [](V x) { return expm1(x[0]); }, {{3, 4}}},
      {"floor", [](V x) { return floor(x[0]) + x[0]; }, {{3, 4}}, 0.2, 0.8},
      {"round", [](V x) { return round(x[0]) * x[0]; }, {{3, 4}}, 1.1, 1.4},
      {"tan", [](V x) { return tan(x[0]); }, {{3, 4}}, -1.2, 1.2},
      {"asin", [](V x) { return asin(x[0]); }, {{3, 4}}, -0.95, 0.95},
      {"acos", [](V x) { return acos(x[0]); }, {{3, 4}}, -0.95, 0.95},
      {"atan", [](V x) { return atan(x[0]); }, {{3, 4}}, -5, 5},
      {"sinh", [](V x) { return sinh(x[0]); }, {{3, 4}}, -4, 4},
      {"cosh", [](V x) { return cosh(x[0]); }, {{3, 4}}, -4, 4},
      {"asinh", [](V x) { return asinh(x[0]); }, {{3, 4}}, -5, 5},
      {"acosh", [](V x) { return acosh(x[0]); }, {{3, 4}}, 1.1, 10},
      {"atanh", [](V x) { return atanh(x[0]); }, {{3, 4}}, -0.9, 0.9},
      {"log2", [](V x) { return log2(x[0]); }, {{3, 4}}, 0.1, 10},
      {"log10", [](V x) { return log10(x[0]); }, {{3, 4}}, 0.1, 10},
      {"exp2", [](V x) { return exp2(x[0]); }, {{3, 4}}, -5, 5},
      {"remainder", [](V x) { return remainder(x[0] * 3, x[1] + 2); }, {{3, 4}, {3, 4}}, 0.2, 0.8},
      {"remainder_neg", [](V x) { return remainder(x[0] * 3, -(x[1] + 2)); }, {{3, 4}, {3, 4}}, 0.2, 0.8},
      {"fmod", [](V x) { return fmod(-(x[0] * 3), x[1] + 2); }, {{3, 4}, {4}}, 0.2, 0.8},
      {"atan2", [](V x) { return atan2(x[0], x[1] - 1); }, {{3, 4}, {3, 4}}, 0.2, 0.8},
      {"add", [](V x) { return x[0] + x[1]; }, {{3, 4}, {3, 4}}},
      {"add_broadcast", [](V x) { return add(x[0], x[1], 2.5); }, {{2, 3, 4}, {3, 1}}},
      {"sub", [](V x) { return x[0] - x[1]; }, {{3, 4}, {4}}},
      {"mul", [](V x) { return x[0] * x[1]; }, {{3, 4}, {3, 4}}},
      {"mul_broadcast", [](V x) { return x[0] * x[1]; }, {{3, 1}, {1, 4}}},
      {"div", [](V x) { return x[0] / x[1]; }, {{3, 4}, {4}}, 0.5, 2},
      {"maximum", [](V x) { return maximum(x[0], x[1]); }, {{3, 4}, {3, 4}}},
      {"minimum", [](V x) { return minimum(x[0], x[1]); }, {{3, 4}, {4}}},
      {"pow", [](V x) { return pow(x[0], x[1]); }, {{3, 4}, {3, 4}}, 0.5, 2},
      {"scalar_ops", [](V x) { return (2 - x[0]) * 3 / (x[0] + 4); }, {{3, 4}}},
      {"where", [](V x) { return where(x[0] > 0, x[0] * x[1], x[1]); }, {{3, 4}, {3, 4}}},
      {"masked_fill", [](V x) { return masked_fill(x[0] * 2, x[0] > 0.5, 1.0); }, {{3, 4}}},
      {"view_reshape", [](V x) { return (x[0].reshape({4, 3}) * 2).view({12}); }, {{3, 4}}},
      {"permute", [](V x) { return x[0].permute({2, 0, 1}) * 3; }, {{2, 3, 4}}},
      {"transpose", [](V x) { return x[0].transpose(0, 1) * x[1]; }, {{3, 4}, {4, 3}}},
      {"slice", [](V x) { return x[0].slice(1, 1, 4, 2) * 2; }, {{3, 4}}},
      {"narrow_select", [](V x) { return x[0].narrow(0, 1, 2).select(1, 2) * 3; }, {{3, 4}}},
      {"expand", [](V x) { return x[0].unsqueeze(0).expand({5, 3, 4}) * x[1]; }, {{3, 4}, {5, 1, 1}}},
      {"squeeze", [](V x) { return x[0].unsqueeze(2).squeeze(2).squeeze() * 2; }, {{3, 4}}},
      {"flatten", [](V x) { return x[0].flatten() * 2; }, {{2, 3, 4}}},
      {"as_strided", [](V x) { return x[0].contiguous().as_strided({2, 2}, {4, 1}, 1) * 2; }, {{3, 4}}},
      {"clone_contiguous", [](V x) { return x[0].t().clone().contiguous() * 2; }, {{3, 4}}},
  };
  return c;
}

}  // namespace

TEST(GradCheck, ElementwiseAndViews) {
  Generator g(11);
  for (const Case& c : cases()) {
    for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Sliced}) {
      SCOPED_TRACE(fmt::format("{} {}", c.name, strata::testing::layout_name(l)));
      std::vector<Tensor> in;
      for (const Shape& s : c.shapes) in.push_back(leaf(uniform_in(s, c.lo, c.hi, g), l));
      // keep equal pairs out of maximum/minimum, where the derivative is not defined
      EXPECT_TRUE(gradcheck(c.f, in));
      if (c.second_order && l == Layout::Contiguous) EXPECT_TRUE(gradgradcheck(c.f, in));
    }
  }
}

// as_strided's gradient, differentiated again, reads the incoming gradient by the strides of
// the contiguous input, whatever that gradient's own layout (here transposed).
TEST(GradCheck, AsStridedSecondOrderTakesAnyGradientLayout) {
  Generator g(12);
  Fn f = [](const std::vector<Tensor>& x) {
    EnableGradGuard grad_mode;  // also while gradcheck perturbs inputs under NoGradGuard
    Tensor y = x[0].as_strided({2, 2}, {4, 1}, 1);
    Tensor gx = autograd::grad({sum(y * y * y)}, {x[0]}, {}, true, true)[0];
    return gx.t() * x[1];
  };
  EXPECT_TRUE(gradcheck(f, {leaf(randn({3, 4}, kFloat64, &g)), leaf(randn({4, 3}, kFloat64, &g))}));
}

TEST(GradCheck, MaximumSplitsTiesEvenly) {
  Tensor a = from_vector<double>({1, 2}).requires_grad_(), b = from_vector<double>({1, 3}).requires_grad_();
  maximum(a, b).backward(ones({2}, kFloat64));
  EXPECT_TRUE(strata::testing::all_close(a.grad(), {0.5, 0}, 0, 0));
  EXPECT_TRUE(strata::testing::all_close(b.grad(), {0.5, 1}, 0, 0));
}

// A NaN operand, which the result carries, passes the gradient to both operands: each is
// masked only where it strictly loses, as in PyTorch.
TEST(GradCheck, MaximumAndMinimumWithNaN) {
  Tensor a = from_vector<double>({NAN, 1}).requires_grad_(), b = from_vector<double>({0, 2}).requires_grad_();
  sum(maximum(a, b)).backward();
  EXPECT_TRUE(strata::testing::all_close(a.grad(), {1, 0}, 0, 0));
  EXPECT_TRUE(strata::testing::all_close(b.grad(), {1, 1}, 0, 0));
  Tensor c = from_vector<double>({NAN, 1}).requires_grad_(), d = from_vector<double>({0, 2}).requires_grad_();
  sum(minimum(c, d)).backward();
  EXPECT_TRUE(strata::testing::all_close(c.grad(), {1, 1}, 0, 0));
  EXPECT_TRUE(strata::testing::all_close(d.grad(), {1, 0}, 0, 0));
}

// pow(x, e) with both tensors at x = 0: d/dx is 0 where e == 0 (not 0 * 0^-1), and d/de is 0
// where e >= 0 (the limit of y log x) but -inf where e < 0, as PyTorch's formulas give.
TEST(GradCheck, TensorPowerAtZero) {
  Tensor x = from_vector<double>({0, 0, 0, 2}).requires_grad_();
  Tensor e = from_vector<double>({0, 2, -1, 3}).requires_grad_();
  sum(pow(x, e)).backward();
  const std::vector<double> gx = strata::testing::values(x.grad()), ge = strata::testing::values(e.grad());
  EXPECT_EQ(gx[0], 0.0);
  EXPECT_EQ(gx[1], 0.0);
  EXPECT_EQ(gx[2], -INFINITY);
  EXPECT_DOUBLE_EQ(gx[3], 12.0);
  EXPECT_EQ(ge[0], 0.0);
  EXPECT_EQ(ge[1], 0.0);
  EXPECT_EQ(ge[2], -INFINITY);
  EXPECT_DOUBLE_EQ(ge[3], 8 * std::log(2.0));
}

// mul and div keep only what the needed gradients read: w * c and w / d need c and d, not w,
// so w written in place after the forward does not break the backward, as in PyTorch
TEST(GradCheck, OperandsNoGradientReadsAreNotSaved) {
  Tensor w = from_vector<double>({1, 2, 3}).requires_grad_();
  Tensor c = from_vector<double>({1, 2, 3}), d = from_vector<double>({1, 2, 4});
  Tensor y = sum(w * c) + sum(w / d);
  {
    NoGradGuard no_grad;
    w.mul_(2);
  }
  y.backward();
  EXPECT_TRUE(strata::testing::all_close(w.grad(), {2, 2.5, 3.25}, 1e-15, 0));
}

// Second derivatives at a zero: d2(a / b)/db2 = 2a / b^3 is +inf at b = 0 (not NaN), and a
// p-norm's Hessian at a zero norm is 0, as PyTorch gives
TEST(GradCheck, SecondDerivativesAtZero) {
  Tensor b = from_vector<double>({0.0}).requires_grad_();
  Tensor g = autograd::grad({div(from_vector<double>({1.0}), b)}, {b}, {}, std::nullopt, true)[0];
  EXPECT_EQ(strata::testing::values(autograd::grad({g}, {b})[0])[0], INFINITY);
  Tensor x = zeros({3}, kFloat64).requires_grad_();
  Tensor gn = autograd::grad({norm(x, 3, {0})}, {x}, {}, std::nullopt, true)[0];
  EXPECT_TRUE(strata::testing::all_close(autograd::grad({sum(gn)}, {x})[0],
                                         {0, 0, 0}, 0, 0));
}

// relu passes the gradient at a NaN input, as PyTorch's threshold_backward does
TEST(GradCheck, ReluPassesTheGradientAtNaN) {
  Tensor x = from_vector<float>({NAN, -1, 0, 2}).requires_grad_();
  sum(relu(x) * 3).backward();
  EXPECT_TRUE(strata::testing::all_close(x.grad(), {3, 0, 0, 3}, 0, 0));
}

// sign's gradient is 0: a loss that reaches x only through it still has one, as in PyTorch
TEST(GradCheck, SignHasAZeroGradient) {
  Tensor x = from_vector<double>({-2, 0, 3}).requires_grad_();
  Tensor y = sign(x);
  EXPECT_TRUE(y.requires_grad());
  sum(y * 5).backward();
  EXPECT_TRUE(strata::testing::all_close(x.grad(), {0, 0, 0}, 0, 0));
}

TEST(GradCheck, GradientDtypeFollowsInput) {
  Tensor a = ones({3}, kFloat32).requires_grad_();
  Tensor b = ones({3}, kFloat64).requires_grad_();
  (a * b).backward(ones({3}, kFloat64));
  EXPECT_EQ(a.grad().dtype(), kFloat32);
  EXPECT_EQ(b.grad().dtype(), kFloat64);
  // through a cast: the gradient is converted back
  Tensor c = from_vector<double>({1, 2}).requires_grad_();
  (c.to(kFloat32) * 3).backward(ones({2}));
  EXPECT_EQ(c.grad().dtype(), kFloat64);
  EXPECT_TRUE(strata::testing::all_close(c.grad(), {3, 3}, 0, 0));
  // a cast to an integer or bool is a constant, as in PyTorch: no gradient flows through it
  Tensor x = from_vector<double>({1.7, -2.3, 0.4}).requires_grad_();
  EXPECT_FALSE(x.to(kInt32).requires_grad());
  EXPECT_FALSE(x.to(kBool).requires_grad());
  EXPECT_FALSE(sum(x, kInt64).requires_grad());
  EXPECT_FALSE(prod(x, std::vector<int64_t>{0}, false, kInt32).requires_grad());
  sum((x.to(kInt32) * 3).to(kFloat64) * x).backward();
  EXPECT_TRUE(strata::testing::all_close(x.grad(), {3, -6, 0}, 0, 0));
  EXPECT_THROW(sum(x.to(kInt32).to(kFloat32)).backward(), Error);
}

// The activations' backward runs fused kernels (kernels/common/activation_grad_math.h) whose
// float32 path uses the SIMD exp and tanh: each float32 gradient against the derivative
// written out in float64, over a range that reaches both branches of tanh and the saturation.
TEST(ActivationGrad, Float32MatchesFloat64Derivative) {
  using D = double (*)(double);
  const double k = 0.79788456080286535588, c = 0.044715;
  struct Act {
    const char* name;
    Tensor (*f)(const Tensor&);
    D df;
  };
  const std::vector<Act> acts = {
      {"relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x > 0 ? 1.0 : 0.0; }},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return 1 - std::tanh(x) * std::tanh(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); },
       [](double x) { double s = 1 / (1 + std::exp(-x)); return s * (1 - s); }},
      {"silu", [](const Tensor& x) { return silu(x); },
       [](double x) { double s = 1 / (1 + std::exp(-x)); return s * (1 + x * (1 - s)); }},
      {"gelu", [](const Tensor& x) { return gelu(x); },
       [](double x) { return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-x * x / 2) / std::sqrt(2 * M_PI); }},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, "tanh"); }, nullptr},
  };
  Generator gen(5);
  Tensor x64 = uniform_in({4097}, -9, 9, gen), g64 = uniform_in({4097}, -2, 2, gen);
  for (const Act& a : acts) {
    SCOPED_TRACE(a.name);
    Tensor x = x64.to(kFloat32).requires_grad_();
    a.f(x).backward(g64.to(kFloat32));
    Tensor got = x.grad().to(kFloat64);
    // the reference takes the float32-rounded inputs, so only the kernel's error remains
    Tensor xr = x64.to(kFloat32).to(kFloat64), gr = g64.to(kFloat32).to(kFloat64);
    const double *px = xr.data_ptr<double>(), *pg = gr.data_ptr<double>(), *pgot = got.data_ptr<double>();
    for (int64_t i = 0; i < 4097; ++i) {
      double v = px[i], d;
      if (a.df) {
        d = a.df(v);
      } else {
        double t = std::tanh(k * (v + c * v * v * v));
        d = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * c * v * v);
      }
      double want = pg[i] * d;
      ASSERT_NEAR(pgot[i], want, 1e-5 * std::max(1.0, std::fabs(want))) << "x = " << v;
    }
  }
}
