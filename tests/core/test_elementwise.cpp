// Unary and binary elementwise ops: one table row per op, each checked against a float64
// reference over dtypes, layouts, broadcasting and empty inputs; in-place forms; bad input.
#include <cmath>
#include <functional>
#include <limits>

#include "testing.h"

using namespace strata;
using strata::testing::all_close;
using strata::testing::Layout;
using strata::testing::throws_with;
using strata::testing::values;

namespace {

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  std::function<double(double)> ref;
  bool float_only;    // integer inputs compute in float32
  double lo, hi;      // input range
};

double gelu_ref(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double gelu_tanh_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {"neg", [](const Tensor& x) { return -x; }, [](double x) { return -x; }, false, -5, 5},
      {"abs", [](const Tensor& x) { return abs(x); }, [](double x) { return std::fabs(x); }, false, -5, 5},
      {"sign", [](const Tensor& x) { return sign(x); }, [](double x) { return double((x > 0) - (x < 0)); }, false, -5, 5},
      {"exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }, true, -5, 5},
      {"log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); }, true, 0.1, 10},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, true, 0, 10},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); }, true, 0.1, 10},
      {"sin", [](const Tensor& x) { return sin(x); }, [](double x) { return std::sin(x); }, true, -4, 4},
      {"cos", [](const Tensor& x) { return cos(x); }, [](double x) { return std::cos(x); }, true, -4, 4},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }, true, -4, 4},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, [](double x) { return 1 / (1 + std::exp(-x)); }, true, -8, 8},
      {"relu", [](const Tensor& x) { return relu(x); }, [](double x) { return x > 0 ? x : 0; }, false, -5, 5},
      {"gelu", [](const Tensor& x) { return gelu(x); }, gelu_ref, true, -5, 5},
      {"gelu_tanh", [](const Tensor& x) { return gelu(x, "tanh"); }, gelu_tanh_ref, true, -5, 5},
      {"silu", [](const Tensor& x) { return silu(x); }, [](double x) { return x / (1 + std::exp(-x)); }, true, -8, 8},
      {"square", [](const Tensor& x) { return square(x); }, [](double x) { return x * x; }, false, -5, 5},
      {"reciprocal", [](const Tensor& x) { return reciprocal(x); }, [](double x) { return 1 / x; }, true, 0.5, 5},
      {"pow3", [](const Tensor& x) { return pow(x, 3); }, [](double x) { return x * x * x; }, false, -3, 3},
      {"pow1.5", [](const Tensor& x) { return pow(x, 1.5); }, [](double x) { return std::pow(x, 1.5); }, true, 0, 4},
      {"clamp", [](const Tensor& x) { return clamp(x, -1, 2); }, [](double x) { return std::min(std::max(x, -1.0), 2.0); }, false, -5, 5},
      {"clamp_min", [](const Tensor& x) { return clamp(x, 0.5, std::nullopt); }, [](double x) { return std::max(x, 0.5); }, true, -5, 5},
      {"leaky_relu", [](const Tensor& x) { return leaky_relu(x, 0.1); }, [](double x) { return x > 0 ? x : 0.1 * x; }, true, -5, 5},
      {"log1p", [](const Tensor& x) { return log1p(x); }, [](double x) { return std::log1p(x); }, true, -0.9, 5},
      {"expm1", [](const Tensor& x) { return expm1(x); }, [](double x) { return std::expm1(x); }, true, -5, 5},
      {"floor", [](const Tensor& x) { return floor(x); }, [](double x) { return std::floor(x); }, false, -5, 5},
      {"ceil", [](const Tensor& x) { return ceil(x); }, [](double x) { return std::ceil(x); }, false, -5, 5},
      {"round", [](const Tensor& x) { return round(x); }, [](double x) { return std::nearbyint(x); }, false, -5, 5},
      {"trunc", [](const Tensor& x) { return trunc(x); }, [](double x) { return std::trunc(x); }, false, -5, 5},
      {"tan", [](const Tensor& x) { return tan(x); }, [](double x) { return std::tan(x); }, true, -1.2, 1.2},
      {"asin", [](const Tensor& x) { return asin(x); }, [](double x) { return std::asin(x); }, true, -0.95, 0.95},
      {"acos", [](const Tensor& x) { return acos(x); }, [](double x) { return std::acos(x); }, true, -0.95, 0.95},
      {"atan", [](const Tensor& x) { return atan(x); }, [](double x) { return std::atan(x); }, true, -5, 5},
      {"sinh", [](const Tensor& x) { return sinh(x); }, [](double x) { return std::sinh(x); }, true, -4, 4},
      {"cosh", [](const Tensor& x) { return cosh(x); }, [](double x) { return std::cosh(x); }, true, -4, 4},
      {"asinh", [](const Tensor& x) { return asinh(x); }, [](double x) { return std::asinh(x); }, true, -5, 5},
      {"acosh", [](const Tensor& x) { return acosh(x); }, [](double x) { return std::acosh(x); }, true, 1.1, 10},
      {"atanh", [](const Tensor& x) { return atanh(x); }, [](double x) { return std::atanh(x); }, true, -0.9, 0.9},
      {"log2", [](const Tensor& x) { return log2(x); }, [](double x) { return std::log2(x); }, true, 0.1, 10},
      {"log10", [](const Tensor& x) { return log10(x); }, [](double x) { return std::log10(x); }, true, 0.1, 10},
      {"exp2", [](const Tensor& x) { return exp2(x); }, [](double x) { return std::exp2(x); }, true, -5, 5},
  };
  return cases;
}

