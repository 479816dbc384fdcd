// Shared by qat.cpp (prepare, prepare_qat, convert) and stubs.cpp.
#pragma once

#include <strata/quant/observer.hpp>

namespace strata::quant::detail {

/// Whether an observer has seen data (its range is set).
bool calibrated(const Observer& o);

}  // namespace strata::quant::detail
