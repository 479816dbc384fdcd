// The library's version, as a compile-time constant and at run time.
#pragma once

#include <strata/core/export.hpp>

#define STRATA_VERSION_MAJOR 0
#define STRATA_VERSION_MINOR 1
#define STRATA_VERSION_PATCH 0
#define STRATA_VERSION_STRING "0.1.0"

namespace strata {
/// The version of the linked library, "major.minor.patch".
STRATA_API const char* version();
}  // namespace strata
