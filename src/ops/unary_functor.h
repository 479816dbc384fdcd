// The per-element functor of a unary kernel call, with its scalar parameters (pow's exponent,
// clamp's bounds, leaky_relu's slope) taken from the call; shared by the CPU and CUDA kernels.
#pragma once

#include <strata/ops/unary.hpp>

#include "core/registry_internal.h"
#include "kernels/common/unary_math.h"

namespace strata::unary_functor {

template <class F> F make(const KernelCall&) { return F{}; }
template <> inline math::PowScalar make(const KernelCall& c) {
  return {c.param<UnaryScalarParams>().a, c.param<UnaryScalarParams>().ia};
}
template <> inline math::Clamp make(const KernelCall& c) {
  const auto& p = c.param<UnaryScalarParams>();
  return {p.a, p.b, p.ia, p.ib, p.integral};
}
template <> inline math::LeakyRelu make(const KernelCall& c) { return {c.param<UnaryScalarParams>().a}; }

}  // namespace strata::unary_functor
