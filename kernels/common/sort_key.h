// Order-preserving unsigned keys for radix sorting: for values a, b of one dtype,
// order_key(a) < order_key(b) exactly when a comes before b in the CPU sort's order
// (kernels/cpu/sort.h: NaN above every number and equal to itself, -0.0 equal to +0.0).
// Equal values get equal keys, so a stable sort of the keys breaks ties by position as the
// CPU does; descending order sorts ~key ascending, which keeps ties in position order too.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "half.h"
#include "host_device.h"

namespace strata::sort_key {

// The unsigned key type of each storage type: as wide as the value.
template <class T> struct key_of { using type = std::make_unsigned_t<T>; };
template <> struct key_of<bool> { using type = uint8_t; };
template <> struct key_of<Half> { using type = uint16_t; };
template <> struct key_of<BFloat16> { using type = uint16_t; };
template <> struct key_of<float> { using type = uint32_t; };
template <> struct key_of<double> { using type = uint64_t; };
template <class T> using key_t = typename key_of<T>::type;

// Float bits -> key: NaN (any sign, any payload) becomes the largest key, -0.0 becomes +0.0,
// then negatives are inverted and positives get the sign bit, so unsigned order is numeric.
// Selects rather than branches: the sign of random data is a coin toss, and its mispredicted
// branch had cost a CPU topk several ns per element.
template <class U>
STRATA_HOST_DEVICE U float_bits_key(U bits, U exp_mask) {
  constexpr U sign = U(U(1) << (sizeof(U) * 8 - 1));
  const U mag = U(bits & U(~sign));
  const U negative = U(U(0) - U(bits >> (sizeof(U) * 8 - 1)));  // all ones for a set sign bit
  U key = U(bits ^ U(negative | sign));                           // ~bits, or bits | sign
  key = mag == 0 ? sign : key;                                     // +0.0 and -0.0
  return mag > exp_mask ? U(~U(0)) : key;                          // NaN
}

template <class T>
STRATA_HOST_DEVICE key_t<T> order_key(T v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? 1 : 0;
  } else if constexpr (std::is_same_v<T, Half>) {
    return float_bits_key<uint16_t>(v.bits, 0x7c00u);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return float_bits_key<uint16_t>(v.bits, 0x7f80u);
  } else if constexpr (std::is_same_v<T, float>) {
    return float_bits_key<uint32_t>(halfbits::f32_bits(v), 0x7f800000u);
  } else if constexpr (std::is_same_v<T, double>) {
#if defined(__CUDA_ARCH__)
    const uint64_t bits = static_cast<uint64_t>(__double_as_longlong(v));
#else
    uint64_t bits;
    std::memcpy(&bits, &v, 8);
#endif
    return float_bits_key<uint64_t>(bits, 0x7ff0000000000000ull);
  } else if constexpr (std::is_signed_v<T>) {
    using U = key_t<T>;
    return static_cast<U>(static_cast<U>(v) ^ (U(1) << (sizeof(U) * 8 - 1)));  // flip the sign bit
  } else {
    return v;
  }
}

/// The key a stable ascending sort orders by: order_key, inverted for descending order.
template <class T>
STRATA_HOST_DEVICE key_t<T> sort_key(T v, bool descending) {
  const key_t<T> k = order_key(v);
  return descending ? static_cast<key_t<T>>(~k) : k;
}

}  // namespace strata::sort_key
