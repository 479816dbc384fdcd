// Blockwise dynamic 8-bit quantization (Dettmers et al. 2021, "8-bit Optimizers via
// Block-wise Quantization"): a tensor is cut into blocks of `block` elements; each block keeps
// one fp32 scale, its absolute maximum, and each element one uint8 code, the index of the
// nearest value of x / absmax in a fixed 256-entry map.
//
// The map is the dynamic tree type of bitsandbytes' create_dynamic_map(): exponent e = 0..6
// covers the decade [10^(e-6) * 0.1, 10^(e-6)] with 2^e linearly spaced values (signed map,
// mirrored to negatives) or 2^(e+1) values (unsigned map), plus 0 and 1. Small magnitudes get
// fine steps and large ones coarse steps, which suits Adam's moments: the signed map holds the
// first moment, the unsigned map the second.
#pragma once

#include <cfloat>
#include <cstdint>

#include "host_device.h"

namespace strata::quant8 {

inline constexpr int kMapSize = 256;
inline constexpr int64_t kDefaultBlock = 2048;
inline constexpr int64_t kMaxBlock = 4096;  // block sizes above this are refused by callers

/// Fills `map` with the 256 ascending values of the signed ([-1, 1]) or unsigned ([0, 1])
/// dynamic map.
STRATA_HOST_DEVICE void build_dynamic_map(float* map, bool is_signed) {
  const double decade[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  int k = 0;
  map[k++] = 0.0f;
  map[k++] = 1.0f;
  for (int e = 0; e < 7; ++e) {
    int n = is_signed ? (1 << e) : (2 << e);
    double step = 0.9 / n;  // midpoints of linspace(0.1, 1, n + 1)
    for (int j = 0; j < n; ++j) {
      double v = decade[e] * (0.1 + (j + 0.5) * step);
      map[k++] = static_cast<float>(v);
      if (is_signed) map[k++] = static_cast<float>(-v);
    }
  }
  for (int i = 1; i < kMapSize; ++i) {  // insertion sort: 256 values, once
    float x = map[i];
    int j = i - 1;
    while (j >= 0 && map[j] > x) {
      map[j + 1] = map[j];
      --j;
    }
    map[j + 1] = x;
  }
}

/// Index of the map value nearest to x (x normalised to the map's range; values outside it
/// go to the end codes). Ties go to the lower code; NaN goes to the code of 0.
STRATA_HOST_DEVICE uint8_t quantize_nearest(const float* map, float x) {
  if (x != x) x = 0.0f;  // NaN: see block_absmax
  int lo = 0;  // largest index with map[lo] <= x (0 when x is below the map)
  for (int step = kMapSize / 2; step > 0; step >>= 1)  // lo + step never passes 255
    if (map[lo + step] <= x) lo += step;
  if (lo + 1 < kMapSize && map[lo + 1] - x < x - map[lo]) ++lo;
  return static_cast<uint8_t>(lo);
}

/// max |x| over the finite values of n values (0 when none is). A NaN or inf moment (from a
/// NaN or inf grad) taken as the scale would turn its whole block NaN on decoding; left out, it
/// is stored as 0 (NaN) or the block's end code (inf), and the damage stays in its element,
/// whose parameter the step has already made NaN, as fp32 Adam's.
template <class T>
STRATA_HOST_DEVICE float block_absmax(const T* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    float a = static_cast<float>(x[i] < 0 ? -x[i] : x[i]);
    if (a > m && a <= FLT_MAX) m = a;  // NaN fails both tests
  }
  return m;
}

/// codes[i] = nearest(x[i] / absmax); all zero codes' values when absmax is 0. A reciprocal
/// multiplies, unless absmax is so small (below 2^-128) that it would overflow to inf.
template <class T>
STRATA_HOST_DEVICE void quantize_block(const float* map, const T* x, int64_t n, float absmax, uint8_t* codes) {
  const float inv = absmax > 0 ? 1.0f / absmax : 0.0f;
  if (inv <= FLT_MAX) {
    for (int64_t i = 0; i < n; ++i) codes[i] = quantize_nearest(map, static_cast<float>(x[i]) * inv);
  } else {
    for (int64_t i = 0; i < n; ++i) codes[i] = quantize_nearest(map, static_cast<float>(x[i]) / absmax);
  }
}

template <class T>
STRATA_HOST_DEVICE void dequantize_block(const float* map, const uint8_t* codes, int64_t n, float absmax, T* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<T>(map[codes[i]] * absmax);
}

}  // namespace strata::quant8
