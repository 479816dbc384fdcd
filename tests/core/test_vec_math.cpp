// The branch-free float exp, tanh, erf and log of kernels/common/vec_exp.h, which the CPU
// kernels of exp, tanh, erf, log, sigmoid, silu, GELU and softmax run, and the sine and cosine
// of kernels/common/vec_trig.h (of radians, behind sin and cos, and of a fraction of a turn,
// behind the normal draws): their error in ulps against the float64 library functions over a
// sweep of the whole useful range, and the special values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "kernels/common/unary_math.h"
#include "kernels/common/vec_exp.h"
#include "kernels/common/vec_trig.h"

namespace {

// Distance in float ulps at the reference value.
double ulps(float got, double want) {
  float w = static_cast<float>(want);
  if (w == 0.0f) return std::fabs(got) / std::numeric_limits<float>::denorm_min();
  double ulp = std::nextafter(std::fabs(w), std::numeric_limits<float>::infinity()) - std::fabs(w);
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

// Every 61st float bit pattern in [lo, hi] (positive and negative), about 2.5 million values.
template <class F>
void sweep(float lo, float hi, F check) {
  uint32_t a, b;
  std::memcpy(&a, &lo, 4);
  std::memcpy(&b, &hi, 4);
  for (uint32_t u = a; u <= b; u += 61) {
    float x;
    std::memcpy(&x, &u, 4);
    check(x);
    check(-x);
  }
}

// The largest error of f against the float64 ref over the sweep of [lo, hi], and where.
struct Worst {
  double ulps = 0;
  float at = 0;
};
template <class F, class Ref>
Worst worst_ulps(float lo, float hi, F f, Ref ref) {
  Worst w;
  sweep(lo, hi, [&](float x) {
    const double e = ulps(f(x), ref(double(x)));
    if (e > w.ulps) w = {e, x};
  });
  return w;
}

}  // namespace

TEST(VecMath, ExpWithinTwoUlps) {
  const Worst w = worst_ulps(1e-8f, 88.7f, [](float x) { return strata::math::vec_exp(x); },
                             [](double x) { return std::exp(x); });
  EXPECT_LE(w.ulps, 2.0) << "at x = " << w.at;
}

TEST(VecMath, TanhWithinThreeUlps) {
  const Worst w = worst_ulps(1e-30f, 20.0f, [](float x) { return strata::math::vec_tanh(x); },
                             [](double x) { return std::tanh(x); });
  EXPECT_LE(w.ulps, 3.0) << "at x = " << w.at;
}

TEST(VecMath, ErfWithinOneUlp) {
  const Worst w = worst_ulps(1e-30f, 6.0f, [](float x) { return strata::math::vec_erf(x); },
                             [](double x) { return std::erf(x); });
  EXPECT_LE(w.ulps, 1.0) << "at x = " << w.at;
}

// The exact GELU the CPU kernel runs, 0.5 x (1 + erf(x / sqrt 2)) in float: within 2 ulp of
// the float64 formula for positive x. Below 0, 1 + erf cancels as x falls (13 ulp at -2), as
// in any GELU written through erf.
TEST(VecMath, ExactGeluWithinTwoUlpsOfPositiveInputs) {
  Worst w;
  sweep(1e-30f, 6.0f, [&](float x) {
    if (x < 0.0f) return;
    const double e = ulps(strata::math::GeluErf{}(x), 0.5 * double(x) * (1.0 + std::erf(double(x) / std::sqrt(2.0))));
    if (e > w.ulps) w = {e, x};
  });
  EXPECT_LE(w.ulps, 2.0) << "at x = " << w.at;
}

TEST(VecMath, LogWithinOneUlp) {
  // positive floats only (the sweep's negatives give NaN, checked below), subnormals included
  Worst w;
  for (uint32_t u = 1; u < 0x7f800000u; u += 61) {
    float x;
    std::memcpy(&x, &u, 4);
    const double e = ulps(strata::math::vec_log(x), std::log(double(x)));
    if (e > w.ulps) w = {e, x};
  }
  EXPECT_LE(w.ulps, 1.0) << "at x = " << w.at;
}

// Radians up to the limit of the vectorized form, 2^20, where a float is 1/8 wide: every float
// there is within 0.57 ulp (an exhaustive check, too slow for a test, found 0.563).
TEST(VecMath, SinCosWithinOneUlp) {
  Worst ws, wc;
  sweep(1e-30f, std::nextafter(strata::math::kVecTrigLimit, 0.0f), [&](float x) {
    float s, c;
    strata::math::vec_sincos(x, s, c);
    const double es = ulps(s, std::sin(double(x))), ec = ulps(c, std::cos(double(x)));
    if (es > ws.ulps) ws = {es, x};
    if (ec > wc.ulps) wc = {ec, x};
  });
  EXPECT_LE(ws.ulps, 1.0) << "sine at x = " << ws.at;
  EXPECT_LE(wc.ulps, 1.0) << "cosine at x = " << wc.at;
  // the float nearest a multiple of pi / 2 keeps its sine's precision: the reduction is exact
  const float near_pi = 3.14159274f;
  EXPECT_LE(ulps(strata::math::vec_sin(near_pi), std::sin(double(near_pi))), 0.5);
  EXPECT_EQ(strata::math::vec_sin(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(strata::math::vec_sin(-0.0f)));
  EXPECT_EQ(strata::math::vec_cos(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(strata::math::vec_sin(std::numeric_limits<float>::infinity())));
  EXPECT_TRUE(std::isnan(strata::math::vec_cos(std::numeric_limits<float>::quiet_NaN())));
}

// sin(2 pi u) and cos(2 pi u) in float64, reduced to the nearest quarter turn first, so that
// they are exact at the quarter turns (sin(2 pi * 0.5) in float64 is 1.2e-16, not 0).
std::pair<double, double> sincos_turns_ref(double u) {
  const double q = std::nearbyint(4.0 * u), t = 6.283185307179586476925 * (u - 0.25 * q);
  const double s = std::sin(t), c = std::cos(t);
  switch (static_cast<int64_t>(q) & 3) {
    case 0: return {s, c};
    case 1: return {c, -s};
    case 2: return {-s, -c};
    default: return {-c, s};
  }
}

// Every uniform the Box-Muller angle can take (k / 2^24), and turns up to 2^20 either way.
TEST(VecMath, SinCosOfTurnsWithinTwoUlps) {
  Worst ws, wc;
  auto check = [&](float u) {
    float s, c;
    strata::math::vec_sincos_turns(u, s, c);
    const auto [rs, rc] = sincos_turns_ref(u);
    const double es = ulps(s, rs), ec = ulps(c, rc);
    if (es > ws.ulps) ws = {es, u};
    if (ec > wc.ulps) wc = {ec, u};
  };
  for (uint32_t k = 0; k < (1u << 24); ++k) check(static_cast<float>(k) * 5.9604644775390625e-8f);
  sweep(1e-30f, 1048575.0f, check);
  EXPECT_LE(ws.ulps, 2.0) << "sine at u = " << ws.at;
  EXPECT_LE(wc.ulps, 2.0) << "cosine at u = " << wc.at;
  // the quarter turns exactly (the cosine at +-1/4 turn is -0.0, which compares equal to 0)
  float s, c;
  strata::math::vec_sincos_turns(0.25f, s, c);
  EXPECT_EQ(s, 1.0f);
  EXPECT_EQ(c, 0.0f);
  strata::math::vec_sincos_turns(0.5f, s, c);
  EXPECT_EQ(s, 0.0f);
  EXPECT_EQ(c, -1.0f);
  strata::math::vec_sincos_turns(-0.25f, s, c);
  EXPECT_EQ(s, -1.0f);
  EXPECT_EQ(c, 0.0f);
}

TEST(VecMath, SpecialValues) {
  using strata::math::vec_exp;
  using strata::math::vec_tanh;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(vec_exp(0.0f), 1.0f);
  EXPECT_EQ(vec_exp(inf), inf);
  EXPECT_EQ(vec_exp(-inf), 0.0f);
  EXPECT_EQ(vec_exp(100.0f), inf);
  EXPECT_GT(vec_exp(-100.0f), 0.0f);  // a subnormal, not flushed to zero
  EXPECT_TRUE(std::isnan(vec_exp(nan)));
  EXPECT_EQ(vec_tanh(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(vec_tanh(-0.0f)));
  EXPECT_EQ(vec_tanh(inf), 1.0f);
  EXPECT_EQ(vec_tanh(-inf), -1.0f);
  EXPECT_EQ(vec_tanh(1e4f), 1.0f);
  EXPECT_TRUE(std::isnan(vec_tanh(nan)));
  EXPECT_EQ(vec_tanh(1e-30f), 1e-30f);
  using strata::math::vec_erf;
  EXPECT_EQ(vec_erf(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(vec_erf(-0.0f)));
  EXPECT_EQ(vec_erf(inf), 1.0f);
  EXPECT_EQ(vec_erf(-inf), -1.0f);
  EXPECT_EQ(vec_erf(5.0f), 1.0f);
  EXPECT_TRUE(std::isnan(vec_erf(nan)));
  using strata::math::vec_log;
  EXPECT_EQ(vec_log(1.0f), 0.0f);
  EXPECT_EQ(vec_log(0.0f), -inf);
  EXPECT_EQ(vec_log(-0.0f), -inf);
  EXPECT_EQ(vec_log(inf), inf);
  EXPECT_TRUE(std::isnan(vec_log(-1.0f)));
  EXPECT_TRUE(std::isnan(vec_log(-inf)));
  EXPECT_TRUE(std::isnan(vec_log(nan)));
  EXPECT_NEAR(vec_log(std::numeric_limits<float>::denorm_min()), std::log(double(std::numeric_limits<float>::denorm_min())),
              1e-5);
}
