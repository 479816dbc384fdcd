// Compositions of ops shared by the activations, the losses and the distances: ones that stay
// finite where the plain formula overflows, and a clamp that keeps the gradient.
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

/// max(x, lo) whose gradient passes to x unchanged where it is clamped, as PyTorch's clamp
/// under no_grad: a norm or variance below lo still learns.
inline Tensor clamp_min_keeping_grad(const Tensor& x, double lo) { return where(x < lo, x - x.detach() + lo, x); }

}  // namespace strata::nn::detail