Tensor random_input(const Shape& shape, DType dtype, double lo, double hi, Generator& g) {
  if (is_integral(dtype)) {
    int64_t l = static_cast<int64_t>(std::ceil(lo)), h = static_cast<int64_t>(std::floor(hi)) + 1;
    if (dtype == kUInt8) l = std::max<int64_t>(l, 0);
    return randint(l, std::max(h, l + 1), shape, TensorOptions(dtype), &g);
  }
  Tensor t = empty(shape, kFloat64);
  uniform_(t, lo, hi, &g);
  return t.to(dtype);
}

const std::vector<Shape> kShapes = {{}, {1}, {7}, {3, 5}, {2, 3, 4}, {0, 3}, {40000}};
const std::vector<DType> kFloatTypes = {kFloat32, kFloat64, kFloat16, kBFloat16};
const std::vector<DType> kIntTypes = {kInt32, kInt64, kInt8, kUInt8};

}  // namespace

TEST(Unary, MatchesFloat64Reference) {
  Generator g(1);
  for (const auto& c : unary_cases()) {
    std::vector<DType> types = kFloatTypes;
    types.insert(types.end(), kIntTypes.begin(), kIntTypes.end());
    for (DType t : types) {
      if (t == kUInt8 && c.lo < 0 && std::string(c.name) != "relu") continue;
      if (is_integral(t) && c.hi - c.lo < 1) continue;
      for (const Shape& s : kShapes) {
        for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Sliced}) {
          Tensor x = strata::testing::with_layout(random_input(s, t, c.lo, c.hi, g), l);
          Tensor y = c.op(x);
          SCOPED_TRACE(fmt::format("{} {} {} {}", c.name, t, s, strata::testing::layout_name(l)));
          ASSERT_EQ(y.shape(), s);
          DType want_t = c.float_only && !is_floating(t) ? kFloat32 : t;
          ASSERT_EQ(y.dtype(), want_t);
          std::vector<double> in = values(x), want(in.size());
          for (size_t i = 0; i < in.size(); ++i) want[i] = c.ref(in[i]);
          double rtol = is_integral(want_t) ? 0 : strata::testing::rtol_for(want_t) * 2;
          double atol = is_integral(want_t) ? 0 : rtol;
          ASSERT_TRUE(all_close(y, want, rtol, atol));
        }
      }
    }
  }
}

TEST(Unary, SpecialValues) {
  Tensor x = from_vector<float>({NAN, INFINITY, -INFINITY, 0.0f, -0.0f});
  std::vector<double> e = values(exp(x));
  EXPECT_TRUE(std::isnan(e[0]));
  EXPECT_EQ(e[1], INFINITY);
  EXPECT_EQ(e[2], 0);
  EXPECT_TRUE(std::isnan(values(clamp(x, -1, 1))[0]));  // NaN passes through clamp
  EXPECT_EQ(values(sigmoid(from_vector<float>({-100, 100}))), (std::vector<double>{0, 1}));
  EXPECT_EQ(values(log(from_vector<float>({0})))[0], -INFINITY);
  // halves round to even, as PyTorch's round; NaN and the infinities pass through the roundings
  const Tensor halves = from_vector<float>({0.5f, 1.5f, 2.5f, -0.5f, -2.5f, NAN, -INFINITY});
  const std::vector<double> r = values(round(halves));
  EXPECT_EQ(std::vector<double>(r.begin(), r.begin() + 5), (std::vector<double>{0, 2, 2, 0, -2}));
  EXPECT_TRUE(std::signbit(r[3]));
  EXPECT_TRUE(std::isnan(r[5]));
  EXPECT_EQ(r[6], -INFINITY);
  EXPECT_EQ(values(floor(halves))[3], -1);
  EXPECT_EQ(values(ceil(halves))[4], -2);
  EXPECT_EQ(values(trunc(from_vector<double>({-1.7, 1.7}))), (std::vector<double>{-1, 1}));
  EXPECT_EQ(log1p(from_vector<float>({-1})).item<float>(), -INFINITY);
  EXPECT_EQ(expm1(from_vector<double>({1e-20})).item<double>(), 1e-20);  // exact near 0, unlike exp(x) - 1
  EXPECT_TRUE(strata::testing::throws_with([] { (void)floor(ones({2}, kBool)); }, {"[floor]", "bool"}));
}

