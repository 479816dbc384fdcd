// RMSprop (Hinton's lecture notes; centered form of Graves 2013), as torch.optim.RMSprop:
//   g = grad (negated when maximize) + weight_decay * p
//   v = alpha * v + (1 - alpha) * g^2
//   vt = v, or v - gavg^2 with centered, gavg = alpha * gavg + (1 - alpha) * g
//   b = momentum * b + g / (sqrt(vt) + eps);  p = p - lr * b       (momentum > 0)
//   p = p - lr * g / (sqrt(vt) + eps)                              (otherwise)
// State per parameter: "square_avg", "grad_avg" (centered), "momentum_buffer" (momentum > 0).
#pragma once

#include <strata/optim/optimizer.hpp>

namespace strata::optim {

struct RMSpropOptions {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0;
  double momentum = 0;
  bool centered = false;
  bool maximize = false;

  template <class Self, class F>
  static void for_each_field(Self& o, F&& f) {
    f("lr", o.lr), f("alpha", o.alpha), f("eps", o.eps), f("weight_decay", o.weight_decay);
    f("momentum", o.momentum), f("centered", o.centered), f("maximize", o.maximize);
  }
};

/// Raises Error when any of lr, alpha, eps, weight_decay, momentum is < 0.
STRATA_API void validate_options(const RMSpropOptions& o);

class STRATA_API RMSprop : public OptimizerFor<RMSpropOptions> {
 public:
  explicit RMSprop(std::vector<Tensor> params, RMSpropOptions options = {});
  explicit RMSprop(std::vector<Group> groups, RMSpropOptions defaults = {});

 protected:
  void update(size_t group, const Tensor& param, const Tensor& grad, ParamState& state) override;
  void update_cuda(size_t group, const std::vector<ParamUpdate>& batch) override;
  std::vector<StateSpec> state_specs(size_t group, const Tensor& param) const override;
};

}  // namespace strata::optim
