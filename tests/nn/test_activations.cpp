// The composed activations against torch.nn.functional's documented formulas, evaluated here in
// double per element, over a grid that holds each kink, the thresholds and values far enough
// out to overflow a careless form; their gradients against torch's backward formulas (at the
// kinks too, where torch picks a side) with no NaN anywhere; finite differences to second order;
// 16-bit inputs; the layers; bad input.
#include <cmath>
#include <functional>

#include "nn/nn_testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::check_cases_to_second_order;
using strata::testing::throws_with;
using strata::testing::values;
namespace F = strata::nn::functional;
using V = const std::vector<Tensor>&;

namespace {

double sigmoid_ref(double x) { return 1 / (1 + std::exp(-x)); }
double softplus_ref(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

struct Activation {
  const char* name;
  std::function<Tensor(const Tensor&)> f;
  std::function<double(double)> value, grad;  // torch's forward and backward formulas
};

const std::vector<Activation>& activations() {
  constexpr double kAlpha = 1.6732632423543772848170429916717, kScale = 1.0507009873554804934193349852946;
  static const std::vector<Activation> all = {
      {"elu", [](const Tensor& x) { return F::elu(x, 0.7); },
       [](double x) { return x > 0 ? x : 0.7 * std::expm1(x); },
       [](double x) { return x > 0 ? 1 : 0.7 * std::exp(x); }},
      {"selu", [](const Tensor& x) { return F::selu(x); },
       [=](double x) { return kScale * (x > 0 ? x : kAlpha * std::expm1(x)); },
       [=](double x) { return kScale * (x > 0 ? 1 : kAlpha * std::exp(x)); }},
      {"celu", [](const Tensor& x) { return F::celu(x, 2.0); },
       [](double x) { return std::max(0.0, x) + std::min(0.0, 2.0 * std::expm1(x / 2.0)); },
       [](double x) { return x > 0 ? 1 : std::exp(x / 2.0); }},
      {"softplus", [](const Tensor& x) { return F::softplus(x, 2.0, 20.0); },
       [](double x) { return 2 * x > 20 ? x : std::log1p(std::exp(2 * x)) / 2; },
       [](double x) { return 2 * x > 20 ? 1 : sigmoid_ref(2 * x); }},
      {"mish", [](const Tensor& x) { return F::mish(x); }, [](double x) { return x * std::tanh(softplus_ref(x)); },
       [](double x) {
         const double t = std::tanh(softplus_ref(x));
         return t + x * sigmoid_ref(x) * (1 - t * t);
       }},
      {"logsigmoid", [](const Tensor& x) { return F::logsigmoid(x); }, [](double x) { return -softplus_ref(-x); },
       [](double x) { return sigmoid_ref(-x); }},
      {"hardtanh", [](const Tensor& x) { return F::hardtanh(x, -2.9, 3.0); },
       [](double x) { return std::min(3.0, std::max(-2.9, x)); },
       [](double x) { return x > -2.9 && x < 3.0 ? 1 : 0; }},
      {"relu6", [](const Tensor& x) { return F::relu6(x); }, [](double x) { return std::min(6.0, std::max(0.0, x)); },
       [](double x) { return x > 0 && x < 6 ? 1 : 0; }},
      {"hardsigmoid", [](const Tensor& x) { return F::hardsigmoid(x); },
       [](double x) { return x <= -3 ? 0 : x >= 3 ? 1 : x / 6 + 0.5; },
       [](double x) { return x > -3 && x < 3 ? 1.0 / 6 : 0; }},
      {"hardswish", [](const Tensor& x) { return F::hardswish(x); },
       [](double x) { return x <= -3 ? 0 : x >= 3 ? x : x * (x + 3) / 6; },
       [](double x) { return x < -3 ? 0 : x <= 3 ? x / 3 + 0.5 : 1; }},
      {"softsign", [](const Tensor& x) { return F::softsign(x); }, [](double x) { return x / (1 + std::fabs(x)); },
       [](double x) { return 1 / ((1 + std::fabs(x)) * (1 + std::fabs(x))); }},
  };
  return all;
}

// Every kink and threshold above, values beyond exp's range, and a few between.
std::vector<double> grid() {
  return {-1000, -100, -30, -20.5, -6, -3, -2.9, -2.5, -1, -0.25, -1e-3, 0, 1e-3, 0.25,
          1,     2.5,  2.9, 3,     6,  9.5, 10,   10.5, 20, 20.5,  30,    100, 1000};
}

}  // namespace

TEST(Activations, ValuesAndGradientsFollowTorchsFormulas) {
  const std::vector<double> xs = grid();
  for (const Activation& a : activations())
    for (DType dt : {kFloat64, kFloat32}) {
      SCOPED_TRACE(fmt::format("{} {}", a.name, dtype_name(dt)));
      std::vector<double> want, want_grad;
      for (double x : xs) {
        // float32 holds the grid point rounded: the reference takes the same point
        const double xr = dt == kFloat32 ? static_cast<double>(static_cast<float>(x)) : x;
        want.push_back(a.value(xr));
        want_grad.push_back(a.grad(xr));
      }
      Tensor x = from_vector(xs).to(dt).requires_grad_();
      Tensor y = a.f(x);
      EXPECT_EQ(y.dtype(), dt);
      const double tol = dt == kFloat64 ? 1e-14 : 1e-6;
      EXPECT_TRUE(all_close(y, want, tol, tol));
      sum(y).backward();
      EXPECT_TRUE(all_close(x.grad(), want_grad, tol, tol));
    }
}

TEST(Activations, GradientsToSecondOrder) {
  std::vector<strata::testing::GradCase> cases;
  for (const Activation& a : activations()) {
    const auto f = a.f;
    // random points rarely meet a kink; the grid's kinks are checked above
    cases.push_back({a.name, [f](V in) { return f(in[0] * 3); }, {{4, 5}}});
  }
  cases.push_back({"glu", [](V in) { return F::glu(in[0], 1); }, {{3, 4, 2}}});
  cases.push_back({"prelu", [](V in) { return F::prelu(in[0], in[1]); }, {{2, 3, 4}, {3}}});
  check_cases_to_second_order(cases, 51);
}

TEST(Activations, SixteenBitInputsComputeInFloat32) {
  Generator g(52);
  const Tensor x = randn({64}, kFloat32, &g) * 4;
  for (DType dt : {kFloat16, kBFloat16})
    for (const Activation& a : activations()) {
      SCOPED_TRACE(fmt::format("{} {}", a.name, dtype_name(dt)));
      const Tensor x16 = x.to(dt);
      const Tensor y = a.f(x16);
      EXPECT_EQ(y.dtype(), dt);
      // computed in float32 and rounded once, as torch's kernels
      EXPECT_TRUE(all_close(y, values(a.f(x16.to(kFloat32)).to(dt)), 0, 0));
    }
}

TEST(Activations, GluAndPReLU) {
  Generator g(53);
  const Tensor x = randn({2, 6, 3}, kFloat64, &g);
  const std::vector<double> xv = values(x);
  std::vector<double> want;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t l = 0; l < 3; ++l) {
        const double a = xv[static_cast<size_t>((n * 6 + c) * 3 + l)], b = xv[static_cast<size_t>((n * 6 + c + 3) * 3 + l)];
        want.push_back(a * sigmoid_ref(b));
      }
  EXPECT_TRUE(all_close(nn::GLU(1)(x), want, 1e-14, 1e-14));
  const Tensor x16 = x.to(kBFloat16);
  EXPECT_TRUE(all_close(F::glu(x16, 1), values(F::glu(x16.to(kFloat32), 1).to(kBFloat16)), 0, 0));