// sin and cos take a vectorized form on blocks of values below 2^20 in magnitude and the
// library's exact reduction elsewhere: blocks of small values, blocks with one huge value, NaN
// and inf, contiguous and strided, all within an ulp of float64's sin and cos.
TEST(Unary, SinCosOnEitherSideOfTheVectorizedRange) {
  std::vector<float> xs(5000);
  Generator g(7);
  std::vector<double> u = values(rand({5000}, TensorOptions(kFloat64), &g));
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>((u[i] - 0.5) * (i < 2048 ? 200.0 : 2e6));
  xs[1500] = 1e30f;  // one huge value puts its block on the exact path
  xs[3000] = NAN;
  xs[3001] = INFINITY;
  xs[3002] = -0.0f;
  xs[3003] = 1048576.0f;
  xs[3004] = std::nextafter(1048576.0f, 0.0f);
  const Tensor x = from_vector<float>(xs);
  auto check = [](const Tensor& got, const Tensor& in, double (*ref)(double), const char* what) {
    const std::vector<double> g = values(got), v = values(in);
    ASSERT_EQ(g.size(), v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      const double want = ref(v[i]);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(g[i])) << what << " of " << v[i];
        continue;
      }
      const double ulp = std::ldexp(1.0, std::max(std::ilogb(want), -126) - 23);
      EXPECT_LE(std::fabs(g[i] - want), ulp) << what << " of " << v[i] << " at " << i;
    }
  };
  double (*dsin)(double) = std::sin, (*dcos)(double) = std::cos;
  check(sin(x), x, dsin, "sin");
  check(cos(x), x, dcos, "cos");
  EXPECT_TRUE(std::signbit(values(sin(x))[3002]));
  const Tensor strided = x.view({2500, 2}).select(1, 1);
  check(sin(strided), strided, dsin, "strided sin");
  check(cos(strided), strided, dcos, "strided cos");
  // float16 computes in float32 and rounds once
  const Tensor h = x.slice(0, 0, 2048).to(kFloat16);
  EXPECT_TRUE(all_close(values(sin(h)), values(sin(h.to(kFloat32)).to(kFloat16)), 0, 0));
}

TEST(Unary, InPlaceAndBadInput) {
  Tensor x = from_vector<float>({-2, -1, 0, 1, 2}, Shape{5});
  Tensor view = x.slice(0, 0, 5, 2);
  view.relu_();
  EXPECT_TRUE(all_close(x, {0, -1, 0, 1, 2}, 0, 0));
  x.clamp_(-0.5, 1.5);
  EXPECT_TRUE(all_close(x, {0, -0.5, 0, 1, 1.5}, 0, 0));
  EXPECT_EQ(exp(ones({2}, kBool)).dtype(), kFloat32);  // bool promotes to float, as in PyTorch
  EXPECT_THROW(neg(ones({2}, kBool)), Error);
  EXPECT_THROW(gelu(ones({2}), "fast"), Error);
  EXPECT_THROW(clamp(ones({2}), std::nullopt, std::nullopt), Error);
  EXPECT_THROW(pow(ones({2}, kInt32), -1), Error);
  EXPECT_THROW(exp(Tensor()), Error);
  EXPECT_EQ(logical_not(from_vector<float>({0, 2})).dtype(), kBool);
  EXPECT_TRUE(all_close(logical_not(from_vector<float>({0, 2})), {1, 0}, 0, 0));
  // a bool tensor with integer scalars promotes to int64, as in PyTorch
  const Tensor b = from_vector<bool>({false, true});
  EXPECT_EQ(pow(b, 3).dtype(), kInt64);
  EXPECT_TRUE(all_close(pow(b, 3), {0, 1}, 0, 0));
  EXPECT_TRUE(all_close(pow(b, 0), {1, 1}, 0, 0));
  EXPECT_EQ(pow(b, 0.5).dtype(), kFloat32);
  EXPECT_EQ(clamp(b, 2, std::nullopt).dtype(), kInt64);
  EXPECT_TRUE(all_close(clamp(b, 2, std::nullopt), {2, 2}, 0, 0));
  EXPECT_TRUE(all_close(clamp(b, -1, 0), {0, 0}, 0, 0));
  EXPECT_EQ(square(b).dtype(), kInt64);
  EXPECT_TRUE(all_close(square(b), {0, 1}, 0, 0));
  EXPECT_EQ(sign(b).dtype(), kBool);
  EXPECT_TRUE(all_close(sign(b), {0, 1}, 0, 0));
}

namespace {

struct BinaryCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  std::function<double(double, double)> ref;
  enum { Arith, TrueDiv, Compare } kind;
  bool positive_b = false;
};

const std::vector<BinaryCase>& binary_cases() {
  static const std::vector<BinaryCase> cases = {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, [](double a, double b) { return a + b; }, BinaryCase::Arith},
      {"add_alpha", [](const Tensor& a, const Tensor& b) { return add(a, b, 2); }, [](double a, double b) { return a + 2 * b; }, BinaryCase::Arith},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, [](double a, double b) { return a - b; }, BinaryCase::Arith},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, [](double a, double b) { return a * b; }, BinaryCase::Arith},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, [](double a, double b) { return a / b; }, BinaryCase::TrueDiv, true},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, [](double a, double b) { return std::max(a, b); }, BinaryCase::Arith},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, [](double a, double b) { return std::min(a, b); }, BinaryCase::Arith},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(abs(a), b); }, [](double a, double b) { return std::pow(std::fabs(a), b); }, BinaryCase::Arith, true},
      {"eq", [](const Tensor& a, const Tensor& b) { return a == b; }, [](double a, double b) { return double(a == b); }, BinaryCase::Compare},
      {"ne", [](const Tensor& a, const Tensor& b) { return a != b; }, [](double a, double b) { return double(a != b); }, BinaryCase::Compare},
      {"lt", [](const Tensor& a, const Tensor& b) { return a < b; }, [](double a, double b) { return double(a < b); }, BinaryCase::Compare},
      {"le", [](const Tensor& a, const Tensor& b) { return a <= b; }, [](double a, double b) { return double(a <= b); }, BinaryCase::Compare},
      {"gt", [](const Tensor& a, const Tensor& b) { return a > b; }, [](double a, double b) { return double(a > b); }, BinaryCase::Compare},
      {"ge", [](const Tensor& a, const Tensor& b) { return a >= b; }, [](double a, double b) { return double(a >= b); }, BinaryCase::Compare},
  };
  return cases;
}

