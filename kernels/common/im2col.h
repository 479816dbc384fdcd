// The im2col gather of the int8 convolution, per element, shared by the CPU loop
// (kernels/cpu/quant.h) and the CUDA kernel (kernels/cuda/quant.cu): column matrix element
// (m, k) of an (N, H, W, C) code tensor (channels last, so each tap copies a run of channels),
// m = (n, oh, ow) and k = (i, j, c - c0): a Conv2d weight's rows taken as (out, kH, kW, in /
// groups). A tap outside the image reads `pad`: the input's zero point, whose code stands for 0.0
// as a zero-padded float convolution reads.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace strata::qmath {

struct Im2colShape {
  int64_t C, H, W;             // the input's channels and size (stored (N, H, W, C))
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
  const int64_t c = s.c0 + k % s.Cg, tap = k / s.Cg, j = tap % s.kw, i = tap / s.kw;
  const int64_t h = oh * s.sh - s.ph + i * s.dh, w = ow * s.sw - s.pw + j * s.dw;
  if (h < 0 || h >= s.H || w < 0 || w >= s.W) return pad;
  return x[((n * s.H + h) * s.W + w) * s.C + c];
}

}  // namespace strata::qmath
