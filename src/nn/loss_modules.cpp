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

BCELoss::BCELoss(functional::BCEOptions o) : options(std::move(o)) {
  parse_reduction(options.reduction, name());
  if (options.weight.defined()) options.weight = register_buffer("weight", options.weight);
}
Tensor BCELoss::forward(const Tensor& input, const Tensor& target) {
  return functional::binary_cross_entropy(input, target, options);
}

HuberLoss::HuberLoss(HuberLossOptions o) : options(std::move(o)) {
  parse_reduction(options.reduction, name());
  STRATA_CHECK(options.delta > 0, "[HuberLoss] delta must be positive, got {}", options.delta);
}
Tensor HuberLoss::forward(const Tensor& input, const Tensor& target) {
  return functional::huber_loss(input, target, options.reduction, options.delta);
}

SoftMarginLoss::SoftMarginLoss(std::string r) : reduction(std::move(r)) { parse_reduction(reduction, name()); }
Tensor SoftMarginLoss::forward(const Tensor& input, const Tensor& target) {
  return functional::soft_margin_loss(input, target, reduction);
}

MarginRankingLoss::MarginRankingLoss(MarginRankingLossOptions o) : options(std::move(o)) {
  parse_reduction(options.reduction, name());
}
Tensor MarginRankingLoss::forward(const Tensor& input1, const Tensor& input2, const Tensor& target) {
  return functional::margin_ranking_loss(input1, input2, target, options.margin, options.reduction);
}

HingeEmbeddingLoss::HingeEmbeddingLoss(HingeEmbeddingLossOptions o) : options(std::move(o)) {
  parse_reduction(options.reduction, name());
}
Tensor HingeEmbeddingLoss::forward(const Tensor& input, const Tensor& target) {
  return functional::hinge_embedding_loss(input, target, options.margin, options.reduction);
}

CosineEmbeddingLoss::CosineEmbeddingLoss(CosineEmbeddingLossOptions o) : options(std::move(o)) {
  parse_reduction(options.reduction, name());
}
Tensor CosineEmbeddingLoss::forward(const Tensor& input1, const Tensor& input2, const Tensor& target) {
  return functional::cosine_embedding_loss(input1, input2, target, options.margin, options.reduction);
}

TripletMarginLoss::TripletMarginLoss(functional::TripletMarginLossOptions o) : options(std::move(o)) {
  parse_reduction(options.reduction, name());
}
Tensor TripletMarginLoss::forward(const Tensor& anchor, const Tensor& positive, const Tensor& negative) {
  return functional::triplet_margin_loss(anchor, positive, negative, options);
}

PoissonNLLLoss::PoissonNLLLoss(functional::PoissonNLLLossOptions o) : options(std::move(o)) {
  parse_reduction(options.reduction, name());
}
Tensor PoissonNLLLoss::forward(const Tensor& input, const Tensor& target) {
  return functional::poisson_nll_loss(input, target, options);
}

GaussianNLLLoss::GaussianNLLLoss(functional::GaussianNLLLossOptions o) : options(std::move(o)) {
  parse_reduction(options.reduction, name());
}
Tensor GaussianNLLLoss::forward(const Tensor& input, const Tensor& target, const Tensor& var) {
  return functional::gaussian_nll_loss(input, target, var, options);
}

MultiLabelSoftMarginLoss::MultiLabelSoftMarginLoss(functional::MultiLabelSoftMarginLossOptions o)
    : options(std::move(o)) {
  parse_reduction(options.reduction, name());
  if (options.weight.defined()) options.weight = register_buffer("weight", options.weight);
}
Tensor MultiLabelSoftMarginLoss::forward(const Tensor& input, const Tensor& target) {
  return functional::multilabel_soft_margin_loss(input, target, options);
}

}  // namespace strata::nn
