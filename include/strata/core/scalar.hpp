// A number that is not a tensor: what `t + 2.0` and `full({2}, 7)` take. It remembers whether
// it was written as a bool, an integer or a floating value, for type promotion.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <strata/core/dtype.hpp>

namespace strata {

class Scalar {
 public:
  enum class Kind : uint8_t { Bool, Int, Float };

  Scalar() : kind_(Kind::Int), i_(0) {}
  template <class T, std::enable_if_t<std::is_same_v<T, bool>, int> = 0>
  Scalar(T v) : kind_(Kind::Bool), i_(v ? 1 : 0) {}
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Scalar(T v) : kind_(Kind::Int), i_(static_cast<int64_t>(v)) {}
  template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T v) : kind_(Kind::Float), d_(static_cast<double>(v)) {}
  Scalar(Half v) : kind_(Kind::Float), d_(static_cast<float>(v)) {}
  Scalar(BFloat16 v) : kind_(Kind::Float), d_(static_cast<float>(v)) {}

  Kind kind() const { return kind_; }
  bool is_floating() const { return kind_ == Kind::Float; }
  double to_double() const { return kind_ == Kind::Float ? d_ : static_cast<double>(i_); }
  /// A floating value truncated toward zero, saturating at the int64 range; NaN gives 0.
  int64_t to_int() const {
    if (kind_ != Kind::Float) return i_;
    if (!(d_ == d_)) return 0;
    if (d_ >= 9223372036854775807.0) return INT64_MAX;
    if (d_ <= -9223372036854775808.0) return INT64_MIN;
    return static_cast<int64_t>(d_);
  }
  template <class T> T to() const {
    if constexpr (std::is_same_v<T, bool>) return kind_ == Kind::Float ? d_ != 0.0 : i_ != 0;
    else if constexpr (std::is_integral_v<T>) return static_cast<T>(to_int());
    else return static_cast<T>(static_cast<float>(to_double()));
  }
  /// Whether T holds this value: an integer type the value truncated toward zero (not NaN or
  /// infinite), float a finite value below its overflow (infinities and NaN stay); bool and
  /// the other types always (as LibTorch's checked conversion of item()).
  template <class T> bool fits() const {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      using L = std::numeric_limits<T>;
      if (kind_ != Kind::Float)
        return std::is_signed_v<T> ? i_ >= static_cast<int64_t>(L::min()) && i_ <= static_cast<int64_t>(L::max())
                                   : i_ >= 0 && static_cast<uint64_t>(i_) <= static_cast<uint64_t>(L::max());
      // [lo, 2^digits): exact doubles; a fraction above -1 truncates to 0, which every type holds
      const double hi = std::ldexp(1.0, L::digits), lo = std::is_signed_v<T> ? -hi : 0.0;
      return d_ > lo - 1 && d_ < hi;
    } else if constexpr (std::is_same_v<T, float>) {
      constexpr auto kLargest = static_cast<double>(std::numeric_limits<float>::max());
      return kind_ != Kind::Float || !std::isfinite(d_) || std::fabs(d_) <= kLargest;
    } else {
      return true;
    }
  }
  /// The dtype a lone tensor made from this scalar gets: bool, int64 or float32.
  DType default_dtype() const {
    return kind_ == Kind::Bool ? kBool : kind_ == Kind::Int ? kInt64 : kFloat32;
  }

 private:
  Kind kind_;
  union {
    int64_t i_;
    double d_;
  };
};

template <> inline double Scalar::to<double>() const { return to_double(); }

}  // namespace strata
