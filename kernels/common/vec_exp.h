// exp, tanh, erf and log for float, written without branches or table lookups, so that a loop
// of them compiles to SIMD (glibc's expf, tanhf, erff and logf are scalar calls; the sine and
// cosine are in vec_trig.h). exp is Cephes' method: x = n ln2 + r with |r| <= ln2 / 2, e^r
// from a degree-7 polynomial, then scaled by 2^n through the exponent bits. Relative error is
// within 2 ulp over the whole range; overflow gives inf, underflow goes through the subnormals
// to 0, and NaN stays NaN. Doubles use the library functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "half.h"
#include "host_device.h"

namespace strata::math {

STRATA_HOST_DEVICE float vec_exp(float x) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln2 = hi + lo, hi exact in 8 bits
  // keeps n in int range; NaN takes -104 here (its conversion to int would be undefined) and
  // comes back as NaN at the end
  float xc = x >= -104.0f ? x : -104.0f;
  xc = xc > 89.0f ? 89.0f : xc;
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

// tanh: Cephes' odd polynomial below |x| = 0.625, where 1 - 2 / (e^2|x| + 1) would lose
// relative precision, and that formula above it (exact +-1 past |x| = 9.01, where float tanh rounds to it).
// Both branches are computed and one is selected, so the loop stays branch-free. Within 3 ulp.
STRATA_HOST_DEVICE float vec_tanh(float x) {
  const float a = x < 0.0f ? -x : x;
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = x * (1.0f + p * z);  // keeps the sign of -0
  const float e = vec_exp(2.0f * (a < 20.0f ? a : 20.0f));
  float large = 1.0f - 2.0f / (e + 1.0f);
  large = x < 0.0f ? -large : large;
  const float y = a < 0.625f ? small : large;
  return x != x ? x : y;
}

// erf: x R(x^2) with R a rational function of degree 5 over 5, fitted for the least relative
// error on |x| <= 4 (2.5e-8, scripts/fit-erf.py) and evaluated in double: the float result is
// within 0.92 ulp of erf (every third float checked). x is clamped to +-4 first, where erf
// rounds to +-1 in float (so does 4 R(16)): infinities need no case of their own, and NaN
// passes the comparison unchanged. One division and no exp.
// Written so that gcc if-converts it under trapping math: a select with a constant arm before
// the polynomial (x > 4 ? 4 : x, or x clamped in float) makes gcc fold that arm and compute
// the rest under a branch, and a loop with a branch does not vectorize; copysign(4, x) is an
// arm it does not fold. This clamp replaced one of z to 16 followed by clamps of the result to
// [-1, 1] and two cases for the infinities: the same floats bit for bit, in less time
// (docs/performance.md, 2026-12-07).
STRATA_HOST_DEVICE float vec_erf(float xf) {
  const double x0 = xf;
  const double x = std::fabs(x0) > 4.0 ? std::copysign(4.0, x0) : x0;
  const double z = x * x;  // exact
  double p = 1.98682019587157008e-06;
  p = p * z + 2.84557998469644698e-04;
  p = p * z + 3.88304556363847303e-03;
  p = p * z + 5.31008287045428642e-02;
  p = p * z + 1.93538264104332669e-01;
  p = p * z + 1.12837913960372838e+00;
  double q = 3.74201510729315126e-05;
  q = q * z + 1.18549637779295520e-03;
  q = q * z + 1.52066575676635951e-02;
  q = q * z + 1.15347171864037895e-01;
  q = q * z + 5.04851379047685178e-01;
  q = q * z + 1.0;
  return static_cast<float>(x * (p / q));  // keeps the sign of -0; NaN stays NaN
}

// log: x = 2^e m with m in [sqrt(1/2), sqrt(2)), log(m) = f - f^2 / 2 + f^3 P(f) for f = m - 1
// with Cephes' degree-8 P, and e ln2 added in two parts (ln2 = hi + lo, hi exact in 8 bits) so
// that it costs no precision. Subnormals are scaled by 2^24 first. log(0) = -inf, log of a
// negative number NaN, log(inf) = inf. Within 1 ulp.
STRATA_HOST_DEVICE float vec_log(float x) {
  // selects of floats only: gcc 12 does not if-convert the loop when some are of integers
  const bool subnormal = x < 1.17549435e-38f;  // also 0 and the negatives, replaced below
  const uint32_t bits = halfbits::f32_bits(x * (subnormal ? 16777216.0f : 1.0f));
  float m = halfbits::bits_f32((bits & 0x007fffffu) | 0x3f800000u);  // in [1, 2)
  const bool upper = m > 1.41421356237309505f;
  m = m * (upper ? 0.5f : 1.0f);
  const float fe = static_cast<float>(static_cast<int32_t>(bits >> 23)) - (subnormal ? 151.0f : 127.0f) +
                   (upper ? 1.0f : 0.0f);
  const float f = m - 1.0f, z = f * f;
  float p = 7.0376836292e-2f;
  p = p * f - 1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f - 1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  float y = f * z * p - 2.12194440e-4f * fe;
  y = y - 0.5f * z;
  y = (f + y) + 0.693359375f * fe;
  y = x == INFINITY ? x : y;
  y = x == 0.0f ? -INFINITY : y;
  y = x < 0.0f ? NAN : y;
  return x != x ? x : y;
}

// What the per-element functors call: the SIMD-friendly forms for float on the host, the
// library functions for double and on the device (CUDA's expf and tanhf are fast there).
template <class T>
STRATA_HOST_DEVICE T fast_exp(T x) {
#if defined(__CUDA_ARCH__)
  return std::exp(x);
#else
  if constexpr (std::is_same_v<T, float>) return vec_exp(x);
  else return std::exp(x);
#endif
}
template <class T>
STRATA_HOST_DEVICE T fast_erf(T x) {
#if defined(__CUDA_ARCH__)
  return std::erf(x);
#else
  if constexpr (std::is_same_v<T, float>) return vec_erf(x);
  else return std::erf(x);
#endif
}
template <class T>
STRATA_HOST_DEVICE T fast_log(T x) {
#if defined(__CUDA_ARCH__)
  return std::log(x);
#else
  if constexpr (std::is_same_v<T, float>) return vec_log(x);
  else return std::log(x);
#endif
}
template <class T>
STRATA_HOST_DEVICE T fast_tanh(T x) {
#if defined(__CUDA_ARCH__)
  return std::tanh(x);
#else
  if constexpr (std::is_same_v<T, float>) return vec_tanh(x);
  else return std::tanh(x);
#endif
}

}  // namespace strata::math
