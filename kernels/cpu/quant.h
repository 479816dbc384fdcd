// CPU loops of affine quantization over contiguous memory, with the per-element math of
// kernels/common/quant_affine.h. A tensor is seen as (outer, channels, inner) with one scale and
// zero point per channel: per-tensor quantization is channels = 1, per-channel along an axis
// puts that axis in the middle. The integer GEMMs are in kernels/cpu/qgemm.h.
#pragma once

#include <cfloat>
#include <cstdint>
#include <cstring>

#include "../common/im2col.h"
#include "../common/quant_affine.h"
#include "parallel.h"

namespace strata::cpu::quant {

using qmath::ChannelLayout;

/// f(c, begin, end) over runs of elements of one channel, the elements split evenly among the
/// threads (a per-tensor layout is one long run, which rows alone would leave to one thread).
template <class F>
void for_each_channel_run(ChannelLayout l, const F& f) {
  parallel_for(0, l.outer * l.channels * l.inner, kDefaultGrain, [&](int64_t b, int64_t e) {
    while (b < e) {
      const int64_t row = b / l.inner, end = std::min(e, (row + 1) * l.inner);
      f(row % l.channels, b, end);
      b = end;
    }
  });
}

template <class Q>
void quantize_affine(const float* x, Q* q, ChannelLayout l, const float* scale, const int32_t* zero_point, int32_t qmin,
                     int32_t qmax) {
  for_each_channel_run(l, [&](int64_t c, int64_t b, int64_t e) {
    // locals, not the captures: the stores through q could alias those, which stops vectorization
    const float inv = 1.0f / scale[c];
    const int32_t z = zero_point[c], lo = qmin, hi = qmax;
    const float* xs = x;
    Q* qs = q;
    for (int64_t i = b; i < e; ++i) qs[i] = static_cast<Q>(qmath::quantize_value(xs[i], inv, z, lo, hi));
  });
}

template <class Q>
void dequantize_affine(const Q* q, float* x, ChannelLayout l, const float* scale, const int32_t* zero_point) {
  for_each_channel_run(l, [&](int64_t c, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] = qmath::dequantize_value(q[i], scale[c], zero_point[c]);
  });
}

/// out = fake_quantize(x); mask[i] = 1 where the gradient passes (straight-through estimator).
/// mask may be null (a forward without gradient, as the static int8 layers' requantization).
inline void fake_quantize(const float* x, float* out, uint8_t* mask, ChannelLayout l, const float* scale,
                          const int32_t* zero_point, int32_t qmin, int32_t qmax) {
  for_each_channel_run(l, [&](int64_t c, int64_t b, int64_t e) {
    const float s = scale[c], inv = 1.0f / s;
    const int32_t z = zero_point[c], lo = qmin, hi = qmax;  // locals, as in quantize_affine
    const float* xs = x;
    float* os = out;
    uint8_t* ms = mask;
    bool in = false;
    if (ms == nullptr) {  // a loop of its own, so that both vectorize
      for (int64_t i = b; i < e; ++i) os[i] = qmath::fake_quantize_value(xs[i], s, inv, z, lo, hi, &in);
      return;
    }
    for (int64_t i = b; i < e; ++i) {
      os[i] = qmath::fake_quantize_value(xs[i], s, inv, z, lo, hi, &in);
      ms[i] = in;
    }
  });
}

/// Finite minimum and maximum of each channel (0 and 0 for a channel with none).
inline void channel_min_max(const float* x, ChannelLayout l, float* lo, float* hi) {
  for (int64_t c = 0; c < l.channels; ++c) {
    lo[c] = FLT_MAX;
    hi[c] = -FLT_MAX;
  }
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t c = 0; c < l.channels; ++c)
      qmath::finite_min_max(x + (o * l.channels + c) * l.inner, l.inner, 1, &lo[c], &hi[c]);
  for (int64_t c = 0; c < l.channels; ++c) qmath::settle_empty_range(&lo[c], &hi[c]);
}

