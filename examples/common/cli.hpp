// Command-line validators the examples share (CLI11). CLI::PositiveNumber and
// CLI::NonNegativeNumber name the largest double as their upper bound when they refuse a value
// (a 309-digit number); these say only what is allowed. The seed must be a plain integer in
// 0..2^64-1: reading "-1" or 2^64 into a uint64_t would wrap or saturate silently.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <string>
#include <system_error>
#include <utility>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace example {

// An integer option in [lo, hi]: a value outside is refused as "<value> <refusal>"; `help`
// describes the range in --help, `name` names the validator.
inline CLI::Validator integer_in(int64_t lo, int64_t hi, std::string refusal, std::string help, std::string name) {
  return CLI::Validator(
      [lo, hi, refusal](std::string& s) -> std::string {
        int64_t v = 0;
        const auto [end, err] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (err != std::errc() || end != s.data() + s.size()) return fmt::format("{} is not an integer", s);
        return v >= lo && v <= hi ? std::string() : fmt::format("{} {}", s, refusal);
      },
      std::move(help), std::move(name));
}

// An integer option of at least `lo`.
inline CLI::Validator at_least(int64_t lo) {
  return integer_in(lo, std::numeric_limits<int64_t>::max(), fmt::format("is less than {}", lo),
                    fmt::format(">= {}", lo), fmt::format("at least {}", lo));
}

// An integer option in [lo, hi] (a bound on what a model or run can sensibly ask for, so a
// typo is refused by name rather than failing in the allocator).
inline CLI::Validator in_range(int64_t lo, int64_t hi) {
  return integer_in(lo, hi, fmt::format("is not in {}..{}", lo, hi), fmt::format("in {}..{}", lo, hi),
                    fmt::format("in_range {} {}", lo, hi));
}

// A random seed: an integer in 0..2^64-1.
inline const CLI::Validator seed_value(
    [](std::string& s) -> std::string {
      uint64_t v = 0;
      const auto [end, err] = std::from_chars(s.data(), s.data() + s.size(), v);
      return err == std::errc() && end == s.data() + s.size() ? std::string()
                                                               : fmt::format("{} is not an integer in 0..2^64-1", s);
    },
    "0..2^64-1", "seed");

// CLI11 reads an integer with base 0: "010" would be 8 and "0x10" 16. This makes every integer
// option of `app` (add it after the options) take plain decimal: leading zeros are dropped
// before the conversion, and anything but an optionally signed run of digits is refused.
inline void decimal_integers(CLI::App& app) {
  const CLI::Validator decimal(
      [](std::string& s) -> std::string {
        const size_t sign = !s.empty() && (s[0] == '+' || s[0] == '-') ? 1 : 0;
        if (s.size() == sign || s.find_first_not_of("0123456789", sign) != std::string::npos)
          return fmt::format("{} is not a decimal integer", s);
        const size_t first = std::min(s.find_first_not_of('0', sign), s.size() - 1);  // "000" keeps one 0
        s = s.substr(0, sign) + s.substr(first);
        return {};
      },
      "", "decimal");
  for (CLI::Option* option : app.get_options()) {
    const std::string type = option->get_type_name();
    if (type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0) option->transform(decimal);
  }
}

}  // namespace example
