// The loop description every reduction kernel walks, CPU and CUDA alike: the kept dims (one
// output element per index) and the reduced dims of the input, each sorted innermost first by
// input stride and coalesced where contiguous. src/ops/reduce.cpp builds it
// (detail::make_reduce_plan); strides and offsets are in elements.
#pragma once

#include <cstdint>

#include "strided_loop.h"

namespace strata {

struct ReducePlan {
  int nkept = 0, nred = 0;
  int64_t kept_size[kMaxLoopDims] = {}, kept_in[kMaxLoopDims] = {}, kept_out[kMaxLoopDims] = {};
  int64_t red_size[kMaxLoopDims] = {}, red_in[kMaxLoopDims] = {};
  int64_t num_out = 1;  // product of kept sizes
  int64_t num_red = 1;  // product of reduced sizes
  // The innermost memory dim is kept rather than reduced (a sum over dim 0 of an (N, C) tensor).
  bool outer() const { return nkept > 0 && nred > 0 && kept_in[0] < red_in[0]; }
};

}  // namespace strata
