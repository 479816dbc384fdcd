// The elementwise losses (mse, l1, smooth_l1, binary_cross_entropy_with_logits, kl_div),
// composed of differentiable strata ops, so their gradients (also with respect to the target)
// come from the ops' own backward formulas.
#include <limits>

#include <strata/amp/autocast.hpp>
#include <strata/nn/functional.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

#include "nn/reduction.h"

namespace strata::nn::functional {

namespace {

void check_pair(const Tensor& input, const Tensor& target, std::string_view op) {
  STRATA_CHECK(input.defined() && target.defined(), "[{}] input or target is undefined", op);
  STRATA_CHECK(input.shape() == target.shape(), "[{}] input of shape {} and target of shape {} must have the same shape",
               op, input.shape(), target.shape());
  STRATA_CHECK(input.device() == target.device(), "[{}] input is on {} but the target is on {}", op, input.device(),
               target.device());
  STRATA_CHECK(is_floating(input.dtype()), "[{}] input must be floating, got {}", op, input.dtype());
}

}  // namespace

Tensor mse_loss(const Tensor& input, const Tensor& target, std::string_view reduction) {
  amp::detail::AutocastScope amp_scope("mse_loss", input, target);
  if (amp_scope.cast()) return mse_loss(amp_scope[0], amp_scope[1], reduction);
  check_pair(input, target, "mse_loss");
  const Reduction r = parse_reduction(reduction, "mse_loss");
  return reduce_loss(square(input - target), r);
}

Tensor l1_loss(const Tensor& input, const Tensor& target, std::string_view reduction) {
  amp::detail::AutocastScope amp_scope("l1_loss", input, target);
  if (amp_scope.cast()) return l1_loss(amp_scope[0], amp_scope[1], reduction);
  check_pair(input, target, "l1_loss");
  const Reduction r = parse_reduction(reduction, "l1_loss");
  return reduce_loss(abs(input - target), r);
}

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, std::string_view reduction, double beta) {
  amp::detail::AutocastScope amp_scope("smooth_l1_loss", input, target);
  if (amp_scope.cast()) return smooth_l1_loss(amp_scope[0], amp_scope[1], reduction, beta);
  check_pair(input, target, "smooth_l1_loss");
  STRATA_CHECK(beta >= 0, "[smooth_l1_loss] beta must be non-negative, got {}", beta);
  const Reduction r = parse_reduction(reduction, "smooth_l1_loss");
  const Tensor diff = input - target;
  const Tensor d = abs(diff);
  if (beta == 0) return reduce_loss(d, r);
  // square(diff), not square(d): abs's derivative of 0 at diff = 0 would zero the curvature
  // there; a division, as 0.5 / beta overflows float for a tiny beta
  return reduce_loss(where(d < beta, square(diff) / (2 * beta), d - 0.5 * beta), r);
}

Tensor binary_cross_entropy_with_logits(const Tensor& input, const Tensor& target, const BCEWithLogitsOptions& o) {
  amp::detail::AutocastScope amp_scope("binary_cross_entropy_with_logits", input, target);
  if (amp_scope.cast()) return binary_cross_entropy_with_logits(amp_scope[0], amp_scope[1], o);
  check_pair(input, target, "binary_cross_entropy_with_logits");
  const Reduction r = parse_reduction(o.reduction, "binary_cross_entropy_with_logits");
  const Tensor y = target.to(input.dtype());
  // softplus(-x) = m + log(exp(-m) + exp(-x - m)) with m = max(-x, 0): no exp overflows, and the
  // gradient is exact for any choice of m (the expression does not depend on it)
  const Tensor m = strata::relu(-input);
  const Tensor softplus_neg = m + log(exp(-m) + exp(-input - m));  // -log sigmoid(x)
  Tensor loss;
  if (o.pos_weight.defined()) {
    const Tensor& pw = o.pos_weight;
    STRATA_CHECK(broadcast_shapes(pw.shape(), input.shape(), "binary_cross_entropy_with_logits") == input.shape(),
                 "[binary_cross_entropy_with_logits] pos_weight of shape {} does not broadcast to the input's shape {}",
                 pw.shape(), input.shape());
    const Tensor log_weight = (pw.to(input.dtype()) - 1) * y + 1;
    loss = (1 - y) * input + log_weight * softplus_neg;
  } else {
    loss = (1 - y) * input + softplus_neg;
  }
  if (o.weight.defined()) {
    STRATA_CHECK(broadcast_shapes(o.weight.shape(), input.shape(), "binary_cross_entropy_with_logits") == input.shape(),
                 "[binary_cross_entropy_with_logits] weight of shape {} does not broadcast to the input's shape {}",
                 o.weight.shape(), input.shape());
    loss = loss * o.weight.to(input.dtype());
  }
  return reduce_loss(loss, r);
}

Tensor kl_div(const Tensor& input, const Tensor& target, std::string_view reduction, bool log_target) {
  amp::detail::AutocastScope amp_scope("kl_div", input, target);
  if (amp_scope.cast()) return kl_div(amp_scope[0], amp_scope[1], reduction, log_target);
  check_pair(input, target, "kl_div");
  const Reduction r = parse_reduction(reduction, "kl_div", true);
  const Tensor y = target.to(input.dtype());
  Tensor loss;
  if (log_target) {
    loss = exp(y) * (y - input);
  } else {
    // y log y is 0 at y = 0 and NaN below (xlogy); log of 1 at 0 keeps the gradient finite
    const Tensor zero = y == 0;
    loss = where(zero, 0.0, y * log(where(zero, 1.0, y))) - y * input;
  }
  return reduce_loss(loss, r);
}

}  // namespace strata::nn::functional
