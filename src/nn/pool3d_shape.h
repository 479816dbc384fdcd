// The kernel description of a 3-d pooling (kernels/common/pool_window.h's Pool3dShape) from its
// tensors, checked the same way by the CPU launchers (nn/pooling3d_kernels.cpp) and the CUDA
// ones (ops/cuda/pool3d.cpp): operands contiguous (N, C, D, H, W) of one dtype and device.
#pragma once

#include <strata/core/error.hpp>
#include <strata/core/tensor.hpp>
#include <strata/nn/functional_conv3d.hpp>

#include "kernels/common/pool_window.h"

namespace strata::nn::detail {

/// x: the (gradient of the) input, y: the (gradient of the) output; indices (optional) as y.
inline pool_math::Pool3dShape pool3d_shape(const char* op, const Tensor& x, const Tensor& y, const Pool3dParams& p,
                                           const Tensor* indices = nullptr) {
  STRATA_CHECK(x.dim() == 5 && y.dim() == 5 && x.size(0) == y.size(0) && x.size(1) == y.size(1) &&
                   x.dtype() == y.dtype() && x.device() == y.device() && x.is_contiguous() && y.is_contiguous(),
               "[{}] kernel operands do not match: {} {} {} and {} {} {} (contiguous 5-d, one dtype and device)", op,
               x.shape(), x.dtype(), x.device(), y.shape(), y.dtype(), y.device());
  if (indices)
    STRATA_CHECK(indices->dtype() == kInt64 && indices->shape() == y.shape() && indices->is_contiguous() &&
                     indices->device() == y.device(),
                 "[{}] indices ({} {}) must be contiguous int64 of the output's shape {}", op, indices->dtype(),
                 indices->shape(), y.shape());
  pool_math::Pool3dShape g;
  g.planes = x.size(0) * x.size(1);
  const Size3* win[4] = {&p.kernel, &p.stride, &p.padding, &p.dilation};
  for (int i = 0; i < 3; ++i) {
    auto at = [i](const Size3& s) { return i == 0 ? s.d : i == 1 ? s.h : s.w; };
    g.dims[i] = {x.size(2 + i), y.size(2 + i), at(*win[0]), at(*win[1]), at(*win[2]), at(*win[3])};
    STRATA_CHECK(g.dims[i].in > 0 && g.dims[i].out > 0, "[{}] empty spatial dims: {} and {}", op, x.shape(),
                 y.shape());
    STRATA_CHECK(p.adaptive || (g.dims[i].k > 0 && g.dims[i].s > 0 && g.dims[i].dil > 0 && g.dims[i].p >= 0),
                 "[{}] bad window: kernel {}, stride {}, padding {}, dilation {}", op, p.kernel, p.stride, p.padding,
                 p.dilation);
  }
  g.adaptive = p.adaptive, g.count_include_pad = p.count_include_pad, g.divisor = p.divisor;
  return g;
}

}  // namespace strata::nn::detail
