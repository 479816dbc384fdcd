// The branch-free float exp, tanh and erf of kernels/common/vec_exp.h, which the CPU kernels
// of exp, tanh, erf, sigmoid, silu, GELU and softmax run: their error in ulps against the float64
// library functions over a sweep of the whole useful range, and the special values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/common/vec_exp.h"

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

TEST(VecMath, ErfWithinFourUlps) {
  const Worst w = worst_ulps(1e-30f, 6.0f, [](float x) { return strata::math::vec_erf(x); },
                             [](double x) { return std::erf(x); });
  EXPECT_LE(w.ulps, 4.0) << "at x = " << w.at;
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
}
