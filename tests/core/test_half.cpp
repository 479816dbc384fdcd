// float16 and bfloat16 conversions on all 65,536 bit patterns, against float64 references
// of IEEE round-to-nearest-even.
#include <cmath>
#include <cstring>

#include "testing.h"

using namespace strata;

namespace {

double f16_value(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  double v;
  if (exp == 31) v = mant ? NAN : INFINITY;
  else if (exp == 0) v = std::ldexp(mant, -24);
  else v = std::ldexp(1024 + mant, exp - 25);
  return sign ? -v : v;
}

double bf16_value(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Nearest representable value with ties to even, by search over all finite patterns of
// the same sign: an independent reference for the bit-twiddling conversions.
template <class ValueOf>
uint16_t nearest_even(double x, ValueOf value_of, uint16_t inf_bits, double max_finite, double overflow_at) {
  uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  double a = std::fabs(x);
  if (a >= overflow_at) return sign | inf_bits;
  // binary search on the monotone positive patterns [0, inf_bits)
  uint16_t lo = 0, hi = static_cast<uint16_t>(inf_bits - 1);
  while (lo < hi) {
    uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (value_of(mid) <= a) lo = mid; else hi = static_cast<uint16_t>(mid - 1);
  }
  uint16_t best = lo;
  if (value_of(lo) != a && lo + 1 <= inf_bits) {
    double below = value_of(lo);
    double above = lo + 1 == inf_bits ? max_finite * 2 : value_of(static_cast<uint16_t>(lo + 1));
    double db = a - below, da = above - a;
    if (da < db || (da == db && ((lo + 1) & 1) == 0)) best = static_cast<uint16_t>(lo + 1);
  }
  return sign | best;
}

}  // namespace

TEST(Half, AllPatternsToFloat) {
  for (uint32_t b = 0; b < 65536; ++b) {
    double want = f16_value(static_cast<uint16_t>(b));
    float got = Half::from_bits(static_cast<uint16_t>(b));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << b;
      // NaN -> float -> half keeps it a NaN
      ASSERT_EQ(Half(got).bits & 0x7c00, 0x7c00) << b;
      ASSERT_NE(Half(got).bits & 0x3ff, 0) << b;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << b;
      ASSERT_EQ(Half(got).bits, b) << "round trip of " << b;
    }
  }
}

TEST(Half, RoundsToNearestEven) {
  auto val = [](uint16_t h) { return f16_value(h); };
  // every midpoint between adjacent patterns, and points a quarter of the way around them
  for (uint32_t b = 0; b < 0x7c00; ++b) {
    double lo = f16_value(static_cast<uint16_t>(b));
    double hi = b + 1 < 0x7c00 ? f16_value(static_cast<uint16_t>(b + 1)) : 65536.0;
    for (double t : {0.25, 0.5, 0.75}) {
      float x = static_cast<float>(lo + (hi - lo) * t);
      uint16_t want = nearest_even(static_cast<double>(x), val, 0x7c00, 65504.0, 65520.0);
      ASSERT_EQ(Half(x).bits, want) << "x=" << x;
      ASSERT_EQ(Half(-x).bits, want | 0x8000) << "x=" << -x;
    }
  }
  EXPECT_EQ(Half(1e6f).bits, 0x7c00);
  EXPECT_EQ(Half(65519.99f).bits, 0x7bff);
  EXPECT_EQ(Half(65520.0f).bits, 0x7c00);
  EXPECT_EQ(Half(1e-9f).bits, 0);
  EXPECT_EQ(Half(-0.0f).bits, 0x8000);
}

// A sweep of float bit patterns of both signs (every 4099th: float subnormals, the float16
// subnormal range, normals, overflow, inf and NaN), against the same reference.
TEST(Half, FloatPatternSweep) {
  auto val = [](uint16_t h) { return f16_value(h); };
  for (uint64_t u = 0; u <= 0xffffffffu; u += 4099) {
    const uint32_t bits = static_cast<uint32_t>(u);
    float x;
    std::memcpy(&x, &bits, 4);
    const uint16_t got = Half(x).bits;
    if (std::isnan(x)) {
      // a quiet NaN with the top ten payload bits kept, as the hardware conversions give
      ASSERT_EQ(got, ((bits >> 16) & 0x8000) | 0x7e00 | ((bits >> 13) & 0x3ff)) << std::hex << bits;
      continue;
    }
    ASSERT_EQ(got, nearest_even(static_cast<double>(x), val, 0x7c00, 65504.0, 65520.0)) << std::hex << bits;
  }
}

TEST(BFloat16, AllPatternsAndRounding) {
  for (uint32_t b = 0; b < 65536; ++b) {
    double want = bf16_value(static_cast<uint16_t>(b));
    float got = BFloat16::from_bits(static_cast<uint16_t>(b));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got));
      ASSERT_TRUE(std::isnan(static_cast<float>(BFloat16(got))));
      continue;
    }
    ASSERT_EQ(static_cast<double>(got), want);
    ASSERT_EQ(BFloat16(got).bits, b);
  }
  auto val = [](uint16_t h) { return bf16_value(h); };
  const double max_finite = bf16_value(0x7f7f);
  const double overflow_at = max_finite + (max_finite - bf16_value(0x7f7e)) / 2;
  for (uint32_t b = 0; b < 0x7f80; b += 3) {
    double lo = bf16_value(static_cast<uint16_t>(b)), hi = bf16_value(static_cast<uint16_t>(b + 1));
    for (double t : {0.25, 0.5, 0.75}) {
      float x = static_cast<float>(lo + (hi - lo) * t);
      if (!std::isfinite(x)) continue;
      ASSERT_EQ(BFloat16(x).bits, nearest_even(static_cast<double>(x), val, 0x7f80, max_finite, overflow_at))
          << "x=" << x;
    }
  }
}

TEST(Half, TensorCasts) {
  std::vector<float> xs;
  for (uint32_t b = 0; b < 65536; b += 7) {
    float f = Half::from_bits(static_cast<uint16_t>(b));
    if (std::isfinite(f)) xs.push_back(f);
  }
  Tensor t = from_vector<float>(xs);
  EXPECT_TRUE(strata::testing::all_close(t.to(kFloat16).to(kFloat32), strata::testing::values(t), 0, 0));
  EXPECT_TRUE(strata::testing::all_close(t.to(kFloat16).to(kFloat64), strata::testing::values(t), 0, 0));
}