// pairs of shapes that broadcast, and the result
const std::vector<std::array<Shape, 3>> kBroadcasts = {
    {Shape{3, 4}, Shape{3, 4}, Shape{3, 4}}, {Shape{3, 4}, Shape{4}, Shape{3, 4}},
    {Shape{3, 1}, Shape{1, 4}, Shape{3, 4}}, {Shape{2, 3, 4}, Shape{3, 1}, Shape{2, 3, 4}},
    {Shape{}, Shape{5}, Shape{5}},           {Shape{4, 1, 3}, Shape{2, 1}, Shape{4, 2, 3}},
    {Shape{0, 3}, Shape{3}, Shape{0, 3}},    {Shape{33, 257}, Shape{257}, Shape{33, 257}},
};

}  // namespace

TEST(Binary, MatchesFloat64ReferenceWithBroadcasting) {
  Generator g(2);
  for (const auto& c : binary_cases()) {
    for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64}) {
      if (std::string(c.name) == "pow" && is_integral(t)) continue;
      for (const auto& [sa, sb, so] : kBroadcasts) {
        for (Layout l : {Layout::Contiguous, Layout::Transposed, Layout::Sliced}) {
          Tensor a = strata::testing::with_layout(random_input(sa, t, -4, 4, g), l);
          Tensor b = random_input(sb, t, c.positive_b ? 0.5 : -4, 4, g);
          if (!c.positive_b && is_integral(t)) b = b.to(t);
          if (c.kind == BinaryCase::Compare) b = where(rand(sb, {}, &g) < 0.3, b, b);  // keep dtype
          SCOPED_TRACE(fmt::format("{} {} {}x{} {}", c.name, t, sa, sb, strata::testing::layout_name(l)));
          Tensor y = c.op(a, b);
          ASSERT_EQ(y.shape(), so);
          DType want_t = c.kind == BinaryCase::Compare ? kBool
                         : c.kind == BinaryCase::TrueDiv && is_integral(t) ? kFloat32 : t;
          ASSERT_EQ(y.dtype(), want_t);
          std::vector<double> va = values(a), vb = values(b), want(static_cast<size_t>(y.numel()));
          for (int64_t i = 0; i < y.numel(); ++i) {
            auto idx = strata::testing::unravel(i, so);
            want[i] = c.ref(va[strata::testing::broadcast_index(idx, sa)], vb[strata::testing::broadcast_index(idx, sb)]);
          }
          double rtol = c.kind == BinaryCase::Compare || is_integral(want_t) ? 0 : strata::testing::rtol_for(want_t) * 2;
          ASSERT_TRUE(all_close(y, want, rtol, rtol));
        }
      }
    }
  }
}

TEST(Binary, ScalarsAndInPlace) {
  Tensor x = from_vector<float>({1, 2, 3});
  EXPECT_TRUE(all_close(x + 1, {2, 3, 4}, 0, 0));
  EXPECT_TRUE(all_close(1 - x, {0, -1, -2}, 0, 0));
  EXPECT_TRUE(all_close(2 * x, {2, 4, 6}, 0, 0));
  EXPECT_TRUE(all_close(6 / x, {6, 3, 2}, 0, 0));
  EXPECT_TRUE(all_close(maximum(x, 2), {2, 2, 3}, 0, 0));
  Tensor m = zeros({2, 3});
  m.add_(x);
  m.mul_(2);
  m.sub_(from_vector<float>({1, 1}).view({2, 1}));
  m.div_(2);
  EXPECT_TRUE(all_close(m, {0.5, 1.5, 2.5, 0.5, 1.5, 2.5}, 0, 0));
  m.add_(x, -1);
  EXPECT_TRUE(all_close(m, {-0.5, -0.5, -0.5, -0.5, -0.5, -0.5}, 0, 0));
  Tensor i = ones({3}, kInt32);
  EXPECT_THROW(i.add_(x), Error);  // float result into an int tensor
  EXPECT_THROW(i.div_(2), Error);
  EXPECT_THROW(ones({3}).add_(ones({2, 3})), Error);  // result larger than destination
  // in-place on a strided view writes only the view
  Tensor base = zeros({4});
  base.slice(0, 1, 4, 2).add_(5);
  EXPECT_TRUE(all_close(base, {0, 5, 0, 5}, 0, 0));
  // no subtraction takes a bool operand, as in PyTorch
  const Tensor yes = ones({2}, kBool), two = full({2}, 2);
  const std::vector<std::function<void()>> bool_subs = {
      [&] { sub(yes, yes); },          [&] { sub(two, yes); },         [&] { sub(yes, two); },
      [&] { sub(two, true); },         [&] { sub(yes, 1); },           [&] { (void)(true - two); },
      [&] { (void)(1.5 - yes); },      [&] { Tensor t = two.clone(); t.sub_(yes); },
      [&] { Tensor t = two.clone(); t.sub_(false); }, [&] { Tensor t = yes.clone(); t.sub_(1); }};
  for (const auto& f : bool_subs) EXPECT_TRUE(strata::testing::throws_with(f, {"[sub] subtraction with a bool operand"}));
  EXPECT_TRUE(all_close(sub(two, 1), {1, 1}, 0, 0));
  EXPECT_TRUE(all_close(ones({2}, kBool) + zeros({2}, kBool), {1, 1}, 0, 0));
  // the larger and smaller of two bools (true > false): or and and, with broadcasting
  const Tensor p = from_vector<bool>({false, false, true, true}), q = from_vector<bool>({false, true, false, true});
  EXPECT_EQ(maximum(p, q).dtype(), kBool);
  EXPECT_TRUE(all_close(maximum(p, q), {0, 1, 1, 1}, 0, 0));
  EXPECT_TRUE(all_close(minimum(p, q), {0, 0, 0, 1}, 0, 0));
  EXPECT_TRUE(all_close(maximum(p.reshape({2, 2}), from_vector<bool>({true, false})), {1, 0, 1, 1}, 0, 0));
  EXPECT_TRUE(all_close(minimum(p, from_vector<bool>({true}).reshape({})), {0, 0, 1, 1}, 0, 0));
}

