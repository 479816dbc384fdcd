// The layout in which pad and interpolate index an input: a channels-last 4-d input is
// worked on through its NHWC view, in which it is dense, so the result comes back
// channels-last (Note [Channels-last results] in src/nn/memory_format.h) without a
// transposing copy.
#pragma once

#include "nn/memory_format.h"

namespace strata::nn::detail {

struct SpatialView {
  explicit SpatialView(const Tensor& x)
      : rank(x.dim()),
        channels_last(x.dim() == 4 && suggested_format(x) == MemoryFormat::ChannelsLast),
        tensor(channels_last ? x.permute({0, 2, 3, 1}) : x) {}

  /// The dim of `tensor` that holds the input's dim d.
  int64_t physical(int64_t d) const {
    if (!channels_last) return d;
    return d == 0 ? 0 : d == 1 ? 3 : d - 1;
  }
  /// A result computed on `tensor`'s dims, viewed with the input's dim order again.
  Tensor restore(const Tensor& t) const { return channels_last ? t.permute({0, 3, 1, 2}) : t; }

  int64_t rank;
  bool channels_last;
  Tensor tensor;
};

}  // namespace strata::nn::detail
