// Per-element math of the binary ops, shared by the CPU and CUDA kernels.
#pragma once

#include <cmath>
#include <type_traits>

#include "host_device.h"

namespace strata::math {

// Integer arithmetic wraps around, as PyTorch's does: computed in the unsigned type of the same
// width, where overflow is defined (signed overflow is undefined behaviour, which the compiler
// may assume never happens). Floats and bool compute as they are.
template <class T, bool = std::is_integral_v<T> && !std::is_same_v<T, bool>>
struct wrapping_type { using type = T; };
template <class T> struct wrapping_type<T, true> { using type = std::make_unsigned_t<T>; };
template <class T> using wrapping_t = typename wrapping_type<T>::type;

struct Add {
  template <class T> STRATA_HOST_DEVICE T operator()(T a, T b) const { return T(wrapping_t<T>(a) + wrapping_t<T>(b)); }
};
struct Sub {
  template <class T> STRATA_HOST_DEVICE T operator()(T a, T b) const { return T(wrapping_t<T>(a) - wrapping_t<T>(b)); }
};
struct Mul {
  template <class T> STRATA_HOST_DEVICE T operator()(T a, T b) const { return T(wrapping_t<T>(a) * wrapping_t<T>(b)); }
};
struct Div { template <class T> STRATA_HOST_DEVICE T operator()(T a, T b) const { return a / b; } };
// max/min propagate NaN, as torch.maximum does.
struct Maximum {
  template <class T> STRATA_HOST_DEVICE T operator()(T a, T b) const {
    if constexpr (!std::is_integral_v<T>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return a > b ? a : b;
  }
};
struct Minimum {
  template <class T> STRATA_HOST_DEVICE T operator()(T a, T b) const {
    if constexpr (!std::is_integral_v<T>) {
      if (a != a) return a;
      if (b != b) return b;
    }
    return a < b ? a : b;
  }
};
struct Pow {
  template <class T> STRATA_HOST_DEVICE T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      if constexpr (std::is_signed_v<T>) {
        if (b < 0) {  // as PyTorch: only 1 and -1 have integer powers below 1; the rest truncate to 0
          if (a == T(1)) return T(1);
          if (a == T(-1)) return (b & 1) ? T(-1) : T(1);
          return T(0);
        }
      }
      using U = wrapping_t<T>;
      U result = 1, base = U(a);
      for (T e = b; e > 0; e >>= 1) {
        if (e & 1) result = U(result * base);
        base = U(base * base);
      }
      return T(result);
    } else {
      return std::pow(a, b);
    }
  }
};
// C's fmod: the remainder of the truncated quotient, with a's sign (torch.fmod).
struct Fmod {
  template <class T> STRATA_HOST_DEVICE T operator()(T a, T b) const {
    if constexpr (std::is_integral_v<T>) {
      // zero divisors are refused before a kernel runs; -1 would overflow INT_MIN / -1
      if (b == T(0) || (std::is_signed_v<T> && b == T(-1))) return T(0);
      return T(a % b);
    } else {
      return std::fmod(a, b);
    }
  }
};
// Python's %: the remainder of the floored quotient, with b's sign (torch.remainder).
struct Remainder {
  template <class T> STRATA_HOST_DEVICE T operator()(T a, T b) const {
    const T r = Fmod{}(a, b);
    if constexpr (std::is_unsigned_v<T>) {
      return r;
    } else {
      return r != T(0) && ((r < T(0)) != (b < T(0))) ? T(r + b) : r;
    }
  }
};
struct Atan2 { template <class T> STRATA_HOST_DEVICE T operator()(T a, T b) const { return std::atan2(a, b); } };
struct Eq { template <class T> STRATA_HOST_DEVICE bool operator()(T a, T b) const { return a == b; } };
struct Ne { template <class T> STRATA_HOST_DEVICE bool operator()(T a, T b) const { return a != b; } };
struct Lt { template <class T> STRATA_HOST_DEVICE bool operator()(T a, T b) const { return a < b; } };
struct Le { template <class T> STRATA_HOST_DEVICE bool operator()(T a, T b) const { return a <= b; } };
struct Gt { template <class T> STRATA_HOST_DEVICE bool operator()(T a, T b) const { return a > b; } };
struct Ge { template <class T> STRATA_HOST_DEVICE bool operator()(T a, T b) const { return a >= b; } };
struct LogicalAnd { template <class T> STRATA_HOST_DEVICE bool operator()(T a, T b) const { return a && b; } };
struct LogicalOr { template <class T> STRATA_HOST_DEVICE bool operator()(T a, T b) const { return a || b; } };

}  // namespace strata::math
