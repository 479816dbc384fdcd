// The losses beyond cross entropy and the regression basics: binary cross entropy on
// probabilities, Huber, the margin and embedding losses, the Poisson and Gaussian negative log
// likelihoods and the multi-label soft margin, with torch.nn.functional's formulas, defaults and
// checks. Composed of differentiable strata ops, so they run on every device and their
// gradients (also with respect to targets and weights) come from the ops' backward formulas.
#include <cmath>
#include <numbers>

#include <strata/amp/autocast.hpp>
#include <strata/nn/functional.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/reduce.hpp>
#include <strata/ops/unary.hpp>

#include "nn/reduction.h"
#include "nn/stable_math.h"

namespace strata::nn::functional {

namespace {

// A floating tensor the loss is computed in (an input, a variance).
void check_input(std::string_view op, std::string_view name, const Tensor& t, const Tensor& first) {
  STRATA_CHECK(t.defined(), "[{}] {} is undefined", op, name);
  STRATA_CHECK(is_floating(t.dtype()), "[{}] {} must be floating, got {}", op, name, t.dtype());
  STRATA_CHECK(t.device() == first.device(), "[{}] {} is on {} but the first input is on {}", op, name, t.device(),
               first.device());
}

// A target, weight or label tensor: any number dtype, converted to the input's, as the losses
// compute in the input's dtype (bool is no number: PyTorch cannot negate it either).
Tensor as_input_dtype(std::string_view op, std::string_view name, const Tensor& t, const Tensor& input) {
  STRATA_CHECK(t.defined(), "[{}] {} is undefined", op, name);
  STRATA_CHECK(t.dtype() != kBool, "[{}] {} must be floating or integer, got bool", op, name);
  STRATA_CHECK(t.device() == input.device(), "[{}] {} is on {} but the input is on {}", op, name, t.device(),
               input.device());
  return t.to(input.dtype());
}

void check_same_shape(std::string_view op, std::string_view a_name, const Tensor& a, std::string_view b_name,
                      const Tensor& b) {
  STRATA_CHECK(a.shape() == b.shape(), "[{}] {} of shape {} and {} of shape {} must have the same shape", op, a_name,
               a.shape(), b_name, b.shape());
}

// The input, floating, with a target converted to its dtype and of its shape: what the
// elementwise losses here take.
Tensor checked_target(std::string_view op, const Tensor& input, const Tensor& target) {
  check_input(op, "input", input, input);
  const Tensor y = as_input_dtype(op, "target", target, input);
  check_same_shape(op, "input", input, "target", target);
  return y;
}

// An optional weight, which must broadcast to the input's shape.
Tensor weighted(std::string_view op, const Tensor& loss, const Tensor& weight, const Tensor& input) {
  if (!weight.defined()) return loss;
  const Tensor w = as_input_dtype(op, "weight", weight, input);
  STRATA_CHECK(broadcast_shapes(w.shape(), input.shape(), op) == input.shape(),
               "[{}] weight of shape {} does not broadcast to the input's shape {}", op, w.shape(), input.shape());
  return loss * w;
}

// max(0, x); the gradient passes at 0, as PyTorch's clamp_min.
Tensor clamp_min0(const Tensor& x) { return clamp(x, 0.0, std::nullopt); }

using detail::log1p_exp;

}  // namespace

Tensor binary_cross_entropy(const Tensor& input, const Tensor& target, const BCEOptions& o) {
  amp::detail::AutocastScope amp_scope("binary_cross_entropy", input, target);
  if (amp_scope.cast()) return binary_cross_entropy(amp_scope[0], amp_scope[1], o);
  constexpr std::string_view op = "binary_cross_entropy";
  const Tensor y = checked_target(op, input, target);
  const Reduction r = parse_reduction(o.reduction, op);
  STRATA_CHECK(all(logical_and(input >= 0, input <= 1)).item<bool>(),
               "[{}] every element of the input must be a probability in [0, 1]", op);
  STRATA_CHECK(all(logical_and(y >= 0, y <= 1)).item<bool>(), "[{}] every element of the target must be in [0, 1]",
               op);
  // max(log(x), -100) and max(log(1 - x), -100) as PyTorch; a placeholder argument where the log
  // is clamped keeps the gradient there 0 rather than 0 * inf
  const Tensor above_floor = input > std::exp(-100.0);
  const Tensor log_x = where(above_floor, log(where(above_floor, input, 1.0)), -100.0);
  const Tensor below_one = input < 1;  // log(1 - x) >= log(2^-53) > -100 for any x < 1
  const Tensor log_1mx = where(below_one, log1p(-where(below_one, input, 0.0)), -100.0);
  const Tensor loss = -(y * log_x + (1 - y) * log_1mx);
  return reduce_loss(weighted(op, loss, o.weight, input), r);
}

Tensor huber_loss(const Tensor& input, const Tensor& target, std::string_view reduction, double delta) {
  amp::detail::AutocastScope amp_scope("huber_loss", input, target);
  if (amp_scope.cast()) return huber_loss(amp_scope[0], amp_scope[1], reduction, delta);
  constexpr std::string_view op = "huber_loss";
  const Tensor y = checked_target(op, input, target);
  const Reduction r = parse_reduction(reduction, op);
  STRATA_CHECK(delta > 0, "[{}] delta must be positive, got {}", op, delta);
  const Tensor diff = input - y;
  const Tensor d = abs(diff);
  // square(diff), not square(d), for the curvature at diff = 0 (see smooth_l1_loss)
  return reduce_loss(where(d < delta, 0.5 * square(diff), delta * (d - 0.5 * delta)), r);
}

Tensor soft_margin_loss(const Tensor& input, const Tensor& target, std::string_view reduction) {
  amp::detail::AutocastScope amp_scope("soft_margin_loss", input, target);
  if (amp_scope.cast()) return soft_margin_loss(amp_scope[0], amp_scope[1], reduction);
  constexpr std::string_view op = "soft_margin_loss";
  const Tensor y = checked_target(op, input, target);
  const Reduction r = parse_reduction(reduction, op);
  return reduce_loss(log1p_exp(-y * input), r);
}

Tensor margin_ranking_loss(const Tensor& input1, const Tensor& input2, const Tensor& target, double margin,
                           std::string_view reduction) {
  amp::detail::AutocastScope amp_scope("margin_ranking_loss", input1, input2, target);
  if (amp_scope.cast()) return margin_ranking_loss(amp_scope[0], amp_scope[1], amp_scope[2], margin, reduction);
  constexpr std::string_view op = "margin_ranking_loss";
  check_input(op, "input1", input1, input1);
  check_input(op, "input2", input2, input1);
  const Tensor y = as_input_dtype(op, "target", target, input1);
  check_same_shape(op, "input1", input1, "input2", input2);
  check_same_shape(op, "input1", input1, "target", target);
  const Reduction r = parse_reduction(reduction, op);
  return reduce_loss(clamp_min0(-y * (input1 - input2) + margin), r);
}

Tensor hinge_embedding_loss(const Tensor& input, const Tensor& target, double margin, std::string_view reduction) {
  amp::detail::AutocastScope amp_scope("hinge_embedding_loss", input, target);
  if (amp_scope.cast()) return hinge_embedding_loss(amp_scope[0], amp_scope[1], margin, reduction);
  constexpr std::string_view op = "hinge_embedding_loss";
  const Tensor y = checked_target(op, input, target);
  const Reduction r = parse_reduction(reduction, op);
  // as PyTorch: a label that is neither 1 nor -1 takes both terms
  const Tensor loss = where(y != 1, clamp_min0(margin - input), 0.0) + where(y != -1, input, 0.0);
  return reduce_loss(loss, r);
}

Tensor cosine_embedding_loss(const Tensor& input1, const Tensor& input2, const Tensor& target, double margin,
                             std::string_view reduction) {
  amp::detail::AutocastScope amp_scope("cosine_embedding_loss", input1, input2, target);
  if (amp_scope.cast()) return cosine_embedding_loss(amp_scope[0], amp_scope[1], amp_scope[2], margin, reduction);
  constexpr std::string_view op = "cosine_embedding_loss";
  check_input(op, "input1", input1, input1);
  check_input(op, "input2", input2, input1);
  const Tensor y = as_input_dtype(op, "target", target, input1);
  check_same_shape(op, "input1", input1, "input2", input2);
  STRATA_CHECK(y.dim() <= 1, "[{}] the target must be 0-d or 1-d (one label per pair), got shape {}", op, y.shape());
  if (y.dim() == 1) {
    STRATA_CHECK(input1.dim() == 2 && input1.size(0) == y.size(0),
                 "[{}] a target of shape {} needs inputs of shape ({}, D), got {}", op, y.shape(), y.size(0),
                 input1.shape());
  } else {
    STRATA_CHECK(input1.dim() == 1, "[{}] a 0-d target needs 1-d inputs, got {}", op, input1.shape());
  }
  const Reduction r = parse_reduction(reduction, op);
  // PyTorch's own cosine here: 1e-12 added to each squared norm, not cosine_similarity's eps
  const int64_t d = y.dim();
  const Tensor dot = sum(input1 * input2, {d});
  const Tensor norms2 = (sum(square(input1), {d}) + 1e-12) * (sum(square(input2), {d}) + 1e-12);
  const Tensor cos = dot / sqrt(norms2);
  const Tensor loss = where(y == 1, 1 - cos, 0.0) + where(y == -1, clamp_min0(cos - margin), 0.0);
  return reduce_loss(loss, r);
}

Tensor triplet_margin_loss(const Tensor& anchor, const Tensor& positive, const Tensor& negative,
                           const TripletMarginLossOptions& o) {
  amp::detail::AutocastScope amp_scope("triplet_margin_loss", anchor, positive, negative);
  if (amp_scope.cast()) return triplet_margin_loss(amp_scope[0], amp_scope[1], amp_scope[2], o);
  constexpr std::string_view op = "triplet_margin_loss";
  check_input(op, "anchor", anchor, anchor);
  check_input(op, "positive", positive, anchor);
  check_input(op, "negative", negative, anchor);
  check_same_shape(op, "anchor", anchor, "positive", positive);
  check_same_shape(op, "anchor", anchor, "negative", negative);
  STRATA_CHECK(anchor.dim() >= 1, "[{}] the inputs must have a feature dim, got 0-d tensors", op);
  const Reduction r = parse_reduction(o.reduction, op);
  const Tensor d_pos = pairwise_distance(anchor, positive, o.p, o.eps);
  Tensor d_neg = pairwise_distance(anchor, negative, o.p, o.eps);
  // the swap of Balntas et al.: the negative's distance to the positive when that is smaller
  if (o.swap) d_neg = minimum(d_neg, pairwise_distance(positive, negative, o.p, o.eps));
  return reduce_loss(clamp_min0(o.margin + d_pos - d_neg), r);
}

Tensor poisson_nll_loss(const Tensor& input, const Tensor& target, const PoissonNLLLossOptions& o) {
  amp::detail::AutocastScope amp_scope("poisson_nll_loss", input, target);
  if (amp_scope.cast()) return poisson_nll_loss(amp_scope[0], amp_scope[1], o);
  constexpr std::string_view op = "poisson_nll_loss";
  const Tensor y = checked_target(op, input, target);
  const Reduction r = parse_reduction(o.reduction, op);
  Tensor loss = o.log_input ? exp(input) - y * input : input - y * log(input + o.eps);
  if (o.full) {
    // Stirling's log(y!) ~ y log y - y + 0.5 log(2 pi y), left out where y <= 1 (as PyTorch); a
    // placeholder there keeps log's gradient finite
    const Tensor small = y <= 1;
    const Tensor ys = where(small, 2.0, y);
    const Tensor stirling = ys * log(ys) - ys + 0.5 * log(2 * std::numbers::pi * ys);
    loss = loss + where(small, 0.0, stirling);
  }
  return reduce_loss(loss, r);
}

Tensor gaussian_nll_loss(const Tensor& input, const Tensor& target, const Tensor& var,
                         const GaussianNLLLossOptions& o) {
  constexpr std::string_view op = "gaussian_nll_loss";
  check_input(op, "input", input, input);
  const Tensor y = as_input_dtype(op, "target", target, input);
  check_input(op, "var", var, input);
  STRATA_CHECK(broadcast_shapes(y.shape(), input.shape(), op) == input.shape(),
               "[{}] target of shape {} must have the input's shape {} or broadcast to it", op, y.shape(),
               input.shape());
  // var has the input's shape, or one variance for the whole last dim: that shape without its
  // last dim, or with a last dim of 1
  Tensor v = var.to(input.dtype());
  if (v.shape() != input.shape()) {
    const Shape lead = input.dim() > 0 ? Shape(input.shape().begin(), input.shape().end() - 1) : Shape{};
    if (v.shape() == lead) {
      v = v.unsqueeze(v.dim());
    } else {
      STRATA_CHECK(v.dim() > 0 && Shape(v.shape().begin(), v.shape().end() - 1) == lead && v.shape().back() == 1,
                   "[{}] var of shape {} must have the input's shape {}, or it without its last dim, or with a last "
                   "dim of 1",
                   op, var.shape(), input.shape());
    }
  }
  const Reduction r = parse_reduction(o.reduction, op);
  STRATA_CHECK(!any(v < 0).item<bool>(), "[{}] var has negative entries", op);
  // a variance below eps still learns, as PyTorch clamps it under no_grad
  const Tensor v_eps = detail::clamp_min_keeping_grad(v, o.eps);
  Tensor loss = 0.5 * (log(v_eps) + square(input - y) / v_eps);
  if (o.full) loss = loss + 0.5 * std::log(2 * std::numbers::pi);
  return reduce_loss(loss, r);
}

Tensor multilabel_soft_margin_loss(const Tensor& input, const Tensor& target,
                                   const MultiLabelSoftMarginLossOptions& o) {
  constexpr std::string_view op = "multilabel_soft_margin_loss";
  const Tensor y = checked_target(op, input, target);
  STRATA_CHECK(input.dim() >= 1, "[{}] the input must be (N, C) or (C), got a 0-d tensor", op);
  const Reduction r = parse_reduction(o.reduction, op);
  // -(y log sigmoid(x) + (1 - y) log sigmoid(-x)), averaged over the classes of each sample
  const Tensor per_class = weighted(op, y * log1p_exp(-input) + (1 - y) * log1p_exp(input), o.weight, input);
  const Tensor loss = sum(per_class, {-1}) / static_cast<double>(input.size(-1));  // (N) or ()
  return reduce_loss(loss, r);
}

}  // namespace strata::nn::functional