  nn::PReLU shared;
  EXPECT_EQ(shared.weight.shape(), (Shape{1}));
  EXPECT_TRUE(all_close(shared.weight, {0.25}, 0, 0));
  ASSERT_EQ(shared.state_dict().count("weight"), 1u);
  nn::PReLU per_channel(6, 0.1);
  {
    NoGradGuard no_grad;
    per_channel.weight.copy_(arange(1, 7, 1, kFloat32) / 10);
  }
  per_channel.to(kFloat64);
  const Tensor y = per_channel(x);
  std::vector<double> want_prelu;
  for (size_t i = 0; i < xv.size(); ++i) {
    const double slope = static_cast<double>((i / 3) % 6 + 1) / 10;
    want_prelu.push_back(xv[i] > 0 ? xv[i] : static_cast<double>(static_cast<float>(slope)) * xv[i]);
  }
  EXPECT_TRUE(all_close(y, want_prelu, 1e-14, 1e-14));
  // torch's gradients at 0: the input's is the slope, the slope's is 0
  Tensor zero = zeros({1, 6}, kFloat64).requires_grad_();
  sum(per_channel(zero)).backward();
  EXPECT_TRUE(all_close(zero.grad(), values(per_channel.weight), 0, 0));
  EXPECT_TRUE(all_close(per_channel.weight.grad(), std::vector<double>(6, 0.0), 0, 0));
}

TEST(Activations, BadInputRaises) {
  const Tensor ints = arange(0, 4, 1, kInt64);
  EXPECT_TRUE(throws_with([&] { F::elu(ints); }, {"[elu]", "floating", "int64"}));
  EXPECT_TRUE(throws_with([&] { F::hardswish(Tensor()); }, {"[hardswish]", "undefined"}));
  EXPECT_TRUE(throws_with([&] { F::celu(randn({3}), 0); }, {"[celu]", "nonzero"}));
  EXPECT_TRUE(throws_with([&] { F::softplus(randn({3}), 0); }, {"[softplus]", "beta"}));
  EXPECT_TRUE(throws_with([&] { F::hardtanh(randn({3}), 2, 1); }, {"[hardtanh]", "must not exceed"}));
  EXPECT_TRUE(throws_with([&] { F::glu(randn({3, 5})); }, {"[glu]", "odd"}));
  EXPECT_TRUE(throws_with([&] { F::glu(randn({3, 4}), 2); }, {"[glu]", "out of range"}));
  EXPECT_TRUE(throws_with([&] { F::prelu(randn({2, 3}), ones({4})); }, {"[prelu]", "4 elements", "3"}));
  EXPECT_TRUE(throws_with([&] { nn::PReLU(0); }, {"[PReLU]", "positive"}));
}
