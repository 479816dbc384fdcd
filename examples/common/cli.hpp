// Command-line validators the examples share (CLI11). CLI::PositiveNumber and
// CLI::NonNegativeNumber name the largest double as their upper bound when they refuse a value
// (a 309-digit number); these say only what is allowed. The seed must be a plain integer in
// 0..2^64-1: reading "-1" or 2^64 into a uint64_t would wrap or saturate silently.
#pragma once

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

}  // namespace example