// remainder and fmod against the floored and truncated quotients taken in long double, torch's
// documented examples, integer tables with every sign and the one overflowing quotient; atan2
// in each quadrant.
TEST(Binary, RemainderFmodAndAtan2) {
  Generator g(7);
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor a = random_input({500}, t, -20, 20, g);
    const Tensor mag = random_input({500}, t, 0.25, 4, g);
    const Tensor b = where(rand({500}, {}, &g) < 0.5, -mag, mag);
    const std::vector<double> va = values(a), vb = values(b);
    std::vector<double> want_rem, want_fmod, want_atan2;
    for (size_t i = 0; i < va.size(); ++i) {
      const long double x = va[i], y = vb[i];
      want_rem.push_back(static_cast<double>(x - y * std::floor(x / y)));
      want_fmod.push_back(static_cast<double>(x - y * std::trunc(x / y)));
      want_atan2.push_back(static_cast<double>(std::atan2(x, y)));
    }
    // the quotient's rounding in the reference moves a result by about an ulp of a, not of b
    const double tol = strata::testing::rtol_for(t) * 40;
    EXPECT_TRUE(all_close(remainder(a, b), want_rem, 0, tol));
    EXPECT_TRUE(all_close(a % b, want_rem, 0, tol));
    EXPECT_TRUE(all_close(fmod(a, b), want_fmod, 0, tol));
    EXPECT_TRUE(all_close(atan2(a, b), want_atan2, strata::testing::rtol_for(t) * 2, strata::testing::rtol_for(t)));
  }
  // torch.remainder's and torch.fmod's documented examples
  const Tensor x = from_vector<float>({-3, -2, -1, 1, 2, 3});
  EXPECT_TRUE(all_close(remainder(x, 2), {1, 0, 1, 1, 0, 1}, 0, 0));
  EXPECT_TRUE(all_close(fmod(x, 2), {-1, -0.0, -1, 1, 0, 1}, 0, 0));
  EXPECT_TRUE(std::signbit(values(fmod(x, 2))[1]));  // fmod keeps a's sign, -0 too
  const Tensor ints = from_vector<int64_t>({1, 2, 3, 4, 5});
  EXPECT_EQ(remainder(ints, -1.5).dtype(), kFloat32);
  EXPECT_TRUE(all_close(remainder(ints, -1.5), {-0.5, -1, 0, -0.5, -1}, 0, 0));
  EXPECT_TRUE(all_close(fmod(ints, -1.5), {1, 0.5, 0, 1, 0.5}, 0, 0));
  // integers: every sign, Python's % and C's %
  for (DType t : {kInt64, kInt32, kInt8}) {
    const Tensor ia = from_vector<int64_t>({-7, -7, 7, 7, 0, -6}).to(t);
    const Tensor ib = from_vector<int64_t>({3, -3, 3, -3, 5, 3}).to(t);
    EXPECT_EQ(remainder(ia, ib).dtype(), t);
    EXPECT_TRUE(all_close(remainder(ia, ib), {2, -1, 1, -2, 0, 0}, 0, 0));
    EXPECT_TRUE(all_close(fmod(ia, ib), {-1, -1, 1, 1, 0, 0}, 0, 0));
    EXPECT_TRUE(strata::testing::throws_with([&] { remainder(ia, ib * 0); }, {"[remainder]", "division by zero"}));
    EXPECT_TRUE(strata::testing::throws_with([&] { fmod(ia, 0); }, {"[fmod]", "division by zero"}));
  }
  EXPECT_TRUE(all_close(remainder(from_vector<uint8_t>({250, 7}), 6), {4, 1}, 0, 0));
  // the most negative integer over -1 overflows the quotient; its remainder is 0
  EXPECT_TRUE(all_close(remainder(from_vector<int8_t>({-128}), -1), {0}, 0, 0));
  EXPECT_TRUE(all_close(fmod(from_vector<int64_t>({INT64_MIN}), -1), {0}, 0, 0));
  // floating division by zero is NaN, as in C
  EXPECT_TRUE(std::isnan(values(fmod(from_vector<float>({1}), 0))[0]));
  EXPECT_TRUE(strata::testing::throws_with([] { remainder(ones({2}, kBool), ones({2}, kBool)); }, {"bool"}));
  // atan2's quadrants and signed zeros: the angle of (b, a)
  const double pi = 3.14159265358979323846;
  const Tensor ys = from_vector<double>({1, 1, -1, -1, 0, -0.0}), xs = from_vector<double>({1, -1, -1, 1, -1, -1});
  EXPECT_TRUE(all_close(atan2(ys, xs), {pi / 4, 3 * pi / 4, -3 * pi / 4, -pi / 4, pi, -pi}, 1e-15, 0));
  EXPECT_EQ(atan2(from_vector<int32_t>({1}), from_vector<int32_t>({0})).dtype(), kFloat32);
}

