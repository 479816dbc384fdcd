// Whether two paths name one file: strata-tokenize and the examples' output checks both refuse
// an output that would overwrite an input, so they share this test.
#pragma once

#include <filesystem>
#include <string>
#include <system_error>

namespace strata_tools {

// `path` with links and "." / ".." resolved as far as it exists; when that lookup fails, only
// made absolute and normalised (two failed lookups must not compare equal).
inline std::filesystem::path resolved(const std::string& path) {
  std::error_code e;
  std::filesystem::path p = std::filesystem::weakly_canonical(path, e);
  if (!e) return p;
  p = std::filesystem::absolute(path, e);  // fails only without a working folder: keep the name
  return (e ? std::filesystem::path(path) : p).lexically_normal();
}

// Whether two paths name one file (existing or not: a link, "./x" and "x" are the same).
inline bool same_file(const std::string& a, const std::string& b) {
  std::error_code e;
  return std::filesystem::equivalent(a, b, e) || resolved(a) == resolved(b);
}

}  // namespace strata_tools
