// The quantized layers' arithmetic written out in float64 for the quantization tests: PyTorch's
// quantize formula, centered codes (exact integers) and the int8 layers' float32 epilogue.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "testing.h"

namespace strata::testing {

// PyTorch's quantize in float32: clamp(zero_point + round_half_even(x * (1 / scale)), 0, 255).
inline std::vector<double> codes_of(const Tensor& x, double scale, int64_t zero, int64_t qmin = 0, int64_t qmax = 255) {
  const float inv = 1.0f / static_cast<float>(scale);
  std::vector<double> out;
  for (double v : values(x)) {
    const double c = std::nearbyint(static_cast<double>(static_cast<float>(v) * inv)) + static_cast<double>(zero);
    out.push_back(std::clamp(c, double(qmin), double(qmax)));
  }
  return out;
}

// (codes - zero) as a float64 tensor of `shape`: exact integers, so a float64 convolution of them
// with the weight codes gives the int32 accumulations exactly.
inline Tensor centered(const std::vector<double>& codes, int64_t zero, const Shape& shape) {
  std::vector<double> c(codes);
  for (double& v : c) v -= static_cast<double>(zero);
  return from_vector(c, shape);
}

// The int8 layers' float32 epilogue on exact int32 sums: float(acc) * (float(x_scale) * float(w_scale))
// + float(bias), per channel c = (i / inner) % channels, as float64 values.
inline Tensor epilogue(const Tensor& acc, double x_scale, const Tensor& w_scale, const Tensor& bias, int64_t inner) {
  const std::vector<double> a = values(acc), ws = values(w_scale), b = values(bias);
  const size_t channels = ws.size();
  std::vector<double> y;
  for (size_t i = 0; i < a.size(); ++i) {
    const size_t c = (i / size_t(inner)) % channels;
    const float p = static_cast<float>(x_scale) * static_cast<float>(ws[c]);
    const float product = static_cast<float>(a[i]) * p;
    y.push_back(static_cast<double>(product + static_cast<float>(b[c])));
  }
  return from_vector(y, acc.shape());
}

// Per-channel symmetric int8 codes of w (out, ...) as float64: round(w / scale), scale = max|w| / 127.5
// per output channel (float32), and the scales.
inline std::pair<Tensor, Tensor> weight_codes(const Tensor& w) {
  const int64_t out = w.size(0), per = w.numel() / out;
  const std::vector<double> v = values(w);
  std::vector<double> codes(v.size()), scales(static_cast<size_t>(out));
  for (int64_t o = 0; o < out; ++o) {
    double m = 0;
    for (int64_t i = 0; i < per; ++i) m = std::max(m, std::fabs(v[size_t(o * per + i)]));
    const float scale = std::max(static_cast<float>(m) / 127.5f, std::numeric_limits<float>::epsilon());
    scales[size_t(o)] = scale;
    const float inv = 1.0f / scale;
    for (int64_t i = 0; i < per; ++i) {
      const size_t k = size_t(o * per + i);
      codes[k] = std::clamp(std::nearbyint(double(static_cast<float>(v[k]) * inv)), -128.0, 127.0);
    }
  }
  return {from_vector(codes, w.shape()), from_vector(scales, Shape{out})};
}

}  // namespace strata::testing
