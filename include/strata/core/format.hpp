// Printing tensors: fmt::format("{}", t) and std::ostream << t give PyTorch's layout,
// eliding the middle of each dim when the tensor has more than 1000 elements.
#pragma once

#include <ostream>
#include <string>

#include <fmt/format.h>

#include <strata/core/tensor.hpp>

namespace strata {
STRATA_API std::string to_string(const Tensor& t);
inline std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << to_string(t); }
inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }
inline std::ostream& operator<<(std::ostream& os, Device d) {
  return d.is_cpu() ? os << "cpu" : os << "cuda:" << d.index;
}
}  // namespace strata

template <>
struct fmt::formatter<strata::Tensor> {
  constexpr auto parse(fmt::format_parse_context& ctx) { return ctx.begin(); }
  auto format(const strata::Tensor& t, fmt::format_context& ctx) const {
    return fmt::format_to(ctx.out(), "{}", strata::to_string(t));
  }
};
