// The loss modules: option checks at construction, weights as buffers, and forwarding to
// nn::functional.
#include <strata/nn/loss.hpp>

#include "nn/reduction.h"

namespace strata::nn {

CrossEntropyLoss::CrossEntropyLoss(functional::CrossEntropyOptions o) : options(std::move(o)) {
  parse_reduction(options.reduction, name());
  STRATA_CHECK(options.label_smoothing >= 0 && options.label_smoothing <= 1,
               "[CrossEntropyLoss] label_smoothing must be in [0, 1], got {}", options.label_smoothing);
  if (options.weight.defined()) options.weight = register_buffer("weight", options.weight);
}
Tensor CrossEntropyLoss::forward(const Tensor& input, const Tensor& target) {
  return functional::cross_entropy(input, target, options);
}

NLLLoss::NLLLoss(functional::NLLLossOptions o) : options(std::move(o)) {
  parse_reduction(options.reduction, name());
  if (options.weight.defined()) options.weight = register_buffer("weight", options.weight);
}
Tensor NLLLoss::forward(const Tensor& input, const Tensor& target) {
  return functional::nll_loss(input, target, options);
}

MSELoss::MSELoss(std::string r) : reduction(std::move(r)) { parse_reduction(reduction, name()); }
Tensor MSELoss::forward(const Tensor& input, const Tensor& target) {
  return functional::mse_loss(input, target, reduction);
}

L1Loss::L1Loss(std::string r) : reduction(std::move(r)) { parse_reduction(reduction, name()); }
Tensor L1Loss::forward(const Tensor& input, const Tensor& target) {
  return functional::l1_loss(input, target, reduction);
}

SmoothL1Loss::SmoothL1Loss(SmoothL1LossOptions o) : options(std::move(o)) {
  parse_reduction(options.reduction, name());
  STRATA_CHECK(options.beta >= 0, "[SmoothL1Loss] beta must be non-negative, got {}", options.beta);
}
Tensor SmoothL1Loss::forward(const Tensor& input, const Tensor& target) {
  return functional::smooth_l1_loss(input, target, options.reduction, options.beta);
}

BCEWithLogitsLoss::BCEWithLogitsLoss(functional::BCEWithLogitsOptions o) : options(std::move(o)) {
  parse_reduction(options.reduction, name());
  if (options.weight.defined()) options.weight = register_buffer("weight", options.weight);
  if (options.pos_weight.defined()) options.pos_weight = register_buffer("pos_weight", options.pos_weight);
}
Tensor BCEWithLogitsLoss::forward(const Tensor& input, const Tensor& target) {
  return functional::binary_cross_entropy_with_logits(input, target, options);
}

KLDivLoss::KLDivLoss(KLDivLossOptions o) : options(std::move(o)) {
  parse_reduction(options.reduction, name(), true);
}
Tensor KLDivLoss::forward(const Tensor& input, const Tensor& target) {
  return functional::kl_div(input, target, options.reduction, options.log_target);
}

}  // namespace strata::nn
