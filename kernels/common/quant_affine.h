// Affine integer quantization, per element, with PyTorch's arithmetic (quantize_val,
// dequantize_val, fake_quantize_per_tensor_affine and the observers' _calculate_qparams):
//
//   q = clamp(zero_point + round_half_even(x * (1 / scale)), qmin, qmax)
//   x' = (q - zero_point) * scale
//
// computed in float32 as PyTorch does, so the codes agree with it bit for bit.
//
// Note [Non-finite values in quantization]
// An integer code cannot hold NaN: quantize maps NaN to the zero point (it dequantizes to 0),
// +inf to qmax and -inf to qmin, as the clamp does for any large value. fake_quantize keeps
// NaN as NaN (its output is float, and a NaN loss should show a diverged run rather than hide
// it) and passes no gradient through it. Ranges (observers, dynamic activation scales, weight
// scales) are taken over the finite values only, so one inf does not make every scale inf.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "host_device.h"

namespace strata::qmath {

struct QParams {
  float scale;
  int32_t zero_point;
};

/// A tensor seen as (outer, channels, inner), one scale and zero point per channel: per-tensor
/// quantization is channels = 1; per-channel along an axis puts that axis in the middle.
struct ChannelLayout {
  int64_t outer, channels, inner;
};

/// The scale floor of PyTorch's observers: torch.finfo(torch.float32).eps.
inline constexpr float kScaleEps = FLT_EPSILON;

STRATA_HOST_DEVICE float clamp_code(float q, int32_t qmin, int32_t qmax) {
  q = q < static_cast<float>(qmin) ? static_cast<float>(qmin) : q;
  return q > static_cast<float>(qmax) ? static_cast<float>(qmax) : q;
}

/// zero_point + rint(x * inv_scale) in float, before clamping (PyTorch's order of rounding);
/// rintf rounds half to even in the default rounding mode, as std::nearbyint.
STRATA_HOST_DEVICE float unclamped_code(float x, float inv_scale, int32_t zero_point) {
  return static_cast<float>(zero_point) + rintf(x * inv_scale);
}

/// The code of x (see Note [Non-finite values in quantization]).
/// Selects rather than branches (here and in fake_quantize_value), so that loops over them vectorize.
STRATA_HOST_DEVICE int32_t quantize_value(float x, float inv_scale, int32_t zero_point, int32_t qmin,
                                          int32_t qmax) {
  const float code = clamp_code(unclamped_code(x, inv_scale, zero_point), qmin, qmax);
  return static_cast<int32_t>(x != x ? static_cast<float>(zero_point) : code);
}

STRATA_HOST_DEVICE float dequantize_value(int32_t q, float scale, int32_t zero_point) {
  return static_cast<float>(q - zero_point) * scale;
}

/// Fake quantization: the quantize-dequantize round trip in float. *in_range is the straight-
/// through mask of torch.fake_quantize_per_tensor_affine's backward: whether the unclamped code
/// lies in [qmin, qmax] (false for NaN, whose output stays NaN).
STRATA_HOST_DEVICE float fake_quantize_value(float x, float scale, float inv_scale, int32_t zero_point, int32_t qmin,
                                             int32_t qmax, bool* in_range) {
  const float q = unclamped_code(x, inv_scale, zero_point);
  *in_range = (q >= static_cast<float>(qmin)) & (q <= static_cast<float>(qmax));
  const float value = (clamp_code(q, qmin, qmax) - static_cast<float>(zero_point)) * scale;
  return x != x ? x : value;
}

/// Scale and zero point from an observed range, as PyTorch's ObserverBase._calculate_qparams:
/// the range is widened to hold 0 (so 0 is exactly representable by the integer zero point),
/// the scale has a floor of `eps`. Symmetric: scale = max|x| / ((qmax - qmin) / 2) and zero
/// point 0 for a signed range, the middle code for an unsigned one (128 for [0, 255], as
/// PyTorch's quint8, else (qmin + qmax) / 2). Affine: scale = (max - min) / (qmax - qmin),
/// zero point = qmin - round(min / scale), clamped to the range.
STRATA_HOST_DEVICE QParams choose_qparams(float min_val, float max_val, int32_t qmin, int32_t qmax, bool symmetric,
                                          float eps = kScaleEps) {
  const float min_neg = min_val < 0.0f ? min_val : 0.0f;
  const float max_pos = max_val > 0.0f ? max_val : 0.0f;
  QParams p{1.0f, 0};
  if (symmetric) {
    const float amax = -min_neg > max_pos ? -min_neg : max_pos;
    p.scale = amax / (static_cast<float>(qmax - qmin) / 2.0f);
    p.scale = p.scale > eps ? p.scale : eps;
    if (qmin >= 0) p.zero_point = (qmin == 0 && qmax == 255) ? 128 : (qmin + qmax) / 2;
  } else {
    // max_pos - min_neg overflows for a range spanning most of float32's (a scale of inf, NaN
    // dequantized); the difference of the quotients does not
    const float span = max_pos - min_neg, levels = static_cast<float>(qmax - qmin);
    p.scale = span - span == 0.0f ? span / levels : max_pos / levels - min_neg / levels;
    p.scale = p.scale > eps ? p.scale : eps;
    p.zero_point = static_cast<int32_t>(clamp_code(static_cast<float>(qmin) - rintf(min_neg / p.scale), qmin, qmax));
  }
  return p;
}

/// Finite minimum and maximum of n values, folded into *lo and *hi (callers start them at
/// +FLT_MAX and -FLT_MAX; both stay there when no value is finite).
template <class T>
STRATA_HOST_DEVICE void finite_min_max(const T* x, int64_t n, int64_t stride, float* lo, float* hi) {
  float mn = *lo, mx = *hi;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(x[i * stride]);
    if (v - v != 0.0f) continue;  // NaN or inf
    mn = v < mn ? v : mn;
    mx = v > mx ? v : mx;
  }
  *lo = mn;
  *hi = mx;
}