/// Dynamic per-row quantization of activations (M, K) to uint8 [0, 255], affine: each row
/// gets the qparams of its finite range. A row holding NaN or inf gets a NaN scale, so its
/// outputs come out NaN rather than silently finite (Note [Non-finite values in quantization]).
template <class T>
void quantize_rows_uint8(const T* x, int64_t M, int64_t K, uint8_t* q, float* scale, int32_t* zero_point) {
  parallel_for(0, M, std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(K, 1)), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const T* row = x + m * K;
      float lo = FLT_MAX, hi = -FLT_MAX;
      qmath::finite_min_max(row, K, 1, &lo, &hi);
      bool finite = true;
      for (int64_t k = 0; k < K; ++k) {
        const float v = static_cast<float>(row[k]);
        finite &= v - v == 0.0f;
      }
      qmath::settle_empty_range(&lo, &hi);
      const qmath::QParams p = qmath::choose_qparams(lo, hi, 0, 255, false);
      const float inv = 1.0f / p.scale;
      for (int64_t k = 0; k < K; ++k)
        q[m * K + k] = static_cast<uint8_t>(qmath::quantize_value(static_cast<float>(row[k]), inv, p.zero_point,
                                                                  0, 255));
      scale[m] = finite ? p.scale : __builtin_nanf("");
      zero_point[m] = p.zero_point;
    }
  });
}

/// Group-wise int4 quantization of a weight (N, K): each run of `group` elements of a row gets
/// its own scale (and zero point when asymmetric; zero_point may be null when symmetric), and the
/// codes are packed two per byte into (N, K / 2).
inline void quantize_int4_groups(const float* w, int64_t N, int64_t K, int64_t group, bool symmetric, uint8_t* packed,
                                 float* scale, uint8_t* zero_point) {
  const int64_t groups = K / group;
  parallel_for(0, N * groups, 64, [&](int64_t b, int64_t e) {
    for (int64_t ng = b; ng < e; ++ng) {
      const int64_t at = (ng / groups) * K + (ng % groups) * group;
      int32_t zero = 0;
      scale[ng] = qmath::quantize_int4_group(w + at, group, symmetric, packed + at / 2, &zero);
      if (zero_point) zero_point[ng] = static_cast<uint8_t>(zero);
    }
  });
}

/// Row n of a packed int4 weight, dequantized into `out` (K floats). zero_point null: symmetric.
inline void dequantize_int4_row(const uint8_t* packed, const float* scale, const uint8_t* zero_point, int64_t n,
                                int64_t K, int64_t group, float* out) {
  const int64_t groups = K / group;
  const uint8_t* row = packed + n * K / 2;
  for (int64_t g = 0; g < groups; ++g) {
    const float s = scale[n * groups + g];
    const float z = static_cast<float>(zero_point ? zero_point[n * groups + g] : qmath::kInt4SymmetricZero);
    for (int64_t j = g * group / 2; j < (g + 1) * group / 2; ++j) {  // by byte: no per-element branch
      const uint8_t byte = row[j];
      out[2 * j] = (static_cast<float>(qmath::low_nibble(byte)) - z) * s;
      out[2 * j + 1] = (static_cast<float>(qmath::high_nibble(byte)) - z) * s;
    }
  }
}

/// cols (N * OH * OW, kh * kw * Cg) uint8 from the codes x (N, H, W, C): the int8 convolution's
/// im2col, taps outside the image reading `pad`. The same gather as qmath::im2col_code (which the
/// CUDA kernel runs per element), a run of Cg channels per tap.
inline void im2col_u8(const uint8_t* x, int64_t N, const qmath::Im2colShape& s, uint8_t pad, uint8_t* cols) {
  const int64_t K = s.cols();
  parallel_for(0, N * s.rows(), std::max<int64_t>(1, kDefaultGrain / std::max<int64_t>(K, 1)),
               [&](int64_t b, int64_t e) {
                 for (int64_t m = b; m < e; ++m) {
                   const int64_t ow = m % s.OW, oh = (m / s.OW) % s.OH, n = m / (s.OW * s.OH);
                   uint8_t* dst = cols + m * K;
                   for (int64_t i = 0; i < s.kh; ++i) {
                     const int64_t h = oh * s.sh - s.ph + i * s.dh;
                     for (int64_t j = 0; j < s.kw; ++j, dst += s.Cg) {
                       const int64_t w = ow * s.sw - s.pw + j * s.dw;
                       if (h < 0 || h >= s.H || w < 0 || w >= s.W) {
                         std::memset(dst, pad, static_cast<size_t>(s.Cg));
                       } else {
                         std::memcpy(dst, x + ((n * s.H + h) * s.W + w) * s.C + s.c0, static_cast<size_t>(s.Cg));
                       }
                     }
                   }
                 }
               });
}

}  // namespace strata::cpu::quant
