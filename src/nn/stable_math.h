// Compositions of ops that stay finite where the plain formula overflows, shared by the
// activations and the losses.
#pragma once

#include <optional>

#include <strata/ops/binary.hpp>
#include <strata/ops/unary.hpp>

namespace strata::nn::detail {

/// log(1 + e^x) for any x, with the gradient sigmoid(x) everywhere (0.5 at 0). Each branch reads
/// x clamped to its own side, so the one a `where` leaves unused stays finite and passes no
/// 0 * inf = NaN into the gradient.
inline Tensor log1p_exp(const Tensor& x) {
  const Tensor neg = clamp(x, std::nullopt, 0), pos = clamp(x, 0, std::nullopt);
  return where(x < 0, log1p(exp(neg)), pos + log1p(exp(-pos)));
}

}  // namespace strata::nn::detail
