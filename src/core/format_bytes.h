// Byte counts for people: "1.50 MiB", "-512 B".
#pragma once

#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace strata::detail {

inline std::string format_bytes(int64_t n) {
  const int64_t a = n < 0 ? -n : n;
  const double v = static_cast<double>(n);
  if (a >= (int64_t(1) << 30)) return fmt::format("{:.2f} GiB", v / double(1 << 30));
  if (a >= (int64_t(1) << 20)) return fmt::format("{:.2f} MiB", v / double(1 << 20));
  if (a >= (int64_t(1) << 10)) return fmt::format("{:.2f} KiB", v / double(1 << 10));
  return fmt::format("{} B", n);
}

}  // namespace strata::detail
