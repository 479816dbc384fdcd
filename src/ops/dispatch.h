// Maps a runtime DType to a C++ type for a generic lambda: dispatch(dt, [&](auto tag) {
// using T = typename decltype(tag)::type; ... }). The sets name which dtypes an op supports;
// a dtype outside the set raises Error naming the op.
#pragma once

#include <cstdint>
#include <string_view>

#include <strata/core/dtype.hpp>
#include <strata/core/error.hpp>

namespace strata {

template <class T> struct type_tag { using type = T; };

enum class DTypeSet : uint8_t {
  All,          // every dtype
  Numeric,      // all but bool
  Floating,     // f16, bf16, f32, f64
  Integral,     // u8, i8, i32, i64
  IntegralBool  // bool and the integers
};

inline bool dtype_in_set(DType t, DTypeSet set) {
  switch (set) {
    case DTypeSet::All: return true;
    case DTypeSet::Numeric: return t != kBool;
    case DTypeSet::Floating: return is_floating(t);
    case DTypeSet::Integral: return is_integral(t);
    case DTypeSet::IntegralBool: return is_integral(t, true);
  }
  return false;
}

template <DTypeSet Set = DTypeSet::All, class F>
decltype(auto) dispatch(DType t, std::string_view op, F&& f) {
  STRATA_CHECK(dtype_in_set(t, Set), "[{}] not supported for dtype {}", op, t);
  switch (t) {
    case DType::Float32: if constexpr (Set != DTypeSet::Integral && Set != DTypeSet::IntegralBool) return f(type_tag<float>{}); break;
    case DType::Float64: if constexpr (Set != DTypeSet::Integral && Set != DTypeSet::IntegralBool) return f(type_tag<double>{}); break;
    case DType::Float16: if constexpr (Set != DTypeSet::Integral && Set != DTypeSet::IntegralBool) return f(type_tag<Half>{}); break;
    case DType::BFloat16: if constexpr (Set != DTypeSet::Integral && Set != DTypeSet::IntegralBool) return f(type_tag<BFloat16>{}); break;
    case DType::Int64: if constexpr (Set != DTypeSet::Floating) return f(type_tag<int64_t>{}); break;
    case DType::Int32: if constexpr (Set != DTypeSet::Floating) return f(type_tag<int32_t>{}); break;
    case DType::Int8: if constexpr (Set != DTypeSet::Floating) return f(type_tag<int8_t>{}); break;
    case DType::UInt8: if constexpr (Set != DTypeSet::Floating) return f(type_tag<uint8_t>{}); break;
    case DType::Bool: if constexpr (Set == DTypeSet::All || Set == DTypeSet::IntegralBool) return f(type_tag<bool>{}); break;
  }
  detail::throw_error("[{}] not supported for dtype {}", op, t);
}

}  // namespace strata
