// L-BFGS (Nocedal 1980; Liu & Nocedal 1989), as torch.optim.LBFGS without a line search: each
// step() runs up to max_iter iterations of the two-loop recursion over the last history_size
// curvature pairs, calling `closure` (zero the grads, compute the loss, backward) to
// re-evaluate after every move, and stops early on PyTorch's tolerances. One parameter group;
// all parameters are treated as one flat vector, computed in float64 on the host whatever the
// parameters' dtype and device (PyTorch computes in the parameters' dtype).
//
//   optim::LBFGS opt(model.parameters(), {.lr = 1, .max_iter = 20, .history_size = 10});
//   opt.step([&] { opt.zero_grad(); Tensor loss = loss_fn(model(x), y); loss.backward(); return loss; });
#pragma once

#include <cstdint>
#include <vector>

#include <strata/optim/optimizer.hpp>

namespace strata::optim {

struct LBFGSOptions {
  double lr = 1;
  int64_t max_iter = 20;
  int64_t max_eval = 0;  ///< closure calls per step; 0: max_iter * 5 / 4, as PyTorch's default
  double tolerance_grad = 1e-7;
  double tolerance_change = 1e-9;
  int64_t history_size = 100;

  template <class Self, class F>
  static void for_each_field(Self& o, F&& f) {
    f("lr", o.lr), f("max_iter", o.max_iter), f("max_eval", o.max_eval), f("tolerance_grad", o.tolerance_grad);
    f("tolerance_change", o.tolerance_change), f("history_size", o.history_size);
  }
};

/// Raises Error for lr, tolerances < 0, max_iter or history_size < 1, or max_eval < 0.
STRATA_API void validate_options(const LBFGSOptions& o);

class STRATA_API LBFGS : public OptimizerFor<LBFGSOptions> {
 public:
  explicit LBFGS(std::vector<Tensor> params, LBFGSOptions options = {});

  /// Needs `closure`; returns the loss of its first call, as PyTorch's.
  Tensor step(const std::function<Tensor()>& closure = {}) override;
  /// The optimizer's state dict plus the search state: direction, step size, last flat grad and
  /// loss, the curvature pairs, counters.
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& dict) override;
  int64_t n_iter() const { return n_iter_; }
  int64_t func_evals() const { return func_evals_; }

 protected:
  void update(size_t group, const Tensor& param, const Tensor& grad, ParamState& state) override;
  std::vector<StateSpec> state_specs(size_t, const Tensor&) const override { return {}; }

 private:
  std::vector<double> flat_grad() const;
  void add_to_params(double t, const std::vector<double>& d);

  int64_t n_iter_ = 0, func_evals_ = 0;
  std::vector<double> d_, prev_flat_grad_;
  double t_ = 0, h_diag_ = 1, prev_loss_ = 0;
  std::vector<std::vector<double>> old_dirs_, old_stps_;
  std::vector<double> ro_;
};

}  // namespace strata::optim
