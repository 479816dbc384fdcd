// Per-element closeness test of isclose / allclose, shared by the CPU and CUDA kernels:
// |a - b| <= atol + rtol * |b| in float64 (integers: the difference exact), as torch.isclose. Equal values (infinities
// included) are close; NaN is close to NaN only when equal_nan is set; an infinity is close
// only to itself.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "host_device.h"

namespace strata::math {

struct IsClose {
  double rtol, atol;
  bool equal_nan;
  STRATA_HOST_DEVICE bool operator()(double a, double b) const {
    if (a == b) return true;
    bool na = a != a, nb = b != b;
    if (na || nb) return equal_nan && na && nb;
    if (std::isinf(a) || std::isinf(b)) return false;
    return std::fabs(a - b) <= atol + rtol * std::fabs(b);
  }
  // Integers: equality and the difference are exact (float64 would round large values
  // together); only the tolerance is in float64, as torch.isclose's.
  template <class T>
  STRATA_HOST_DEVICE bool integers(T a, T b) const {
    if (a == b) return true;
    const uint64_t diff = a > b ? uint64_t(a) - uint64_t(b) : uint64_t(b) - uint64_t(a);  // modulo 2^64: exact
    double mag = static_cast<double>(b);
    if constexpr (std::is_signed_v<T>) mag = mag < 0 ? -mag : mag;
    return static_cast<double>(diff) <= atol + rtol * mag;
  }
};

}  // namespace strata::math
