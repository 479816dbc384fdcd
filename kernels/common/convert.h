// Value conversion between element types, as PyTorch's casts do it: through the source's
// compute type; to bool is "not zero"; to Half/BFloat16 rounds to nearest even.
#pragma once

#include <type_traits>

#include "half.h"
#include "host_device.h"

namespace strata {

template <class T>
inline constexpr bool is_reduced_float_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

template <class To, class From>
STRATA_HOST_DEVICE To convert(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<compute_t<From>>(x) != compute_t<From>(0);
  } else if constexpr (is_reduced_float_v<To>) {
    return To(static_cast<float>(static_cast<compute_t<From>>(x)));
  } else {
    return static_cast<To>(static_cast<compute_t<From>>(x));
  }
}

}  // namespace strata
