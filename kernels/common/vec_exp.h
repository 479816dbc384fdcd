// exp for float written without branches or table lookups, so that a loop of it compiles to
// SIMD (glibc's expf is a scalar call). Cephes' method: x = n ln2 + r with |r| <= ln2 / 2,
// e^r from a degree-7 polynomial, then scaled by 2^n through the exponent bits. Relative
// error is within 2 ulp over the whole range; overflow gives inf, underflow goes through the
// subnormals to 0, and NaN stays NaN. Doubles use std::exp.
#pragma once

#include <cmath>
#include <cstdint>

#include "half.h"
#include "host_device.h"

namespace strata::math {

STRATA_HOST_DEVICE float vec_exp(float x) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln2 = hi + lo, hi exact in 8 bits
  float xc = x < -104.0f ? -104.0f : x > 89.0f ? 89.0f : x;     // keeps n in int range
  // round to nearest by adding and removing 1.5 * 2^23 (floorf does not vectorise)
  const float kRound = 12582912.0f;
  float n = (xc * kLog2e + kRound) - kRound;
  float r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n as two normal powers of two, so that n < -126 reaches the subnormals
  int32_t ni = static_cast<int32_t>(n);
  int32_t n1 = ni / 2, n2 = ni - n1;
  float s1 = halfbits::bits_f32(static_cast<uint32_t>(n1 + 127) << 23);
  float s2 = halfbits::bits_f32(static_cast<uint32_t>(n2 + 127) << 23);
  float y = p * s1 * s2;
  y = x > 88.72283935546875f ? INFINITY : y;
  y = x < -103.972084045410f ? 0.0f : y;
  return x != x ? x : y;
}

STRATA_HOST_DEVICE double vec_exp(double x) { return std::exp(x); }

}  // namespace strata::math
