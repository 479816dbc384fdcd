// Output sizes of sliding windows along one dim, shared by the 2-d and 3-d convolutions and
// pooling ops (nn/conv.cpp, nn/pooling.cpp, nn/conv3d.cpp, nn/pooling3d.cpp).
#pragma once

#include <cstdint>

namespace strata::nn::detail {

// Largest output size of a convolution over `in` (with both paddings), or 0 when the dilated
// kernel does not fit.
inline int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  const int64_t span = in + 2 * p - d * (k - 1) - 1;
  return span < 0 ? 0 : span / s + 1;
}

// Output size of a transposed convolution (its output_padding `extra` added on the far side).
inline int64_t conv_transpose_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, int64_t extra) {
  return (in - 1) * s - 2 * p + d * (k - 1) + extra + 1;
}

inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// PyTorch's pooling_output_shape: with ceil_mode the last window must start inside the
// input or its left padding.
inline int64_t pool_out(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, bool ceil_mode) {
  int64_t out = floor_div(in + 2 * pad - dil * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0), stride) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

// Whether every one of the out windows along one dimension has a tap inside the input: with
// dilation, a padded window's taps can all miss it, leaving a maximum of -inf whose index
// names no element (PyTorch's backward then adds its gradient to a neighbour).
inline bool every_window_has_a_tap(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, int64_t out) {
  for (int64_t o = 0; o < out; ++o) {
    const int64_t start = o * stride - pad;
    const int64_t first = start < 0 ? (-start + dil - 1) / dil : 0;  // the first tap at or past 0
    if (first >= k || start + first * dil >= in) return false;
  }
  return true;
}

}  // namespace strata::nn::detail
