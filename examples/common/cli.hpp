// Command-line validators the examples share (CLI11). CLI::PositiveNumber and
// CLI::NonNegativeNumber name the largest double as their upper bound when they refuse a value
// (a 309-digit number); these say only what is allowed. The seed must be a plain integer in
// 0..2^64-1: reading "-1" or 2^64 into a uint64_t would wrap or saturate silently.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <system_error>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

namespace example {

// An integer option of at least `lo`.
inline CLI::Validator at_least(int64_t lo) {
  return CLI::Validator(
      [lo](std::string& s) -> std::string {
        int64_t v = 0;
        const auto [end, err] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (err != std::errc() || end != s.data() + s.size()) return fmt::format("{} is not an integer", s);
        return v >= lo ? std::string() : fmt::format("{} is less than {}", s, lo);
      },
      fmt::format(">= {}", lo), fmt::format("at least {}", lo));
}

// An integer option in [lo, hi] (a bound on what a model or run can sensibly ask for, so a
// typo is refused by name rather than failing in the allocator).
inline CLI::Validator in_range(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) -> std::string {
        int64_t v = 0;
        const auto [end, err] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (err != std::errc() || end != s.data() + s.size()) return fmt::format("{} is not an integer", s);
        return v >= lo && v <= hi ? std::string() : fmt::format("{} is not in {}..{}", s, lo, hi);
      },
      fmt::format("in {}..{}", lo, hi), fmt::format("in_range {} {}", lo, hi));
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
