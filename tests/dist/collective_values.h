// Rank-dependent inputs of the collective tests and their closed-form results, computed in
// float64: every dtype, contiguous and strided layouts.
#pragma once

#include <algorithm>
#include <vector>

#include "dist/dist_testing.h"

namespace strata::dist_testing {

using dist::ReduceOp;
using testing::Layout;
using testing::values;

const DType kAllDTypes[] = {kBool, kUInt8, kInt8, kInt32, kInt64, kFloat16, kBFloat16, kFloat32, kFloat64};
const Layout kLayouts[] = {Layout::Contiguous, Layout::Transposed, Layout::Sliced};
const Shape kShape{4, 6};

inline bool is_signed(DType d) { return d != kUInt8 && d != kBool; }

// Rank r's element i for sums, means, maxima and minima: small integers, negative ones too
// for signed dtypes, so every reduction is exact in every dtype (bfloat16 included).
inline double general_value(int r, int64_t i, DType d) {
  if (d == kBool) return (r + i) % 3 == 0;
  double v = static_cast<double>((r * 3 + i) % 7) + 1;
  return is_signed(d) ? v - 3 : v;
}

// Rank r's element i for products: +-1 and 2, so products of 4 ranks stay small.
inline double product_value(int r, int64_t i, DType d) {
  if (d == kBool) return (r + i) % 4 != 0;
  double v = 1 + static_cast<double>((r + i) % 2);
  return is_signed(d) && (r + i) % 3 == 0 ? -v : v;
}

inline double value_for(ReduceOp op, int r, int64_t i, DType d) {
  return op == ReduceOp::Product ? product_value(r, i, d) : general_value(r, i, d);
}

// The reduction over ranks 0..n-1 of value_for(op, r, i), in float64.
inline double reduced(ReduceOp op, int n, int64_t i, DType d) {
  double acc = value_for(op, 0, i, d);
  for (int r = 1; r < n; ++r) {
    const double v = value_for(op, r, i, d);
    switch (op) {
      case ReduceOp::Sum: case ReduceOp::Avg: acc = d == kBool ? (acc || v) : acc + v; break;
      case ReduceOp::Product: acc = d == kBool ? (acc && v) : acc * v; break;
      case ReduceOp::Max: acc = std::max(acc, v); break;
      case ReduceOp::Min: acc = std::min(acc, v); break;
    }
  }
  return op == ReduceOp::Avg ? acc / n : acc;
}

// A tensor of `shape` whose element i (C order) is f(i), in dtype d, laid out as `layout`.
template <class F> Tensor make(F f, DType d, Layout layout, const Shape& shape = kShape) {
  std::vector<double> v(static_cast<size_t>(checked_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = f(static_cast<int64_t>(i));
  return testing::with_layout(from_vector(v, shape).to(d), layout);
}

// The expected values as the dtype holds them (one rounding, as the backends promise).
template <class F> std::vector<double> expect(F f, DType d, const Shape& shape = kShape) {
  return values(make(f, d, Layout::Contiguous, shape));
}

inline const char* op_name(ReduceOp op) {
  const char* names[] = {"sum", "avg", "product", "max", "min"};
  return names[static_cast<int>(op)];
}

}  // namespace strata::dist_testing
