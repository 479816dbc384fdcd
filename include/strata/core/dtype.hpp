// Element types, their sizes and names, and PyTorch's type-promotion rules.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <fmt/format.h>

#include <strata/core/export.hpp>
#include <strata/kernels/common/half.h>

namespace strata {

/// Element type of a tensor. Ordered by promotion category: bool, integers, floats.
enum class DType : uint8_t { Bool, UInt8, Int8, Int32, Int64, Float16, BFloat16, Float32, Float64 };
inline constexpr int kNumDTypes = 9;

inline constexpr DType kBool = DType::Bool;
inline constexpr DType kUInt8 = DType::UInt8;
inline constexpr DType kInt8 = DType::Int8;
inline constexpr DType kInt32 = DType::Int32;
inline constexpr DType kInt64 = DType::Int64;
inline constexpr DType kFloat16 = DType::Float16;
inline constexpr DType kHalf = DType::Float16;
inline constexpr DType kBFloat16 = DType::BFloat16;
inline constexpr DType kFloat32 = DType::Float32;
inline constexpr DType kFloat = DType::Float32;
inline constexpr DType kFloat64 = DType::Float64;
inline constexpr DType kDouble = DType::Float64;

/// Bytes per element.
constexpr size_t itemsize(DType t) {
  switch (t) {
    case DType::Bool: case DType::UInt8: case DType::Int8: return 1;
    case DType::Float16: case DType::BFloat16: return 2;
    case DType::Int32: case DType::Float32: return 4;
    case DType::Int64: case DType::Float64: return 8;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::Bool: return "bool";
    case DType::UInt8: return "uint8";
    case DType::Int8: return "int8";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
  }
  return "?";
}

constexpr bool is_floating(DType t) { return t >= DType::Float16; }
constexpr bool is_integral(DType t, bool include_bool = false) {
  return (t >= DType::UInt8 && t <= DType::Int64) || (include_bool && t == DType::Bool);
}

/// PyTorch's promotion of two tensor dtypes: the higher category wins; within a category
/// the wider type; uint8 with int8 gives int32 (there is no int16); float16 with bfloat16
/// gives float32.
STRATA_API DType promote_types(DType a, DType b);

/// The C++ type of each dtype and back.
template <class T> struct dtype_of;
template <> struct dtype_of<bool> { static constexpr DType value = kBool; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = kUInt8; };
template <> struct dtype_of<int8_t> { static constexpr DType value = kInt8; };
template <> struct dtype_of<int32_t> { static constexpr DType value = kInt32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = kInt64; };
template <> struct dtype_of<Half> { static constexpr DType value = kFloat16; };
template <> struct dtype_of<BFloat16> { static constexpr DType value = kBFloat16; };
template <> struct dtype_of<float> { static constexpr DType value = kFloat32; };
template <> struct dtype_of<double> { static constexpr DType value = kFloat64; };
template <class T> inline constexpr DType dtype_of_v = dtype_of<T>::value;

}  // namespace strata

template <>
struct fmt::formatter<strata::DType> : fmt::formatter<std::string_view> {
  auto format(strata::DType t, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(strata::dtype_name(t), ctx);
  }
};
