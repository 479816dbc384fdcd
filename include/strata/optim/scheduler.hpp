// Learning-rate schedules, as torch.optim.lr_scheduler. Each scheduler is a closed form
// lr(step) of the base lr it starts from (the optimizer's "initial_lr", recorded by the first
// scheduler attached), so schedules compose (SequentialLR) and resume exactly from a step count.
// As in PyTorch, constructing a scheduler applies the step-0 lr; call step() once per epoch or
// iteration, after optimizer.step().
//
// Unlike PyTorch's recursive forms, each step sets the lr from the closed form alone, so two
// schedulers stepped on one optimizer would overwrite each other's lr: compose them with
// ChainedScheduler (the product of their factors, as PyTorch's chaining gives for the
// multiplicative schedules) or SequentialLR. A scheduler stepped again after another one
// stepped the same optimizer raises Error (one that replaces another, never stepped again, is
// fine). An lr set by hand lasts until the next step. A state dict holds the position and base
// lrs (a composed scheduler's, its children's too), not the constructor's arguments: load it
// into a scheduler built alike.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <strata/optim/optimizer.hpp>

namespace strata::optim {

class STRATA_API LRScheduler {
 public:
  virtual ~LRScheduler();
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// Advances one step and sets every group's lr; raises Error, changing nothing, when an lr
  /// would be negative or not finite.
  void step();
  /// The lrs the last step (or the constructor) set, one per group.
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  /// The lr of `group` at step `epoch` (no side effects).
  virtual double lr_at(int64_t epoch, size_t group) const = 0;

  StateDict state_dict() const;
  /// Restores a state_dict() of the same scheduler type over the same number of groups.
  /// Like PyTorch, it does not touch the optimizer's lrs (the optimizer's state dict has them).
  void load_state_dict(const StateDict& dict);

  const std::string& name() const { return name_; }
  Optimizer& optimizer() const { return *opt_; }

 protected:
  LRScheduler(Optimizer& opt, std::string name);
  /// Applies the step-0 lr; the last line of every derived constructor.
  void initial_step();
  /// Sets the lrs (and anything else, such as momentum) for `epoch`.
  virtual void apply(int64_t epoch);
  virtual void save_extra(StateDict&) const {}
  virtual void load_extra(const StateDict&) {}
  void set_epoch(int64_t epoch) { last_epoch_ = epoch; }

  Optimizer* opt_;
  std::string name_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = -1;

 private:
  void advance();  // applies the next step
  uint64_t id_;          // unique in the process: the optimizer records which scheduler stepped it last
  bool stepped_ = false;  // step() was called (the constructor's step 0 does not count)

  friend class ComposedLR;
};

/// lr = base_lr * lambda(epoch); one function for all groups, or one per group. A factor that
/// is negative or not finite raises Error naming the group and the step.
class STRATA_API LambdaLR : public LRScheduler {
 public:
  using Lambda = std::function<double(int64_t)>;
  LambdaLR(Optimizer& opt, Lambda lambda);
  LambdaLR(Optimizer& opt, std::vector<Lambda> lambdas);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  std::vector<Lambda> lambdas_;
};

/// lr = base_lr * gamma^floor(epoch / step_size); gamma finite and >= 0.
class STRATA_API StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& opt, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// lr = base_lr * gamma^(number of milestones <= epoch); milestones ascending, gamma finite and >= 0.
class STRATA_API MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& opt, std::vector<int64_t> milestones, double gamma = 0.1);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  std::vector<int64_t> milestones_;
  double gamma_;
};

/// lr = base_lr * gamma^epoch; gamma finite and >= 0.
class STRATA_API ExponentialLR : public LRScheduler {
 public:
  ExponentialLR(Optimizer& opt, double gamma);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  double gamma_;
};

/// lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2 (SGDR without
/// restarts; periodic past T_max, as PyTorch's closed form); eta_min finite and >= 0.
class STRATA_API CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& opt, int64_t T_max, double eta_min = 0);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

/// lr = base_lr * (start_factor + (end_factor - start_factor) * min(epoch, total_iters) /
/// total_iters).
class STRATA_API LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& opt, double start_factor = 1.0 / 3, double end_factor = 1.0, int64_t total_iters = 5);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  double start_, end_;
  int64_t total_;
};

