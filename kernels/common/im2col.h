// The im2col gather of the int8 convolution, per element, shared by the CPU loop
// (kernels/cpu/quant.h) and the CUDA kernel (kernels/cuda/quant.cu): column matrix element
// (m, k) of an (N, C, H, W) code tensor, m = (n, oh, ow) and k = (c - c0, i, j) in the order of a
// Conv2d weight's (out, in / groups, kH, kW) rows, so the columns multiply the weight's rows as a
// Linear's do. A tap outside the image reads `pad`: the input's zero point, whose code stands
// for 0.0 as a zero-padded float convolution reads.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace strata::qmath {

struct Im2colShape {
  int64_t C, H, W;             // the input's channels and size
  int64_t c0, Cg;              // the channels of the group gathered: [c0, c0 + Cg)
  int64_t kh, kw;              // kernel
  int64_t sh, sw, ph, pw, dh, dw;  // stride, padding, dilation
  int64_t OH, OW;              // output size
  STRATA_HOST_DEVICE int64_t rows() const { return OH * OW; }  // per image
  STRATA_HOST_DEVICE int64_t cols() const { return Cg * kh * kw; }
};

template <class Q>
STRATA_HOST_DEVICE Q im2col_code(const Q* x, const Im2colShape& s, int64_t m, int64_t k, Q pad) {
  const int64_t ow = m % s.OW, oh = (m / s.OW) % s.OH, n = m / (s.OW * s.OH);
  const int64_t j = k % s.kw, i = (k / s.kw) % s.kh, c = s.c0 + k / (s.kw * s.kh);
  const int64_t h = oh * s.sh - s.ph + i * s.dh, w = ow * s.sw - s.pw + j * s.dw;
  if (h < 0 || h >= s.H || w < 0 || w >= s.W) return pad;
  return x[((n * s.C + c) * s.H + h) * s.W + w];
}

}  // namespace strata::qmath
