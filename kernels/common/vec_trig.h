// Sine and cosine written without branches or table lookups, so that a loop of them compiles
// to SIMD (glibc's sinf and cosf are scalar calls): the argument is reduced to t in
// [-pi / 4, pi / 4] and a quadrant, Cephes' sine and cosine polynomials give sin t and cos t,
// and the quadrant swaps and negates them.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "host_device.h"

namespace strata::math {

// sin and cos of the angle quadrant * pi / 2 + t for |t| <= pi / 4, evaluated in T (the
// quadrant an integer as wide as T: the vectorizer turns the selects into blends only then).
template <class T, class Q>
STRATA_HOST_DEVICE void sincos_of_quadrant(T t, Q quadrant, T& sine, T& cosine) {
  const T z = t * t;
  T s = T(-1.9515295891e-4);
  s = s * z + T(8.3321608736e-3);
  s = s * z - T(1.6666654611e-1);
  // t (1 + z s) keeps the sign of t = -0, which t + t z s loses; in float its rounding would
  // cost up to half an ulp, so float keeps the sum
  if constexpr (sizeof(T) == 8) s = t * (T(1) + z * s);
  else s = s * z * t + t;
  T c = T(2.443315711809948e-5);
  c = c * z - T(1.388731625493765e-3);
  c = c * z + T(4.166664568298827e-2);
  c = c * z * z - T(0.5) * z + T(1);
  const T sv = quadrant & 1 ? c : s, cv = quadrant & 1 ? s : c;
  sine = quadrant & 2 ? -sv : sv;
  cosine = (quadrant + 1) & 2 ? -cv : cv;
}

// sin(2 pi u) and cos(2 pi u) for |u| < 2^20, the angle of a Box-Muller pair. Subtracting the
// nearest quarter turn q / 4 from u is exact, which leaves t = 2 pi (u - q / 4) in
// [-pi / 4, pi / 4]. Within 2 ulp; more accurate than sinf(2 pi u), whose argument is rounded.
STRATA_HOST_DEVICE void vec_sincos_turns(float u, float& sine, float& cosine) {
  const float kRound = 12582912.0f;  // 1.5 * 2^23: adding and removing it rounds to an integer
  const float q = (4.0f * u + kRound) - kRound;
  const float t = 6.28318530717958647692f * (u - 0.25f * q);
  sincos_of_quadrant(t, static_cast<int32_t>(q), sine, cosine);
}

// sin x and cos x in radians, exact enough for |x| < kVecTrigLimit = 2^20 (callers take
// std::sin and std::cos beyond, where the reduction needs more bits of pi). x = q pi / 2 + t
// in double with pi / 2 split as in fdlibm: p1, its first 33 bits, so that q p1 and x - q p1
// are exact for |q| < 2^20, and p1t = pi / 2 - p1. The polynomials run in double on t and
// round once to float: within 1 ulp of the correctly rounded value. NaN and inf give NaN.
// Host only: CUDA's sinf and cosf are fast on the device.
inline constexpr float kVecTrigLimit = 1048576.0f;

inline __attribute__((always_inline)) void vec_sincos(float x, float& sine, float& cosine) {
  const double kRound = 6755399441055744.0;  // 1.5 * 2^52: adding and removing it rounds to an integer
  const double shifted = static_cast<double>(x) * 0.63661977236758134308 + kRound;
  const double q = shifted - kRound;
  const double t = (static_cast<double>(x) - q * 1.57079632673412561417) - q * 6.07710050650619224932e-11;
  // the low bits of shifted hold q as an integer (also for NaN and inf, where any quadrant does)
  int64_t shifted_bits;
  std::memcpy(&shifted_bits, &shifted, sizeof shifted_bits);
  double s, c;
  sincos_of_quadrant(t, shifted_bits, s, c);
  sine = static_cast<float>(s);
  cosine = static_cast<float>(c);
}
inline __attribute__((always_inline)) float vec_sin(float x) {
  float s, c;
  vec_sincos(x, s, c);
  return s;
}
inline __attribute__((always_inline)) float vec_cos(float x) {
  float s, c;
  vec_sincos(x, s, c);
  return c;
}

}  // namespace strata::math