/// lr = base_lr * factor before total_iters, base_lr from then on; factor in [0, 1],
/// total_iters >= 0.
class STRATA_API ConstantLR : public LRScheduler {
 public:
  ConstantLR(Optimizer& opt, double factor = 1.0 / 3, int64_t total_iters = 5);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  double factor_;
  int64_t total_;
};

/// lr = base_lr * lambda(1) * ... * lambda(epoch) (PyTorch's lr *= lambda(epoch) each step); one
/// function for all groups, or one per group. A factor that is negative or not finite raises
/// Error naming the group and the step. Each factor is computed once and remembered.
class STRATA_API MultiplicativeLR : public LRScheduler {
 public:
  using Lambda = std::function<double(int64_t)>;
  MultiplicativeLR(Optimizer& opt, Lambda lambda);
  MultiplicativeLR(Optimizer& opt, std::vector<Lambda> lambdas);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  std::vector<Lambda> lambdas_;
  // by group: the last step computed and the product of the factors up to it (steps advance one at
  // a time, so each costs one factor; an earlier step starts again from 0)
  mutable std::vector<std::pair<int64_t, double>> products_;
};

/// lr = base_lr * (1 - min(epoch, total_iters) / total_iters)^power; total_iters > 0, power
/// finite and >= 0.
class STRATA_API PolynomialLR : public LRScheduler {
 public:
  PolynomialLR(Optimizer& opt, int64_t total_iters = 5, double power = 1.0);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  int64_t total_;
  double power_;
};

/// Linear warmup from 0 over warmup_steps (lr = base_lr * epoch / warmup_steps, as the
/// Hugging Face schedules), then a decay from base_lr to min_lr at total_steps, and min_lr
/// after it: none (constant base_lr), linear, or cosine (half a cosine period).
class STRATA_API WarmupDecayLR : public LRScheduler {
 public:
  enum class Decay { None, Linear, Cosine };
  WarmupDecayLR(Optimizer& opt, int64_t warmup_steps, int64_t total_steps, double min_lr, Decay decay);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  int64_t warmup_, total_;
  double min_lr_;
  Decay decay_;
};

/// Linear warmup, then the base lr.
class STRATA_API LinearWarmup : public WarmupDecayLR {
 public:
  LinearWarmup(Optimizer& opt, int64_t warmup_steps)
      : WarmupDecayLR(opt, warmup_steps, warmup_steps, 0, Decay::None) {}
};

/// Linear warmup, then cosine decay to min_lr at total_steps.
class STRATA_API WarmupCosine : public WarmupDecayLR {
 public:
  WarmupCosine(Optimizer& opt, int64_t warmup_steps, int64_t total_steps, double min_lr = 0)
      : WarmupDecayLR(opt, warmup_steps, total_steps, min_lr, Decay::Cosine) {}
};

/// Linear warmup, then linear decay to min_lr at total_steps.
class STRATA_API WarmupLinear : public WarmupDecayLR {
 public:
  WarmupLinear(Optimizer& opt, int64_t warmup_steps, int64_t total_steps, double min_lr = 0)
      : WarmupDecayLR(opt, warmup_steps, total_steps, min_lr, Decay::Linear) {}
};

struct OneCycleOptions {
  double pct_start = 0.3;
  enum class Anneal { Cos, Linear } anneal_strategy = Anneal::Cos;
  bool cycle_momentum = true;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  double div_factor = 25;
  double final_div_factor = 1e4;
  bool three_phase = false;
};

/// The 1cycle policy (Smith & Topin 2018), as torch.optim.lr_scheduler.OneCycleLR: from
/// max_lr / div_factor up to max_lr over pct_start of total_steps, then down to
/// initial_lr / final_div_factor (three_phase: back to the initial lr first), while the
/// momentum (beta1 for the Adam family) cycles the opposite way. max_lr finite and >= 0. A
/// phase of zero length (pct_start * total_steps == 1) starts at its end value, where PyTorch
/// divides by zero. Step total_steps keeps the final values (PyTorch extrapolates past them);
/// stepping past it raises Error.
class STRATA_API OneCycleLR : public LRScheduler {
 public:
  OneCycleLR(Optimizer& opt, double max_lr, int64_t total_steps, OneCycleOptions options = {});
  OneCycleLR(Optimizer& opt, std::vector<double> max_lrs, int64_t total_steps, OneCycleOptions options = {});
  double lr_at(int64_t epoch, size_t group) const override;
  double momentum_at(int64_t epoch) const;

