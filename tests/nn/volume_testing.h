// Direct float64 loops of PyTorch's conv3d and conv_transpose3d, and a table of odd cases (stride,
// padding, dilation and groups mixed per dim), shared by test_conv3d and test_conv3d_native.
#pragma once

#include <vector>

#include "nn/nn_testing.h"

namespace strata::testing {

namespace F = strata::nn::functional;
using nn::Size3;

struct Dims {
  int64_t n, c, d, h, w;
};

inline int64_t at(Size3 s, int i) { return i == 0 ? s.d : i == 1 ? s.h : s.w; }

// y[n, o, z] = b[o] + sum_{i, k} x[n, g * Cg + i, z * s - p + k * dil] * w[o, i, k] over the three dims
inline std::vector<double> conv3d_loop(const Tensor& x, const Tensor& w, const Tensor& b, const F::Conv3dArgs& a,
                                Shape& out_shape) {
  const std::vector<double> xv = values(x), wv = values(w), bv = b.defined() ? values(b) : std::vector<double>{};
  const int64_t N = x.size(0), C = x.size(1), O = w.size(0), G = a.groups, Cg = C / G, Og = O / G;
  int64_t in[3], k[3], out[3];
  for (int i = 0; i < 3; ++i) {
    in[i] = x.size(2 + i), k[i] = w.size(2 + i);
    out[i] = (in[i] + 2 * at(a.padding, i) - at(a.dilation, i) * (k[i] - 1) - 1) / at(a.stride, i) + 1;
  }
  out_shape = {N, O, out[0], out[1], out[2]};
  std::vector<double> y;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t z0 = 0; z0 < out[0]; ++z0)
        for (int64_t z1 = 0; z1 < out[1]; ++z1)
          for (int64_t z2 = 0; z2 < out[2]; ++z2) {
            double s = bv.empty() ? 0 : bv[o];
            for (int64_t i = 0; i < Cg; ++i)
              for (int64_t k0 = 0; k0 < k[0]; ++k0)
                for (int64_t k1 = 0; k1 < k[1]; ++k1)
                  for (int64_t k2 = 0; k2 < k[2]; ++k2) {
                    const int64_t p0 = z0 * a.stride.d - a.padding.d + k0 * a.dilation.d;
                    const int64_t p1 = z1 * a.stride.h - a.padding.h + k1 * a.dilation.h;
                    const int64_t p2 = z2 * a.stride.w - a.padding.w + k2 * a.dilation.w;
                    if (p0 < 0 || p0 >= in[0] || p1 < 0 || p1 >= in[1] || p2 < 0 || p2 >= in[2]) continue;
                    const int64_t ch = (o / Og) * Cg + i;
                    s += xv[(((n * C + ch) * in[0] + p0) * in[1] + p1) * in[2] + p2] *
                         wv[(((o * Cg + i) * k[0] + k0) * k[1] + k1) * k[2] + k2];
                  }
            y.push_back(s);
          }
  return y;
}

// The transpose: every input element scattered through the kernel, y[n, g * Og + j, z * s - p + k * dil]
// += x[n, c, z] * w[c, j, k] for c in group g; positions cut by the padding are dropped.
inline std::vector<double> conv_transpose3d_loop(const Tensor& x, const Tensor& w, const Tensor& b,
                                          const F::ConvTranspose3dArgs& a, Shape& out_shape) {
  const std::vector<double> xv = values(x), wv = values(w);
  const int64_t N = x.size(0), C = x.size(1), G = a.groups, Cg = C / G, Og = w.size(1), O = Og * G;
  int64_t in[3], k[3], out[3];
  for (int i = 0; i < 3; ++i) {
    in[i] = x.size(2 + i), k[i] = w.size(2 + i);
    out[i] = (in[i] - 1) * at(a.stride, i) - 2 * at(a.padding, i) + at(a.dilation, i) * (k[i] - 1) +
             at(a.output_padding, i) + 1;
  }
  out_shape = {N, O, out[0], out[1], out[2]};
  const int64_t volume = out[0] * out[1] * out[2];
  std::vector<double> y(static_cast<size_t>(N * O * volume), 0.0);
  if (b.defined())
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o)
        for (int64_t v = 0; v < volume; ++v) y[(n * O + o) * volume + v] = values(b)[o];
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i0 = 0; i0 < in[0]; ++i0)
        for (int64_t i1 = 0; i1 < in[1]; ++i1)
          for (int64_t i2 = 0; i2 < in[2]; ++i2)
            for (int64_t j = 0; j < Og; ++j)
              for (int64_t k0 = 0; k0 < k[0]; ++k0)
                for (int64_t k1 = 0; k1 < k[1]; ++k1)
                  for (int64_t k2 = 0; k2 < k[2]; ++k2) {
                    const int64_t p0 = i0 * a.stride.d - a.padding.d + k0 * a.dilation.d;
                    const int64_t p1 = i1 * a.stride.h - a.padding.h + k1 * a.dilation.h;
                    const int64_t p2 = i2 * a.stride.w - a.padding.w + k2 * a.dilation.w;
                    if (p0 < 0 || p0 >= out[0] || p1 < 0 || p1 >= out[1] || p2 < 0 || p2 >= out[2]) continue;
                    const int64_t o = (c / Cg) * Og + j;
                    y[((n * O + o) * out[0] + p0) * out[1] * out[2] + p1 * out[2] + p2] +=
                        xv[(((n * C + c) * in[0] + i0) * in[1] + i1) * in[2] + i2] *
                        wv[(((c * Og + j) * k[0] + k0) * k[1] + k1) * k[2] + k2];
                  }
  return y;
}

struct ConvCase {
  Dims x;
  int64_t out_channels;
  Size3 kernel, stride, padding, dilation;
  int64_t groups;
  bool bias;
  Size3 output_padding = 0;  // the transpose only
};

inline const ConvCase kCases[] = {
    {{1, 1, 3, 3, 3}, 1, 1, 1, 0, 1, 1, false},
    {{2, 3, 5, 6, 7}, 4, {3, 2, 3}, 1, 1, 1, 1, true},
    {{2, 4, 7, 5, 6}, 6, {3, 3, 2}, {2, 1, 2}, {1, 0, 1}, {1, 2, 1}, 2, true, {1, 0, 1}},
    {{1, 6, 6, 7, 5}, 3, {2, 3, 3}, {1, 2, 1}, {0, 1, 1}, {2, 1, 1}, 3, false, {0, 1, 0}},
    {{3, 2, 4, 4, 4}, 2, 3, 2, 1, 1, 2, true, 1},  // depthwise
};

}  // namespace strata::testing