// Integer arithmetic wraps around, as in PyTorch (it was signed overflow, which is undefined).
TEST(Binary, IntegerArithmeticWraps) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max(), kMin = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(add(from_vector<int64_t>({kMax}), 1).item<int64_t>(), kMin);
  EXPECT_EQ(sub(from_vector<int64_t>({kMin}), 1).item<int64_t>(), kMax);
  EXPECT_EQ(mul(from_vector<int32_t>({std::numeric_limits<int32_t>::max()}), 2).item<int32_t>(), -2);
  EXPECT_EQ(neg(from_vector<int64_t>({kMin})).item<int64_t>(), kMin);
  EXPECT_EQ(abs(from_vector<int64_t>({kMin})).item<int64_t>(), kMin);
  EXPECT_EQ(square(from_vector<int64_t>({int64_t(1) << 32})).item<int64_t>(), 0);
  // 65536^1 squared its base once too often; 3^21 wraps to 1870418611 in int32
  EXPECT_TRUE(
      all_close(pow(from_vector<int32_t>({65536, 3}), from_vector<int32_t>({1, 21})), {65536, 1870418611}, 0, 0));
  Tensor acc = from_vector<int64_t>({kMax});
  index_add_(acc, 0, from_vector<int64_t>({0}), from_vector<int64_t>({1}));
  EXPECT_EQ(acc.item<int64_t>(), kMin);
}

TEST(Binary, WhereAndMaskedFill) {
  Tensor c = from_vector<bool>({true, false, true});
  Tensor a = from_vector<float>({1, 2, 3});
  Tensor b = from_vector<int32_t>({10, 20, 30}, Shape{3, 1});
  Tensor w = where(c, a, b);
  EXPECT_EQ(w.shape(), (Shape{3, 3}));
  EXPECT_EQ(w.dtype(), kFloat32);
  EXPECT_TRUE(all_close(w, {1, 10, 3, 1, 20, 3, 1, 30, 3}, 0, 0));
  EXPECT_TRUE(all_close(where(c, a, 0.5), {1, 0.5, 3}, 0, 0));
  EXPECT_TRUE(all_close(masked_fill(a, c, -1), {-1, 2, -1}, 0, 0));
  EXPECT_TRUE(all_close(a, {1, 2, 3}, 0, 0));  // functional form leaves its input alone
  Tensor m = zeros({2, 3});
  m.masked_fill_(c, 7);
  EXPECT_TRUE(all_close(m, {7, 0, 7, 7, 0, 7}, 0, 0));
  // a mask overlapping the tensor it fills is read as it was before the fill
  Tensor flags = from_vector<bool>({true, false, false, false, false});
  flags.slice(0, 1, 5, 1).masked_fill_(flags.slice(0, 0, 4, 1), true);
  EXPECT_EQ(values(flags), (std::vector<double>{1, 1, 0, 0, 0}));
  Tensor self_masked = from_vector<bool>({true, false, true});  // the same view: each element read, then written
  self_masked.masked_fill_(self_masked, false);
  EXPECT_EQ(values(self_masked), (std::vector<double>{0, 0, 0}));
  EXPECT_THROW(where(a, a, a), Error);                      // non-bool condition
  EXPECT_THROW(m.masked_fill_(from_vector<bool>({true, false}), 1), Error);
  EXPECT_THROW(m.masked_fill_(ones({3}), 1), Error);
}