 protected:
  void apply(int64_t epoch) override;
  /// Refuses a position past total_steps (a dict from a longer schedule).
  void load_extra(const StateDict& d) override;

 private:
  struct Phase {
    double end_step;
    int start_lr, end_lr;  // 0: initial, 1: max, 2: min
  };
  double anneal(double start, double end, double pct) const;
  // the phase containing `epoch` and the fraction of it done
  const Phase& phase_at(int64_t epoch, double& pct) const;

  std::vector<double> max_lrs_;
  int64_t total_;
  OneCycleOptions o_;
  std::vector<Phase> phases_;
};

/// A scheduler made of others, all built on the same optimizer, which it steps itself (step
/// only the composed one).
class STRATA_API ComposedLR : public LRScheduler {
 protected:
  ComposedLR(Optimizer& opt, std::string name, std::vector<std::shared_ptr<LRScheduler>> schedulers);
  /// Sets child i to `epoch` (its lr and anything else it sets, such as momentum).
  void apply_child(size_t i, int64_t epoch);
  /// The children's state dicts, under "scheduler.<i>.": their base lrs give the lrs.
  void save_extra(StateDict& d) const override;
  void load_extra(const StateDict& d) override;

  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
};

/// Runs `schedulers` one after another: scheduler i from step milestones[i-1] on, counting
/// its own steps from 0 there (milestones ascending, one fewer than schedulers).
class STRATA_API SequentialLR : public ComposedLR {
 public:
  SequentialLR(Optimizer& opt, std::vector<std::shared_ptr<LRScheduler>> schedulers, std::vector<int64_t> milestones);
  double lr_at(int64_t epoch, size_t group) const override;

 protected:
  void apply(int64_t epoch) override;

 private:
  size_t index_at(int64_t epoch, int64_t& local) const;
  std::vector<int64_t> milestones_;
};

/// Runs `schedulers` together, as torch.optim.lr_scheduler.ChainedScheduler: at each step the
/// lr is the base lr times the product of their factors (lr_at / base lr), so ExponentialLR
/// chained with MultiStepLR decays every step and drops at the milestones. Each child also
/// applies what else it sets (OneCycleLR's momentum), in order.
class STRATA_API ChainedScheduler : public ComposedLR {
 public:
  ChainedScheduler(Optimizer& opt, std::vector<std::shared_ptr<LRScheduler>> schedulers);
  double lr_at(int64_t epoch, size_t group) const override;

 protected:
  void apply(int64_t epoch) override;
};

struct ReduceLROnPlateauOptions {
  enum class Mode { Min, Max } mode = Mode::Min;
  double factor = 0.1;
  int64_t patience = 10;
  double threshold = 1e-4;
  enum class ThresholdMode { Rel, Abs } threshold_mode = ThresholdMode::Rel;
  int64_t cooldown = 0;
  double min_lr = 0;             ///< for every group, unless min_lrs is given
  std::vector<double> min_lrs;  ///< one per group
  double eps = 1e-8;            ///< lr changes smaller than this are skipped
};

/// Multiplies the lr by `factor` once the metric passed to step() has not improved for more
/// than `patience` steps, as torch.optim.lr_scheduler.ReduceLROnPlateau.
class STRATA_API ReduceLROnPlateau {
 public:
  explicit ReduceLROnPlateau(Optimizer& opt, ReduceLROnPlateauOptions options = {});
  void step(double metric);
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  int64_t last_epoch() const { return last_epoch_; }
  double best() const { return best_; }
  int64_t num_bad_epochs() const { return num_bad_; }

  StateDict state_dict() const;
  void load_state_dict(const StateDict& dict);

 private:
  bool is_better(double a) const;
  Optimizer* opt_;
  ReduceLROnPlateauOptions o_;
  double best_;
  int64_t num_bad_ = 0, cooldown_counter_ = 0, last_epoch_ = 0;
  std::vector<double> last_lr_;
};

}  // namespace strata::optim
