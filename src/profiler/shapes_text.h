// Input shapes as PyTorch's profiler prints them: "[[2, 3], [3, 4]]" ("[]" for an undefined input).
#pragma once

#include <string>
#include <vector>

#include <strata/core/shape.hpp>

namespace strata::profiler::detail {

std::string shapes_text(const std::vector<Shape>& shapes);

}  // namespace strata::profiler::detail