TEST(Binary, BadInput) {
  EXPECT_THROW(ones({2, 3}) + ones({3, 2}), Error);
  EXPECT_THROW(ones({2}) * ones({3}), Error);
  EXPECT_THROW(ones({2}) + Tensor(), Error);
  try {
    ones({2, 3}) + ones({4});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[add]"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos) << e.what();
  }
  // a fractional alpha for integer operands is refused, as in PyTorch; an integral one scales
  const Tensor i = from_vector<int64_t>({1, 2});
  Tensor acc = from_vector<int64_t>({5, 5});
  for (const auto& f : std::vector<std::function<void()>>{[&] { add(i, i, 0.5); }, [&] { sub(i, i, 1.5); },
                                                           [&] { acc.add_(i, 0.5); }, [&] { acc.sub_(i, 0.5); },
                                                           [&] { add(i, i, true); }}) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("alpha"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(values(acc), (std::vector<double>{5, 5}));  // nothing written by the refused calls
  EXPECT_EQ(values(add(i, i, 3)), (std::vector<double>{4, 8}));
  EXPECT_EQ(add(i, i, 3).dtype(), kInt64);
  EXPECT_EQ(values(add(i, from_vector<float>({1, 1}), 0.5)), (std::vector<double>{1.5, 2.5}));  // float result
  EXPECT_EQ(values(add(from_vector<bool>({true, false}), from_vector<bool>({false, false}), true)),
            (std::vector<double>{1, 0}));
}

TEST(Elementwise, ThreadCountDoesNotChangeResults) {
  Tensor x = randn({1 << 18});
  set_num_threads(1);
  std::vector<double> one = values(gelu(x) * x + 1);
  set_num_threads(2);
  EXPECT_EQ(values(gelu(x) * x + 1), one);
}

TEST(Binary, InPlaceSourcesThatOverlapTheDestination) {
  // each source is read as it was before the write began (PyTorch refuses these; strata copies
  // the source first)
  auto v = [](std::vector<float> x, Shape s) { return from_vector<float>(x, s); };
  Tensor a = v({2, 4, 6, 8}, {2, 2});
  a.div_(a.slice(1, 0, 1));  // each row by its first column
  EXPECT_TRUE(all_close(a, {1, 2, 1, 8.0 / 6.0}, 1e-7, 0));
  Tensor b = v({1, 2, 3, 4}, {2, 2});
  b.add_(b.select(0, 0));
  EXPECT_TRUE(all_close(b, {2, 4, 4, 6}, 0, 0));
  Tensor c = v({1, 2, 3, 4}, {2, 2});
  c.copy_(c.t());
  EXPECT_TRUE(all_close(c, {1, 3, 2, 4}, 0, 0));
  Tensor d = v({1, 2, 3, 4}, {4});
  d.slice(0, 1, 4).add_(d.slice(0, 0, 3));
  EXPECT_TRUE(all_close(d, {1, 3, 5, 7}, 0, 0));
  Tensor e = v({1, 2, 3, 4}, {2, 2});
  e.add_(e.t());
  EXPECT_TRUE(all_close(e, {2, 5, 5, 8}, 0, 0));
  Tensor f = v({1, 2, 3, 4}, {4});
  f.mul_(f);  // the same view: each element read just before it is written
  EXPECT_TRUE(all_close(f, {1, 4, 9, 16}, 0, 0));
  Tensor g = v({1, 2, 3, 4}, {4});
  g.slice(0, 2, 4).sub_(g.slice(0, 0, 2));  // disjoint parts of one storage
  EXPECT_TRUE(all_close(g, {1, 2, 2, 2}, 0, 0));
  Tensor h = v({1, 2, 3, 4}, {4});
  h.copy_(h);  // onto itself: nothing to do
  EXPECT_TRUE(all_close(h, {1, 2, 3, 4}, 0, 0));
  // an integer tensor cannot take a NaN bound in place
  Tensor i = from_vector<int64_t>({1, 5});
  EXPECT_THROW(i.clamp_(NAN, 3), Error);
  EXPECT_EQ(values(i), (std::vector<double>{1, 5}));
}

TEST(Binary, HalfScalarsThe16BitTypeCannotHold) {
  // a scalar that would overflow to inf, vanish to 0 or lose its bits among the subnormals of
  // float16/bfloat16 is used in float32 and the result rounded once, as PyTorch's kernels do
  const std::vector<float> xs = {60000, 1000, 1, 0.1f, -3.5f, 123.25f};
  for (DType t : {kFloat16, kBFloat16}) {
    Tensor h = from_vector<float>(xs).to(t);
    const std::vector<double> hv = values(h);
    const std::vector<double> scalars = t == kFloat16 ? std::vector<double>{100000.0, 1e-8, 3e-7, 2.0}
                                                      : std::vector<double>{1e39, 1e-42, 2.0};
    for (double s : scalars) {
      std::vector<float> mul_ref, div_ref, sub_ref, rdiv_ref;
      for (double x : hv) {
        mul_ref.push_back(static_cast<float>(x) * static_cast<float>(s));
        div_ref.push_back(static_cast<float>(x) / static_cast<float>(s));
        sub_ref.push_back(static_cast<float>(x) - static_cast<float>(s));
        rdiv_ref.push_back(static_cast<float>(s) / static_cast<float>(x));
      }
      auto rounded = [&](const std::vector<float>& r) { return values(from_vector<float>(r).to(t)); };
      EXPECT_EQ(values(h * s), rounded(mul_ref)) << s;
      EXPECT_EQ(values(h / s), rounded(div_ref)) << s;
      EXPECT_EQ(values(h - s), rounded(sub_ref)) << s;
      EXPECT_EQ(values(s / h), rounded(rdiv_ref)) << s;
      Tensor inplace = h.clone();
      inplace.mul_(s);
      EXPECT_EQ(inplace.dtype(), t);
      EXPECT_EQ(values(inplace), rounded(mul_ref)) << s;
    }
  }
  // 60000 / 1e5 is 0.6 (in float16), not 60000 / inf = 0
  EXPECT_NEAR((from_vector<float>({60000}).to(kFloat16) / 100000.0).item<double>(), 0.6, 1e-3);
}

TEST(Elementwise, PyTorchEdgeRules) {
  // integer pow below exponent 0: only 1 and -1 have integer powers; the rest truncate to 0
  Tensor base = from_vector<int64_t>({-3, -2, -1, 0, 1, 2, 3});
  EXPECT_EQ(values(pow(base, full({7}, int64_t(-1), kInt64))), (std::vector<double>{0, 0, -1, 0, 1, 0, 0}));
  EXPECT_EQ(values(pow(base, full({7}, int64_t(-2), kInt64))), (std::vector<double>{0, 0, 1, 0, 1, 0, 0}));
  // clamp is min(max(x, lo), hi): lo > hi gives hi everywhere; a NaN bound gives NaN
  Tensor x = from_vector<float>({-2, -0.5f, 0, 0.5f, 2, INFINITY});
  EXPECT_EQ(values(clamp(x, 3, 1)), (std::vector<double>(6, 1.0)));
  EXPECT_EQ(values(clamp(from_vector<int64_t>({-5, -1, 0, 1, 5}), 3, 1)), (std::vector<double>(5, 1.0)));
  for (double got : values(clamp(from_vector<float>({1, 2}), NAN, std::nullopt))) EXPECT_TRUE(std::isnan(got));
  for (double got : values(clamp(from_vector<float>({1, 2}), 0, NAN))) EXPECT_TRUE(std::isnan(got));
  // -0.0 inside the bounds keeps its sign; int64 past 2^53 compares with integer bounds exactly
  // (in double, 2^53 + 1 and 2^53 are one value), and a bound outside a small type saturates
  EXPECT_TRUE(std::signbit(clamp(from_vector<float>({-0.0f}), -1, 1).item<double>()));
  const int64_t two53 = int64_t(1) << 53, odd = two53 + 1;
  Tensor wide = clamp(from_vector<int64_t>({odd, -odd, 7, two53 + 3}), -two53, two53 + 1);
  const int64_t* w = wide.data_ptr<int64_t>();
  EXPECT_EQ(w[0], odd);
  EXPECT_EQ(w[1], -two53);
  EXPECT_EQ(w[2], 7);
  EXPECT_EQ(w[3], two53 + 1);
  EXPECT_EQ(clamp(from_vector<int64_t>({odd}), std::nullopt, two53).data_ptr<int64_t>()[0], two53);
  Tensor small = from_vector<int64_t>({-100, 5, 100}).to(kInt8);
  EXPECT_EQ(values(clamp(small, -300, 300)), (std::vector<double>{-100, 5, 100}));
  EXPECT_EQ(values(clamp(small, 300, std::nullopt)), (std::vector<double>{127, 127, 127}));
  // an integer bound past an integer type's range saturates to it in place; a float bound would
  // make the result floating, which clamp_ refuses, as add_ and PyTorch do
  Tensor i32 = from_vector<int64_t>({-5, 0, 5}).to(kInt32);
  EXPECT_EQ(values(i32.clone().clamp_(int64_t(1) << 40, std::nullopt)), (std::vector<double>(3, 2147483647.0)));
  EXPECT_EQ(values(i32.clone().clamp_(std::nullopt, -(int64_t(1) << 40))), (std::vector<double>(3, -2147483648.0)));
  EXPECT_TRUE(throws_with([&] { i32.clamp_(1.5, std::nullopt); }, {"[clamp_]", "floating bound", "int32"}));
  EXPECT_EQ(values(i32), (std::vector<double>{-5, 0, 5}));
  EXPECT_EQ(values(clamp(i32, 1e10, std::nullopt)), (std::vector<double>(3, 1e10)));
  // an integer exponent past 2^53 is exact (2^63 - 1 is odd; as a double it would be 2^63), and
  // the powers wrap as Python's pow(x, 2**63 - 1, 2**64) does
  Tensor wrapped = pow(from_vector<int64_t>({1, -1, 0, 2, 3}), INT64_MAX);
  ASSERT_EQ(wrapped.dtype(), kInt64);
  const int64_t* pw = wrapped.data_ptr<int64_t>();
  EXPECT_EQ(std::vector<int64_t>(pw, pw + 5), (std::vector<int64_t>{1, -1, 0, 0, -6148914691236517205}));
  Tensor in_place = from_vector<int64_t>({odd, -odd});
  in_place.clamp_(-two53, two53);
  EXPECT_EQ(in_place.data_ptr<int64_t>()[0], two53);
  EXPECT_EQ(in_place.data_ptr<int64_t>()[1], -two53);
  // PyTorch's special float exponents are products and roots: against float64 pow within 2
  // ulps, and pow(-0.0, 0.5) is sqrt's -0.0
  Tensor pos = from_vector<float>({0.1f, 0.7f, 1.0f, 3.5f, 1e3f, 1e-3f});
  for (double e : {2.0, 3.0, 0.5, -0.5, -1.0, -2.0}) {
    std::vector<double> got = values(pow(pos, e)), in = values(pos);
    for (size_t i = 0; i < in.size(); ++i) {
      const double want = std::pow(in[i], e);
      EXPECT_NEAR(got[i], want, 2.5e-7 * std::fabs(want)) << "x " << in[i] << " e " << e;
    }
  }
  EXPECT_TRUE(std::signbit(pow(from_vector<float>({-0.0f}), 0.5).item<double>()));
  // leaky_relu (its slope now read outside the select)
  EXPECT_EQ(values(leaky_relu(from_vector<float>({-2, 0, 3}), 0.25)), (std::vector<double>{-0.5, 0, 3}));
  // relu keeps NaN; abs clears the sign of -0.0
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    EXPECT_TRUE(std::isnan(relu(from_vector<float>({NAN}).to(t)).item<double>()));
    EXPECT_FALSE(std::signbit(abs(from_vector<float>({-0.0f}).to(t)).item<double>())) << fmt::format("{}", t);
  }
  EXPECT_EQ(rsqrt(abs(from_vector<float>({-0.0f}))).item<double>(), INFINITY);
  // isclose on integers compares them exactly
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_FALSE(isclose(from_vector<int64_t>({big}), from_vector<int64_t>({big - 1}), 0, 0).item<bool>());
  EXPECT_TRUE(isclose(from_vector<int64_t>({big}), from_vector<int64_t>({big - 1}), 0, 1).item<bool>());
  EXPECT_FALSE(isclose(from_vector<int64_t>({big}), from_vector<int64_t>({-big}), 0, 1e18).item<bool>());
}
