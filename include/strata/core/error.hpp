// strata::Error and the one check macro every layer raises it through. Messages start with
// the op in brackets, "[matmul] ...", and name the shapes, dtypes and devices involved.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

#include <strata/core/export.hpp>

namespace strata {

/// The exception every strata API raises for bad input or a failed backend call.
class STRATA_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <class... Args>
[[noreturn]] void throw_error(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}
}  // namespace detail

}  // namespace strata

/// Raises strata::Error with a fmt-formatted message when `cond` is false. Always on, in
/// every build type.
#define STRATA_CHECK(cond, ...)                  \
  do {                                           \
    if (!(cond)) [[unlikely]] {                  \
      ::strata::detail::throw_error(__VA_ARGS__); \
    }                                            \
  } while (0)
