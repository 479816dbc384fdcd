// Adagrad (Duchi et al. 2011), as torch.optim.Adagrad:
//   g = grad (negated when maximize) + weight_decay * p
//   clr = lr / (1 + (t - 1) * lr_decay)
//   sum = sum + g^2                        (starts at initial_accumulator_value)
//   p = p - clr * g / (sqrt(sum) + eps)
// State per parameter: "sum".
#pragma once

#include <strata/optim/optimizer.hpp>

namespace strata::optim {

struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0;
  double weight_decay = 0;
  double initial_accumulator_value = 0;
  double eps = 1e-10;
  bool maximize = false;

  template <class Self, class F>
  static void for_each_field(Self& o, F&& f) {
    f("lr", o.lr), f("lr_decay", o.lr_decay), f("weight_decay", o.weight_decay);
    f("initial_accumulator_value", o.initial_accumulator_value), f("eps", o.eps), f("maximize", o.maximize);
  }
};

/// Raises Error when any of lr, lr_decay, weight_decay, initial_accumulator_value, eps is < 0.
STRATA_API void validate_options(const AdagradOptions& o);

class STRATA_API Adagrad : public OptimizerFor<AdagradOptions> {
 public:
  explicit Adagrad(std::vector<Tensor> params, AdagradOptions options = {});
  explicit Adagrad(std::vector<Group> groups, AdagradOptions defaults = {});

 protected:
  void update(size_t group, const Tensor& param, const Tensor& grad, ParamState& state) override;
  void update_cuda(size_t group, const std::vector<ParamUpdate>& batch) override;
  std::vector<StateSpec> state_specs(size_t group, const Tensor& param) const override;
};

}  // namespace strata::optim
