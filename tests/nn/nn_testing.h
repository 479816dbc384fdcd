// Helpers shared by the nn tests: float64 reference matrices and quick random tensors.
#pragma once

#include <vector>

#include "gradcheck.h"

namespace strata::testing {

/// A dense row-major float64 matrix (or a stack of them) for the references.
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<double> v;
  Mat() = default;
  Mat(int64_t r, int64_t c) : rows(r), cols(c), v(static_cast<size_t>(r * c), 0.0) {}
  explicit Mat(const Tensor& t) : rows(t.size(0)), cols(t.size(1)), v(values(t)) {}
  double& operator()(int64_t r, int64_t c) { return v[static_cast<size_t>(r * cols + c)]; }
  double operator()(int64_t r, int64_t c) const { return v[static_cast<size_t>(r * cols + c)]; }
};

/// a @ b^T.
inline Mat matmul_nt(const Mat& a, const Mat& b) {
  Mat out(a.rows, b.rows);
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < b.rows; ++j) {
      double s = 0;
      for (int64_t k = 0; k < a.cols; ++k) s += a(i, k) * b(j, k);
      out(i, j) = s;
    }
  return out;
}

/// PyTorch's pooling_output_shape: windows of k taps dil apart, stride s, padding p on both sides;
/// with ceil_mode the last window must start inside the input or its left padding.
inline int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  const int64_t span = in + 2 * p - d * (k - 1) - 1;
  int64_t out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

inline Tensor randn64(const Shape& shape, Generator& g) { return randn(shape, kFloat64, &g); }

}  // namespace strata::testing