/// A range with no finite value (every element NaN or inf, or none at all) is taken as [0, 0].
STRATA_HOST_DEVICE void settle_empty_range(float* lo, float* hi) {
  if (*lo > *hi) *lo = *hi = 0.0f;
}

// ---- int4: two 4-bit codes per byte ------------------------------------------------------------
// Codes are unsigned nibbles u in [0, 15] with the value (u - zero_point) * scale. Element 2j of
// a row sits in the low nibble of byte j, element 2j + 1 in the high nibble. A symmetric group
// quantizes in [-8, 7] with zero point 0 and stores u = q + 8, so it reads as zero point 8.

inline constexpr int32_t kInt4SymmetricZero = 8;

STRATA_HOST_DEVICE uint8_t pack_nibbles(int32_t even, int32_t odd) {
  return static_cast<uint8_t>((even & 0xF) | ((odd & 0xF) << 4));
}
STRATA_HOST_DEVICE int32_t low_nibble(uint8_t b) { return b & 0xF; }
STRATA_HOST_DEVICE int32_t high_nibble(uint8_t b) { return b >> 4; }

/// Quantizes one group of `group` (even) values to packed int4 codes (group / 2 bytes) and
/// returns its scale; *zero_point gets the stored zero code (8 when symmetric).
STRATA_HOST_DEVICE float quantize_int4_group(const float* src, int64_t group, bool symmetric, uint8_t* dst,
                                             int32_t* zero_point) {
  float lo = FLT_MAX, hi = -FLT_MAX;
  finite_min_max(src, group, 1, &lo, &hi);
  settle_empty_range(&lo, &hi);
  const int32_t qmin = symmetric ? -8 : 0, qmax = symmetric ? 7 : 15;
  const QParams p = choose_qparams(lo, hi, qmin, qmax, symmetric);
  const int32_t shift = symmetric ? kInt4SymmetricZero : 0;
  const float inv = 1.0f / p.scale;
  for (int64_t k = 0; k < group; k += 2)
    dst[k / 2] = pack_nibbles(quantize_value(src[k], inv, p.zero_point, qmin, qmax) + shift,
                              quantize_value(src[k + 1], inv, p.zero_point, qmin, qmax) + shift);
  *zero_point = p.zero_point + shift;
  return p.scale;
}

/// Element k of a packed int4 row, dequantized with its group's scale and zero code.
STRATA_HOST_DEVICE float int4_value(const uint8_t* row, int64_t k, float scale, float zero) {
  const uint8_t byte = row[k / 2];
  return (static_cast<float>((k & 1) ? high_nibble(byte) : low_nibble(byte)) - zero) * scale;
}

}  // namespace strata::qmath
