// IEEE binary16 (Half) and bfloat16 (BFloat16) storage types with round-to-nearest-even
// conversions. Arithmetic is done in float: both types convert implicitly to and from it.
#pragma once

#include <cstdint>
#include <cstring>

#include "host_device.h"

namespace strata {

namespace halfbits {

STRATA_HOST_DEVICE uint32_t f32_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

STRATA_HOST_DEVICE float bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// float -> binary16, round to nearest even; overflow gives inf, NaN stays a quiet NaN that
// keeps its top payload bits, as hardware conversions do. Every path is computed and one is
// selected, so a loop of conversions runs without data-dependent branches (3x the branchy
// form's speed on the host). The float16 subnormals round through a float add, so they assume
// the default rounding mode (to nearest), as the rest of the library does.
STRATA_HOST_DEVICE uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
  // normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits
  const uint32_t r = mag - 0x38000000u;
  const uint32_t normal = (r + 0x0fffu + ((r >> 13) & 1u)) >> 13;
  // below 2^-14 (subnormal or zero): adding 0.5 rounds |f| to a multiple of 2^-24, to nearest
  // even, and leaves that multiple in the low bits of the sum
  const uint32_t subnormal = f32_bits(bits_f32(mag) + 0.5f) - 0x3f000000u;
  const uint32_t special = mag > 0x7f800000u ? 0x7e00u | ((mag >> 13) & 0x3ffu) : 0x7c00u;  // NaN : inf
  uint32_t h = mag < 0x38800000u ? subnormal : normal;
  h = mag >= 0x477ff000u ? special : h;  // at least 65520 rounds to inf
  return static_cast<uint16_t>(sign | h);
}

// binary16 -> float, exact. Branch-free like f32_to_f16: the exponent and mantissa move up 13
// bits and the exponent is rebiased (15 -> 127); the largest exponent (inf, NaN) is rebiased to
// 255 instead; and a subnormal m 2^-24 is read as the normal float 2^-14 (1 + m / 1024), less
// 2^-14, which is exact. (The branching form ran at a sixth of LibTorch's float16 to float.)
STRATA_HOST_DEVICE float f16_to_f32(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t shifted = (static_cast<uint32_t>(h) & 0x7fffu) << 13;  // exponent and mantissa
  const uint32_t exp = shifted & 0x0f800000u;
  const uint32_t normal = shifted + (112u << 23);                       // 127 - 15
  const uint32_t inf_nan = shifted + (224u << 23);                      // 31 + 224 = 255
  const float subnormal = bits_f32(shifted + (113u << 23)) - 6.103515625e-05f;  // 2^-14
  const uint32_t bits = exp == 0 ? f32_bits(subnormal) : exp == 0x0f800000u ? inf_nan : normal;
  return bits_f32(sign | bits);
}

// float -> bfloat16, round to nearest even; NaN stays a quiet NaN.
STRATA_HOST_DEVICE uint16_t f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  uint32_t lsb = (x >> 16) & 1u;
  x += 0x7fffu + lsb;
  return static_cast<uint16_t>(x >> 16);
}

STRATA_HOST_DEVICE float bf16_to_f32(uint16_t b) { return bits_f32(static_cast<uint32_t>(b) << 16); }

}  // namespace halfbits

struct Half {
  uint16_t bits = 0;
  Half() = default;
  STRATA_HOST_DEVICE Half(float f) : bits(halfbits::f32_to_f16(f)) {}
  STRATA_HOST_DEVICE operator float() const { return halfbits::f16_to_f32(bits); }
  STRATA_HOST_DEVICE static Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }
};

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  STRATA_HOST_DEVICE BFloat16(float f) : bits(halfbits::f32_to_bf16(f)) {}
  STRATA_HOST_DEVICE operator float() const { return halfbits::bf16_to_f32(bits); }
  STRATA_HOST_DEVICE static BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
};

// The type arithmetic on T is carried out in: float for the 16-bit floats, T otherwise.
template <class T> struct compute_type { using type = T; };
template <> struct compute_type<Half> { using type = float; };
template <> struct compute_type<BFloat16> { using type = float; };
template <class T> using compute_t = typename compute_type<T>::type;

}  // namespace strata
