// Per-element math of the unary ops, shared by the CPU and CUDA kernels. Each functor maps
// one value of compute type T (float, double or an integer type) to its result.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "binary_math.h"
#include "host_device.h"
#include "reduce_ops.h"
#include "vec_exp.h"

namespace strata::math {

// The integer minimum negates to itself, as in PyTorch (wrapping, see binary_math.h).
struct Neg {
  template <class T> STRATA_HOST_DEVICE T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) return -x;
    else return T(wrapping_t<T>(0) - wrapping_t<T>(x));
  }
};
struct Abs {
  template <class T> STRATA_HOST_DEVICE T operator()(T x) const {
    if constexpr (std::is_unsigned_v<T>) return x;
    else if constexpr (std::is_floating_point_v<T>) return std::fabs(x);  // abs(-0.0) is +0.0
    else return x < T(0) ? Neg{}(x) : x;
  }
};
struct Sign {
  template <class T> STRATA_HOST_DEVICE T operator()(T x) const {
    if constexpr (std::is_unsigned_v<T>) return T(x != T(0));
    else return T((T(0) < x) - (x < T(0)));
  }
};
struct Exp { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return fast_exp(x); } };
struct Log { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return fast_log(x); } };
struct Sqrt { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::sqrt(x); } };
struct Rsqrt { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return T(1) / std::sqrt(x); } };
struct Sin { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::sin(x); } };
struct Cos { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::cos(x); } };
struct Tanh { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return fast_tanh(x); } };
struct Sigmoid {
  template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return T(1) / (T(1) + fast_exp(-x)); }
};
struct Erf { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return fast_erf(x); } };
// NaN passes through, as PyTorch's clamp_min(x, 0) lets it.
struct Relu {
  template <class T> STRATA_HOST_DEVICE T operator()(T x) const {
    if constexpr (std::is_unsigned_v<T>) return x;
    else return x < T(0) ? T(0) : x;
  }
};
// GELU, exact: x * Phi(x) with the normal CDF written through erf.
struct GeluErf {
  template <class T> STRATA_HOST_DEVICE T operator()(T x) const {
    return T(0.5) * x * (T(1) + fast_erf(x * T(0.70710678118654752440)));
  }
};
// GELU, tanh approximation (Hendrycks & Gimpel): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
struct GeluTanh {
  template <class T> STRATA_HOST_DEVICE T operator()(T x) const {
    T inner = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
    return T(0.5) * x * (T(1) + fast_tanh(inner));
  }
};
struct Silu {
  template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return x / (T(1) + fast_exp(-x)); }
};
struct Square { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return Mul{}(x, x); } };
struct Reciprocal { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return T(1) / x; } };
// The circular, hyperbolic and base-2/base-10 functions of <cmath>.
struct Tan { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::tan(x); } };
struct Asin { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::asin(x); } };
struct Acos { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::acos(x); } };
struct Atan { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::atan(x); } };
struct Sinh { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::sinh(x); } };
struct Cosh { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::cosh(x); } };
struct Asinh { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::asinh(x); } };
struct Acosh { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::acosh(x); } };
struct Atanh { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::atanh(x); } };
struct Log2 { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::log2(x); } };
struct Log10 { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::log10(x); } };
struct Exp2 { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::exp2(x); } };
struct Log1p { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::log1p(x); } };
struct Expm1 { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::expm1(x); } };
struct Floor { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::floor(x); } };
struct Ceil { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::ceil(x); } };
// Halves to even, as PyTorch's round (nearbyint in the default rounding mode).
struct Round { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::nearbyint(x); } };
struct Trunc { template <class T> STRATA_HOST_DEVICE T operator()(T x) const { return std::trunc(x); } };
struct LogicalNot { template <class T> STRATA_HOST_DEVICE bool operator()(T x) const { return !x; } };

// Ops with one scalar parameter.
struct PowScalar {
  double exponent;
  int64_t integer_exponent = 0;  // the exponent of integer data, exact (the op checks it is >= 0)
  template <class T> STRATA_HOST_DEVICE T operator()(T x) const {
    if constexpr (std::is_integral_v<T>) {
      // by squaring, in uint64: the products wrap as the integer type's do, without signed overflow
      uint64_t result = 1, base = static_cast<uint64_t>(x);
      for (uint64_t k = integer_exponent > 0 ? static_cast<uint64_t>(integer_exponent) : 0; k > 0; k >>= 1) {
        if (k & 1) result *= base;
        base *= base;
      }
      return static_cast<T>(result);
    } else {
      // PyTorch's special exponents, each a product or a root rather than a call of pow
      if (exponent == 2.0) return x * x;
      if (exponent == 3.0) return x * x * x;
      if (exponent == 0.5) return std::sqrt(x);
      if (exponent == -0.5) return T(1) / std::sqrt(x);
      if (exponent == -1.0) return T(1) / x;
      if (exponent == -2.0) return T(1) / (x * x);
      return std::pow(x, T(exponent));
    }
  }
};
// The two functors with parameters read them unconditionally and choose by selects: a
// parameter read in only one branch kept the CPU loop from vectorizing (4 ns per element).
struct Clamp {
  double lo, hi;  // -inf / +inf when absent
  // the bounds as integers (absent: the int64 limits), used for integer data when `integral`
  int64_t ilo = 0, ihi = 0;
  bool integral = false;
  template <class T> STRATA_HOST_DEVICE T operator()(T x) const {
    // min(max(x, lo), hi), as PyTorch: NaN (in x or a bound) propagates, and lo > hi gives hi.
    // Integer data with integer bounds compares as integers (exact past 2^53; a bound outside
    // T's range saturates to it); floats round-trip through double exactly.
    if constexpr (std::is_integral_v<T>) {
      if (integral) {
        const int64_t tmin = static_cast<int64_t>(lowest<T>()), tmax = static_cast<int64_t>(highest<T>());
        const int64_t l = ilo < tmin ? tmin : ilo > tmax ? tmax : ilo;
        const int64_t h = ihi < tmin ? tmin : ihi > tmax ? tmax : ihi;
        int64_t r = static_cast<int64_t>(x);
        r = r < l ? l : r;
        return static_cast<T>(r > h ? h : r);
      }
    }
    const double l = lo, h = hi, v = static_cast<double>(x);
    double r = v < l ? l : v;
    r = r > h ? h : r;
    if constexpr (std::is_integral_v<T>) {
      // a float bound past T's range saturates to it: converting such a double is undefined
      // (x86 gives the lowest value, CUDA saturates). int64's highest rounds up to 2^63 in double
      const double tmin = static_cast<double>(lowest<T>()), tmax = static_cast<double>(highest<T>());
      const T in_range = r >= tmax ? highest<T>() : r <= tmin ? lowest<T>() : static_cast<T>(r);
      return r == v ? x : in_range;
    } else {
      r = h != h ? h : r;
      r = l != l ? l : r;
      return static_cast<T>(r);
    }
  }
};
struct LeakyRelu {
  double slope;
  template <class T> STRATA_HOST_DEVICE T operator()(T x) const {
    const T s = T(slope);
    return x > T(0) ? x : x * s;
  }
};

}  // namespace strata::math
