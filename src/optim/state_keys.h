// The per-parameter keys of an optimizer's StateDict, "state.<i>.<name>" (i counted across the
// groups in order), shared by Optimizer and dist::ZeroRedundancyOptimizer, which renumbers them.
#pragma once

#include <cstddef>
#include <string>

#include <fmt/format.h>

namespace strata::optim::detail {

inline std::string state_key(size_t index, const std::string& name) { return fmt::format("state.{}.{}", index, name); }

// "state.<i>.<name>" -> (i, name); false for any other form.
inline bool parse_state_key(const std::string& key, size_t& index, std::string& name) {
  if (key.rfind("state.", 0) != 0) return false;
  size_t dot = key.find('.', 6);
  if (dot == std::string::npos || dot == 6 || dot + 1 >= key.size()) return false;
  index = 0;
  for (size_t i = 6; i < dot; ++i) {
    if (key[i] < '0' || key[i] > '9' || index > (size_t(1) << 40)) return false;
    index = index * 10 + size_t(key[i] - '0');
  }
  name = key.substr(dot + 1);
  return true;
}

}  // namespace strata::optim::detail
