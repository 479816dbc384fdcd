// What the pruning tests share.
#pragma once

#include <cstdint>
#include <set>

#include "testing.h"

namespace strata::testing {

/// The flat (C order) indices of the zero entries of `t`.
inline std::set<int64_t> zero_positions(const Tensor& t) {
  std::set<int64_t> out;
  const auto v = values(t);
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == 0) out.insert(static_cast<int64_t>(i));
  return out;
}

}  // namespace strata::testing
