// Float64 loop references for the attention tests: scaled dot-product attention over one
// (L, E) x (S, E) problem and MultiheadAttention / TransformerEncoderLayer for one sequence.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "nn/nn_testing.h"

namespace strata::testing {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

/// The additive score bias of query i for key j: 0 to attend, -inf to block, any other value
/// is added (a float mask).
using ScoreBias = std::function<double(int64_t i, int64_t j)>;

/// softmax(q k^T * scale + bias) v for q (L, E), k (S, E), v (S, Ev). A query whose keys are
/// all blocked gets NaN.
inline Mat attention_ref(const Mat& q, const Mat& k, const Mat& v, double scale, const ScoreBias& bias = nullptr) {
  Mat out(q.rows, v.cols);
  std::vector<double> s(static_cast<size_t>(k.rows));
  for (int64_t i = 0; i < q.rows; ++i) {
    double mx = kNegInf;
    for (int64_t j = 0; j < k.rows; ++j) {
      double d = 0;
      for (int64_t e = 0; e < q.cols; ++e) d += q(i, e) * k(j, e);
      s[j] = d * scale + (bias ? bias(i, j) : 0.0);
      mx = std::max(mx, s[j]);
    }
    if (mx == kNegInf) {
      for (int64_t c = 0; c < v.cols; ++c) out(i, c) = std::nan("");
      continue;
    }
    double z = 0;
    for (int64_t j = 0; j < k.rows; ++j) z += (s[j] = std::exp(s[j] - mx));
    for (int64_t j = 0; j < k.rows; ++j)
      for (int64_t c = 0; c < v.cols; ++c) out(i, c) += s[j] / z * v(j, c);
  }
  return out;
}

/// x @ w^T + b (b may be empty).
inline Mat linear_ref(const Mat& x, const Mat& w, const std::vector<double>& b) {
  Mat y = matmul_nt(x, w);
  if (!b.empty())
    for (int64_t i = 0; i < y.rows; ++i)
      for (int64_t o = 0; o < y.cols; ++o) y(i, o) += b[o];
  return y;
}

/// Rows [r0, r0 + n) of m.
inline Mat rows_of(const Mat& m, int64_t r0, int64_t n) {
  Mat out(n, m.cols);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < m.cols; ++c) out(i, c) = m(r0 + i, c);
  return out;
}

/// Columns [c0, c0 + n) of m.
inline Mat cols_of(const Mat& m, int64_t c0, int64_t n) {
  Mat out(m.rows, n);
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t c = 0; c < n; ++c) out(i, c) = m(i, c0 + c);
  return out;
}

/// MultiheadAttention's parameters in float64.
struct MhaParams {
  int64_t heads = 1;
  Mat in_w;                      // (3E, E), or empty when the projections are separate:
  Mat q_w, k_w, v_w;             // (E, E), (E, kdim), (E, vdim)
  std::vector<double> in_b;      // (3E) or empty
  Mat out_w;                     // (E, E)
  std::vector<double> out_b;     // (E) or empty
  std::vector<double> bias_k, bias_v;  // (E) each with add_bias_kv, else empty
  bool zero_attn = false;              // add_zero_attn
};

/// m with row r appended.
inline Mat with_row(const Mat& m, const std::vector<double>& r) {
  Mat out(m.rows + 1, m.cols);
  std::copy(m.v.begin(), m.v.end(), out.v.begin());
  std::copy(r.begin(), r.end(), out.v.begin() + m.rows * m.cols);
  return out;
}

/// The query, key and value projections (part 0, 1, 2) of x.
inline Mat mha_project(const MhaParams& p, const Mat& x, int64_t part) {
  const int64_t E = p.out_w.rows;
  const std::vector<double> b =
      p.in_b.empty() ? std::vector<double>{}
                     : std::vector<double>(p.in_b.begin() + part * E, p.in_b.begin() + (part + 1) * E);
  if (p.in_w.rows == 0) return linear_ref(x, part == 0 ? p.q_w : part == 1 ? p.k_w : p.v_w, b);
  return linear_ref(x, rows_of(p.in_w, part * E, E), b);
}

/// Multi-head attention of one sequence: xq (L, E), xk (S, kdim), xv (S, vdim); bias(h, i, j)
/// as ScoreBias, over the S keys and those add_bias_kv and add_zero_attn append after them.
inline Mat mha_ref(const MhaParams& p, const Mat& xq, const Mat& xk, const Mat& xv,
                   const std::function<double(int64_t h, int64_t i, int64_t j)>& bias = nullptr) {
  const int64_t E = xq.cols, hd = E / p.heads;
  Mat q = mha_project(p, xq, 0), k = mha_project(p, xk, 1), v = mha_project(p, xv, 2);
  if (!p.bias_k.empty()) k = with_row(k, p.bias_k), v = with_row(v, p.bias_v);
  if (p.zero_attn) k = with_row(k, std::vector<double>(E, 0.0)), v = with_row(v, std::vector<double>(E, 0.0));
  Mat merged(xq.rows, E);
  for (int64_t h = 0; h < p.heads; ++h) {
    ScoreBias b = bias ? ScoreBias([&, h](int64_t i, int64_t j) { return bias(h, i, j); }) : nullptr;
    Mat o = attention_ref(cols_of(q, h * hd, hd), cols_of(k, h * hd, hd), cols_of(v, h * hd, hd),
                          1.0 / std::sqrt(static_cast<double>(hd)), b);
    for (int64_t i = 0; i < o.rows; ++i)
      for (int64_t c = 0; c < hd; ++c) merged(i, h * hd + c) = o(i, c);
  }
  return linear_ref(merged, p.out_w, p.out_b);
}

/// Row-wise layer norm with weight and bias.
inline Mat layer_norm_ref(const Mat& x, const std::vector<double>& w, const std::vector<double>& b, double eps) {
  Mat y(x.rows, x.cols);
  for (int64_t r = 0; r < x.rows; ++r) {
    double m = 0, var = 0;
    for (int64_t c = 0; c < x.cols; ++c) m += x(r, c);
    m /= static_cast<double>(x.cols);
    for (int64_t c = 0; c < x.cols; ++c) var += (x(r, c) - m) * (x(r, c) - m);
    var /= static_cast<double>(x.cols);
    for (int64_t c = 0; c < x.cols; ++c) y(r, c) = (x(r, c) - m) / std::sqrt(var + eps) * w[c] + b[c];
  }
  return y;
}

inline Mat add(const Mat& a, const Mat& b) {
  Mat out = a;
  for (size_t i = 0; i < out.v.size(); ++i) out.v[i] += b.v[i];
  return out;
}

}  // namespace strata::testing
