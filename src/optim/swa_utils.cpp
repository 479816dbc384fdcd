// AveragedModel, SWALR and the batch-norm statistics recompute of optim::swa_utils.
#include <strata/optim/swa_utils.hpp>

#include <algorithm>
#include <cmath>
#include <numbers>

#include <strata/nn/batchnorm.hpp>
#include <strata/ops/binary.hpp>
#include <strata/ops/creation.hpp>

namespace strata::optim::swa_utils {

MultiAvgFn get_ema_multi_avg_fn(double decay) {
  STRATA_CHECK(decay >= 0 && decay <= 1, "[get_ema_multi_avg_fn] decay must be in [0, 1], got {}", decay);
  return [decay](const std::vector<Tensor>& averaged, const std::vector<Tensor>& current, int64_t) {
    for (size_t i = 0; i < averaged.size(); ++i) averaged[i].add_(current[i] - averaged[i], 1 - decay);
  };
}

MultiAvgFn get_swa_multi_avg_fn() {
  return [](const std::vector<Tensor>& averaged, const std::vector<Tensor>& current, int64_t n) {
    const double w = 1.0 / static_cast<double>(n + 1);
    for (size_t i = 0; i < averaged.size(); ++i) averaged[i].add_(current[i] - averaged[i], w);
  };
}

namespace {

// The (averaged, model) tensor pairs of the two modules, by name, after checking that they match.
std::vector<std::pair<Tensor, Tensor>> paired(const std::vector<std::pair<std::string, Tensor>>& mine,
                                              const std::vector<std::pair<std::string, Tensor>>& theirs,
                                              const char* what) {
  STRATA_CHECK(mine.size() == theirs.size(), "[AveragedModel] the average has {} {} but the model has {}",
               mine.size(), what, theirs.size());
  std::vector<std::pair<Tensor, Tensor>> out;
  for (size_t i = 0; i < mine.size(); ++i) {
    const auto& [name, a] = mine[i];
    const auto& [model_name, m] = theirs[i];
    STRATA_CHECK(name == model_name, "[AveragedModel] {} {} of the average is '{}' but the model's is '{}'", what, i,
                 name, model_name);
    if (!a.defined() || !m.defined()) {
      STRATA_CHECK(a.defined() == m.defined(), "[AveragedModel] '{}' is defined in only one of the modules", name);
      continue;
    }
    STRATA_CHECK(a.shape() == m.shape() && a.dtype() == m.dtype(),
                 "[AveragedModel] '{}' is {} {} in the average but {} {} in the model", name, a.shape(), a.dtype(),
                 m.shape(), m.dtype());
    out.emplace_back(a, m);
  }
  return out;
}

}  // namespace

AveragedModel::AveragedModel(const nn::Module& model, std::unique_ptr<nn::Module> average,
                             AveragedModelOptions options)
    : options_(std::move(options)) {
  STRATA_CHECK(average != nullptr, "[AveragedModel] the average module is null");
  if (!options_.multi_avg_fn) options_.multi_avg_fn = get_swa_multi_avg_fn();
  module_ = &register_module("module", std::move(average));
  n_averaged_ = register_buffer("n_averaged", zeros({}, TensorOptions(kInt64)));
  NoGradGuard no_grad;
  for (auto& [a, m] : paired(module_->named_parameters(), model.named_parameters(), "parameter"))
    a.copy_(m.detach());
  for (auto& [a, m] : paired(module_->named_buffers(), model.named_buffers(), "buffer")) a.copy_(m.detach());
}

int64_t AveragedModel::n_averaged() const { return n_averaged_.item<int64_t>(); }

Tensor AveragedModel::forward(const Tensor& input) { return (*module_)(input); }

void AveragedModel::update_parameters(const nn::Module& model) {
  NoGradGuard no_grad;
  const auto params = paired(module_->named_parameters(), model.named_parameters(), "parameter");
  const auto buffers = paired(module_->named_buffers(), model.named_buffers(), "buffer");
  std::vector<Tensor> averaged, current;
  auto take = [&](const Tensor& a, const Tensor& m) {
    averaged.push_back(a);
    current.push_back(m.detach().to(a.device()));
  };
  for (const auto& [a, m] : params) take(a, m);
  for (const auto& [a, m] : buffers) {
    if (options_.use_buffers && is_floating(a.dtype())) take(a, m);
    else a.copy_(m.detach());  // kept in sync with the model, as PyTorch does
  }
  const int64_t n = n_averaged();
  if (n == 0) {
    for (size_t i = 0; i < averaged.size(); ++i) averaged[i].copy_(current[i]);
  } else {
    options_.multi_avg_fn(averaged, current, n);
  }
  n_averaged_.add_(1);
}

// ---- SWALR ------------------------------------------------------------------------------

SWALR::SWALR(Optimizer& opt, double swa_lr, int64_t anneal_epochs, Anneal anneal_strategy)
    : SWALR(opt, std::vector<double>(opt.num_param_groups(), swa_lr), anneal_epochs, anneal_strategy) {}

SWALR::SWALR(Optimizer& opt, std::vector<double> swa_lrs, int64_t anneal_epochs, Anneal anneal_strategy)
    : LRScheduler(opt, "SWALR"), swa_lrs_(std::move(swa_lrs)), anneal_epochs_(anneal_epochs), anneal_(anneal_strategy) {
  STRATA_CHECK(swa_lrs_.size() == base_lrs_.size(), "[SWALR] got {} swa_lrs for {} param groups", swa_lrs_.size(),
               base_lrs_.size());
  for (size_t g = 0; g < swa_lrs_.size(); ++g)
    STRATA_CHECK(std::isfinite(swa_lrs_[g]) && swa_lrs_[g] >= 0,
                 "[SWALR] swa_lr of param group {} must be finite and >= 0, got {}", g, swa_lrs_[g]);
  STRATA_CHECK(anneal_epochs >= 0, "[SWALR] anneal_epochs must be >= 0, got {}", anneal_epochs);
  // the anneal starts from the lr the optimizer has now (another schedule's end), as PyTorch's
  for (size_t g = 0; g < base_lrs_.size(); ++g) base_lrs_[g] = opt.lr(g);
  initial_step();
}

double SWALR::lr_at(int64_t epoch, size_t g) const {
  const int64_t step = anneal_epochs_ == 0 ? std::max<int64_t>(1, epoch) : epoch;
  const double t = std::clamp(static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, anneal_epochs_)),
                              0.0, 1.0);
  const double alpha = anneal_ == Anneal::Cos ? (1 - std::cos(std::numbers::pi * t)) / 2 : t;
  return swa_lrs_.at(g) * alpha + base_lrs_.at(g) * (1 - alpha);
}

// ---- update_bn --------------------------------------------------------------------------

BatchNormRecompute::BatchNormRecompute(nn::Module& model) : model_(&model), was_training_(model.is_training()) {
  for (auto& [name, m] : model.named_modules()) {
    auto* bn = dynamic_cast<nn::BatchNormBase*>(m);
    if (bn == nullptr || !bn->running_mean.defined()) continue;
    bn->reset_running_stats();
    momenta_.emplace_back(bn, bn->options.momentum);
    bn->options.momentum = std::nullopt;
  }
  if (has_batch_norm()) model.train(true);
}

BatchNormRecompute::~BatchNormRecompute() {
  for (auto& [m, momentum] : momenta_) static_cast<nn::BatchNormBase*>(m)->options.momentum = momentum;
  if (has_batch_norm()) model_->train(was_training_);
}

}  // namespace strata::optim::swa_utils
