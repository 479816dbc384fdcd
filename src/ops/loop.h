// Turns tensors into the StridedLoop an elementwise kernel walks: broadcasts every input to
// the output's shape (stride 0), drops size-1 dims and merges dims that are contiguous for
// every operand, innermost first.
#pragma once

#include <array>

#include <strata/core/tensor.hpp>

#include "kernels/common/strided_loop.h"

namespace strata {

// Raises Error naming `op` if an input's shape does not broadcast to out's shape.
template <int N>
StridedLoop<N> make_loop(const Tensor& out, const std::array<const Tensor*, N - 1>& inputs, std::string_view op) {
  StridedLoop<N> loop;
  const Shape& shape = out.shape();
  const int64_t nd = static_cast<int64_t>(shape.size());
  STRATA_CHECK(nd <= kMaxLoopDims, "[{}] tensors of more than {} dims are not supported", op, kMaxLoopDims);
  // per-operand strides, broadcast to out's shape, outermost first
  std::array<Strides, N> st;
  st[0] = out.strides();
  for (int k = 1; k < N; ++k) {
    const Tensor& t = *inputs[k - 1];
    st[k].assign(nd, 0);
    int64_t off = nd - t.dim();
    STRATA_CHECK(off >= 0, "[{}] input of shape {} has more dims than the output {}", op, t.shape(), shape);
    for (int64_t d = 0; d < t.dim(); ++d) {
      int64_t sz = t.shape()[d];
      STRATA_CHECK(sz == shape[off + d] || sz == 1, "[{}] shape {} does not broadcast to {}", op, t.shape(), shape);
      st[k][off + d] = sz == 1 ? 0 : t.strides()[d];
    }
  }
  loop.numel = out.numel();
  int nd_out = 0;
  for (int64_t d = nd - 1; d >= 0; --d) {  // innermost first
    int64_t sz = shape[d];
    if (sz == 1) continue;
    if (nd_out > 0) {
      bool merge = true;
      for (int k = 0; k < N; ++k)
        if (st[k][d] != loop.strides[k][nd_out - 1] * loop.shape[nd_out - 1]) merge = false;
      if (merge) {
        loop.shape[nd_out - 1] *= sz;
        continue;
      }
    }
    loop.shape[nd_out] = sz;
    for (int k = 0; k < N; ++k) loop.strides[k][nd_out] = st[k][d];
    ++nd_out;
  }
  loop.ndim = nd_out;
  if (nd_out == 0 && loop.numel == 1) {
    loop.ndim = 1;
    loop.shape[0] = 1;
    for (int k = 0; k < N; ++k) loop.strides[k][0] = 1;
  }
  return loop;
}

}  // namespace strata
