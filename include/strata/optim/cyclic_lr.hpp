// Periodic learning-rate schedules, as torch.optim.lr_scheduler.CosineAnnealingWarmRestarts and
// CyclicLR: closed forms of the step count, like the schedules in scheduler.hpp.
#pragma once

#include <functional>
#include <optional>

#include <strata/optim/scheduler.hpp>

namespace strata::optim {

/// SGDR (Loshchilov & Hutter 2017): cosine annealing from base_lr to eta_min over a period that
/// restarts at base_lr; the first period is T_0 steps, each next one T_mult times longer.
///   lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * T_cur / T_i)) / 2
/// T_0 > 0, T_mult >= 1, eta_min finite and >= 0. Integer steps only (PyTorch also takes a
/// fractional epoch in step(epoch)).
class STRATA_API CosineAnnealingWarmRestarts : public LRScheduler {
 public:
  CosineAnnealingWarmRestarts(Optimizer& opt, int64_t T_0, int64_t T_mult = 1, double eta_min = 0);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  int64_t t0_, t_mult_;
  double eta_min_;
};

struct CyclicLROptions {
  int64_t step_size_up = 2000;
  std::optional<int64_t> step_size_down;  ///< step_size_up when not given
  enum class Mode { Triangular, Triangular2, ExpRange } mode = Mode::Triangular;
  double gamma = 1.0;  ///< ExpRange: the amplitude is scaled by gamma^step
  /// A custom amplitude scale, replacing `mode`, of the cycle number (from 1) or the step.
  std::function<double(double)> scale_fn;
  enum class ScaleMode { Cycle, Iterations } scale_mode = ScaleMode::Cycle;
  bool cycle_momentum = true;
  double base_momentum = 0.8;
  double max_momentum = 0.9;
};

/// The cyclical learning rate policy (Smith 2017), as torch.optim.lr_scheduler.CyclicLR: the lr
/// goes from base_lr up to max_lr over step_size_up steps and back over step_size_down, the
/// amplitude scaled by the mode (triangular: 1; triangular2: halved each cycle; exp_range:
/// gamma^step). With cycle_momentum the momentum (beta1 for the Adam family) cycles the other
/// way between max_momentum and base_momentum. Like PyTorch, the schedule starts from base_lr
/// whatever lr the optimizer had. Step once per batch.
class STRATA_API CyclicLR : public LRScheduler {
 public:
  CyclicLR(Optimizer& opt, double base_lr, double max_lr, CyclicLROptions options = {});
  CyclicLR(Optimizer& opt, std::vector<double> base_lrs, std::vector<double> max_lrs, CyclicLROptions options = {});
  double lr_at(int64_t epoch, size_t group) const override;
  double momentum_at(int64_t epoch) const;

 protected:
  void apply(int64_t epoch) override;

 private:
  // the fraction of the way from the low to the high value at `epoch`, times the amplitude scale
  double height(int64_t epoch) const;

  std::vector<double> max_lrs_;
  CyclicLROptions o_;
  double total_size_, step_ratio_;
};

}  // namespace strata::optim
