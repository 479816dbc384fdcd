// Type promotion and shape arithmetic.
#include <limits>

#include <strata/core/dtype.hpp>
#include <strata/core/error.hpp>
#include <strata/core/shape.hpp>
#include <strata/version.hpp>

namespace strata {

const char* version() { return STRATA_VERSION_STRING; }

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a > b) std::swap(a, b);  // now a < b in enum order (bool < ints < floats)
  if (a == kBool) return b;
  if (is_integral(a) && is_floating(b)) return b;
  if (a == kUInt8 && b == kInt8) return kInt32;  // no int16: the next signed type holding both
  if (a == kFloat16 && b == kBFloat16) return kFloat32;
  return b;
}

int64_t checked_numel(const Shape& shape, std::string_view op) {
  int64_t n = 1;
  bool zero = false;
  for (int64_t s : shape) {
    STRATA_CHECK(s >= 0, "[{}] negative size in shape {}", op, shape);
    if (s == 0) zero = true;
  }
  if (zero) return 0;
  for (int64_t s : shape) {
    STRATA_CHECK(n <= std::numeric_limits<int64_t>::max() / s, "[{}] shape {} has more elements than int64 can count",
                 op, shape);
    n *= s;
  }
  return n;
}

Strides contiguous_strides(const Shape& shape) {
  Strides st(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    st[i] = s;
    // Only a shape with a zero dim (no elements, so no stride is ever used) can overflow
    // here: saturate instead of wrapping, since signed overflow is undefined.
    if (__builtin_mul_overflow(s, std::max<int64_t>(shape[i], 1), &s)) s = std::numeric_limits<int64_t>::max();
  }
  return st;
}

int64_t normalize_dim(int64_t dim, int64_t ndim, std::string_view op) {
  int64_t n = std::max<int64_t>(ndim, 1);  // a 0-d tensor accepts dim 0 and -1
  STRATA_CHECK(dim >= -n && dim < n, "[{}] dim {} is out of range for a tensor of {} dims", op, dim, ndim);
  return dim < 0 ? dim + n : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, std::string_view op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    STRATA_CHECK(da == db || da == 1 || db == 1, "[{}] shapes {} and {} do not broadcast", op, a, b);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace strata
