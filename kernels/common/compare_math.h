// Per-element closeness test of isclose / allclose, shared by the CPU and CUDA kernels:
// |a - b| <= atol + rtol * |b| in float64, as torch.isclose. Equal values (infinities
// included) are close; NaN is close to NaN only when equal_nan is set; an infinity is close
// only to itself.
#pragma once

#include <cmath>

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
};

}  // namespace strata::math
