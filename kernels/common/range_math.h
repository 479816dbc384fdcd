// Value i of arange and linspace, shared by the CPU and CUDA kernels.
#pragma once

#include <cstdint>

#include "host_device.h"

namespace strata::math {

/// arange: start + i * step (the CPU kernel calls this alone: without linspace's branches its
/// loop vectorizes).
STRATA_HOST_DEVICE double arange_value(int64_t i, double start, double step) {
  return start + static_cast<double>(i) * step;
}

/// arange, or linspace (count values from start to end, step apart): the first half steps up
/// from start and the second half down from end, as PyTorch computes it, so both ends are exact
/// and the values are symmetric (the middle of [-1, 1] is exactly 0).
STRATA_HOST_DEVICE double range_value(int64_t i, double start, double step, double end, int64_t count,
                                             bool linspace) {
  if (!linspace || count == 1 || i < count / 2) return arange_value(i, start, step);
  // the middle of an odd count: exact whether or not the compiler fuses end - k * step
  if (2 * i == count - 1) return start + (end - start) * 0.5;
  return end - static_cast<double>(count - 1 - i) * step;
}

}  // namespace strata::math
