// Helpers shared by the tests: tensors to float64 vectors, random inputs in several layouts,
// and closeness checks against float64 references.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <strata/strata.hpp>

namespace strata::testing {

/// The tensor's values, in C order, as float64 (via a CPU copy).
inline std::vector<double> values(const Tensor& t) {
  Tensor d = t.cpu().to(kFloat64).contiguous();
  const double* p = static_cast<const double*>(d.data());
  return std::vector<double>(p, p + d.numel());
}

/// The largest |a - b| over two tensors of the same number of elements, in float64.
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> av = values(a), bv = values(b);
  double m = 0;
  for (size_t i = 0; i < av.size(); ++i) m = std::max(m, std::fabs(av[i] - bv[i]));
  return m;
}

/// Row-major flat index -> multi-index of `shape`.
inline std::vector<int64_t> unravel(int64_t i, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] ? i % shape[d] : 0;
    i = shape[d] ? i / shape[d] : 0;
  }
  return idx;
}

/// Flat index into a (broadcast) input of shape `in` for output multi-index `idx`.
inline int64_t broadcast_index(const std::vector<int64_t>& idx, const Shape& in) {
  int64_t flat = 0;
  size_t lead = idx.size() - in.size();
  for (size_t d = 0; d < in.size(); ++d) flat = flat * in[d] + (in[d] == 1 ? 0 : idx[lead + d]);
  return flat;
}

/// Layouts a test input can take: same values, different strides.
enum class Layout { Contiguous, Transposed, Sliced };
inline const char* layout_name(Layout l) {
  return l == Layout::Contiguous ? "contiguous" : l == Layout::Transposed ? "transposed" : "sliced";
}

/// A tensor with the given values (C order of `shape`) laid out as `layout`: Transposed
/// stores it with its last two dims swapped in memory; Sliced takes every other element of
/// a larger buffer.
inline Tensor with_layout(const Tensor& t, Layout layout) {
  if (layout == Layout::Contiguous || t.dim() == 0) return t.contiguous();
  if (layout == Layout::Transposed && t.dim() >= 2) {
    int64_t a = t.dim() - 2, b = t.dim() - 1;
    return t.transpose(a, b).contiguous().transpose(a, b);
  }
  Shape big = t.shape();
  big.back() *= 2;
  Tensor buf = zeros(big, TensorOptions(t.dtype(), t.device()));
  Tensor view = buf.slice(-1, 0, big.back(), 2);
  view.copy_(t);
  return view;
}

inline ::testing::AssertionResult all_close(const std::vector<double>& got, const std::vector<double>& want,
                                             double rtol, double atol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    double g = got[i], w = want[i];
    if (std::isnan(w) && std::isnan(g)) continue;
    if (std::isinf(w) && g == w) continue;
    if (!(std::fabs(g - w) <= atol + rtol * std::fabs(w)))
      return ::testing::AssertionFailure() << "element " << i << ": got " << g << ", want " << w;
  }
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult all_close(const Tensor& got, const std::vector<double>& want, double rtol,
                                             double atol) {
  return all_close(values(got), want, rtol, atol);
}

/// Relative / absolute tolerance for results computed in `dtype`.
inline double rtol_for(DType t) {
  switch (t) {
    case kFloat64: return 1e-12;
    case kFloat32: return 1e-5;
    case kBFloat16: return 1e-2;
    case kFloat16: return 2e-3;
    default: return 0;
  }
}

/// True when calling f raises strata::Error whose message contains every one of `parts`.
template <class F>
::testing::AssertionResult throws_with(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
  } catch (const Error& e) {
    std::string what = e.what();
    for (const char* p : parts)
      if (what.find(p) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << what << "\" lacks \"" << p << "\"";
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no strata::Error was raised";
}

}  // namespace strata::testing
