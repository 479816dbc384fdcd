// Stochastic Weight Averaging (Izmailov et al. 2018) and exponential moving averages of
// weights, as torch.optim.swa_utils: AveragedModel keeps the running average of a model's
// parameters (optionally its buffers too), SWALR anneals each group's lr to a fixed SWA lr,
// and update_bn recomputes batch-norm statistics for the averaged weights.
//
//   auto avg = std::make_shared<optim::swa_utils::AveragedModel>(model, std::make_unique<Net>(),
//       optim::swa_utils::AveragedModelOptions{.multi_avg_fn = optim::swa_utils::get_ema_multi_avg_fn(0.999)});
//   ... after each optimizer step: avg->update_parameters(model);
//
// C++ modules have no generic deep copy, so AveragedModel takes a freshly built module of the
// same architecture and copies the model's values into it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <vector>

#include <strata/autograd/grad_mode.hpp>
#include <strata/nn/module.hpp>
#include <strata/optim/scheduler.hpp>

namespace strata::optim::swa_utils {

/// Updates `averaged` in place from `current` (the model's tensors, on the same devices), given
/// how many models were averaged before: PyTorch's multi_avg_fn.
using MultiAvgFn =
    std::function<void(const std::vector<Tensor>& averaged, const std::vector<Tensor>& current, int64_t num_averaged)>;

/// avg = decay * avg + (1 - decay) * current (computed as a lerp); decay in [0, 1].
STRATA_API MultiAvgFn get_ema_multi_avg_fn(double decay = 0.999);
/// avg = avg + (current - avg) / (num_averaged + 1): the equal-weight running mean.
STRATA_API MultiAvgFn get_swa_multi_avg_fn();

struct AveragedModelOptions {
  /// The averaging rule; the equal-weight mean (get_swa_multi_avg_fn) when empty.
  MultiAvgFn multi_avg_fn;
  /// Average the floating buffers (running statistics) too; otherwise they are copied from the
  /// model at each update. Integer buffers (num_batches_tracked) are always copied.
  bool use_buffers = false;
};

/// A module holding the average: child "module" (the average) and buffer "n_averaged", so its
/// state_dict is PyTorch's ("module.<name>", "n_averaged") and a checkpoint restores it.
class STRATA_API AveragedModel : public nn::Module {
 public:
  /// `average` is a module built like `model` (same parameter and buffer names and shapes); it
  /// receives a copy of the model's current values. Raises Error naming the first mismatch.
  AveragedModel(const nn::Module& model, std::unique_ptr<nn::Module> average, AveragedModelOptions options = {});

  /// Folds the model's current values into the average; the first call copies them.
  void update_parameters(const nn::Module& model);
  /// How many models have been averaged.
  int64_t n_averaged() const;
  nn::Module& module() { return *module_; }
  Tensor forward(const Tensor& input) override;
  std::string name() const override { return "AveragedModel"; }

 private:
  nn::Module* module_;
  AveragedModelOptions options_;
  Tensor n_averaged_;  // int64 scalar
};

/// Anneals each group's lr from its lr at construction to swa_lr over anneal_epochs steps
/// (cosine: alpha = (1 - cos(pi t)) / 2, or linear: alpha = t, t = step / anneal_epochs), then
/// holds swa_lr: lr = swa_lr * alpha + lr0 * (1 - alpha), PyTorch's SWALR in closed form.
/// anneal_epochs >= 0 (0: swa_lr at once); swa_lr finite and >= 0.
class STRATA_API SWALR : public LRScheduler {
 public:
  enum class Anneal { Cos, Linear };
  SWALR(Optimizer& opt, double swa_lr, int64_t anneal_epochs = 10, Anneal anneal_strategy = Anneal::Cos);
  SWALR(Optimizer& opt, std::vector<double> swa_lrs, int64_t anneal_epochs = 10,
        Anneal anneal_strategy = Anneal::Cos);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  std::vector<double> swa_lrs_;
  int64_t anneal_epochs_;
  Anneal anneal_;
};

/// Batch-norm statistics recomputed from scratch: every BatchNorm layer's running statistics
/// are reset and averaged cumulatively (momentum none) over one pass of the model, in training
/// mode and without gradients, on the inputs `batches` yields (Tensors, or vectors of Tensors
/// whose first is the input); then the momenta and the model's mode are restored. Does nothing
/// for a model without batch norms.
class STRATA_API BatchNormRecompute {
 public:
  explicit BatchNormRecompute(nn::Module& model);
  ~BatchNormRecompute();
  BatchNormRecompute(const BatchNormRecompute&) = delete;
  BatchNormRecompute& operator=(const BatchNormRecompute&) = delete;
  bool has_batch_norm() const { return !momenta_.empty(); }

 private:
  nn::Module* model_;
  bool was_training_;
  std::vector<std::pair<nn::Module*, std::optional<double>>> momenta_;
};

template <class Batches>
void update_bn(const Batches& batches, nn::Module& model) {
  BatchNormRecompute recompute(model);
  if (!recompute.has_batch_norm()) return;
  NoGradGuard no_grad;
  for (const auto& batch : batches) {
    if constexpr (std::is_convertible_v<decltype(batch), const Tensor&>) {
      model(batch);
    } else {
      STRATA_CHECK(!batch.empty(), "[update_bn] a batch holds no tensors");
      model(batch[0]);
    }
  }
}

}  // namespace strata::optim::swa_utils
